"""Load any timm Vision Transformer, from the hub, a local folder or a single file.

``load_vit(source)`` returns a :class:`LoadedViT`: the model in eval mode on its device,
its geometry (:class:`~analysis.spec.ViTSpec`), its own preprocessing and its class
names. Sources, tried in this order:

* ``"demo"``: the bundled demo model in ``assets/demo_vit``;
* ``"local-dir:PATH"`` or a folder in timm's hub layout (``config.json`` + ``model.safetensors``);
* a single weights file (``.safetensors``, ``.pth``/``.pt``/``.bin``, Google's ``.npz``) with ``arch=``;
* ``"hf-hub:org/name"`` or a timm model name, with or without a pretrained tag.

Pickle-based files are only ever read with ``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import copy
import difflib
import json
import os
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import timm
import torch
import torch.nn as nn
from PIL import Image
from timm.layers import Attention
from timm.models.vision_transformer import VisionTransformer

from .devices import resolve_device
from .errors import (
    CheckpointError,
    ModelLoadError,
    UnsupportedModelError,
    WeightsUnavailableError,
)
from .preprocessing import Preprocessing
from .spec import ViTSpec, spec_from_model

__all__ = ["LoadedViT", "load_vit", "DEMO_MODEL_DIR", "SUPPORTED_FAMILIES"]

DEMO_MODEL_DIR = Path(__file__).resolve().parent.parent / "assets" / "demo_vit"
SINGLE_FILE_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".npz")
# timm modules whose models are ``VisionTransformer`` (or subclasses) with standard attention.
SUPPORTED_MODULES = ("vision_transformer", "vision_transformer_hybrid", "deit")
SUPPORTED_FAMILIES = (
    "timm VisionTransformer models (vit_*, deit_*, deit3_*, DINO/DINOv2 incl. registers, "
    "CLIP/SigLIP image towers built as VisionTransformer, hybrid vit_*_r50_*)"
)
_HUB_PROBE_TIMEOUT_S = 3.0
_CPU_COPY_LOCK = threading.Lock()


@dataclass(eq=False)
class LoadedViT:
    """A loaded ViT with everything needed to feed it and read it.

    Attributes:
        model: the ``timm`` model, eval mode, on ``device``.
        name: the source it was loaded from.
        device: where the model lives.
        spec: token geometry at the configured input size.
        class_names: one name per output class, or ``None``.
        preprocessing: resize / crop / normalise at ``spec.img_size``.
    """

    model: nn.Module
    name: str
    device: torch.device
    spec: ViTSpec
    class_names: list[str] | None
    preprocessing: Preprocessing
    data_config: dict = field(default_factory=dict)
    _cpu_copy: nn.Module | None = field(default=None, repr=False)

    def preprocess(self, image: Image.Image) -> torch.Tensor:
        """PIL image -> ``(1, 3, H, W)`` float tensor (CPU) at the model's input size."""
        return self.preprocessing(image)

    def model_input_image(self, image: Image.Image) -> Image.Image:
        """The resized, centre-cropped RGB image (W, H) the model sees: draw overlays on this."""
        return self.preprocessing.crop(image)

    def cpu_model(self) -> nn.Module:
        """A private float32 CPU copy of the model (made once), for out-of-memory fallbacks:
        the shared model stays on its device, where other sessions are using it."""
        if self.device.type == "cpu":
            return self.model
        with _CPU_COPY_LOCK:
            if self._cpu_copy is None:
                self._cpu_copy = copy.deepcopy(self.model).float().to("cpu")
            return self._cpu_copy

    @property
    def num_classes(self) -> int:
        return int(getattr(self.model, "num_classes", 0) or 0)

    def __repr__(self) -> str:
        s = self.spec
        return (
            f"LoadedViT({self.name!r}, device={self.device.type}, img_size={s.img_size}, "
            f"patch={s.patch_size}, grid={s.grid_size}, prefix_tokens={s.num_prefix_tokens}, "
            f"layers={s.num_layers}, heads={s.num_heads})"
        )


# --------------------------------------------------------------------------- public entry


