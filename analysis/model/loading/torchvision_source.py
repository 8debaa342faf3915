"""torchvision ``VisionTransformer`` (``vit_b_16``, ``vit_b_32``, ``vit_l_16``, ``vit_l_32``, ``vit_h_14``).

Converted at the boundary into the equivalent timm ``VisionTransformer`` that *shares*
torchvision's modules and parameters (see :mod:`.assemble`): ``conv_proj`` is the patch
projection, ``class_token`` and ``encoder.pos_embedding`` the tokens, each
``nn.MultiheadAttention``'s ``in_proj_weight``/``in_proj_bias`` (already one fused
``(3D, D)`` matrix) the ``qkv`` projection and ``out_proj`` the output projection; the
LayerNorms, MLPs and head are torchvision's own modules.

torchvision's Swins (``swin_t/s/b``, ``swin_v2_t/s/b``) are converted the same way, into timm's
Swin, by :mod:`.torchvision_swin`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from ...base.errors import CheckpointError, ModelLoadError, UnsupportedModelError, WeightsUnavailableError
from .assemble import finish, shared_linear, skeleton
from .checkpoints import load_state_dict_into, read_state_dict
from .loaded import LoadedViT, wrap_model
from .torchvision_swin import TORCHVISION_SWINS, is_torchvision_swin, to_timm_swin

__all__ = ["TORCHVISION_VITS", "is_torchvision_vit", "wrap_torchvision", "load_torchvision", "load_torchvision_file"]

# Third-party models and their layers are annotated ``Any`` where their submodules are read by name: torch's
# ``nn.Module.__getattr__`` types every such attribute as ``Tensor | Module``, whatever the library put there.

TORCHVISION_VITS = ("vit_b_16", "vit_b_32", "vit_l_16", "vit_l_32", "vit_h_14")
# torchvision's IMAGENET1K_V1 eval transform: resize 256 (bilinear), centre crop 224.
_SUPPORTED = TORCHVISION_VITS + TORCHVISION_SWINS
_DEFAULT_DATA_CONFIG = dict(
    mean=(0.485, 0.456, 0.406),
    std=(0.229, 0.224, 0.225),
    interpolation="bilinear",
    crop_pct=224 / 256,
    crop_mode="center",
)


def _torchvision():
    try:
        import torchvision
    except ImportError as exc:  # pragma: no cover - torchvision is a requirement
        raise ModelLoadError("torchvision is not installed: pip install torchvision") from exc
    return torchvision


def is_torchvision_vit(module: nn.Module) -> bool:
    """Whether ``module`` is torchvision's ``VisionTransformer`` (``vit_b_16``, ...).

    Parameters
    ----------
    module : torch.nn.Module
        A model object.

    Returns
    -------
    bool
        True for a ``torchvision.models`` ``VisionTransformer``.
    """
    return type(module).__module__.startswith("torchvision.models") and type(module).__name__ == "VisionTransformer"


def _is_torchvision_model(module: nn.Module) -> bool:
    return type(module).__module__.startswith("torchvision.models")


def to_timm(tv: Any) -> nn.Module:
    """The timm ``VisionTransformer`` made of ``tv``'s own modules (shared, not copied)."""
    blocks = list(tv.encoder.layers)
    first = blocks[0]
    hidden = int(tv.hidden_dim)
    patch = int(tv.patch_size)
    model = skeleton(
        img_size=int(tv.image_size),
        patch_size=patch,
        embed_dim=hidden,
        depth=len(blocks),
        num_heads=int(first.num_heads),
        mlp_ratio=float(tv.mlp_dim) / hidden,
        qkv_bias=first.self_attention.in_proj_bias is not None,
        num_classes=int(tv.num_classes),
        global_pool="token",
    )
    model.patch_embed.proj = tv.conv_proj  # (B, 3, H, W) -> (B, D, gh, gw), a conv stem too
    model.cls_token = tv.class_token
    model.pos_embed = tv.encoder.pos_embedding  # (1, 1 + N, D): class position first, as in timm
    model.pos_drop = tv.encoder.dropout
    for block, layer in zip(model.blocks, blocks, strict=True):
        attention = layer.self_attention
        if not attention.batch_first or not attention._qkv_same_embed_dim:
            raise UnsupportedModelError("This torchvision ViT's attention does not use one fused in-projection.")
        block.norm1 = layer.ln_1
        block.attn.qkv = shared_linear(attention.in_proj_weight, attention.in_proj_bias)
        block.attn.proj = attention.out_proj
        block.attn.attn_drop = nn.Dropout(attention.dropout)
        block.attn.proj_drop = layer.dropout
        block.norm2 = layer.ln_2
        block.mlp = layer.mlp  # Linear, GELU, Dropout, Linear, Dropout: torchvision's own module
    model.norm = tv.encoder.ln
    model.head = tv.heads  # head (or pre_logits, tanh, head): torchvision's own module
    return finish(model, "torchvision")


