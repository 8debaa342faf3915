"""Load any supported ViT into one :class:`LoadedViT`, from wherever it lives.

``load_vit(source)`` returns the model in eval mode on its device, its geometry
(:class:`~analysis.model.geometry.ViTSpec`), its own preprocessing and its class names. Sources:

* an ``nn.Module`` a notebook already holds (timm, Hugging Face or torchvision): wrapped
  without copying weights (:mod:`.objects`);
* ``"demo"``: the bundled demo model in ``assets/demo_vit``; ``"demo_swin"``: the bundled demo
  Swin in ``assets/demo_swin`` (same scenes and classes); ``"demo_textured"`` and
  ``"demo_swin_textured"``: the two fine-tuned on textured scenes as well, so they read texture
  (``assets/demo_vit_textured``, ``assets/demo_swin_textured``);
* ``"local-dir:PATH"`` or a folder: timm's hub layout (``config.json`` with ``architecture``),
  or a Hugging Face ``save_pretrained`` folder (``config.json`` with ``model_type``);
* ``"hf:org/name"``: a Hugging Face transformers model, from the local cache or the hub;
* ``"torchvision:vit_b_16"`` (and the other torchvision ViT names);
* a single weights file (``.safetensors``, ``.pth``/``.pt``/``.bin``, Google's ``.npz``) with
  ``arch=`` (a timm name, or ``"torchvision:<name>"``);
* ``"hf-hub:org/name"`` or a timm model name, with or without a pretrained tag.

One module per source; every foreign model is converted once, at this boundary, into the
equivalent timm model, so everything after sees one kind of model. Pickle-based files are
only ever read with ``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from ...base.assets import asset_path
from ...base.devices import resolve_device
from ...base.errors import ModelLoadError
from . import hf_transformers, objects, torchvision_source
from .families import SUPPORTED_FAMILIES, is_embedding_tower
from .files import (
    existing_model_path,
    looks_like_file,
    looks_like_path,
    model_from_file,
    model_from_timm_folder,
    read_folder_config,
)
from .loaded import LoadedViT, class_label, class_probabilities, top_classes, wrap_model
from .loaded_clip import LoadedCLIP, TextEncoding
from .random_weights import RANDOM_WEIGHTS_SEED as RANDOM_WEIGHTS_SEED  # the attribute stays
from .random_weights import seeded_random_weights
from .timm_source import model_from_timm_name
from .two_tower import load_clip

__all__ = [
    "LoadedViT",
    "load_vit",
    "LoadedCLIP",
    "TextEncoding",
    "load_clip",
    "DEMO_MODEL_DIR",
    "DEMO_MODELS",
    "TEXTURED_DEMO_MODELS",
    "SUPPORTED_FAMILIES",
    "class_probabilities",
    "class_label",
    "top_classes",
]

DEMO_MODEL_DIR = asset_path("demo_vit")
# The bundled demo models by name: (folder, the command that trains it again).
DEMO_MODELS: dict[str, tuple[Path, str]] = {
    "demo": (DEMO_MODEL_DIR, "python -m training.train_demo_vit"),
    "demo_swin": (asset_path("demo_swin"), "python -m training.train_demo_swin"),
    "demo_textured": (
        asset_path("demo_vit_textured"),
        "python -m training.train_textured_variants --model vit --threads 1",
    ),
    "demo_swin_textured": (
        asset_path("demo_swin_textured"),
        "python -m training.train_textured_variants --model swin --threads 1",
    ),
}
#: a plain demo model -> its variant fine-tuned on textured scenes too (it reads texture, so a shape bias
#: on cue-conflict scenes means something for it; the plain ones never saw a textured object)
TEXTURED_DEMO_MODELS: dict[str, str] = {"demo": "demo_textured", "demo_swin": "demo_swin_textured"}


def load_vit(
    source: str | os.PathLike | nn.Module,
    *,
    pretrained: bool = True,
    device: str | torch.device | None = None,
    arch: str | None = None,
    **model_kwargs: Any,
) -> LoadedViT:
    """Load a ViT for inspection.

    Parameters
    ----------
    source : str, os.PathLike or torch.nn.Module
        An ``nn.Module``; a bundled demo model (``"demo"``, ``"demo_swin"``, ``"demo_textured"``,
        ``"demo_swin_textured"``: :data:`DEMO_MODELS`); a timm name
        (``"vit_base_patch16_224.augreg2_in21k_ft_in1k"``); ``"hf-hub:org/name"`` (timm weights on
        the hub); ``"hf:org/name"`` (a transformers model); ``"torchvision:vit_b_16"``;
        ``"local-dir:folder"`` or a folder (timm hub layout or transformers ``save_pretrained``); or
        a single weights file (then ``arch`` is required).
    pretrained : bool, default True
        For names only: load pretrained weights (from the local cache, else downloaded). ``False``
        gives random weights, the same on every load (seeded with
        :data:`~analysis.model.loading.random_weights.RANDOM_WEIGHTS_SEED`; the caller's random
        state is left as it was).
    device : str, torch.device or None, default None
        ``None`` picks cuda, then mps, then cpu (a module object stays where it is).
    arch : str or None, default None
        The architecture of a single weights file: a timm name or ``"torchvision:<name>"``.
    **model_kwargs : Any
        For timm sources, passed on to ``timm.create_model`` (``img_size=``, ``num_classes=``,
        ``dynamic_img_size=``...; they win over a folder's saved ``model_args``). For module objects
        and foreign models: ``img_size=``, ``mean=``, ``std=`` override the preprocessing.

    Returns
    -------
    LoadedViT
        The model in eval mode on its device, with its geometry (``spec``), its preprocessing and
        its class names.

    Raises
    ------
    ModelLoadError
        And its subclasses, with a message that says what to do.
    """
    if isinstance(source, nn.Module):
        return objects.wrap_module(source, device=None if device is None else resolve_device(device), **model_kwargs)
    if not isinstance(source, (str, os.PathLike)):
        raise ModelLoadError(
            f"load_vit takes a model name (timm, 'hf:org/name', 'torchvision:vit_b_16'), a folder or file "
            f"path, or an nn.Module; got {type(source).__name__}."
        )
    source_str = os.fspath(source)
    if not source_str.strip():
        raise ModelLoadError("load_vit got an empty name: pass 'demo', a model name, a path or an nn.Module.")
    target = resolve_device(device)
    if source_str.startswith("hf:"):
        with seeded_random_weights(enabled=not pretrained):
            return hf_transformers.load_hf(
                source_str.removeprefix("hf:"), target, pretrained=pretrained, **model_kwargs
            )
    if source_str.startswith("torchvision:"):
        with seeded_random_weights(enabled=not pretrained):
            return torchvision_source.load_torchvision(source_str, target, pretrained=pretrained, **model_kwargs)
    if source_str in DEMO_MODELS:
        folder, retrain = DEMO_MODELS[source_str]
        if not (folder / "config.json").is_file():
            raise ModelLoadError(
                f"The bundled demo model {source_str!r} is missing ({folder}). Restore it from git "
                f"(`git checkout -- assets/{folder.name}`) or reinstall the package, or retrain it with "
                f"`{retrain}` (from a checkout's root)."
            )
        return _from_folder(folder, source_str, target, model_kwargs)
    if looks_like_path(source_str):
        existing_model_path(source_str)  # a path that names nothing: say so (not "unknown model")
    if source_str.startswith("local-dir:") or Path(source_str).is_dir():
        folder = Path(source_str.removeprefix("local-dir:")).expanduser()
        return _from_folder(folder, source_str, target, model_kwargs)
    if looks_like_file(source_str):
        path = Path(source_str).expanduser()
        if arch and arch.startswith("torchvision:"):
            return torchvision_source.load_torchvision_file(path, arch, target, **model_kwargs)
        return wrap_model(model_from_file(path, arch, model_kwargs), source_str, target)
    with seeded_random_weights(enabled=not pretrained):
        model = model_from_timm_name(source_str, pretrained, model_kwargs)
    label_names = getattr(model, "pretrained_cfg", {}).get("label_names")
    embedding = is_embedding_tower(source_str, int(getattr(model, "num_classes", 0) or 0))
    return wrap_model(model, source_str, target, label_names, embedding_output=embedding)


def _from_folder(folder: Path, name: str, device: torch.device, model_kwargs: dict) -> LoadedViT:
    config = read_folder_config(folder)
    if "model_type" in config and "architecture" not in config:
        return hf_transformers.load_hf_folder(folder, config, name, device, **model_kwargs)
    model = model_from_timm_folder(folder, config, model_kwargs)
    architecture = str(config.get("architecture"))
    embedding = is_embedding_tower(architecture, int(getattr(model, "num_classes", 0) or 0))
    return wrap_model(model, name, device, config.get("label_names"), embedding_output=embedding)