def load_vit(
    source: str | os.PathLike,
    *,
    pretrained: bool = True,
    device: str | torch.device | None = None,
    arch: str | None = None,
    **model_kwargs: Any,
) -> LoadedViT:
    """Load a timm ViT for inspection.

    Args:
        source: ``"demo"``, a timm name (``"vit_base_patch16_224.augreg2_in21k_ft_in1k"``),
            ``"hf-hub:org/name"``, ``"local-dir:folder"`` or a folder in timm's hub layout,
            or a single weights file (then ``arch`` is required).
        pretrained: for timm names only: load pretrained weights (from the local Hugging Face
            cache, else downloaded). ``False`` gives random weights.
        device: ``None`` picks cuda, then mps, then cpu.
        arch: the timm architecture of a single weights file.
        **model_kwargs: passed on to ``timm.create_model`` (``img_size=``, ``num_classes=``,
            ``dynamic_img_size=``...); they win over a folder's saved ``model_args``.

    Raises:
        ModelLoadError and its subclasses, with a message that says what to do.
    """
    target = resolve_device(device)
    source_str = os.fspath(source)
    if source_str == "demo":
        if not (DEMO_MODEL_DIR / "config.json").is_file():
            raise ModelLoadError(
                f"The bundled demo model is missing ({DEMO_MODEL_DIR}). Restore it from git "
                "(`git checkout -- assets/demo_vit`) or retrain it with `python -m analysis.train_demo`."
            )
        model, config = _model_from_folder(DEMO_MODEL_DIR, model_kwargs)
        label_names = config.get("label_names")
    elif source_str.startswith("local-dir:") or Path(source_str).is_dir():
        folder = Path(source_str.removeprefix("local-dir:")).expanduser()
        model, config = _model_from_folder(folder, model_kwargs)
        label_names = config.get("label_names")
    elif _looks_like_file(source_str):
        model = _model_from_file(Path(source_str).expanduser(), arch, model_kwargs)
        label_names = None
    else:
        model = _model_from_timm(source_str, pretrained, model_kwargs)
        label_names = getattr(model, "pretrained_cfg", {}).get("label_names")
    return _wrap(model, source_str, target, label_names)


# --------------------------------------------------------------------------- sources


def _looks_like_file(source: str) -> bool:
    return source.lower().endswith(SINGLE_FILE_SUFFIXES) or Path(source).is_file()


def _model_from_folder(folder: Path, model_kwargs: dict) -> tuple[nn.Module, dict]:
    """Build from timm's hub layout: config.json (+ model.safetensors or pytorch_model.bin)."""
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise CheckpointError(
            f"{folder} has no config.json. A model folder needs timm's hub layout: config.json "
            "(architecture, model_args, pretrained_cfg) and model.safetensors."
        )
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"Could not read {config_path}: {exc}") from exc
    architecture = config.get("architecture")
    if not architecture:
        raise CheckpointError(f"{config_path} does not name an 'architecture' (a timm model name).")
    _check_supported_architecture(architecture)

    kwargs = dict(config.get("model_args") or {})
    num_classes = config.get("num_classes", (config.get("pretrained_cfg") or {}).get("num_classes"))
    if num_classes is not None:
        kwargs.setdefault("num_classes", num_classes)
    kwargs.update(model_kwargs)
    pretrained_cfg = dict(config.get("pretrained_cfg") or {})
    model = _create(architecture, pretrained=False, pretrained_cfg_overlay=pretrained_cfg, **kwargs)

    for weights_name in ("model.safetensors", "pytorch_model.bin", "model.pth"):
        weights = folder / weights_name
        if weights.is_file():
            _load_state_dict_into(model, _read_state_dict(weights), weights)
            break
    else:
        raise CheckpointError(f"{folder} has config.json but no model.safetensors (or pytorch_model.bin).")
    return model, config


