"""Assemble a timm ``SwinTransformer`` / ``SwinTransformerV2`` from a foreign Swin's own modules.

The foreign model (Hugging Face ``Swin``/``Swinv2``, torchvision ``swin_*``/``swin_v2_*``) is
described once, as :class:`SwinParts`: its stem, one :class:`SwinBlockParts` per block, its
patch mergings, final norm and classifier. :func:`assemble_swin` builds the timm skeleton on
the ``meta`` device (see :mod:`.assemble`) and puts those modules and parameters in place, so
the result shares every weight with the foreign model and the timm window adapters
(:mod:`analysis.model.adapters.shifted_window`, :mod:`analysis.model.adapters.cosine_window`) read its
attention. Only the shift mask is timm's own, recomputed from the block's geometry: it holds
no weights (−100 between cells of different roll regions, the same rule in all three libraries).

The three libraries agree on the shifted windows only where every stage grid is a whole number
of windows: timm shifts, then pads to whole windows, while Hugging Face and torchvision pad,
then shift (and torchvision keeps a window larger than the grid, padding up to it, where the
others shrink it). :func:`assemble_swin` therefore refuses, with the reason, a model whose
stage grid at this input size is not whole windows, or whose blocks' windows and shifts are
not the ones timm derives from the same grid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.models.swin_transformer import SwinTransformer
from timm.models.swin_transformer_v2 import SwinTransformerV2

from ...base.errors import UnsupportedModelError
from .assemble import finish, skeleton

__all__ = ["SwinBlockParts", "SwinParts", "assemble_swin", "KeyBiasFreeLinear", "MlpWithDropout"]


@dataclass
class SwinBlockParts:
    """One block's modules.

    v1 (pre-norm, ``x + attn(norm1(x))``) sets ``bias_table``; v2 (post-norm,
    ``x + norm1(attn(x))``) sets ``logit_scale``, ``cpb_mlp`` and ``coords_table``.

    Attributes
    ----------
    norm1 : torch.nn.Module
        The first norm (v1: before attention; v2: after it).
    qkv : torch.nn.Module
        The fused projection ``x (…, C) -> [q, k, v] (…, 3C)``.
    proj : torch.nn.Module
        The attention's output projection.
    norm2 : torch.nn.Module
        The second norm (v1: before the MLP; v2: after it).
    mlp : torch.nn.Module
        ``x (…, C) -> (…, C)``, the whole MLP branch before its residual add.
    position_index : torch.Tensor
        The relative-position index, ``(Wt·Wt,)`` or ``(Wt, Wt)`` long.
    window : tuple of int
        ``(wh, ww)``: the window the foreign block uses at this input.
    shift : tuple of int
        ``(sh, sw)``: the cyclic shift the foreign block uses at this input.
    attn_drop : torch.nn.Module
        Dropout on the attention probabilities.
    proj_drop : torch.nn.Module
        Dropout after the output projection.
    drop_path1 : torch.nn.Module
        Stochastic depth of the attention branch.
    drop_path2 : torch.nn.Module
        Stochastic depth of the MLP branch.
    bias_table : torch.nn.Parameter or None, default None
        v1: the relative-position bias table ``((2wh−1)(2ww−1), heads)``.
    logit_scale : torch.nn.Parameter or None, default None
        v2: the cosine attention's ``(heads, 1, 1)`` log temperature.
    cpb_mlp : torch.nn.Module or None, default None
        v2: the continuous position-bias MLP.
    coords_table : torch.Tensor or None, default None
        v2: the relative coordinates ``(1, 2wh−1, 2ww−1, 2)`` fed to ``cpb_mlp``.
    """

    norm1: nn.Module
    qkv: nn.Module  # x (…, C) -> [q, k, v] (…, 3C)
    proj: nn.Module
    norm2: nn.Module
    mlp: nn.Module  # x (…, C) -> (…, C), the whole MLP branch before its residual add
    position_index: torch.Tensor
    window: tuple[int, int]
    shift: tuple[int, int]
    attn_drop: nn.Module
    proj_drop: nn.Module
    drop_path1: nn.Module
    drop_path2: nn.Module
    bias_table: nn.Parameter | None = None
    logit_scale: nn.Parameter | None = None
    cpb_mlp: nn.Module | None = None
    coords_table: torch.Tensor | None = None


@dataclass
class SwinParts:
    """The whole model, described once for :func:`assemble_swin`.

    Attributes
    ----------
    v2 : bool
        Swin V2 (post-norm, cosine attention) rather than v1.
    img_size : tuple of int
        ``(H, W)`` input size.
    patch_size : int
        Input pixels per patch side.
    embed_dim : int
        Width ``C`` of the first stage.
    num_heads : tuple of int
        Attention heads per stage.
    mlp_ratio : float
        MLP hidden width over the block width.
    stem_proj : torch.nn.Module
        The patch projection, a ``Conv2d`` ``(B, 3, H, W) -> (B, C, gh, gw)``.
    stem_norm : torch.nn.Module
        The norm after it (with any embedding dropout).
    stages : list of list of SwinBlockParts
        ``stages[s]``: the blocks of stage ``s``.
    mergings : list of tuple of torch.nn.Module
        ``mergings[s − 1]``: the ``(norm, reduction)`` of the patch merging before stage ``s ≥ 1``.
    norm : torch.nn.Module
        The final norm.
    classifier : torch.nn.Module or None
        The head ``(B, C) -> (B, classes)``; ``None``: no head.
    """

    v2: bool
    img_size: tuple[int, int]
    patch_size: int
    embed_dim: int
    num_heads: tuple[int, ...]
    mlp_ratio: float
    stem_proj: nn.Module  # Conv2d (B, 3, H, W) -> (B, C, gh, gw)
    stem_norm: nn.Module
    stages: list[list[SwinBlockParts]]
    mergings: list[tuple[nn.Module, nn.Module]]
    norm: nn.Module
    classifier: nn.Module | None  # (B, C) -> (B, classes); None: no head


class KeyBiasFreeLinear(nn.Module):
    """``F.linear(x, W, [b_q, 0, b_v])``: a fused q/k/v projection whose key bias is forced to
    zero in every call (torchvision's Swin V2 zeroes it in ``shifted_window_attention``),
    sharing the wrapped ``nn.Linear``'s parameters.

    Parameters
    ----------
    linear : torch.nn.Linear
        The fused ``C -> 3C`` projection, bias ``[b_q, b_k, b_v]`` (or none).
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias: torch.Tensor | None = self.linear.bias
        if bias is not None:
            length = bias.numel() // 3
            bias = torch.cat([bias[:length], torch.zeros_like(bias[length : 2 * length]), bias[2 * length :]])
        return F.linear(x, self.linear.weight, bias)


class MlpWithDropout(nn.Module):
    """``dropout(mlp(x))``: a block's MLP followed by the block's own dropout on its output.

    Parameters
    ----------
    mlp : torch.nn.Module
        The block's MLP.
    dropout : torch.nn.Module
        The block's dropout, applied to the MLP's output.
    """

    def __init__(self, mlp: nn.Module, dropout: nn.Module) -> None:
        super().__init__()
        self.mlp, self.dropout = mlp, dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.mlp(x))


