"""Swin's shifted-window attention (timm ``SwinTransformer``, v1): relative-position bias table.

Each block cuts its stage grid into windows (after a cyclic shift of half a window in every
other block) and runs ordinary multi-head attention inside each window, so one call of the
module sees ``B·windows`` independent sequences of ``Wt = wh·ww`` tokens:

    P = softmax(scale·q·kᵀ + B + M)      # (B·windows, heads, Wt, Wt)

``B`` is the window's relative-position bias (``relative_position_bias_table``), ``M`` the
shift mask (−100 between cells from different roll regions). Both paths of the module are
read by the base contract: the fused call (bias and mask folded into ``attn_mask``) or the
explicit ``softmax`` through ``attn_drop``. Where the cells of each window sit on the stage
grid is read off the block (``input_resolution``, ``window_size``, ``shift_size``) as a
:class:`~analysis.model.geometry.LayerGeometry`; the capture zeroes the masked pairs (whose probability
``< e⁻¹⁰⁰·…`` is a float32 denormal, not 0) so they are exactly 0 in the record.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from timm.models.swin_transformer import WindowAttention

from ...base.errors import UnsupportedModelError
from ..geometry import LayerGeometry
from .base import AttentionAdapter
from .registry import register_adapter


class ShiftedWindowAttentionAdapter(AttentionAdapter):
    name = "shifted-window attention (Swin)"
    module_types: tuple[type[nn.Module], ...] = (WindowAttention,)
    windowed = True
    # The block attribute that holds its stage grid (timm swinv2_cr: ``feat_size``).
    grid_attribute = "input_resolution"
    includes = (
        "softmax(scale·q·kᵀ + B + M) inside each window: B the window's relative-position bias, "
        "M the shift mask (masked pairs recorded as exactly 0)"
    )

    def layer_geometry(self, site, patch_grid: tuple[int, int], patch_size: tuple[int, int]) -> LayerGeometry:
        """The block's stage grid, stride (patch size × the patch mergings before it), window
        and shift, read off the Swin block that holds the attention."""
        block = site.block
        if getattr(block, "dynamic_mask", False):
            raise UnsupportedModelError(
                "windowed attention: dynamic_img_size is not yet supported for Swin (its windows and "
                "shift mask change with every input size); load it at a fixed img_size."
            )
        grid_attribute = getattr(block, self.grid_attribute)
        grid = (int(grid_attribute[0]), int(grid_attribute[1]))
        if patch_grid[0] % grid[0] or patch_grid[1] % grid[1]:
            raise UnsupportedModelError(
                f"windowed attention: stage {site.stage}'s {grid[0]}x{grid[1]} grid does not divide the "
                f"{patch_grid[0]}x{patch_grid[1]} patch grid (padded patch merging) — not yet supported for "
                "Swin; use an img_size that halves evenly at every stage."
            )
        stride = (patch_size[0] * (patch_grid[0] // grid[0]), patch_size[1] * (patch_grid[1] // grid[1]))
        return LayerGeometry(
            stage=site.stage,
            grid_size=grid,
            stride=stride,
            window_size=(int(block.window_size[0]), int(block.window_size[1])),
            shift=(int(block.shift_size[0]), int(block.shift_size[1])),
            num_heads=self.num_heads(site.module),
        )

    def relative_position_bias(self, module: Any, window: tuple[int, int]) -> torch.Tensor:
        """v1: the learned ``relative_position_bias_table`` ``((2wh − 1)·(2ww − 1), heads)``, row-major in
        ``(Δy, Δx)``, as ``(heads, 2wh − 1, 2ww − 1)``."""
        table = module.relative_position_bias_table.detach()
        return table.view(2 * window[0] - 1, 2 * window[1] - 1, -1).permute(2, 0, 1).float().contiguous()


ADAPTER = register_adapter(ShiftedWindowAttentionAdapter())