def _model_from_file(path: Path, arch: str | None, model_kwargs: dict) -> nn.Module:
    if not path.is_file():
        raise CheckpointError(f"Checkpoint file not found: {path}. Check the path (it is read on the server).")
    if not arch:
        raise CheckpointError(
            f"{path.name} is a bare weights file: pass the timm architecture it was trained with, "
            "e.g. load_vit(path, arch='vit_base_patch16_224')."
        )
    _check_supported_architecture(arch)
    if path.suffix.lower() == ".npz":
        kwargs = dict(model_kwargs)
        if "num_classes" not in kwargs:
            kwargs["num_classes"] = _npz_num_classes(path)
        model = _create(arch, pretrained=False, **kwargs)
        try:
            model.load_pretrained(str(path))  # timm's loader for Google's original ViT .npz files
        except Exception as exc:  # noqa: BLE001 - any failure means the file does not fit
            raise CheckpointError(f"{path.name} is not a Google ViT .npz checkpoint for {arch}: {exc}") from exc
        return model
    state_dict = _read_state_dict(path)
    kwargs = dict(model_kwargs)
    head = state_dict.get("head.weight")
    if "num_classes" not in kwargs and isinstance(head, torch.Tensor) and head.ndim == 2:
        kwargs["num_classes"] = head.shape[0]
    if "num_classes" not in kwargs and "head.weight" not in state_dict:
        kwargs["num_classes"] = 0
    model = _create(arch, pretrained=False, **kwargs)
    _load_state_dict_into(model, state_dict, path)
    return model


def _npz_num_classes(path: Path) -> int:
    """Classes of the head stored in a Google ViT .npz (0 when it has none)."""
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as weights:
            return int(weights["head/bias"].shape[0]) if "head/bias" in weights.files else 0
    except Exception as exc:  # noqa: BLE001
        raise CheckpointError(f"{path.name} is not a readable .npz archive: {exc}") from exc


def _model_from_timm(name: str, pretrained: bool, model_kwargs: dict) -> nn.Module:
    if name.startswith("hf-hub:"):
        if pretrained:
            _ensure_hub_reachable(name.removeprefix("hf-hub:").split("@")[0], name)
        return _create(name, pretrained=pretrained, **model_kwargs)
    architecture, _, tag = name.partition(".")
    if not timm.is_model(architecture):
        close = difflib.get_close_matches(architecture, timm.list_models(), n=5, cutoff=0.6)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise ModelLoadError(
            f"Unknown timm model {name!r}.{hint} List ViTs with timm.list_models('vit_*'); "
            "for your own weights pass a folder or a file path."
        )
    _check_supported_architecture(architecture)
    if tag:
        tags = [n.partition(".")[2] for n in timm.list_pretrained(f"{architecture}.*")]
        if tag not in tags:
            raise ModelLoadError(
                f"{architecture!r} has no pretrained tag {tag!r}. Available: {', '.join(tags) or 'none'}."
            )
    if pretrained:
        _ensure_pretrained_available(name)
    return _create(name, pretrained=pretrained, **model_kwargs)


# --------------------------------------------------------------------------- helpers


def _create(name: str, **kwargs: Any) -> nn.Module:
    try:
        return timm.create_model(name, **kwargs)
    except WeightsUnavailableError:
        raise
    except Exception as exc:  # noqa: BLE001 - translate timm/hub failures into one typed error
        text = f"{type(exc).__name__}: {exc}"
        if _is_offline_error(exc):
            raise WeightsUnavailableError(_offline_message(name)) from exc
        raise ModelLoadError(f"timm could not build {name!r}: {text}") from exc


def _check_supported_architecture(architecture: str) -> None:
    arch = architecture.removeprefix("hf-hub:").split(".")[0]
    if not timm.is_model(arch):
        close = difflib.get_close_matches(arch, timm.list_models(), n=5, cutoff=0.6)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise ModelLoadError(f"Unknown timm architecture {arch!r}.{hint}")
    if not timm.models.is_model_in_modules(arch, SUPPORTED_MODULES):
        raise UnsupportedModelError(
            f"{arch!r} is not a Vision Transformer this tool can inspect: it has no per-token "
            f"self-attention maps of the ViT kind. Supported: {SUPPORTED_FAMILIES}. "
            "Try 'demo', 'vit_base_patch16_224.augreg2_in21k_ft_in1k' or 'deit_small_patch16_224'."
        )


