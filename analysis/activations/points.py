"""The named hook points of a ViT block: one table, one parser.

Every block ``i`` (``0 ≤ i < L``) exposes these points, in forward order. Names follow
TransformerLens (``blocks.{i}.hook_resid_pre`` there, ``blocks.{i}.resid_pre`` here); shapes
are those of a global-attention ViT with ``T = prefix + patches`` tokens of width ``D``:

==========================  ==========================  ==============================================
name                        shape                       what it is
==========================  ==========================  ==============================================
``blocks.{i}.resid_pre``    ``(B, T, D)``               the block's input (the residual stream)
``blocks.{i}.attn.q``       ``(B, heads, T, d)``        queries as the attention compared them (after
                                                        q-norm and rotary embedding)
``blocks.{i}.attn.k``       ``(B, kv_heads, T, d)``     keys, likewise
``blocks.{i}.attn.v``       ``(B, kv_heads, T, d)``     values
``blocks.{i}.attn.probs``   ``(B, heads, Q, K)``        ``softmax(scale·q·kᵀ + M)``, every bias and mask
                                                        included (``Q = K = T``)
``blocks.{i}.attn.z``       ``(B, T, heads, d)``        each head's output ``P·v`` as the output
                                                        projection receives it (TransformerLens
                                                        ``hook_z``)
``blocks.{i}.attn.out``     ``(B, T, D)``               what the attention branch adds to the stream
                                                        (projection, layer scale, post-norm included)
``blocks.{i}.resid_mid``    ``(B, T, D)``               ``resid_pre + attn.out``
``blocks.{i}.mlp.out``      ``(B, T, D)``               what the MLP branch adds to the stream
``blocks.{i}.resid_post``   ``(B, T, D)``               the block's output, ``resid_mid + mlp.out``
==========================  ==========================  ==============================================

A model with an attention-pooling head (SigLIP's and PE's ``map`` pooling: learned probe
queries attend over the output tokens) also has ``pool.probs``, ``(B, heads, probes, T)``, read
(and replaceable) like ``attn.probs``; it is cached when asked for by name or with ``names=None``.

Windowed and hierarchical models (Swin, SAM) have the same points, laid out as their blocks
compute them: ``resid_pre``/``resid_post`` are the block's NHWC map ``(B, gh, gw, C)`` on its
stage grid; ``attn.out`` and ``mlp.out`` are laid out as the block adds them (``mlp.out`` is
``(B, gh·gw, C)`` in Swin and SAM; SAM's windowed ``attn.out`` is per window, so its
``resid_mid`` is not defined: left out of ``names=None``, refused when asked for); timm's Swin
computes its softmax itself, so it has no ``attn.q``/``.k``/``.v`` (likewise any model built with
``fused_attn=False``); SAM's ``attn.q``/``.k``/``.v`` and every ``attn.z`` are per window,
``(B·windows, heads, Wt, d)`` and ``(B·windows, Wt, heads, d)`` (a global block: one window);
``attn.probs`` is ``(B, windows, heads, Wt, Wt)`` (pairs the shift mask removes exactly 0), as
:func:`analysis.capture_attention` records it. They have no prefix tokens.

``d`` is the head width; ``kv_heads < heads`` only for grouped-query attention. The branch
outputs are read where the block adds them (its ``drop_path1`` / ``drop_path2``, identity at
inference), so ``resid_mid = resid_pre + attn.out`` and ``resid_post = resid_mid + mlp.out``
hold exactly, for pre-norm (``x + ls(f(norm(x)))``) and post-norm (``x + norm(f(x))``) blocks
(unless a hook replaces ``resid_mid``: the branch then adds ``new − resid_pre``, not the cached
``attn.out``). In attention modules with an inner norm before the projection (timm's
``scale_norm``: BEiT-3, EVA-02-CLIP) ``attn.z`` is that norm's output, which mixes the heads;
the per-head analyses of :mod:`analysis.circuits` refuse such models.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import AnalysisError

__all__ = ["HookPoint", "HOOK_POINTS", "POOL_POINT", "POOL_NAME", "hook_point_names", "parse_hook_name"]


@dataclass(frozen=True)
class HookPoint:
    """One kind of point in every block: its name after ``blocks.{i}.``, its shape, and which
    axes index tokens (``token_axes[0]`` is the one :meth:`ActivationCache.patches` splits by default)."""

    suffix: str
    shape: str
    token_axes: tuple[int, ...]
    meaning: str


HOOK_POINTS: tuple[HookPoint, ...] = (
    HookPoint("resid_pre", "(B, T, D)", (1,), "the block's input"),
    HookPoint("attn.q", "(B, heads, T, d)", (2,), "queries as compared (after q-norm and rotary embedding)"),
    HookPoint("attn.k", "(B, kv_heads, T, d)", (2,), "keys as compared"),
    HookPoint("attn.v", "(B, kv_heads, T, d)", (2,), "values"),
    HookPoint("attn.probs", "(B, heads, Q, K)", (2, 3), "softmax(scale·q·kᵀ + M), every bias and mask included"),
    HookPoint("attn.z", "(B, T, heads, d)", (1,), "each head's output P·v, as the output projection receives it"),
    HookPoint("attn.out", "(B, T, D)", (1,), "what the attention branch adds to the residual stream"),
    HookPoint("resid_mid", "(B, T, D)", (1,), "resid_pre + attn.out"),
    HookPoint("mlp.out", "(B, T, D)", (1,), "what the MLP branch adds to the residual stream"),
    HookPoint("resid_post", "(B, T, D)", (1,), "the block's output, resid_mid + mlp.out"),
)
#: The attention-pooling head's probabilities (a model-level point, not a block's).
POOL_POINT = HookPoint("pool.probs", "(B, heads, probes, T)", (3,),
                       "an attention-pooling head's probe queries over the output tokens (SigLIP, PE)")
POOL_NAME = "pool.probs"
_BY_SUFFIX = {point.suffix: point for point in HOOK_POINTS}
_ORDER = {point.suffix: index for index, point in enumerate(HOOK_POINTS)}
_NAME = re.compile(r"blocks\.(\d+)\.(.+)")


def hook_point_names(num_layers: int) -> list[str]:
    """Every point of a model with ``num_layers`` blocks, in forward order."""
    return [f"blocks.{layer}.{point.suffix}" for layer in range(num_layers) for point in HOOK_POINTS]


def parse_hook_name(name: str, num_layers: int) -> tuple[int, HookPoint]:
    """``"blocks.3.attn.z"`` → ``(3, HookPoint("attn.z", ...))``; ``"pool.probs"`` →
    ``(num_layers, POOL_POINT)`` (after every block); AnalysisError naming the valid names otherwise."""
    if name == POOL_NAME:
        return num_layers, POOL_POINT
    match = _NAME.fullmatch(name) if isinstance(name, str) else None
    point = _BY_SUFFIX.get(match.group(2)) if match else None
    if point is None:
        raise AnalysisError(
            f"{name!r} is not a hook point. Names are 'blocks.{{i}}.<point>' with <point> one of: "
            f"{', '.join(_BY_SUFFIX)} (see analysis.activations.HOOK_POINTS); an attention-pooling head's is "
            f"'{POOL_NAME}'."
        )
    layer = int(match.group(1))
    if not 0 <= layer < num_layers:
        raise AnalysisError(f"{name!r}: this model has blocks 0..{num_layers - 1}.")
    return layer, point


def forward_order(name: str, num_layers: int) -> tuple[int, int]:
    """A sort key putting names in the order the forward pass reaches them."""
    layer, point = parse_hook_name(name, num_layers)
    return layer, _ORDER.get(point.suffix, 0)
