"""The one definition of the attention probabilities every capture reports.

    P = softmax(scale · q·kᵀ + M)        over keys, in float32 (autocast off)

exactly as ``F.scaled_dot_product_attention`` defines its weights: grouped-query keys are
repeated per head; a boolean ``mask`` keeps ``True`` (False → −∞), a float mask is added to the
scores; ``is_causal`` keeps keys ``j ≤ i``. Two ways to evaluate it, one rule:

* the default writes in place (one GEMM straight into ``out``, the mask and the softmax applied
  row by row without temporaries): the capture's fast path, no autograd;
* :func:`attention_scores` gives the scores by out-of-place ops, so gradients flow to q, k and the
  mask: the engine's gradient mode takes their softmax (the class-specific explanations' path).

:func:`attend_and_record` evaluates it together with the call's output ``P·v`` (the path every
capture takes when it replaces a fused call: the scores are computed once).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .base import AttentionInputs

__all__ = ["attention_scores", "attention_probabilities", "attend_and_record"]


def attention_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    scale: float,
    *,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
) -> torch.Tensor:
    """``scale·q·kᵀ + M`` by out-of-place (differentiable) ops: the scores whose softmax over keys
    is :func:`attention_probabilities` (pairs a mask removes are ``−inf``), computed in float32
    with autocast off.

    Parameters
    ----------
    q : torch.Tensor
        Queries ``(B, heads, Q, d)``.
    k : torch.Tensor
        Keys ``(B, kv_heads, T, d)``, repeated per head for grouped-query attention.
    scale : float
        The factor on q·kᵀ.
    mask : torch.Tensor or None, default None
        Broadcastable to ``(B, heads, Q, T)``: a boolean keep-mask (``False`` → ``−inf``) or a float
        bias added to the scores.
    is_causal : bool, default False
        Keep only keys ``j ≤ i`` for query ``i``.

    Returns
    -------
    torch.Tensor
        ``(B, heads, Q, T)`` float32 scores.
    """
    with torch.autocast(q.device.type, enabled=False):
        if k.shape[1] != q.shape[1]:
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        q, k = q.float(), k.float()
        scores = torch.matmul(q, k.transpose(-2, -1)) * scale
        if is_causal:
            keep = (
                torch.arange(k.shape[2], device=q.device)[None, :] <= torch.arange(q.shape[2], device=q.device)[:, None]
            )
            scores = scores.masked_fill(~keep, float("-inf"))
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.float()
    return scores


def attention_probabilities(
    q: torch.Tensor,
    k: torch.Tensor,
    scale: float,
    rows: torch.Tensor | None = None,
    *,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``P`` of one attention call (module docstring), computed in place: one GEMM straight into
    the output, the mask and the softmax applied row by row without temporaries (no autograd).

    Parameters
    ----------
    q : torch.Tensor
        Queries ``(B, heads, T, d)``.
    k : torch.Tensor
        Keys ``(B, kv_heads, T, d)``, repeated per head for grouped-query attention.
    scale : float
        The factor on q·kᵀ.
    rows : torch.Tensor or None, default None
        Integer indices ``(Q,)`` of the query rows to compute; ``None``, all ``T`` (``Q = T``).
    mask : torch.Tensor or None, default None
        Broadcastable to ``(B, heads, T, T)`` (its query rows are selected with ``rows``): a boolean
        keep-mask (``False`` → ``−inf``) or a float bias added to the scores.
    is_causal : bool, default False
        Keep only keys ``j ≤ i`` for query ``i`` (``i`` the full-sequence index of a selected row).
    out : torch.Tensor or None, default None
        A float32 ``(B, heads, Q, T)`` tensor on ``q``'s device to write into.

    Returns
    -------
    torch.Tensor
        ``(B, heads, Q, T)`` float32 probabilities (``out`` when given).
    """
    with torch.autocast(q.device.type, enabled=False):
        if k.shape[1] != q.shape[1]:
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        full_queries = q.shape[2]
        if rows is not None:
            q = q.index_select(2, rows)
        q, k = q.float(), k.float()
        batch, heads, queries, head_dim = q.shape
        tokens = k.shape[2]
        scores = (
            out if out is not None else torch.empty(batch, heads, queries, tokens, dtype=torch.float32, device=q.device)
        )
        torch.baddbmm(  # scale·(q·kᵀ) in one GEMM, written straight into the output
            scores.view(batch * heads, queries, tokens),
            q.reshape(batch * heads, queries, head_dim),
            k.reshape(batch * heads, tokens, head_dim).transpose(1, 2),
            beta=0.0,
            alpha=scale,
            out=scores.view(batch * heads, queries, tokens),
        )
        if is_causal:
            query_index = rows if rows is not None else torch.arange(full_queries, device=q.device)
            keep = torch.arange(tokens, device=q.device)[None, :] <= query_index[:, None]  # (Q, T)
            scores = scores.masked_fill_(~keep, float("-inf"))
        if mask is not None:
            if rows is not None and mask.ndim >= 2 and mask.shape[-2] == full_queries and full_queries > 1:
                mask = mask.index_select(-2, rows)
            if mask.dtype == torch.bool:
                scores = scores.masked_fill_(~mask, float("-inf"))
            else:
                scores = scores.add_(mask.float())
        torch.ops.aten._softmax.out(scores, -1, False, out=scores)  # in place, row by row: no temporary
    return scores


