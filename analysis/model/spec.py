"""Reading a :class:`~analysis.model.geometry.ViTSpec` off a model (never assumed), through its attention adapters.

:func:`spec_from_model` asks each block's adapter (:mod:`analysis.model.adapters`) for its heads and,
for a windowed model, its :class:`~analysis.model.geometry.LayerGeometry`; the types themselves live one layer down, in
:mod:`analysis.model.geometry` (below the adapters, which build a windowed layer's geometry):
``from analysis.model.geometry import ViTSpec, LayerGeometry``.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..base.errors import UnsupportedModelError
from .adapters import block_sites, model_blocks
from .geometry import ViTSpec, as_pair, patch_embedding_module

__all__ = ["spec_from_model"]


def _position_kind(model: nn.Module) -> str:
    embed = patch_embedding_module(model)
    table = isinstance(getattr(model, "pos_embed", None), torch.Tensor) or isinstance(
        getattr(embed, "pos_embed", None), torch.Tensor
    )
    rope = getattr(model, "rope", None) is not None
    relative = any(getattr(model, name, None) is not None for name in ("rel_pos_bias", "shared_rel_pos")) or any(
        getattr(block.attn, name, None) is not None
        for block in getattr(model, "blocks")
        for name in ("relative_position_bias_table", "rel_pos")
    )
    if rope:
        return "learned+rope" if table else "rope"
    if relative:
        return "learned+relative" if table else "relative"
    return "learned" if table else "none"


def _windowed_position_kind(model: nn.Module) -> str:
    """Windowed models: a relative-position bias inside attention, plus SAM's absolute table if present."""
    return "learned+relative" if isinstance(getattr(model, "pos_embed", None), torch.Tensor) else "relative"


def _class_token(model: nn.Module, embed: nn.Module | None):
    token = getattr(model, "cls_token", None)
    return token if token is not None else getattr(embed, "cls_token", None)


def _head_kind(model: nn.Module, embedding_output: bool) -> tuple[str, int]:
    outputs = int(getattr(model, "num_classes", 0) or 0)
    if outputs == 0:
        return "none", 0
    return ("embedding" if embedding_output else "classifier"), outputs


def spec_from_model(model: nn.Module, *, embedding_output: bool = False, default_img_size=None) -> ViTSpec:
    """Read a :class:`ViTSpec` off a timm ViT-like model (VisionTransformer, Eva, Beit,
    VisionTransformerRelPos, NaFlexVit) or a windowed one (Swin, SAM), through each block's
    attention adapter (heads, and a windowed layer's :class:`~analysis.model.geometry.LayerGeometry`).

    The patch size is the input-pixel stride ``img_size // grid_size`` when the patch embedding
    declares both (hybrid stems' own patch is a feature-map patch).

    Parameters
    ----------
    model : torch.nn.Module
        The model.
    embedding_output : bool, default False
        The model's head projects to an embedding (CLIP/SigLIP/PE towers), not to classes.
    default_img_size : int, tuple of int or None, default None
        The input size of models whose patch embedding has none (NaFlex); ``None``: 224.

    Returns
    -------
    ViTSpec
        The model's geometry at its configured input size.

    Raises
    ------
    UnsupportedModelError
        No patch embedding (``patch_embed`` or ``embeds``); no transformer blocks, or one whose
        attention no adapter knows; windowed and global layers mixed; a windowed model with
        ``dynamic_img_size``.
    """
    embed = patch_embedding_module(model)
    if embed is None:
        raise UnsupportedModelError(f"{type(model).__name__} has no patch embedding (patch_embed or embeds).")
    if getattr(embed, "grid_size", None) is not None and getattr(embed, "img_size", None) is not None:
        grid = as_pair(embed.grid_size)
        img = as_pair(embed.img_size)
        # For hybrid (CNN stem) embeddings patch_size is the stem's feature patch, so derive
        # the effective stride in input pixels from the image and grid sizes instead.
        patch = (img[0] // grid[0], img[1] // grid[1])
    else:
        patch = as_pair(embed.patch_size)
        img = as_pair(default_img_size or 224)
        grid = (img[0] // patch[0], img[1] // patch[1])
    sites = block_sites(model)
    geometry = tuple(site.adapter.layer_geometry(site, grid, patch) for site in sites)
    geometry = geometry if any(g is not None for g in geometry) else ()
    if geometry and not all(geometry):
        raise UnsupportedModelError(f"{type(model).__name__} mixes windowed and global layers: not yet supported.")
    if geometry and getattr(model, "dynamic_img_size", False):
        raise UnsupportedModelError(
            "windowed attention: dynamic_img_size is not yet supported for windowed models (their windows change "
            "with the input size); load it at a fixed img_size."
        )
    head, outputs = _head_kind(model, embedding_output)
    dynamic = bool(getattr(model, "dynamic_img_size", False)) or type(model).__name__ == "NaFlexVit"
    return ViTSpec(
        patch_size=patch,
        grid_size=grid,
        num_prefix_tokens=int(getattr(model, "num_prefix_tokens", 0)),
        num_layers=len(sites),
        num_heads=sites[0].adapter.num_heads(sites[0].module),
        embed_dim=int(getattr(model, "embed_dim", None) or getattr(model, "num_features")),
        img_size=(grid[0] * patch[0], grid[1] * patch[1]),
        has_class_token=_class_token(model, embed) is not None,
        position_embedding=_windowed_position_kind(model) if geometry else _position_kind(model),
        head=head,
        num_outputs=outputs,
        dynamic_img_size=dynamic,
        dynamic_img_pad=bool(getattr(embed, "dynamic_img_pad", False)),
        family=type(model).__name__,
        residual_norm=_residual_norm(model),
        prefix_names=_prefix_names(model, embed),
        layer_geometry=geometry,
    )


def _prefix_names(model: nn.Module, embed: nn.Module | None) -> tuple[str, ...]:
    """Prefix tokens in timm's order: class token, distillation token, registers."""
    names = ["class"] if _class_token(model, embed) is not None else []
    if getattr(model, "dist_token", None) is not None:
        names.append("distillation")
    registers = int(getattr(model, "num_prefix_tokens", 0)) - len(names)
    return tuple(names + [f"register {k}" for k in range(1, registers + 1)])


def _residual_norm(model: nn.Module) -> str:
    """ "post" when the blocks normalise the branch output, ``x + norm(attn(x))`` (timm's ``ResPost*Block``,
    ``EvaBlockPostNorm`` and Swin v2's blocks), else "pre"."""
    post = ("ResPost", "EvaBlockPostNorm", "SwinTransformerV2Block", "SwinTransformerV2CrBlock")
    return "post" if any(type(block).__name__.startswith(post) for _, block in model_blocks(model)) else "pre"
