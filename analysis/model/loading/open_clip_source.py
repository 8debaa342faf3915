"""open_clip models (``"open_clip:<arch>"``): the image tower as a timm ViT, the text tower as is.

open_clip is an optional extra: without it, loading raises a ModelLoadError that says
``pip install open_clip_torch``. The model comes from open_clip's documented API::

    model, _, preprocess = open_clip.create_model_and_transforms(arch, pretrained=tag_or_file)
    tokenizer = open_clip.get_tokenizer(arch)
    model.encode_text(tokenizer(prompts))       # (P, E)

Its own ``VisionTransformer`` (``conv1``, ``class_embedding``, ``positional_embedding``,
``ln_pre``, ``transformer.resblocks`` of ``ln_1`` / ``nn.MultiheadAttention`` / ``ls_1`` /
``ln_2`` / ``mlp`` / ``ls_2``, ``ln_post``, ``proj``) is assembled into the equivalent timm
``VisionTransformer`` from its own modules and parameters (nothing copied; see :mod:`.assemble`),
as the torchvision ViT is. Image towers built on a timm trunk (open_clip's ``TimmModel``: the
SigLIP ports, ConvNeXt...) and attention-pooled towers (CoCa) are refused with the reason.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from ...base.errors import ModelLoadError, UnsupportedModelError, WeightsUnavailableError
from .assemble import finish, shared_linear, skeleton
from .loaded import wrap_model
from .loaded_clip import LoadedCLIP

__all__ = ["load_open_clip", "wrap_open_clip", "OPEN_CLIP_INSTALL"]

# Third-party models and their layers are annotated ``Any`` where their submodules are read by name: torch's
# ``nn.Module.__getattr__`` types every such attribute as ``Tensor | Module``, whatever the library put there.

OPEN_CLIP_INSTALL = "pip install open_clip_torch"
_OPENAI = ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))


def _open_clip():
    try:
        import open_clip
    except ImportError as exc:
        raise ModelLoadError(
            f"'open_clip:' models need the open_clip package, which is not installed: {OPEN_CLIP_INSTALL}"
        ) from exc
    return open_clip


def load_open_clip(arch: str, device: torch.device, *, checkpoint: str | None = None):
    """An open_clip model through its documented API (module docstring), as a
    :class:`~.loaded_clip.LoadedCLIP` (:func:`wrap_open_clip`).

    Parameters
    ----------
    arch : str
        An open_clip model name (``"ViT-B-32"``) or ``"hf-hub:org/name"``.
    device : torch.device
        Where to put the model.
    checkpoint : str or None, default None
        A pretrained tag or a local checkpoint file; ``None``: random weights, or the hub model's own.

    Returns
    -------
    LoadedCLIP
        Named ``"open_clip:<arch>"``, with open_clip's tokenizer.

    Raises
    ------
    ModelLoadError
        open_clip is not installed (``pip install open_clip_torch``), ``arch`` is empty, or open_clip
        cannot build the model.
    WeightsUnavailableError
        The weights cannot be downloaded (offline).
    UnsupportedModelError
        An image tower that is not open_clip's own ViT (see :func:`wrap_open_clip`).
    """
    open_clip = _open_clip()
    if not arch.strip():
        raise ModelLoadError("'open_clip:' needs an architecture, e.g. 'open_clip:ViT-B-32'.")
    try:
        model, _, _ = open_clip.create_model_and_transforms(arch, pretrained=checkpoint)
        tokenizer = open_clip.get_tokenizer(arch)
    except Exception as exc:  # noqa: BLE001 - unknown names, missing weights, offline hub
        from .hub import is_offline_error

        error = WeightsUnavailableError if is_offline_error(exc) else ModelLoadError
        raise error(
            f"open_clip could not build {arch!r} (pretrained={checkpoint!r}): {type(exc).__name__}: {exc}"
        ) from exc
    return wrap_open_clip(model, f"open_clip:{arch}", device, tokenizer=tokenizer)


class _OpenCLIPTextTower(nn.Module):
    """``(ids, mask) -> model.encode_text(ids)`` (open_clip's text towers take no mask)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model: Any = model  # an open_clip CLIP (encode_text)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return self.model.encode_text(ids)


def _visual_to_timm(visual: Any) -> nn.Module:
    """open_clip's ``VisionTransformer`` as a timm ``VisionTransformer`` sharing its modules."""
    if hasattr(visual, "trunk"):
        raise UnsupportedModelError(
            "This open_clip model's image tower is a timm trunk (open_clip's TimmModel), not open_clip's own "
            "VisionTransformer: load the trunk with load_vit(model.visual.trunk) for the image analyses."
        )
    needed = ("conv1", "class_embedding", "positional_embedding", "ln_pre", "transformer", "ln_post")
    missing = [name for name in needed if getattr(visual, name, None) is None]
    if missing:
        raise UnsupportedModelError(
            f"open_clip's {type(visual).__name__} has no {', '.join(missing)}: not a ViT image tower."
        )
    if getattr(visual, "attn_pool", None) is not None:
        raise UnsupportedModelError("This open_clip image tower pools with attention (CoCa): not supported yet.")
    pool = getattr(visual, "pool_type", "tok")
    if pool not in ("tok", "avg") or (pool == "avg" and getattr(visual, "final_ln_after_pool", False)):
        raise UnsupportedModelError(f"open_clip pooling {pool!r} (final_ln_after_pool) is not supported yet.")
    blocks = list(visual.transformer.resblocks)
    first = blocks[0].attn
    hidden = int(visual.class_embedding.shape[-1])
    image_size = (
        tuple(int(v) for v in visual.image_size) if not isinstance(visual.image_size, int) else (visual.image_size,) * 2
    )
    patch = tuple(int(v) for v in visual.conv1.kernel_size)
    projection = getattr(visual, "proj", None)
    model = skeleton(
        img_size=image_size,
        patch_size=patch,
        embed_dim=hidden,
        depth=len(blocks),
        num_heads=int(first.num_heads),
        mlp_ratio=float(blocks[0].mlp.c_fc.out_features) / hidden,
        qkv_bias=first.in_proj_bias is not None,
        num_classes=0 if projection is None else int(projection.shape[1]),
        pre_norm=True,
        global_pool="token" if pool == "tok" else "avg",
        fc_norm=False,  # ln_post runs on every token, then the pool
    )
    model.patch_embed.proj = visual.conv1
    model.cls_token = nn.Parameter(visual.class_embedding.data.view(1, 1, -1))  # a view: shared storage
    model.pos_embed = nn.Parameter(visual.positional_embedding.data.unsqueeze(0))
    model.norm_pre = visual.ln_pre
    for block, layer in zip(model.blocks, blocks, strict=True):
        attention = layer.attn
        if not isinstance(attention, nn.MultiheadAttention) or not attention._qkv_same_embed_dim:
            raise UnsupportedModelError(
                "This open_clip block's attention is not one nn.MultiheadAttention with a fused in-projection."
            )
        block.norm1 = layer.ln_1
        block.attn.qkv = shared_linear(attention.in_proj_weight, attention.in_proj_bias)
        block.attn.proj = attention.out_proj
        block.ls1 = getattr(layer, "ls_1", None) or nn.Identity()
        block.norm2 = layer.ln_2
        block.mlp = layer.mlp  # c_fc, gelu, c_proj: open_clip's own module
        block.ls2 = getattr(layer, "ls_2", None) or nn.Identity()
    model.norm = visual.ln_post
    if projection is not None:  # x @ proj, proj (D, E)
        model.head = shared_linear(nn.Parameter(projection.data.T), None)  # a transposed view: shared storage
    else:
        model.head = nn.Identity()
    return finish(model, "open_clip")


def _data_config(visual: Any) -> dict:
    config = getattr(visual, "preprocess_cfg", None) or {}
    mean, std = config.get("mean", _OPENAI[0]), config.get("std", _OPENAI[1])
    return dict(
        mean=tuple(mean),
        std=tuple(std),
        interpolation=config.get("interpolation", "bicubic"),
        crop_pct=1.0,
        crop_mode="squash" if config.get("resize_mode") == "squash" else "center",
    )


def wrap_open_clip(model: Any, name: str, device: torch.device, *, tokenizer):
    """An open_clip ``CLIP`` / ``CustomTextCLIP`` model as a :class:`~.loaded_clip.LoadedCLIP`.

    The model is put in eval mode and frozen; its image tower becomes the equivalent timm ViT
    (module docstring), its text tower is ``model.encode_text``.

    Parameters
    ----------
    model : Any
        The open_clip model (with ``visual`` and ``encode_text``).
    name : str
        The source it was loaded from.
    device : torch.device
        Where to put both towers.
    tokenizer : Any or None
        open_clip's tokenizer for it; ``None``: text must be given as token ids.

    Returns
    -------
    LoadedCLIP
        With ``source_library="open_clip"``; ``probability`` ``"sigmoid"`` when the model has a
        ``logit_bias`` (SigLIP), else ``"softmax"``.

    Raises
    ------
    NoTextTowerError
        The model has no ``encode_text`` or ``visual``.
    UnsupportedModelError
        Its image tower is a timm trunk, attention-pooled (CoCa), pooled otherwise than by the class
        token or a plain mean, or lacks the parts of open_clip's ``VisionTransformer``.
    """
    if not hasattr(model, "encode_text") or not hasattr(model, "visual"):
        from ...base.errors import NoTextTowerError

        raise NoTextTowerError(f"{name} ({type(model).__name__}) has no text tower (encode_text).")
    model.eval().requires_grad_(False)
    image = wrap_model(
        _visual_to_timm(model.visual),
        name,
        device,
        embedding_output=True,
        data_config=_data_config(model.visual),
        source_library="open_clip",
    )
    bias = getattr(model, "logit_bias", None)
    context = int(getattr(model, "context_length", 0) or getattr(tokenizer, "context_length", 77))

    def count_tokens(prompt: str) -> int:  # start and end tokens included
        inner = getattr(tokenizer, "tokenizer", None)
        if inner is not None:  # open_clip's HFTokenizer wraps a transformers tokenizer
            return len(inner(prompt)["input_ids"])
        return len(tokenizer.encode(prompt)) + 2

    return LoadedCLIP(
        image=image,
        text_tower=_OpenCLIPTextTower(model).to(device).eval(),
        logit_scale=float(model.logit_scale.detach().exp()),
        logit_bias=None if bias is None else float(bias.detach().reshape(-1)[0]),
        probability="softmax" if bias is None else "sigmoid",
        context_length=context,
        tokenizer=tokenizer,
        name=name,
        source_library="open_clip",
        vocab_size=getattr(model, "vocab_size", None),
        tokenizer_note="" if tokenizer is not None else "this model object came without its tokenizer",
        _count_tokens=count_tokens if tokenizer is not None else None,
    )
