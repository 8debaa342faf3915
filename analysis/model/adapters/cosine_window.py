"""Swin V2's scaled-cosine window attention (timm ``SwinTransformerV2``).

The same shifted windows as Swin v1 (:mod:`.shifted_window`), with the scores

    P = softmax(τ·cos(q, k) + 16·sigmoid(cpb_mlp(Δ)) + M)      # (B·windows, heads, Wt, Wt)

``τ = exp(min(logit_scale, log 100))`` per head, ``cpb_mlp`` the continuous position bias
of the log-spaced relative offsets ``Δ``, ``M`` the shift mask. The module always computes
``P`` explicitly and passes it through ``attn_drop``, where the base contract reads it.
"""

from __future__ import annotations

from typing import Any

import torch
from timm.models.swin_transformer_v2 import WindowAttention as CosineWindowAttention

from .registry import register_adapter
from .shifted_window import ShiftedWindowAttentionAdapter


class CosineWindowAttentionAdapter(ShiftedWindowAttentionAdapter):
    name = "scaled-cosine shifted-window attention (Swin V2)"
    module_types = (CosineWindowAttention,)
    always_explicit = True  # cosine attention: its softmax is never the fused kernel
    includes = (
        "softmax(τ·cos(q,k) + 16·sigmoid(cpb_mlp(Δ)) + M) inside each window: τ from logit_scale, "
        "M the shift mask (masked pairs recorded as exactly 0)"
    )

    def relative_position_bias(self, module: Any, window: tuple[int, int]) -> torch.Tensor:
        """``16·sigmoid(cpb_mlp(relative_coords_table))``: the continuous position bias of the log-spaced
        offsets ``(1, 2wh − 1, 2ww − 1, 2)``, computed as the module computes it."""
        with torch.no_grad():
            table = 16 * torch.sigmoid(module.cpb_mlp(module.relative_coords_table))
        return table.view(2 * window[0] - 1, 2 * window[1] - 1, -1).permute(2, 0, 1).float().contiguous()


ADAPTER = register_adapter(CosineWindowAttentionAdapter())