def _check_geometry(model: Any, parts: SwinParts, source: str) -> None:
    """Refuse grids that are not whole windows, and any block whose window or shift differs
    from what timm derives from its grid (see the module docstring)."""
    timm_blocks = [(index, block) for index, stage in enumerate(model.layers) for block in stage.blocks]
    foreign = [block for stage in parts.stages for block in stage]
    for (stage, block), theirs in zip(timm_blocks, foreign, strict=True):
        grid = tuple(int(v) for v in block.input_resolution)
        window = tuple(int(v) for v in theirs.window)
        if grid[0] % window[0] or grid[1] % window[1]:
            raise UnsupportedModelError(
                f"windowed attention: stage {stage} of this {source} Swin works on a {grid[0]}x{grid[1]} grid, not a "
                f"whole number of its {window[0]}x{window[1]} windows; {source} pads before its cyclic shift where "
                "timm shifts first, so its windows cannot be captured as timm's. Use an input size whose stage grids "
                "are whole windows (e.g. 224 for window 7, 256 for window 8)."
            )
        ours = (tuple(int(v) for v in block.window_size), tuple(int(v) for v in block.shift_size))
        if ours != (window, tuple(int(v) for v in theirs.shift)):
            raise UnsupportedModelError(
                f"windowed attention: a stage-{stage} block of this {source} Swin uses window {window} and shift "
                f"{tuple(theirs.shift)} on its {grid[0]}x{grid[1]} grid, timm's would use {ours[0]} and {ours[1]}: "
                "not supported."
            )