def _read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """Read tensors from safetensors, or from a pickle with ``weights_only=True`` (never code)."""
    try:
        if path.suffix.lower() == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path), device="cpu")
        else:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
    except FileNotFoundError as exc:
        raise CheckpointError(f"Checkpoint file not found: {path}.") from exc
    except Exception as exc:  # noqa: BLE001 - corrupt, unsafe or foreign files all land here
        raise CheckpointError(
            f"Could not read {path.name} as weights: {type(exc).__name__}: {str(exc)[:400]}. "
            "Pickle files are loaded with weights_only=True, so checkpoints that contain code or "
            "custom classes are refused; re-save it as a plain state dict, ideally as .safetensors."
        ) from exc
    for key in ("state_dict", "model", "model_state_dict", "module"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
            break
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path.name} does not hold a state dict of tensors.")
    if state and all(k.startswith("module.") for k in state):
        state = {k.removeprefix("module."): v for k, v in state.items()}
    return state


def _resample_position_embedding(model: nn.Module, state_dict: dict) -> dict:
    """Fit a checkpoint's ``pos_embed`` to the model's grid (bicubic, as timm does when a
    model is built at another ``img_size`` than it was trained at)."""
    saved = state_dict.get("pos_embed")
    own = getattr(model, "pos_embed", None)
    if not isinstance(saved, torch.Tensor) or not isinstance(own, torch.Tensor) or saved.shape == own.shape:
        return state_dict
    from timm.layers import resample_abs_pos_embed

    prefix = 0 if getattr(model, "no_embed_class", False) else int(model.num_prefix_tokens)
    saved_patches = saved.shape[1] - prefix
    side = int(round(saved_patches**0.5))
    if saved.ndim != 3 or saved.shape[-1] != own.shape[-1] or side * side != saved_patches:
        return state_dict  # not a square grid we can resample: let the shape check explain it
    resampled = resample_abs_pos_embed(
        saved, new_size=list(model.patch_embed.grid_size), old_size=[side, side], num_prefix_tokens=prefix
    )
    return {**state_dict, "pos_embed": resampled}


def _load_state_dict_into(model: nn.Module, state_dict: dict, path: Path) -> None:
    state_dict = _resample_position_embedding(model, state_dict)
    own = model.state_dict()
    missing = sorted(set(own) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(own))
    wrong_shape = [
        f"{k}: file {tuple(state_dict[k].shape)} vs model {tuple(own[k].shape)}"
        for k in sorted(set(own) & set(state_dict))
        if tuple(own[k].shape) != tuple(state_dict[k].shape)
    ]
    if missing or unexpected or wrong_shape:
        parts = []
        if missing:
            parts.append(f"missing keys ({len(missing)}): {', '.join(missing[:8])}")
        if unexpected:
            parts.append(f"unexpected keys ({len(unexpected)}): {', '.join(unexpected[:8])}")
        if wrong_shape:
            parts.append(f"wrong shapes ({len(wrong_shape)}): {'; '.join(wrong_shape[:5])}")
        raise CheckpointError(
            f"{path.name} does not fit {type(model).__name__} as configured: "
            + " | ".join(parts)
            + ". Check arch= and model arguments (img_size, patch_size, num_classes)."
        )
    model.load_state_dict(state_dict, strict=True)


def _is_offline_error(exc: BaseException) -> bool:
    names = {type(e).__name__ for e in _exception_chain(exc)}
    offline = {
        "OfflineModeIsEnabled",
        "LocalEntryNotFoundError",
        "ConnectionError",
        "ConnectTimeout",
        "ReadTimeout",
        "ConnectError",
        "URLError",
        "gaierror",
    }
    return bool(names & offline)


def _exception_chain(exc: BaseException):
    seen = 0
    while exc is not None and seen < 10:
        yield exc
        exc = exc.__cause__ or exc.__context__
        seen += 1


def _offline_message(name: str) -> str:
    return (
        f"Pretrained weights for {name!r} are not in the local cache and cannot be downloaded "
        "(offline or HF_HUB_OFFLINE=1). Use the bundled 'demo' model, a local folder or weights "
        "file, or pretrained=False for random weights; or download the weights once on a "
        "machine with internet (they land in ~/.cache/huggingface)."
    )