_CHUNK_BYTES = 4 << 20  # probabilities per piece of attend_and_record: small enough to stay in cache
_ONE_IMAGE_BYTES = 1 << 20  # from this size of one image's maps on, attend_and_record takes one image at a time


def attend_and_record(inputs: AttentionInputs, out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(P, P·v)`` for one fused attention call: ``P = softmax(scale·q·kᵀ + M)`` in float32 as
    :func:`attention_probabilities`, and the call's output ``P·v`` in ``v``'s dtype, computed a
    few images at a time so each piece of ``P`` is multiplied with ``v`` while it is still in cache.

    Parameters
    ----------
    inputs : AttentionInputs
        A fused call's inputs: ``q (B, heads, T, d)``, ``k`` and ``v (B, kv_heads, T, d)``,
        ``scale``, and optionally ``mask`` and ``is_causal``.
    out : torch.Tensor or None, default None
        A float32 ``(B, heads, T, T)`` tensor on ``q``'s device to write ``P`` into.

    Returns
    -------
    tuple of torch.Tensor
        ``P (B, heads, T, T)`` float32 (``out`` when given) and ``P·v (B, heads, T, d)`` in ``v``'s
        dtype.
    """
    q, k, v, mask, scale = inputs.q, inputs.k, inputs.v, inputs.mask, inputs.scale
    assert q is not None and k is not None and v is not None and scale is not None, "a fused call's inputs"
    batch, heads, queries, _ = q.shape
    tokens = k.shape[2]
    if out is None:
        out = torch.empty(batch, heads, queries, tokens, dtype=torch.float32, device=q.device)
    if v.shape[1] != heads:  # grouped-query values, repeated per head
        v = v.repeat_interleave(heads // v.shape[1], dim=1)
    output = torch.empty(batch, heads, queries, v.shape[-1], dtype=v.dtype, device=v.device)
    image_bytes = heads * queries * tokens * 4
    # One image at a time once its maps are large: its q, k and v are then 3-D views of the call's
    # (B, heads, T, d) tensors, whatever their strides (a piece of several images of a permuted qkv
    # would be copied to merge batch and heads: 1 % of ViT-B/16's capture), and the loop's few
    # calls cost nothing beside the GEMMs.
    step = 1 if image_bytes >= _ONE_IMAGE_BYTES else max(1, _CHUNK_BYTES // max(1, image_bytes))
    per_image_mask = mask is not None and mask.ndim == 4 and mask.shape[0] == batch and batch > 1
    for start in range(0, batch, step):
        piece = slice(start, start + step)
        probs = attention_probabilities(
            q[piece],
            k[piece],
            scale,
            mask=mask[piece] if per_image_mask and mask is not None else mask,
            is_causal=inputs.is_causal,
            out=out[piece],
        )
        with torch.autocast(v.device.type, enabled=False):
            torch.matmul(probs.to(v.dtype), v[piece], out=output[piece])
    return out, output
