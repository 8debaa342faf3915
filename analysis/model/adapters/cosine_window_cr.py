"""timm ``swinv2_cr_*`` (``SwinTransformerV2Cr``): its own scaled-cosine window attention with a
meta-network position bias.

The same shifted windows as Swin v1/v2 (:mod:`.shifted_window`: cyclic shift by half a window in
every other block, zero padding to whole windows after the shift, row-major windows, the
−100 shift mask), with the scores

    P = softmax(τ·cos(q, k) + meta_mlp(Δ) + M)      # (B·windows, heads, Wt, Wt)

``τ = exp(min(logit_scale, log 100))`` per head, ``meta_mlp`` a two-layer MLP of the
log-spaced relative offset ``Δ = sign(d)·log(1 + |d|)`` of each (query, key) pair (no
sigmoid, unlike Swin V2's ``16·sigmoid(cpb_mlp)``), ``M`` the shift mask. The module always
computes ``P`` explicitly and passes it through ``attn_drop``, where the base contract reads
it. Its block keeps the stage grid as ``feat_size`` (Swin: ``input_resolution``) and its
stages are ``model.stages`` (see :func:`~.registry.model_blocks`).
"""

from __future__ import annotations

from typing import Any

import torch
from timm.models.swin_transformer_v2_cr import WindowMultiHeadAttention

from .blocks import BlockLayout
from .registry import register_adapter
from .shifted_window import ShiftedWindowAttentionAdapter


class MetaCosineWindowAttentionAdapter(ShiftedWindowAttentionAdapter):
    name = "scaled-cosine shifted-window attention with a meta-network position bias (swinv2_cr)"
    module_types = (WindowMultiHeadAttention,)
    always_explicit = True  # cosine attention: its softmax is never the fused kernel
    grid_attribute = "feat_size"
    # Its blocks may normalise the stream after the MLP branch (norm3, ``extra_norm``): resid_post = norm3(…).
    block_layout = BlockLayout(stream_norm=("norm3",))
    includes = (
        "softmax(τ·cos(q,k) + meta_mlp(Δ) + M) inside each window: τ from logit_scale, Δ the log-spaced "
        "relative offset, M the shift mask (masked pairs recorded as exactly 0)"
    )

    def relative_position_bias(self, module: Any, window: tuple[int, int]) -> torch.Tensor:
        """``meta_mlp(sign(Δ)·log(1 + |Δ|))`` of every offset ``Δ = (Δy, Δx)`` of the window (no sigmoid)."""
        anchor = module.logit_scale
        rows, cols = (torch.arange(-(w - 1), w, dtype=torch.float32, device=anchor.device) for w in window)
        offsets = torch.stack(torch.meshgrid(rows, cols, indexing="ij"), dim=-1)  # (2wh − 1, 2ww − 1, 2) as (Δy, Δx)
        with torch.no_grad():
            table = module.meta_mlp((torch.sign(offsets) * torch.log1p(offsets.abs())).to(anchor.dtype))
        return table.permute(2, 0, 1).float().contiguous()


ADAPTER = register_adapter(MetaCosineWindowAttentionAdapter())
