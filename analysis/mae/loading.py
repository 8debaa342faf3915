"""Load a masked autoencoder with its decoder: Hugging Face ``ViTMAEForPreTraining``.

``load_mae(source)`` returns a :class:`LoadedMAE`: the transformers model itself (encoder and
decoder, eval mode, on its device; not converted, since reconstruction runs the model's own
forward), the encoder's geometry as a :class:`~analysis.model.geometry.ViTSpec`, its preprocessing and
the config's ``norm_pix_loss``, patch size and image size. Sources: a ``save_pretrained``
folder (or ``"local-dir:PATH"``), ``"hf:org/name"`` (local cache, else the hub), ``"demo_mae"`` (the bundled demo MAE in
``assets/demo_mae``, trained on the demo scenes) or a ``ViTMAEForPreTraining`` a notebook
already holds.

An MAE *encoder* alone (a timm ``.mae`` model, a Hugging Face ``ViTMAEModel``) cannot
reconstruct anything: it is refused with a :class:`~analysis.base.errors.MissingDecoderError` that
says where to get a model with its decoder. Such encoders still load as headless ViTs with
:func:`analysis.load_vit`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from ..base.assets import asset_path
from ..base.devices import resolve_device
from ..base.errors import MissingDecoderError, ModelLoadError, UnsupportedModelError
from ..base.preprocessing import Preprocessing
from ..model.geometry import ViTSpec, as_pair
from ..model.loading.files import existing_model_path, looks_like_path
from ..model.loading.hf_transformers import hf_snapshot, preprocessing_config, read_preprocessor
from ..model.loading.loaded import LoadedModel, place_model

__all__ = ["LoadedMAE", "load_mae", "wrap_mae", "MAE_WITH_DECODER", "DEMO_MAE_DIR"]

#: The bundled demo MAE (``load_mae("demo_mae")``) and the command that trains it again.
DEMO_MAE_DIR = asset_path("demo_mae")
_DEMO_MAE_RETRAIN = "python -m training.train_demo_mae --threads 1"

#: A public MAE that ships its decoder (ViT-B/16, ImageNet-1k, norm_pix_loss).
MAE_WITH_DECODER = "hf:facebook/vit-mae-base"
_DECODER_ARCHITECTURE = "ViTMAEForPreTraining"


def _no_decoder(what: str) -> MissingDecoderError:
    return MissingDecoderError(
        f"{what} is a masked-autoencoder encoder without its decoder, so it cannot reconstruct hidden patches. "
        f"A reconstruction needs a Hugging Face {_DECODER_ARCHITECTURE} (encoder and decoder), e.g. "
        f"load_mae({MAE_WITH_DECODER!r}) (downloaded once, with internet; also the -large and -huge variants). "
        "The encoder alone still opens as a headless ViT with load_vit(...), for its attention."
    )


@dataclass(eq=False)
class LoadedMAE(LoadedModel):
    """A masked autoencoder with everything needed to feed it (the fields of
    :class:`~analysis.model.loading.loaded.LoadedModel`, and:)

    Attributes
    ----------
    model : torch.nn.Module
        The transformers ``ViTMAEForPreTraining``, eval mode, frozen, on ``device``.
    name : str
        The source it was loaded from.
    device : torch.device
        Where the model lives.
    spec : ViTSpec
        The encoder's geometry at ``preprocessing``'s input size with every patch visible: one
        class token, ``grid_size`` patches, ``head="none"``.
    class_names : list of str or None
        ``None``: an MAE has no classes.
    preprocessing : Preprocessing
        Resize / crop / normalise at ``spec.img_size``.
    data_config : dict
        timm-style data config read from the preprocessor (``input_size`` is ``(3, H, W)`` of
        ``spec.img_size``).
    native_img_size : tuple of int, default (224, 224)
        The ``(H, W)`` the model was built for (``config.image_size``); other whole-patch sizes
        run with the model's own position interpolation.
    norm_pix_loss : bool, default False
        The config's flag: the decoder predicts each patch normalised by its own mean and variance
        (MAE's ``norm_pix_loss``), and the loss compares with that target.
    config_mask_ratio : float, default 0.75
        The ratio the model was trained with (``config.mask_ratio``).
    """

    native_img_size: tuple[int, int] = (224, 224)
    norm_pix_loss: bool = False
    config_mask_ratio: float = 0.75

    def __repr__(self) -> str:
        s = self.spec
        return (
            f"LoadedMAE({self.name!r}, device={self.device.type}, img_size={s.img_size}, patch={s.patch_size}, "
            f"grid={s.grid_size}, layers={s.num_layers}, heads={s.num_heads}, norm_pix_loss={self.norm_pix_loss})"
        )


def _is_pretraining_model(module: nn.Module) -> bool:
    return type(module).__name__ == _DECODER_ARCHITECTURE and hasattr(module, "decoder") and hasattr(module, "vit")


def _is_mae_encoder(module: nn.Module) -> bool:
    """An MAE encoder alone: transformers' ``ViTMAEModel``, or a timm model with an ``mae`` pretrained tag."""
    tag = (getattr(module, "pretrained_cfg", None) or {}).get("tag") or ""
    return type(module).__name__ == "ViTMAEModel" or "mae" in str(tag)


def wrap_mae(
    model: nn.Module, name: str, device: torch.device | None, *, preprocessor: dict | None = None, img_size=None
) -> LoadedMAE:
    """Check that ``model`` is a ``ViTMAEForPreTraining``, then wrap it: eval mode, frozen, on ``device``.

    Parameters
    ----------
    model : torch.nn.Module
        A transformers ``ViTMAEForPreTraining``.
    name : str
        The name it is known by (:attr:`LoadedMAE.name`).
    device : torch.device or None
        Where to move it; ``None``, where its parameters are.
    preprocessor : dict or None, default None
        A ``preprocessor_config.json``'s contents; ``None``, the image processor's defaults for ``vit_mae``.
    img_size : int, tuple of int or None, default None
        The input size to preprocess to; ``None``, the preprocessor's, else the config's ``image_size``.

    Returns
    -------
    LoadedMAE
        The wrapped model.

    Raises
    ------
    MissingDecoderError
        An MAE encoder without its decoder (timm ``.mae``, ``ViTMAEModel``).
    UnsupportedModelError
        Any other model that is not a ``ViTMAEForPreTraining``.
    ModelLoadError
        An input size that is not a whole number of patches.
    """
    if not _is_pretraining_model(model):
        kind = type(model).__name__
        if _is_mae_encoder(model):
            raise _no_decoder(f"{name!r} ({kind})")
        raise UnsupportedModelError(
            f"{name!r} is a {kind}, not a masked autoencoder with a decoder: load_mae needs a Hugging Face "
            f"{_DECODER_ARCHITECTURE}, e.g. {MAE_WITH_DECODER!r}."
        )
    config: Any = model.config  # transformers' ViTMAEConfig
    patch = as_pair(config.patch_size)
    native = as_pair(config.image_size)
    data_config, target = preprocessing_config("vit_mae", preprocessor)
    if img_size is not None:
        target = as_pair(img_size)
    size = target or native
    if size[0] % patch[0] or size[1] % patch[1]:
        raise ModelLoadError(f"img_size={size} is not a whole number of {patch[0]}x{patch[1]}-pixel patches.")
    model, device = place_model(model, device)
    model.eval()
    model.requires_grad_(False)
    grid = (size[0] // patch[0], size[1] // patch[1])
    spec = ViTSpec(
        patch_size=patch,
        grid_size=grid,
        num_prefix_tokens=1,
        num_layers=int(config.num_hidden_layers),
        num_heads=int(config.num_attention_heads),
        embed_dim=int(config.hidden_size),
        img_size=size,
        has_class_token=True,
        position_embedding="learned",  # a table (MAE: fixed sine-cosine), added to each patch
        head="none",
        num_outputs=0,
        dynamic_img_size=True,
        family=type(model).__name__,
        prefix_names=("class",),
    )
    data_config = dict(data_config, input_size=(3, *size))
    return LoadedMAE(
        model=model,
        name=name,
        device=device,
        spec=spec,
        class_names=None,
        preprocessing=Preprocessing.from_data_config(data_config, size),
        data_config=data_config,
        native_img_size=native,
        norm_pix_loss=bool(getattr(config, "norm_pix_loss", False)),
        config_mask_ratio=float(getattr(config, "mask_ratio", 0.75)),
    )


def _load_folder(folder: Path, name: str, device: torch.device, img_size) -> LoadedMAE:
    from ..model.loading.files import read_folder_config
    from ..model.loading.hf_parts import from_folder, require_transformers

    config = read_folder_config(folder)
    if "model_type" not in config:  # timm's hub layout: an encoder
        architecture = str(config.get("architecture", ""))
        if "mae" in architecture or "mae" in str(config.get("pretrained_cfg", {}).get("tag", "")):
            raise _no_decoder(f"{name!r} (timm {architecture})")
        raise UnsupportedModelError(
            f"{folder} holds a timm {architecture or 'model'}, not a masked autoencoder: "
            f"load_mae needs a Hugging Face {_DECODER_ARCHITECTURE} folder."
        )
    if config.get("model_type") != "vit_mae":
        raise UnsupportedModelError(
            f"{folder} holds a transformers {config.get('model_type')!r} model, not a masked "
            f"autoencoder: load_mae needs a {_DECODER_ARCHITECTURE}, e.g. {MAE_WITH_DECODER!r}."
        )
    architectures = config.get("architectures") or [_DECODER_ARCHITECTURE]
    if _DECODER_ARCHITECTURE not in architectures:
        raise _no_decoder(f"{name!r} ({', '.join(architectures)})")
    transformers = require_transformers()
    try:
        model = from_folder(transformers.ViTMAEForPreTraining, folder)
    except Exception as exc:  # noqa: BLE001 - corrupt or mismatched folders
        raise ModelLoadError(f"transformers could not load {folder}: {type(exc).__name__}: {str(exc)[:400]}") from exc
    return wrap_mae(model, name, device, preprocessor=read_preprocessor(folder), img_size=img_size)


def load_mae(
    source: str | os.PathLike | nn.Module,
    *,
    device: str | torch.device | None = None,
    img_size: int | tuple[int, int] | None = None,
) -> LoadedMAE:
    """Load a masked autoencoder with its decoder.

    Parameters
    ----------
    source : str, os.PathLike or torch.nn.Module
        A ``ViTMAEForPreTraining`` object; a ``save_pretrained`` folder or ``"local-dir:PATH"``;
        ``"hf:org/name"`` (e.g. ``"hf:facebook/vit-mae-base"``); or ``"demo_mae"``, the bundled demo MAE.
    device : str, torch.device or None, default None
        ``None`` picks cuda, then mps, then cpu (a module object stays where it is).
    img_size : int, tuple of int or None, default None
        The input size to preprocess to (default: the preprocessor's, else the config's
        ``image_size``); other sizes than the model's own run with its own position interpolation
        (``interpolate_pos_encoding``).

    Returns
    -------
    LoadedMAE
        The model, eval mode, frozen, with its spec and preprocessing.

    Raises
    ------
    MissingDecoderError
        An MAE encoder without decoder (timm ``.mae``, ``ViTMAEModel``).
    ModelLoadError
        And its subclasses otherwise (a missing folder or demo, a model that is not an MAE, an
        input size that is not a whole number of patches), with what to do.
    """
    if isinstance(source, nn.Module):
        return wrap_mae(
            source, type(source).__name__, None if device is None else resolve_device(device), img_size=img_size
        )
    if not isinstance(source, (str, os.PathLike)) or not os.fspath(source).strip():
        raise ModelLoadError(
            f"load_mae takes 'demo_mae', a folder, 'hf:org/name' (e.g. {MAE_WITH_DECODER!r}) or a "
            f"{_DECODER_ARCHITECTURE} object; got {source!r}."
        )
    text = os.fspath(source)
    target = resolve_device(device)
    if text == "demo_mae":
        if not (DEMO_MAE_DIR / "config.json").is_file():
            raise ModelLoadError(
                f"The bundled demo MAE is missing ({DEMO_MAE_DIR}). Restore it from git (`git checkout -- "
                f"assets/demo_mae`) or reinstall the package, or retrain it with `{_DEMO_MAE_RETRAIN}` (from a "
                "checkout's root)."
            )
        return _load_folder(DEMO_MAE_DIR, text, target, img_size)
    if text.startswith("hf:"):
        return _load_folder(hf_snapshot(text.removeprefix("hf:")), text, target, img_size)
    if looks_like_path(text):  # a path that names nothing: say so, not 'cannot open'
        existing_model_path(text)
    if text.startswith("local-dir:") or Path(text).expanduser().is_dir():
        return _load_folder(Path(text.removeprefix("local-dir:")).expanduser(), text, target, img_size)
    if "mae" in text.lower():  # a timm name such as vit_base_patch16_224.mae
        raise _no_decoder(repr(text))
    raise ModelLoadError(
        f"load_mae cannot open {text!r}: pass 'demo_mae', a {_DECODER_ARCHITECTURE} save_pretrained "
        f"folder or 'hf:org/name' (e.g. {MAE_WITH_DECODER!r})."
    )
