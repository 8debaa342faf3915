"""SAM's image encoder (timm ``samvit_*``): windowed blocks and global blocks, both with
decomposed relative positions.

A windowed block pads its grid to whole ``w×w`` windows and attends inside each (no shift,
no mask: padding tokens are keys like any other); a global block (``window_size == 0``)
attends over the whole grid. Either way the scores are

    P = softmax(scale·q·kᵀ + B),   B[(i,j),(k,l)] = q_(i,j)·R_h[i−k] + q_(i,j)·R_w[j−l]

with ``R_h``, ``R_w`` the module's ``rel_pos_h``/``rel_pos_w`` tables (``get_decomposed_rel_pos_bias``),
and the module passes ``B`` to its fused call or adds it on its explicit path. The module
folds heads into the batch (``q (B·windows·heads, N, d)``); this adapter unfolds them to
``(B·windows, heads, N, d)`` for the base contract and folds the call's output back.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.nn as nn
from timm.models.vision_transformer_sam import Attention as SamAttention
from timm.models.vision_transformer_sam import get_rel_pos

from ..geometry import LayerGeometry
from .base import AttentionAdapter, AttentionInputs, Report
from .registry import register_adapter


class DecomposedWindowAttentionAdapter(AttentionAdapter):
    name = "windowed / global attention with decomposed relative positions (SAM)"
    module_types = (SamAttention,)
    windowed = True
    includes = (
        "softmax(scale·q·kᵀ + B) inside each window (global blocks: over the grid), B the decomposed "
        "relative-position bias from rel_pos_h / rel_pos_w; q, k after q/k norm"
    )

    def tap(self, module: nn.Module, report: Report, owner: int, *, reuse: bool = False):
        heads = self.num_heads(module)

        def unfold(tensor: torch.Tensor | None) -> torch.Tensor | None:  # (B'·heads, ...) -> (B', heads, ...)
            return None if tensor is None or tensor.ndim != 3 else tensor.unflatten(0, (-1, heads))

        def per_head(inputs: AttentionInputs):
            if inputs.probs is not None:  # a replacement goes back in the module's (B'·heads, N, N) layout
                replaced = report(AttentionInputs(probs=unfold(inputs.probs)))
                return None if replaced is None else replaced.flatten(0, 1)
            output = report(
                replace(inputs, q=unfold(inputs.q), k=unfold(inputs.k), v=unfold(inputs.v), mask=unfold(inputs.mask))
            )
            return None if output is None else output.flatten(0, 1)  # (B', heads, N, d) -> (B'·heads, N, d)

        return super().tap(module, per_head, owner, reuse=reuse)

    def defines(self, site, point: str) -> bool:
        """A windowed SAM block adds its attention branch per window, before un-partitioning:
        ``resid_mid`` (input + that branch) is not defined there."""
        if point == "resid_mid" and int(getattr(site.block, "window_size", 0) or 0) > 0:
            return False
        return super().defines(site, point)

    def layer_geometry(self, site, patch_grid: tuple[int, int], patch_size: tuple[int, int]) -> LayerGeometry:
        """One stage on the patch grid; a windowed block's ``w×w`` windows, or one window of
        the whole grid for a global block."""
        window = int(getattr(site.block, "window_size", 0) or 0)
        return LayerGeometry(
            stage=0,
            grid_size=(patch_grid[0], patch_grid[1]),
            stride=(patch_size[0], patch_size[1]),
            window_size=(window, window) if window > 0 else (patch_grid[0], patch_grid[1]),
            num_heads=self.num_heads(site.module),
        )

    def decomposed_relative_position(
        self, module: Any, window: tuple[int, int]
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``rel_pos_h`` and ``rel_pos_w`` by offset, read through timm's own ``get_rel_pos`` (which
        resizes a table of another length exactly as the module does); ``None`` without the tables."""
        if getattr(module, "rel_pos_h", None) is None:
            return None
        with torch.no_grad():
            return _table_by_offset(window[0], module.rel_pos_h), _table_by_offset(window[1], module.rel_pos_w)


def _table_by_offset(side: int, rel_pos: torch.Tensor) -> torch.Tensor:
    """``(2·side − 1, C)``: the row the module uses for each offset ``Δ = query − key``."""
    pairs = get_rel_pos(side, side, rel_pos)  # (side_q, side_k, C): row of offset q − k
    offsets = torch.arange(-(side - 1), side)
    return pairs[offsets.clamp(min=0), (-offsets).clamp(min=0)].float()


ADAPTER = register_adapter(DecomposedWindowAttentionAdapter())