def wrap_torchvision(
    tv: nn.Module,
    name: str,
    device: torch.device | None,
    *,
    data_config: dict | None = None,
    label_names: list[str] | None = None,
    freeze: bool = True,
    img_size=None,
) -> LoadedViT:
    """Wrap a torchvision ViT or Swin as the timm model made of its own modules (shared, not copied).

    Parameters
    ----------
    tv : torch.nn.Module
        A torchvision ``VisionTransformer`` or ``SwinTransformer``; put in eval mode.
    name : str
        The source it was loaded from.
    device : torch.device or None
        Where to put it; ``None`` leaves it where its parameters are.
    data_config : dict or None, default None
        timm-style data config; ``None``: torchvision's ImageNet eval transform (resize 256
        bilinear, centre crop 224, ImageNet mean and std).
    label_names : list of str or None, default None
        Class names (the weights' ``categories``).
    freeze : bool, default True
        Turn off ``requires_grad``; ``False`` leaves it untouched.
    img_size : int, tuple of int or None, default None
        The input size of a Swin (torchvision's Swins take any; the converted model has one;
        ``None``: :func:`~.torchvision_swin.default_img_size`). A ViT has its own: refused for it.

    Returns
    -------
    LoadedViT
        With ``source_library="torchvision"``.

    Raises
    ------
    UnsupportedModelError
        Not a torchvision ViT or Swin (a convolutional network), or a layout that cannot be converted
        (see :func:`~.torchvision_swin.to_timm_swin`).
    ModelLoadError
        ``img_size`` given for a ViT, or a model that cannot move to ``device``.
    """
    if not (is_torchvision_vit(tv) or is_torchvision_swin(tv)):
        raise UnsupportedModelError(
            f"{name}: torchvision's {type(tv).__name__} is a convolutional network, not a Vision "
            f"Transformer: it has no attention. torchvision transformers: {', '.join(_SUPPORTED)}."
        )
    tv.eval()
    if is_torchvision_swin(tv):
        model = to_timm_swin(tv, img_size)
    elif img_size is not None:
        raise ModelLoadError("img_size= is for torchvision Swins; a torchvision ViT has its own image_size.")
    else:
        model = to_timm(tv)
    return wrap_model(
        model,
        name,
        device,
        label_names,
        data_config=dict(data_config or _DEFAULT_DATA_CONFIG),
        source_library="torchvision",
        freeze=freeze,
    )


def _architecture(arch: str) -> str:
    name = arch.removeprefix("torchvision:")
    if name not in _SUPPORTED:
        torchvision = _torchvision()
        known = set(torchvision.models.list_models(module=torchvision.models))
        if name in known:
            raise UnsupportedModelError(
                f"torchvision's {name!r} is not a Vision Transformer (a convolutional network: no attention). "
                f"torchvision transformers: {', '.join(_SUPPORTED)}."
            )
        raise ModelLoadError(f"Unknown torchvision model {name!r}. torchvision transformers: {', '.join(_SUPPORTED)}.")
    return name


def _weights_data_config(weights) -> dict:
    transform = weights.transforms()
    crop = int(transform.crop_size[0])
    resize = int(transform.resize_size[0])
    interpolation = str(getattr(transform.interpolation, "value", transform.interpolation))
    return dict(
        _DEFAULT_DATA_CONFIG,
        crop_pct=crop / resize,
        interpolation=interpolation,
        mean=tuple(transform.mean),
        std=tuple(transform.std),
    )


