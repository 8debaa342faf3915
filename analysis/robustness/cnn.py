"""CNN comparison models for the robustness probes: a timm CNN (or the bundled demo CNN) with
its preprocessing and a patch grid on which pixel drops and shuffles are defined."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from ..base.assets import asset_path
from ..base.devices import resolve_device
from ..base.errors import AnalysisError, ModelLoadError
from ..base.preprocessing import Preprocessing
from ..model.geometry import ViTSpec
from ..model.loading.files import existing_model_path, looks_like_path
from ..model.loading.loaded import LoadedModel, class_names_for
from ..model.loading.random_weights import seeded_random_weights

__all__ = [
    "DEMO_CNN_DIR",
    "DEMO_CNNS",
    "TEXTURED_DEMO_CNNS",
    "IMAGENET_1K_CNNS",
    "LoadedCNN",
    "load_cnn",
    "cnn_gradcam",
]

DEMO_CNN_DIR = asset_path("demo_cnn")
#: the bundled demo CNNs by name: ``"demo"`` (trained on the demo scenes) and ``"demo_textured"`` (fine-tuned
#: from it on textured scenes as well, so it reads texture); their drop grid is the demo ViT's 6 px patches
DEMO_CNNS: dict[str, Path] = {"demo": DEMO_CNN_DIR, "demo_textured": asset_path("demo_cnn_textured")}
#: a plain demo CNN -> its variant fine-tuned on textured scenes too
TEXTURED_DEMO_CNNS: dict[str, str] = {"demo": "demo_textured"}
#: timm CNNs with ImageNet-1k heads (pretrained weights from the hub) to set beside an
#: ImageNet-1k ViT: ResNet-50, the CNN of Naseer et al. 2021, first; then smaller and newer ones.
IMAGENET_1K_CNNS = ("resnet50.a1_in1k", "resnet18.a1_in1k", "convnext_tiny.fb_in1k", "efficientnet_b0.ra_in1k")


@dataclass(eq=False)
class LoadedCNN(LoadedModel):
    """A CNN classifier, fed like :class:`~analysis.LoadedViT` (the same :class:`LoadedModel`
    fields). Its ``spec`` has no tokens and no layers: only a patch grid (``patch_size``
    pixels per cell) on which pixel drops and shuffles are placed.

    Attributes
    ----------
    model : torch.nn.Module
        The timm CNN, eval mode, gradients off, on ``device``.
    name : str
        The source it was loaded from.
    device : torch.device
        Where the model lives.
    spec : ViTSpec
        Its drop grid: ``patch_size`` ``(cell, cell)``, ``grid_size`` ``(gh, gw)``, ``img_size``
        ``(gh·cell, gw·cell)``; no prefix tokens, layers or heads (``num_layers = 0``).
    class_names : list of str or None
        One name per output class, or ``None``.
    preprocessing : Preprocessing
        Resize / crop / normalise at ``spec.img_size``.
    data_config : dict
        timm's data config it was built from.
    """


def load_cnn(source: str = "demo", *, pretrained: bool = True, patch_size: int | None = None, device=None) -> LoadedCNN:
    """Load a CNN classifier to compare with a ViT under the robustness probes.

    Parameters
    ----------
    source : str, default "demo"
        ``"demo"`` (``assets/demo_cnn``, its drop grid the demo ViT's 6 px patches) or
        ``"demo_textured"`` (``assets/demo_cnn_textured``, the same grid; :data:`DEMO_CNNS`), a timm
        CNN name (weights from the local cache or the hub), or a folder in timm's hub layout
        (``config.json`` and ``model.safetensors``; a ``local-dir:`` prefix is allowed).
    pretrained : bool, default True
        For a timm name: ``False`` builds it with (seeded) random weights instead.
    patch_size : int or None, default None
        The drop grid's cell in pixels; ``None``, 6 px for the demo CNNs, else 16 px.
    device : str, torch.device or None, default None
        Where to put the model; ``None``, the first available of cuda, mps and cpu.

    Returns
    -------
    LoadedCNN
        The model in eval mode with gradients off; its ``spec`` grid is the input size divided
        by the cell, rounded down (``img_size`` is whole cells).

    Raises
    ------
    ModelPathNotFoundError
        A path-like ``source`` that names nothing.
    ModelLoadError
        A bundled demo CNN is missing; timm could not build or load the model; ``source`` is a
        transformer (use :func:`load_vit`); an unknown ``device``.
    """
    import timm

    demo = source in DEMO_CNNS
    if not demo and looks_like_path(source):
        existing_model_path(source)  # a path that names nothing: say so (not "unknown model")
    path = DEMO_CNNS[source] if demo else Path(str(source).removeprefix("local-dir:")).expanduser()
    if demo and not (path / "config.json").is_file():
        retrain = "train_demo_cnn" if source == "demo" else "train_textured_variants --model cnn --threads 1"
        raise ModelLoadError(
            f"The bundled demo CNN {source!r} is missing ({path}). Restore it from git or reinstall the package, "
            f"or retrain it with `python -m training.{retrain}` (from a checkout's root)."
        )
    names = None
    try:
        if path.is_dir():  # built here, not by timm's local-dir: (older timm releases unpickle safetensors)
            config = json.loads((path / "config.json").read_text())
            names = config.get("label_names")
            model = _cnn_from_folder(timm, path, config)
        else:
            with seeded_random_weights(enabled=not pretrained):
                model = timm.create_model(source, pretrained=pretrained)
    except Exception as exc:  # noqa: BLE001 - one typed error, whatever timm raised
        raise ModelLoadError(f"Could not load the CNN {source!r}: {exc}") from exc
    if hasattr(model, "blocks") and hasattr(model, "patch_embed"):
        raise ModelLoadError(f"{source!r} is a transformer: load it with load_vit.")
    where = resolve_device(device)
    model = model.eval().to(where).requires_grad_(False)
    data_config = timm.data.resolve_data_config({}, model=model)
    height, width = data_config["input_size"][1:]
    cell = int(patch_size or (6 if demo else 16))
    grid = (height // cell, width // cell)
    spec = ViTSpec(
        patch_size=(cell, cell),
        grid_size=grid,
        num_prefix_tokens=0,
        num_layers=0,
        num_heads=0,
        embed_dim=0,
        img_size=(grid[0] * cell, grid[1] * cell),
        has_class_token=False,
        position_embedding="none",
        head="classifier",
        num_outputs=int(getattr(model, "num_classes")),
        family=type(model).__name__,
    )
    return LoadedCNN(
        model=model,
        name=str(source),
        device=where,
        spec=spec,
        class_names=class_names_for(model, names),
        preprocessing=Preprocessing.from_data_config(data_config, spec.img_size),
        data_config=data_config,
    )


def _cnn_from_folder(timm, folder: Path, config: dict) -> nn.Module:
    """timm's hub layout: config.json (architecture, num_classes, model_args, pretrained_cfg) and
    model.safetensors, loaded strictly."""
    from ..model.loading.checkpoints import read_state_dict

    kwargs = dict(config.get("model_args") or {})
    kwargs.setdefault("num_classes", config.get("num_classes", (config.get("pretrained_cfg") or {}).get("num_classes")))
    model = timm.create_model(
        config["architecture"],
        pretrained=False,
        pretrained_cfg_overlay=dict(config.get("pretrained_cfg") or {}),
        **kwargs,
    )
    model.load_state_dict(read_state_dict(folder / "model.safetensors"), strict=True)
    return model


def cnn_gradcam(cnn: LoadedCNN, pixels: torch.Tensor, target: int | None = None) -> torch.Tensor:
    """Grad-CAM (Selvaraju et al. 2017) on the CNN's last feature map ``F`` ``(B, C, h, w)``
    (timm's ``forward_features``): ``relu(Σ_c α_c F_c)`` with ``α_c = mean_hw ∂y_target/∂F_c``.

    Parameters
    ----------
    cnn : LoadedCNN
        A timm CNN from :func:`load_cnn` (with ``forward_features`` / ``forward_head``).
    pixels : torch.Tensor
        ``(B, 3, H, W)`` preprocessed input.
    target : int or None, default None
        The class index explained for every image; ``None``, each image's prediction.

    Returns
    -------
    torch.Tensor
        ``(B, h, w)`` float32 on the CPU, at the feature map's own resolution (upsample it to
        compare with a ViT's patch map).

    Raises
    ------
    AnalysisError
        The model has no ``forward_features`` / ``forward_head``; its features are not a
        ``(B, C, h, w)`` map; ``target`` is not one of its classes.
    """
    model: Any = cnn.model  # a timm CNN: forward_features / forward_head, read by name
    if not (hasattr(model, "forward_features") and hasattr(model, "forward_head")):
        raise AnalysisError(
            f"{type(model).__name__} has no forward_features / forward_head: Grad-CAM needs a timm CNN."
        )
    with torch.enable_grad():
        features = model.forward_features(pixels.to(cnn.device)).detach().requires_grad_(True)  # (B, C, h, w)
        if features.ndim != 4:
            raise AnalysisError(
                f"Grad-CAM needs a (B, C, h, w) feature map; {type(model).__name__} gives {tuple(features.shape)}."
            )
        logits = model.forward_head(features)  # (B, classes)
        classes = logits.argmax(-1) if target is None else torch.full((len(logits),), int(target), device=logits.device)
        if not bool(((classes >= 0) & (classes < logits.shape[-1])).all()):
            raise AnalysisError(f"target {target} is not one of the {logits.shape[-1]} classes.")
        (gradient,) = torch.autograd.grad(logits.gather(1, classes[:, None]).sum(), features)
    weights = gradient.mean(dim=(2, 3), keepdim=True)  # (B, C, 1, 1)
    return torch.relu((weights * features.detach()).sum(1)).float().cpu()
