"""Capture every layer's attention probabilities in one forward pass.

timm's attention modules compute ``softmax(q·kᵀ·scale)`` only on their unfused path; with
fused attention (``F.scaled_dot_product_attention``, the default) the weights never
exist. We therefore never rely on ``fused_attn`` (nor on timm's global
``set_fused_attn``, which only affects models built after the call). Instead each block's
attention adapter (:mod:`analysis.model.adapters`, one per attention family) reads what the
module itself uses, q and k after q/k norm and RoPE and the relative-position bias, and
we compute

    P = softmax(q · kᵀ · scale + M)        # (B, heads, T, T), in float32

By default that very ``P`` then gives the call's output, ``P·v``, in place of the fused
kernel: the scores are computed once, so a capture costs about a plain forward, and the
logits equal an uncaptured forward's to float rounding (~1e-6 relative). With
``exact_logits=True`` the fused kernel runs untouched beside the capture and the model's
output is bit-identical. Layers that are not requested keep the fused kernel either way.

:func:`capture_attention` is a view over the activation engine
(:func:`analysis.engine.activations.run_with_cache`'s ``blocks.{i}.attn.probs``, stacked): one capture
path for records, caches, tokens and the streamed analyses. A record's maps go straight into
their final ``(L, B, heads, Q, T)`` buffer. Gradients go through the same engine (``run_with_cache(..., grad_of=fn)``).

Hooks are registered per call and removed in ``finally``; they only react to the thread
that registered them, so one model can be shared by many threads (browser sessions),
each capturing its own input at the same time. Nothing is stored on the modules.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..base.arguments import check_float_dtype, check_int, resolve_layers
from ..base.errors import AnalysisError
from ..model.adapters import pool_site
from ..model.geometry import input_spec
from ..model.windowed_support import require_global_attention
from ..records.assemble import assemble_record, stacks_layers
from ..records.attention import AttentionRecord
from .activations.points import POOL_NAME
from .activations.run import cache_forward

__all__ = ["capture_attention", "require_every_layer"]


def require_every_layer(requested: Sequence[int], seen, what: str = "attention") -> None:
    """Refuse a forward pass in which some requested layer's tap never fired.

    Every capture (records, streamed distances, tokens, gradients) calls this after its
    forward: a layer whose adapter saw nothing would otherwise come back as zeros or a stale
    buffer and be read (or averaged in) as data.

    Parameters
    ----------
    requested : sequence of int
        The layers the capture asked for.
    seen : container of int
        The layers the taps reported (anything ``in`` works: a set, a dict, a list).
    what : str, default "attention"
        What was captured, for the error message.

    Raises
    ------
    AnalysisError
        A requested layer is not in ``seen``.
    """
    missing = [layer for layer in requested if layer not in seen]
    if missing:
        raise AnalysisError(
            f"The {what} of layers {missing} was never computed during the forward pass: this "
            "model's blocks did not run as their attention adapter expects, so it is not supported."
        )


def capture_attention(
    vit,
    pixels: torch.Tensor,
    *,
    layers: Sequence[int] | int | None = None,
    query_tokens: Sequence[int] | None = None,
    dtype: torch.dtype = torch.float32,
    precision: str = "auto",
    to_cpu: bool = True,
    exact_logits: bool = False,
) -> AttentionRecord:
    """Run one forward pass and return every requested layer's attention and the logits.

    Parameters
    ----------
    vit : LoadedViT
        A :class:`~analysis.model.loading.LoadedViT`.
    pixels : torch.Tensor
        ``(B, 3, H, W)`` floating preprocessed input (any device; moved to the model's).
    layers : int, sequence of int or None, default None
        Model layer indices to keep (negative ones count from the end; ``None``: all). Others keep
        the fused kernel (an attention-pooling head's is always recorded, as ``P·v``). The record
        holds them in increasing order, the order of the forward pass that rollout composes;
        ``record.select_layers([...])`` gives any other order.
    query_tokens : sequence of int or None, default None
        Keep only these query rows (token indices in ``0..T-1``; e.g. ``[0]`` for the class
        token) to save memory: attentions are then ``(L, B, heads, len(query_tokens), T)``.
        ``None`` keeps every row; it must be ``None`` for a windowed model (Swin).
    dtype : torch.dtype, default torch.float32
        Storage dtype of the kept maps (``torch.float16`` halves memory); the probabilities
        themselves are always computed in float32.
    precision : str, default "auto"
        Autocast for the forward: ``"auto"`` (bf16/fp16 on cuda, fp32 on cpu), ``"float32"``,
        ``"bfloat16"``, ``"float16"``.
    to_cpu : bool, default True
        Move the kept maps (and the logits) to CPU memory, else keep them on the model's device.
    exact_logits : bool, default False
        ``False``: each fused attention call's output is computed as ``P·v`` from the very
        probabilities recorded, so the scores are computed once and capture costs about a plain
        forward; the logits then equal an uncaptured forward's to float rounding (tested at 1e-5).
        ``True``: the fused kernel runs untouched beside the capture and the logits are
        bit-identical, at about 1.1x the cost.

    Returns
    -------
    AttentionRecord
        An :class:`AttentionRecord` with ``attentions`` ``(L, B, heads, Q, T)`` in ``dtype``
        (``Q == T`` unless ``query_tokens`` is given, then ``Q == len(query_tokens)``) and
        ``logits`` ``(B, classes)`` float32 (an embedding tower's ``(B, E)``); for a model whose layers
        attend inside windows (Swin, SAM) a record with one ``(B, windows, heads, Wt, Wt)`` tensor per
        layer instead (:func:`~analysis.records.assemble.assemble_record` says which).

    Raises
    ------
    AnalysisError
        For ``pixels`` of the wrong shape or size for the model, a non-floating ``dtype``, a layer
        outside the model, ``query_tokens`` that are empty, outside ``0..T-1`` or given for a
        windowed model, or a forward pass in which a requested layer's attention was never computed.
    """
    spec = input_spec(vit, pixels)
    layer_ids = tuple(sorted(resolve_layers(layers, spec.num_layers)))  # the forward order
    check_float_dtype("dtype", dtype)
    if query_tokens is not None:
        require_global_attention(
            spec,
            lambda _: AnalysisError(
                "query_tokens is not defined for a windowed model (Swin): its windows are kept whole. "
                "Pass query_tokens=None."
            ),
        )
        query_tokens = tuple(check_int("query token", t) for t in query_tokens)
        if not query_tokens:
            raise AnalysisError("query_tokens is empty: pass None for every query row, or some token indices.")
        bad = [t for t in query_tokens if not 0 <= t < spec.num_tokens]
        if bad:
            raise AnalysisError(f"Query tokens {bad} are outside 0..{spec.num_tokens - 1}.")
    names = [f"blocks.{layer}.attn.probs" for layer in layer_ids]
    has_pool, stack = pool_site(vit.model) is not None, stacks_layers(spec)
    cache = cache_forward(
        vit,
        pixels,
        spec,
        names + ([POOL_NAME] if has_pool else []),
        dtype=dtype,
        precision=precision,
        to_cpu=to_cpu,
        query_rows=query_tokens,
        exact=exact_logits,
        stack=stack,
    )
    maps = cache.stack("attn.probs") if stack else [cache[name] for name in names]
    return assemble_record(  # (L, B, heads, Q, T), the store's own buffer; or one tensor of windows per layer
        maps,
        cache.output,
        spec,
        layer_ids,
        query_tokens=query_tokens,
        pool_attention=cache.get(POOL_NAME),
    )
