"""torchvision Swin (``swin_t``, ``swin_s``, ``swin_b``) and Swin V2 (``swin_v2_t``, ``swin_v2_s``, ``swin_v2_b``).

Converted at the boundary into the equivalent timm ``SwinTransformer`` / ``SwinTransformerV2``
that *shares* torchvision's modules and parameters (see :mod:`.swin_assemble`): ``features[0]``'s
convolution and LayerNorm are the patch embedding, ``features[2s]`` the patch merging before stage
``s`` (its ``norm`` and ``reduction``), each block's ``norm1``/``norm2``/``mlp`` and its
attention's ``qkv``, ``proj``, ``relative_position_bias_table`` (v1) or ``logit_scale``,
``cpb_mlp`` and ``relative_coords_table`` (v2), then ``norm`` and ``head``. Two small wrappers
keep torchvision's arithmetic: v2's key bias is zeroed in every call, as
``shifted_window_attention`` does (:class:`~.swin_assemble.KeyBiasFreeLinear`), and the
attention and output dropouts (plain floats in torchvision) become ``nn.Dropout`` modules.

torchvision's Swin takes any input size; the converted model has a fixed one, ``img_size=``
(default: the weights' crop size, 224 for v1 and 256 for v2), and its stage grids must be whole
windows there (:mod:`.swin_assemble` says why).
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from ...base.errors import UnsupportedModelError
from ..geometry import as_pair
from .swin_assemble import KeyBiasFreeLinear, SwinBlockParts, SwinParts, assemble_swin

__all__ = ["TORCHVISION_SWINS", "is_torchvision_swin", "to_timm_swin", "default_img_size"]

# Third-party models and their layers are annotated ``Any`` where their submodules are read by name: torch's
# ``nn.Module.__getattr__`` types every such attribute as ``Tensor | Module``, whatever the library put there.

TORCHVISION_SWINS = ("swin_t", "swin_s", "swin_b", "swin_v2_t", "swin_v2_s", "swin_v2_b")


def is_torchvision_swin(module: nn.Module) -> bool:
    """Whether ``module`` is torchvision's ``SwinTransformer`` (v1 or v2).

    Parameters
    ----------
    module : torch.nn.Module
        A model object.

    Returns
    -------
    bool
        True for ``torchvision.models.swin_transformer.SwinTransformer``.
    """
    return (
        type(module).__module__ == "torchvision.models.swin_transformer" and type(module).__name__ == "SwinTransformer"
    )


def _is_v2(tv: Any) -> bool:
    return getattr(tv.features[1][0].attn, "logit_scale", None) is not None


def default_img_size(tv: Any) -> int:
    """The crop size of torchvision's Swin weights: 256 for v2, 224 for v1.

    Parameters
    ----------
    tv : Any
        A torchvision ``SwinTransformer``.

    Returns
    -------
    int
        The input side.
    """
    return 256 if _is_v2(tv) else 224


def _block(block: Any, grid: tuple[int, int], v2: bool) -> SwinBlockParts:
    attn = block.attn
    window = as_pair(attn.window_size)
    # shifted_window_attention drops the shift where the window covers the (padded) grid
    shift = tuple(0 if w >= g else int(s) for w, g, s in zip(window, grid, as_pair(attn.shift_size)))
    common = dict(
        norm1=block.norm1,
        proj=attn.proj,
        norm2=block.norm2,
        mlp=block.mlp,
        position_index=attn.relative_position_index,
        window=window,
        shift=shift,
        attn_drop=nn.Dropout(float(attn.attention_dropout)),
        proj_drop=nn.Dropout(float(attn.dropout)),
        drop_path1=block.stochastic_depth,
        drop_path2=block.stochastic_depth,
    )
    if v2:
        return SwinBlockParts(
            qkv=KeyBiasFreeLinear(attn.qkv),
            logit_scale=attn.logit_scale,
            cpb_mlp=attn.cpb_mlp,
            coords_table=attn.relative_coords_table,
            **common,
        )
    return SwinBlockParts(qkv=attn.qkv, bias_table=attn.relative_position_bias_table, **common)


def to_timm_swin(tv: Any, img_size: int | tuple[int, int] | None = None) -> nn.Module:
    """The timm Swin made of ``tv``'s own modules (shared, not copied), at ``img_size``.

    Parameters
    ----------
    tv : Any
        A torchvision ``SwinTransformer`` (v1 or v2).
    img_size : int, tuple of int or None, default None
        Input size ``H`` or ``(H, W)``; ``None``: :func:`default_img_size`.

    Returns
    -------
    torch.nn.Module
        The timm ``SwinTransformer`` / ``SwinTransformerV2``, in eval mode.

    Raises
    ------
    UnsupportedModelError
        ``img_size`` is not whole patches; the patch grid does not halve evenly at every patch
        merging; a stage grid is not whole windows (:func:`~.swin_assemble.assemble_swin`).
    """
    size = as_pair(img_size or default_img_size(tv))
    features = list(tv.features)
    stem, stages, mergings = features[0], features[1::2], features[2::2]
    conv, norm = stem[0], stem[2]
    patch = as_pair(conv.stride)
    if patch[0] != patch[1] or size[0] % patch[0] or size[1] % patch[1]:
        raise UnsupportedModelError(
            f"torchvision Swin: img_size {size} is not a whole number of its {patch[0]}x{patch[1]} patches."
        )
    v2 = _is_v2(tv)
    grid = (size[0] // patch[0], size[1] // patch[1])
    blocks = []
    for index, stage in enumerate(stages):
        stage_grid = (grid[0] >> index, grid[1] >> index) if all(g % (1 << index) == 0 for g in grid) else (-1, -1)
        if stage_grid[0] <= 0:
            raise UnsupportedModelError(
                f"torchvision Swin: the {grid[0]}x{grid[1]} patch grid does not halve evenly at every patch merging "
                "(padded merging is not supported). Use an img_size like 224 (v1) or 256 (v2)."
            )
        blocks.append([_block(block, stage_grid, v2) for block in stage])
    parts = SwinParts(
        v2=v2,
        img_size=size,
        patch_size=patch[0],
        embed_dim=int(conv.out_channels),
        num_heads=tuple(int(stage[0].attn.num_heads) for stage in stages),
        mlp_ratio=float(stages[0][0].mlp[0].out_features) / int(conv.out_channels),
        stem_proj=conv,
        stem_norm=norm,
        stages=blocks,
        mergings=[(merging.norm, merging.reduction) for merging in mergings],
        norm=tv.norm,
        classifier=tv.head,
    )
    return assemble_swin(parts, "torchvision")