def assemble_swin(parts: SwinParts, source: str) -> nn.Module:
    """The timm Swin (v1 or v2) made of ``parts``' own modules (shared, not copied).

    Only the shift mask is timm's own, recomputed from each block's geometry (no weights).

    Parameters
    ----------
    parts : SwinParts
        The foreign model's modules.
    source : str
        The foreign library's name, as errors write it (``"transformers"``, ``"torchvision"``).

    Returns
    -------
    torch.nn.Module
        The timm ``SwinTransformer`` / ``SwinTransformerV2``, in eval mode.

    Raises
    ------
    UnsupportedModelError
        A v1 model whose stages use different windows; a stage grid that is not a whole number of
        windows; a block whose window or shift is not the one timm derives from its grid.
    ModelLoadError
        A part of the skeleton was left unreplaced (:func:`finish`).
    """
    windows = {tuple(block.window) for stage in parts.stages for block in stage}
    first_windows = [tuple(stage[0].window) for stage in parts.stages]
    options = dict(
        img_size=parts.img_size,
        patch_size=parts.patch_size,
        embed_dim=parts.embed_dim,
        depths=tuple(len(stage) for stage in parts.stages),
        num_heads=parts.num_heads,
        window_size=first_windows if parts.v2 else first_windows[0],
        mlp_ratio=parts.mlp_ratio,
        num_classes=int(getattr(parts.classifier, "out_features", 0) or 0),
        drop_path_rate=0.0,
        qkv_bias=not parts.v2,  # v2: q/k/v biases live inside the foreign qkv module
    )
    if not parts.v2 and len({w for w in first_windows}) > 1:
        raise UnsupportedModelError(
            f"This {source} Swin uses different windows per stage ({sorted(windows)}): not supported."
        )
    model = skeleton(SwinTransformerV2 if parts.v2 else SwinTransformer, **options)
    _check_geometry(model, parts, source)
    model.patch_embed.proj = parts.stem_proj
    model.patch_embed.norm = parts.stem_norm
    device = parts.stem_proj.weight.device
    for index, (stage, blocks) in enumerate(zip(model.layers, parts.stages, strict=True)):
        if index > 0:
            stage.downsample.norm, stage.downsample.reduction = parts.mergings[index - 1]
        for block, theirs in zip(stage.blocks, blocks, strict=True):
            attn = block.attn
            wt = theirs.window[0] * theirs.window[1]
            block.norm1, block.norm2, block.mlp = theirs.norm1, theirs.norm2, theirs.mlp
            block.drop_path1, block.drop_path2 = theirs.drop_path1, theirs.drop_path2
            attn.qkv, attn.proj, attn.attn_drop, attn.proj_drop = (
                theirs.qkv,
                theirs.proj,
                theirs.attn_drop,
                theirs.proj_drop,
            )
            attn.relative_position_index = theirs.position_index.view(wt, wt)  # a view: shared storage
            if parts.v2:
                attn.logit_scale, attn.cpb_mlp = theirs.logit_scale, theirs.cpb_mlp
                attn.relative_coords_table = theirs.coords_table
            else:
                attn.relative_position_bias_table = theirs.bias_table
            mask = block.get_attn_mask()  # no weights: the shift's roll regions (float32, CPU; timm ≥ 1.0.20)
            block.register_buffer("attn_mask", None if mask is None else mask.to(device), persistent=False)
    model.norm = parts.norm
    if parts.classifier is not None:
        model.head.fc = parts.classifier
    return finish(model, source)