def _hub_offline_env() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _ensure_pretrained_available(name: str) -> None:
    """Fail within seconds, not minutes, when weights are neither cached nor reachable."""
    try:
        cfg = timm.models.get_pretrained_cfg(name, allow_unregistered=False)
    except Exception:  # noqa: BLE001
        cfg = None
    hub_id = getattr(cfg, "hf_hub_id", None) if cfg is not None else None
    if hub_id and _in_hf_cache(hub_id.split("@")[0]):
        return
    _ensure_hub_reachable(hub_id, name)


def _ensure_hub_reachable(hub_id: str | None, name: str) -> None:
    if hub_id and _in_hf_cache(hub_id):
        return
    if _hub_offline_env() or not _can_reach("huggingface.co", 443):
        raise WeightsUnavailableError(_offline_message(name))


def _in_hf_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover
        return False
    for filename in ("model.safetensors", "open_clip_model.safetensors", "pytorch_model.bin", "open_clip_pytorch_model.bin"):
        try:
            found = try_to_load_from_cache(repo_id, filename)
        except Exception:  # noqa: BLE001
            found = None
        if isinstance(found, str):
            return True
    return False


def _can_reach(host: str, port: int) -> bool:
    result: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=_HUB_PROBE_TIMEOUT_S):
                result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe, daemon=True)  # DNS can hang past socket timeouts
    thread.start()
    thread.join(_HUB_PROBE_TIMEOUT_S + 0.5)
    return bool(result and result[0])


def _class_names(model: nn.Module, label_names: list[str] | None) -> list[str] | None:
    num_classes = int(getattr(model, "num_classes", 0) or 0)
    if label_names and len(label_names) == num_classes:
        return [str(n) for n in label_names]
    if num_classes in (1000, 11821, 21841, 21843):
        try:
            from timm.data import ImageNetInfo, infer_imagenet_subset

            subset = infer_imagenet_subset(model)
            if subset:
                return list(ImageNetInfo(subset).label_descriptions())
        except Exception:  # noqa: BLE001 - class names are a nicety, never a failure
            return None
    return None


def _wrap(model: nn.Module, name: str, device: torch.device, label_names) -> LoadedViT:
    if not isinstance(model, VisionTransformer):
        raise UnsupportedModelError(
            f"{name!r} built a {type(model).__name__}, not a VisionTransformer. Supported: {SUPPORTED_FAMILIES}."
        )
    for index, block in enumerate(model.blocks):
        attn = getattr(block, "attn", None)
        if type(attn) is not Attention:  # variants (differential, rope, ...) compute other maps
            raise UnsupportedModelError(
                f"{name!r}: block {index} uses {type(attn).__name__ if attn is not None else 'no attention module'}, "
                f"not timm's standard multi-head Attention, so softmax(q·kᵀ) would not be the map it uses. "
                f"Supported: {SUPPORTED_FAMILIES}."
            )
    if getattr(model, "patch_embed", None) is None:
        raise UnsupportedModelError(f"{name!r} has no patch embedding.")
    declared = tuple(int(v) for v in model.patch_embed.img_size) if model.patch_embed.img_size else None
    spec = spec_from_model(model)
    if declared and declared != spec.img_size and not getattr(model, "dynamic_img_size", False):
        ph, pw = spec.patch_size
        raise UnsupportedModelError(
            f"img_size {declared[0]}x{declared[1]} is not a multiple of the patch size {ph}x{pw}: "
            f"use e.g. img_size={spec.img_size[0]} or {spec.img_size[0] + ph}."
        )
    try:
        model = model.to(device).eval()
    except (RuntimeError, AssertionError) as exc:
        raise ModelLoadError(f"Cannot move the model to {device}: {exc}. Use device='cpu'.") from exc
    model.requires_grad_(False)
    from timm.data import resolve_data_config

    data_config = dict(resolve_data_config({}, model=model))
    data_config["input_size"] = (3, *spec.img_size)  # the model's actual size wins over the pretrained default
    return LoadedViT(
        model=model,
        name=name,
        device=device,
        spec=spec,
        class_names=_class_names(model, label_names),
        preprocessing=Preprocessing.from_data_config(data_config, spec.img_size),
        data_config=dict(data_config),
    )
