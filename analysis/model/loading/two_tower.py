"""Two-tower image–text models (CLIP, SigLIP): ``load_clip(source)`` -> :class:`LoadedCLIP`.

The image tower is converted once, at this boundary, into an ordinary :class:`LoadedViT`
(:mod:`.hf_transformers` for Hugging Face ``CLIPModel`` / ``SiglipModel``, :mod:`.open_clip_source`
for open_clip), so every image analysis works on ``clip.image`` unchanged. The text side stays
the source library's own module, wrapped as ``text_tower(ids, mask) -> (P, E)`` embeddings in the
joint space. The image–text score is the model's own (Radford et al. 2021; Zhai et al. 2023):

    s(image, text) = exp(t) · cos(u, v) + b

with ``u`` the image embedding, ``v`` the text embedding, ``exp(t)`` the learned logit scale and
``b`` SigLIP's learned bias (0 for CLIP). CLIP turns scores into probabilities with a softmax
over the prompts; SigLIP with a sigmoid per prompt (its training loss: each image–text pair is
its own binary decision).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from ...base.devices import resolve_device
from ...base.errors import ModelLoadError, NoTextTowerError
from .files import existing_model_path, looks_like_path
from .loaded import LoadedViT
from .loaded_clip import TOKENIZER_FILES, LoadedCLIP

__all__ = ["load_clip"]

_IMAGE_ONLY_HINT = (
    "Load a two-tower image-text model with load_clip: a Hugging Face CLIPModel or SiglipModel folder or "
    "'hf:openai/clip-vit-base-patch32', or 'open_clip:ViT-B-32' (pip install open_clip_torch)."
)
#: the bundled demo CLIP by name (``"demo-clip"`` is the same model): its folder is ``asset_path("demo_clip")``.
DEMO_CLIP_NAMES = ("demo_clip", "demo-clip")
_DEMO_CLIP_RETRAIN = "python -m training.train_demo_clip"


# --------------------------------------------------------------------------- loading


def load_clip(
    source,
    *,
    device: str | torch.device | None = None,
    pretrained: bool = True,
    checkpoint: str | None = None,
) -> LoadedCLIP:
    """Load a two-tower image–text model.

    Parameters
    ----------
    source : str, os.PathLike, torch.nn.Module or LoadedCLIP
        ``"demo_clip"`` (the bundled demo CLIP, trained on the demo scenes), a Hugging Face
        ``CLIPModel`` / ``SiglipModel`` ``save_pretrained`` folder (or ``"local-dir:PATH"``),
        ``"hf:org/name"`` (the local cache, else the hub), such a model object,
        ``"open_clip:<arch>"`` (e.g. ``"open_clip:ViT-B-32"``, ``"open_clip:hf-hub:org/name"``), or
        a :class:`LoadedCLIP` (returned as is).
    device : str, torch.device or None, default None
        ``None`` picks cuda, then mps, then cpu.
    pretrained : bool, default True
        ``hf:`` ids only: ``False`` gives random weights.
    checkpoint : str or None, default None
        open_clip only: a pretrained tag (``"laion2b_s34b_b79k"``) or a local checkpoint file.

    Returns
    -------
    LoadedCLIP
        The image tower as a :class:`LoadedViT` (``clip.image``) with the text tower, the learned
        logit scale (and SigLIP's bias), the probability rule and the tokenizer.

    Raises
    ------
    NoTextTowerError
        For an image-only model (a ViT, or a CLIP/SigLIP vision tower alone).
    ModelLoadError
        And its subclasses otherwise, with what to do.
    """
    if isinstance(source, LoadedCLIP):
        return source
    if isinstance(source, LoadedViT):
        raise NoTextTowerError(
            f"{source.name!r} is an image-only model (a LoadedViT): it has no text tower. {_IMAGE_ONLY_HINT}"
        )
    target = resolve_device(device)
    if isinstance(source, nn.Module):
        if type(source).__module__.startswith("open_clip"):
            from .open_clip_source import wrap_open_clip

            return wrap_open_clip(source, type(source).__name__, target, tokenizer=None)
        return wrap_hf_two_tower(source, type(source).__name__, target)
    if not isinstance(source, (str, os.PathLike)) or not os.fspath(source).strip():
        raise ModelLoadError(
            f"load_clip takes a folder, 'hf:org/name', 'open_clip:<arch>' or a model object; got {source!r}."
        )
    name = os.fspath(source)
    if name.startswith("open_clip:"):
        from .open_clip_source import load_open_clip

        return load_open_clip(name.removeprefix("open_clip:"), target, checkpoint=checkpoint)
    if name in DEMO_CLIP_NAMES:
        return _load_demo_clip(name, target)
    if name.startswith("hf:"):
        return _load_hf_hub(name.removeprefix("hf:"), target, pretrained=pretrained)
    if looks_like_path(name):  # a path that names nothing: say so, not 'no text tower'
        existing_model_path(name)
    folder = Path(name.removeprefix("local-dir:")).expanduser()
    if folder.is_dir():
        return load_hf_two_tower_folder(folder, name, target)
    raise NoTextTowerError(
        f"{name!r} is not a two-tower image-text model: model names, 'demo' and weights files open image-only models "
        f"(no text tower), with load_vit. {_IMAGE_ONLY_HINT} The bundled demo CLIP is 'demo_clip'."
    )


def _load_demo_clip(name: str, device: torch.device) -> LoadedCLIP:
    """The bundled demo CLIP (``assets/demo_clip``: a ``CLIPModel`` folder with its tokenizer)."""
    from ...base.assets import asset_path

    folder = asset_path("demo_clip")
    if not (folder / "config.json").is_file():
        raise ModelLoadError(
            f"The bundled demo CLIP is missing ({folder}). Restore it from git (`git checkout -- assets/demo_clip`) "
            f"or reinstall the package, or retrain it with `{_DEMO_CLIP_RETRAIN}` (from a checkout's root)."
        )
    return load_hf_two_tower_folder(folder, name, device)


class _HFTextTower(nn.Module):
    """A transformers text model and its projection: ``(ids, mask) -> (P, E)`` as ``get_text_features``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.text_model: Any = model.text_model  # transformers' text model (pooler_output)
        self.projection = getattr(model, "text_projection", None)  # CLIP; SigLIP's head is inside the text model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        pooled = self.text_model(input_ids=ids, attention_mask=mask).pooler_output  # (P, D_text)
        return pooled if self.projection is None else self.projection(pooled)  # (P, E)


def _two_tower_kind(model: nn.Module, name: str) -> str:
    model_type = str(getattr(getattr(model, "config", None), "model_type", ""))
    if model_type in ("clip", "siglip") and getattr(model, "text_model", None) is not None:
        return model_type
    raise NoTextTowerError(
        f"{name!r} is a transformers {type(model).__name__} (model_type {model_type!r}): an image-only model with "
        f"no text tower. {_IMAGE_ONLY_HINT}"
    )


def wrap_hf_two_tower(
    model: Any,
    name: str,
    device: torch.device,
    *,
    tokenizer=None,
    tokenizer_note: str = "",
    preprocessor: dict | None = None,
) -> LoadedCLIP:
    """A transformers ``CLIPModel`` / ``SiglipModel`` as a :class:`LoadedCLIP` (modules shared, not copied)."""
    from .hf_transformers import wrap_hf

    kind = _two_tower_kind(model, name)
    model.eval().requires_grad_(False)
    image = wrap_hf(model, name, device, preprocessor=preprocessor)
    text_tower = _HFTextTower(model).to(device).eval()
    bias = getattr(model, "logit_bias", None)
    text_config = model.config.text_config
    return LoadedCLIP(
        image=image,
        text_tower=text_tower,
        logit_scale=float(model.logit_scale.detach().exp()),
        logit_bias=None if bias is None else float(bias.detach().reshape(-1)[0]),
        probability="sigmoid" if kind == "siglip" else "softmax",
        context_length=int(text_config.max_position_embeddings),
        tokenizer=tokenizer,
        name=name,
        pad_to_context=kind == "siglip",
        use_attention_mask=kind == "clip",
        source_library="transformers",
        tokenizer_note=tokenizer_note,
        vocab_size=int(text_config.vocab_size),
        _count_tokens=None
        if tokenizer is None
        else (lambda prompt: len(tokenizer(prompt, truncation=False)["input_ids"])),
    )


def _hf_tokenizer(folder: Path):
    """``(tokenizer or None, why none)`` from a folder's tokenizer files."""
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        return None, f"{folder} has no tokenizer files"
    import transformers

    try:
        return transformers.AutoTokenizer.from_pretrained(str(folder)), ""
    except Exception as exc:  # noqa: BLE001 - a broken tokenizer leaves token ids usable
        return None, f"its tokenizer could not be loaded: {type(exc).__name__}: {str(exc)[:200]}"


def load_hf_two_tower_folder(folder: Path, name: str, device: torch.device) -> LoadedCLIP:
    """A ``save_pretrained`` folder of a ``CLIPModel`` / ``SiglipModel`` (with its tokenizer and
    ``preprocessor_config.json`` when it has them)."""
    from .files import read_folder_config
    from .hf_parts import from_folder, require_transformers
    from .hf_transformers import read_preprocessor

    config = read_folder_config(folder)
    model_type = str(config.get("model_type", ""))
    architectures = config.get("architectures") or []
    if model_type not in ("clip", "siglip"):
        what = f"a transformers {model_type!r} model" if model_type else f"a {config.get('architecture', 'timm')} model"
        raise NoTextTowerError(f"{folder} holds {what}: an image-only model with no text tower. {_IMAGE_ONLY_HINT}")
    transformers = require_transformers()
    model_class = getattr(transformers, architectures[0], None) if architectures else None
    if model_class is None:
        model_class = transformers.CLIPModel if model_type == "clip" else transformers.SiglipModel
    try:
        model = from_folder(model_class, folder)
    except Exception as exc:  # noqa: BLE001 - corrupt or mismatched folders
        raise ModelLoadError(f"transformers could not load {folder}: {type(exc).__name__}: {str(exc)[:400]}") from exc
    tokenizer, note = _hf_tokenizer(folder)
    return wrap_hf_two_tower(
        model, name, device, tokenizer=tokenizer, tokenizer_note=note, preprocessor=read_preprocessor(folder)
    )


def _load_hf_hub(repo_id: str, device: torch.device, *, pretrained: bool) -> LoadedCLIP:
    """``"hf:org/name"``: the local Hugging Face cache, else the hub (weights, config, tokenizer)."""
    from huggingface_hub import snapshot_download

    from ...base.errors import WeightsUnavailableError
    from .hub import hub_offline_env, in_hf_cache, offline_message

    if not in_hf_cache(repo_id, ("config.json",)) and hub_offline_env():
        raise WeightsUnavailableError(offline_message(f"hf:{repo_id}"))
    patterns = ["*.json", "*.txt", "*.model"] + (["*.safetensors"] if pretrained else [])
    try:
        folder = Path(snapshot_download(repo_id, allow_patterns=patterns, local_files_only=hub_offline_env()))
    except Exception as exc:  # noqa: BLE001 - offline, missing repo, auth
        raise WeightsUnavailableError(f"{offline_message(f'hf:{repo_id}')} ({type(exc).__name__}: {exc})") from exc
    if pretrained:
        return load_hf_two_tower_folder(folder, f"hf:{repo_id}", device)
    import transformers

    config = transformers.AutoConfig.from_pretrained(str(folder))
    model_class = transformers.SiglipModel if config.model_type == "siglip" else transformers.CLIPModel
    tokenizer, note = _hf_tokenizer(folder)
    from .hf_transformers import read_preprocessor
    from .random_weights import seeded_random_weights

    with seeded_random_weights():
        model = model_class._from_config(config)
    return wrap_hf_two_tower(
        model, f"hf:{repo_id}", device, tokenizer=tokenizer, tokenizer_note=note, preprocessor=read_preprocessor(folder)
    )