def load_torchvision(source: str, device: torch.device, *, pretrained: bool = True, **kwargs) -> LoadedViT:
    """``"torchvision:vit_b_16"``: torchvision's default weights (from the torch hub cache,
    else downloaded), or random weights with ``pretrained=False``.

    The preprocessing is the weights' own eval transform; a Swin is converted at the weights'
    crop size unless ``img_size`` is given.

    Parameters
    ----------
    source : str
        ``"torchvision:<name>"`` (or the bare name) of a ViT (:data:`TORCHVISION_VITS`) or Swin.
    device : torch.device
        Where to put the model.
    pretrained : bool, default True
        Load the default weights; ``False``, random ones.
    **kwargs : Any
        ``img_size=`` for a Swin; nothing else is accepted.

    Returns
    -------
    LoadedViT
        With ``source_library="torchvision"``.

    Raises
    ------
    ModelLoadError
        An unknown torchvision model, or options it does not take.
    UnsupportedModelError
        A torchvision model that is not a transformer.
    WeightsUnavailableError
        The weights are not in the torch hub cache and cannot be downloaded.
    """
    torchvision = _torchvision()
    name = _architecture(source)
    img_size = kwargs.pop("img_size", None) if name in TORCHVISION_SWINS else None
    if kwargs:
        allowed = " (Swins take img_size=)" if name in TORCHVISION_SWINS else ""
        raise ModelLoadError(f"torchvision models take no options here{allowed} (got {', '.join(sorted(kwargs))}).")
    if not pretrained:
        return wrap_torchvision(torchvision.models.get_model(name, weights=None), source, device, img_size=img_size)
    weights = torchvision.models.get_model_weights(name).DEFAULT
    cached = Path(torch.hub.get_dir()) / "checkpoints" / Path(weights.url).name
    from .hub import can_reach, hub_offline_env

    if not cached.is_file() and (hub_offline_env() or not can_reach("download.pytorch.org", 443)):
        raise WeightsUnavailableError(
            f"torchvision weights for {name} are not in the torch hub cache ({cached}) and cannot be downloaded "
            "offline. Use pretrained=False (random weights), or a weights file with arch='torchvision:" + name + "'."
        )
    try:
        tv = torchvision.models.get_model(name, weights=weights)
    except Exception as exc:  # noqa: BLE001
        raise WeightsUnavailableError(f"Could not get torchvision weights for {name}: {exc}") from exc
    data_config = _weights_data_config(weights)
    if img_size is None and name in TORCHVISION_SWINS:
        img_size = int(weights.transforms().crop_size[0])  # the size the weights were evaluated at
    return wrap_torchvision(
        tv, source, device, data_config=data_config, label_names=list(weights.meta["categories"]), img_size=img_size
    )


def load_torchvision_file(path: Path, arch: str, device: torch.device, **kwargs) -> LoadedViT:
    """A torchvision ViT or Swin state dict (``.pth``/``.safetensors``) with ``arch="torchvision:vit_b_16"``.

    ``num_classes`` is read from the head's weight and a ViT's ``image_size`` from its square
    position table, unless given.

    Parameters
    ----------
    path : pathlib.Path
        The weights file.
    arch : str
        ``"torchvision:<name>"`` (or the bare name) of a ViT or Swin.
    device : torch.device
        Where to put the model.
    **kwargs : Any
        ``torchvision.models.get_model`` arguments (``num_classes``, ``image_size``, ...); a Swin
        also takes ``img_size=``.

    Returns
    -------
    LoadedViT
        Named ``str(path)``, with ``source_library="torchvision"``.

    Raises
    ------
    CheckpointError
        The file is missing, unreadable, or does not fit the model.
    ModelLoadError
        An unknown torchvision model, or torchvision cannot build it with these options.
    UnsupportedModelError
        A torchvision model that is not a transformer.
    """
    torchvision = _torchvision()
    name = _architecture(arch)
    if not path.is_file():
        raise CheckpointError(f"Checkpoint file not found: {path}.")
    state_dict = read_state_dict(path)
    options = dict(kwargs)
    img_size = options.pop("img_size", None) if name in TORCHVISION_SWINS else None
    head = state_dict.get("head.weight" if name in TORCHVISION_SWINS else "heads.head.weight")
    if isinstance(head, torch.Tensor) and "num_classes" not in options:
        options["num_classes"] = int(head.shape[0])
    if "encoder.pos_embedding" in state_dict and "image_size" not in options:
        tokens = int(state_dict["encoder.pos_embedding"].shape[1]) - 1
        side = int(round(tokens**0.5))
        patch = int(name.rsplit("_", 1)[1])
        if side * side == tokens:
            options["image_size"] = side * patch
    try:
        tv = torchvision.models.get_model(name, weights=None, **options)
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"torchvision could not build {name} with {options}: {exc}") from exc
    load_state_dict_into(tv, state_dict, path)
    return wrap_torchvision(tv, str(path), device, img_size=img_size)
