"""The named hook points of a ViT block: one table, one parser.

Every block ``i`` (``0 ≤ i < L``) exposes these points, in forward order. Names follow
TransformerLens (``blocks.{i}.hook_resid_pre`` there, ``blocks.{i}.resid_pre`` here); shapes
are those of a global-attention ViT with ``T = prefix + patches`` tokens of width ``D``:

=============================  =========================  ==========================================  ===========================
name                           shape                      what it is                                  TransformerLens name
=============================  =========================  ==========================================  ===========================
``blocks.{i}.resid_pre``       ``(B, T, D)``              the block's input (the residual stream)     ``hook_resid_pre``
``blocks.{i}.ln1.scale``       ``(B, T, 1)``              the first norm's per-token scale ``s``      ``ln1.hook_scale``
                                                          (below)
``blocks.{i}.ln1.out``         ``(B, T, D)``              the first norm's output (``norm1``)         ``ln1.hook_normalized``
``blocks.{i}.attn.in``         ``(B, T, D)``              the attention module's input (pre-norm:     ``hook_attn_in`` (TL: per
                                                          ``ln1.out``)                                head, ours shared)
``blocks.{i}.attn.q``          ``(B, heads, T, d)``       queries as the attention compared them      ``attn.hook_q`` (TL:
                                                          (after q-norm and rotary embedding)         ``(B, T, heads, d)``)
``blocks.{i}.attn.k``          ``(B, kv_heads, T, d)``    keys, likewise                              ``attn.hook_k`` (likewise)
``blocks.{i}.attn.v``          ``(B, kv_heads, T, d)``    values                                      ``attn.hook_v`` (likewise)
``blocks.{i}.attn.scores``     ``(B, heads, Q, K)``       ``scale·q·kᵀ + M`` before the softmax,      ``attn.hook_attn_scores``
                                                          float32 (masked pairs ``−inf``)
``blocks.{i}.attn.probs``      ``(B, heads, Q, K)``       ``softmax(scale·q·kᵀ + M)``, every bias     ``attn.hook_pattern``
                                                          and mask included (``Q = K = T``)
``blocks.{i}.attn.z``          ``(B, T, heads, d)``       each head's output ``P·v`` as the output    ``attn.hook_z``
                                                          projection receives it
``blocks.{i}.attn.result``     ``(B, T, heads, D)``       each head's output in model width,          ``attn.hook_result``
                                                          ``z_h · W_Oᵀ[:, h·d:(h+1)·d]`` (no bias)
``blocks.{i}.attn.out``        ``(B, T, D)``              what the attention branch adds to the       ``hook_attn_out``
                                                          stream (projection, layer scale,
                                                          post-norm included)
``blocks.{i}.resid_mid``       ``(B, T, D)``              ``resid_pre + attn.out``                    ``hook_resid_mid``
``blocks.{i}.ln2.scale``       ``(B, T, 1)``              the second norm's per-token scale           ``ln2.hook_scale``
``blocks.{i}.ln2.out``         ``(B, T, D)``              the second norm's output (``norm2``)        ``ln2.hook_normalized``
``blocks.{i}.mlp.pre``         ``(B, T, hidden)``         the MLP's hidden units before the           ``mlp.hook_pre``
                                                          activation (``fc1``'s output; SwiGLU:
                                                          the gate ``fc1_g``'s; GluMlp: both halves)
``blocks.{i}.mlp.post``        ``(B, T, hidden)``         the hidden units as ``fc2`` receives them   ``mlp.hook_post``
                                                          (after the activation, gating and the
                                                          MLP's inner norm if any)
``blocks.{i}.mlp.out``         ``(B, T, D)``              what the MLP branch adds to the stream      ``hook_mlp_out``
``blocks.{i}.resid_post``      ``(B, T, D)``              the block's output, ``resid_mid + mlp.out`` ``hook_resid_post``
``ln_final.scale``             ``(B, T, 1)``              the final norm's per-token scale            ``ln_final.hook_scale``
``ln_final.out``               ``(B, T, D)``              the final norm's output (``model.norm``)    ``ln_final.hook_normalized``
``pool.probs``                 ``(B, heads, probes, T)``  an attention-pooling head's probabilities   (none)
=============================  =========================  ==========================================  ===========================

The TransformerLens names (``blocks.3.attn.hook_z``, ``blocks.3.hook_resid_pre``,
``ln_final.hook_scale``, …) are accepted wherever a name is (aliases of the names above; the
cache is keyed by the names above and looks either up). :data:`TRANSFORMERLENS_NAMES` is this
table's last column as data.

**Layouts.** ``attn.q``/``.k``/``.v`` are ``(B, heads, T, d)``, the layout the attention computes
in (the one ``F.scaled_dot_product_attention`` receives, and this library's since the cache
exists), while ``attn.z`` and ``attn.result`` put tokens before heads, as the output projection
receives them. TransformerLens keeps tokens before heads everywhere (``hook_q`` is
``(B, T, heads, d)``); its names here give *our* layout (``.transpose(1, 2)`` converts), so a
hook works on the tensor the attention actually uses, without a copy.

**Norm scale.** For a LayerNorm ``s = 1/sqrt(Var[x] + eps)`` (biased variance over the width),
for an RMSNorm (timm ``RmsNorm``/``SimpleNorm``, ``nn.RMSNorm``) ``s = 1/sqrt(mean(x²) + eps)``,
in float32, so that ``out = (x − mean(x))·s·w + b`` (RMSNorm: ``x·s·w``). A hook may replace
``s``: the norm's output becomes ``(out − b)·s'/s + b``, the output with the new scale.
Its gradient (gradient mode) is with the centred input held fixed, as in TransformerLens.

**attn.result.** ``Σ_h attn.result[..., h, :] + b_O`` equals the projection's output, which is
``attn.out`` in a pre-norm block without layer scale (``attn.out = ls(Σ_h result_h + b_O)``
otherwise). A replaced ``attn.result`` makes the projection output ``Σ_h result_h + b_O``.

**Norms.** ``ln1`` is the block's first norm wherever the block applies it: before the
attention in a pre-norm block (then ``ln1.out`` is ``attn.in``), on the attention's output in a
post-norm one (Swin v2); likewise ``ln2`` and the MLP. A block or model without such a norm (a
model that pools first has ``fc_norm``, not ``norm``) has no ``ln*`` points.

**Gradients.** ``run_with_cache(vit, pixels, names, grad_of=fn)`` also keeps, for every cached
point, the gradient of the scalar ``fn(output)`` with respect to it: ``cache.grad(name)``, the
point's shape (TransformerLens's ``run_with_cache(incl_bwd=True)``, which keys it
``name + "_grad"``). See :mod:`analysis.engine.activations.run`.

**stop_at_layer.** ``run_with_cache(..., stop_at_layer=n)`` runs blocks ``0..n−1`` only (no later
block, norm or head): the cache's ``residual`` is the stream after block ``n − 1`` (its
``resid_post``; ``n = 0``: the input of block 0) and ``logits`` is ``None``.

A model with an attention-pooling head (SigLIP's and PE's ``map`` pooling: learned probe
queries attend over the output tokens) also has ``pool.probs``, ``(B, heads, probes, T)``, read
(and replaceable) like ``attn.probs``; it is cached when asked for by name or with ``names=None``.

Windowed and hierarchical models (Swin, SAM) have the same points, laid out as their blocks
compute them: ``resid_pre``/``resid_post`` are the block's NHWC map ``(B, gh, gw, C)`` on its
stage grid; ``attn.out`` and ``mlp.out`` are laid out as the block adds them (``mlp.out`` is
``(B, gh·gw, C)`` in Swin and SAM; SAM's windowed ``attn.out`` is per window, so its
``resid_mid`` is not defined: left out of ``names=None``, refused when asked for); timm's Swin
computes its softmax itself, so it has no ``attn.q``/``.k``/``.v``/``.scores`` (likewise any model
built with ``fused_attn=False``); SAM's ``attn.q``/``.k``/``.v``/``.scores`` and every ``attn.z``,
``attn.result``, ``attn.in`` are per window, ``(B·windows, heads, Wt, d)``,
``(B·windows, heads, Wt, Wt)``, ``(B·windows, Wt, heads, d)`` (a global block: one window);
``attn.probs`` is ``(B, windows, heads, Wt, Wt)`` (pairs the shift mask removes exactly 0), as
:func:`analysis.capture_attention` records it; the norm and MLP points are laid out as the block
computes them (NHWC maps or ``(B, gh·gw, ·)``). They have no prefix tokens.

``d`` is the head width; ``kv_heads < heads`` only for grouped-query attention. The branch
outputs are read where the block adds them (timm's ``drop_path1`` / ``drop_path2``, identity at
inference), so ``resid_mid = resid_pre + attn.out`` and ``resid_post = resid_mid + mlp.out``
hold exactly, for pre-norm (``x + ls(f(norm(x)))``) and post-norm (``x + norm(f(x))``) blocks
(``swinv2_cr`` blocks with a ``norm3`` normalise the stream after the MLP branch:
``resid_post = norm3(resid_mid + mlp.out)``; unless a hook replaces ``resid_mid``: the branch then adds ``new − resid_pre``, not the cached
``attn.out``). In attention modules with an inner norm before the projection (timm's
``scale_norm``: BEiT-3, EVA-02-CLIP) ``attn.z`` is that norm's output, which mixes the heads;
the per-head analyses of :mod:`analysis.circuits` refuse such models.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...base.errors import AnalysisError

__all__ = [
    "HookPoint",
    "HOOK_POINTS",
    "MODEL_POINTS",
    "POOL_POINT",
    "POOL_NAME",
    "TRANSFORMERLENS_NAMES",
    "hook_point_names",
    "parse_hook_name",
    "canonical_name",
]


@dataclass(frozen=True)
class HookPoint:
    """One kind of point in every block: its name after ``blocks.{i}.``, its shape, and which
    axes index tokens (``token_axes[0]`` is the one :meth:`ActivationCache.patches` splits by
    default). Model-level points (``ln_final.*``, ``pool.probs``) carry their whole name.

    Attributes
    ----------
    suffix : str
        The name after ``blocks.{i}.`` (e.g. ``"attn.probs"``), or a model-level point's whole name.
    shape : str
        Its shape in a global-attention ViT, as prose (e.g. ``"(B, heads, Q, K)"``).
    token_axes : tuple of int
        The axes that index tokens (``attn.probs``: ``(2, 3)``, queries then keys).
    meaning : str
        What it is, in a few words.
    """

    suffix: str
    shape: str
    token_axes: tuple[int, ...]
    meaning: str


HOOK_POINTS: tuple[HookPoint, ...] = (
    HookPoint("resid_pre", "(B, T, D)", (1,), "the block's input"),
    HookPoint("ln1.scale", "(B, T, 1)", (1,), "the first norm's per-token scale 1/sqrt(Var[x]+eps) (RMSNorm: 1/rms)"),
    HookPoint("ln1.out", "(B, T, D)", (1,), "the first norm's output"),
    HookPoint("attn.in", "(B, T, D)", (1,), "the attention module's input"),
    HookPoint("attn.q", "(B, heads, T, d)", (2,), "queries as compared (after q-norm and rotary embedding)"),
    HookPoint("attn.k", "(B, kv_heads, T, d)", (2,), "keys as compared"),
    HookPoint("attn.v", "(B, kv_heads, T, d)", (2,), "values"),
    HookPoint("attn.scores", "(B, heads, Q, K)", (2, 3), "scale·q·kᵀ + M before the softmax (float32)"),
    HookPoint("attn.probs", "(B, heads, Q, K)", (2, 3), "softmax(scale·q·kᵀ + M), every bias and mask included"),
    HookPoint("attn.z", "(B, T, heads, d)", (1,), "each head's output P·v, as the output projection receives it"),
    HookPoint("attn.result", "(B, T, heads, D)", (1,), "each head's output in model width, z_h·W_O[h] (no bias)"),
    HookPoint("attn.out", "(B, T, D)", (1,), "what the attention branch adds to the residual stream"),
    HookPoint("resid_mid", "(B, T, D)", (1,), "resid_pre + attn.out"),
    HookPoint("ln2.scale", "(B, T, 1)", (1,), "the second norm's per-token scale"),
    HookPoint("ln2.out", "(B, T, D)", (1,), "the second norm's output"),
    HookPoint("mlp.pre", "(B, T, hidden)", (1,), "the MLP's hidden units before the activation"),
    HookPoint("mlp.post", "(B, T, hidden)", (1,), "the MLP's hidden units as its output layer receives them"),
    HookPoint("mlp.out", "(B, T, D)", (1,), "what the MLP branch adds to the residual stream"),
    HookPoint("resid_post", "(B, T, D)", (1,), "the block's output, resid_mid + mlp.out"),
)
#: The attention-pooling head's probabilities (a model-level point, not a block's).
POOL_POINT = HookPoint(
    "pool.probs",
    "(B, heads, probes, T)",
    (3,),
    "an attention-pooling head's probe queries over the output tokens (SigLIP, PE)",
)
POOL_NAME = "pool.probs"
#: Points of the model, not of a block, in forward order: the final norm, then the pooling head.
MODEL_POINTS: tuple[HookPoint, ...] = (
    HookPoint("ln_final.scale", "(B, T, 1)", (1,), "the final norm's per-token scale"),
    HookPoint("ln_final.out", "(B, T, D)", (1,), "the final norm's output (model.norm)"),
    POOL_POINT,
)
#: Every name of the table (block points after ``blocks.{i}.``) → its TransformerLens name.
TRANSFORMERLENS_NAMES: dict[str, str] = {
    "resid_pre": "hook_resid_pre",
    "ln1.scale": "ln1.hook_scale",
    "ln1.out": "ln1.hook_normalized",
    "attn.in": "hook_attn_in",
    "attn.q": "attn.hook_q",
    "attn.k": "attn.hook_k",
    "attn.v": "attn.hook_v",
    "attn.scores": "attn.hook_attn_scores",
    "attn.probs": "attn.hook_pattern",
    "attn.z": "attn.hook_z",
    "attn.result": "attn.hook_result",
    "attn.out": "hook_attn_out",
    "resid_mid": "hook_resid_mid",
    "ln2.scale": "ln2.hook_scale",
    "ln2.out": "ln2.hook_normalized",
    "mlp.pre": "mlp.hook_pre",
    "mlp.post": "mlp.hook_post",
    "mlp.out": "hook_mlp_out",
    "resid_post": "hook_resid_post",
    "ln_final.scale": "ln_final.hook_scale",
    "ln_final.out": "ln_final.hook_normalized",
}
_BY_SUFFIX = {point.suffix: point for point in HOOK_POINTS}
_MODEL_BY_NAME = {point.suffix: point for point in MODEL_POINTS}
_FROM_TRANSFORMERLENS = {lens: ours for ours, lens in TRANSFORMERLENS_NAMES.items()}
_ORDER = {point.suffix: index for index, point in enumerate(HOOK_POINTS)}
_NAME = re.compile(r"blocks\.(\d+)\.(.+)")


def canonical_name(name: str) -> str:
    """The table's name for ``name``, which may be a TransformerLens alias
    (``"blocks.3.attn.hook_z"`` → ``"blocks.3.attn.z"``); other names are returned unchanged.

    Parameters
    ----------
    name : str
        A hook-point name, ours or TransformerLens's (a non-string is returned as it is).

    Returns
    -------
    str
        The table's name; not checked to be a hook point (:func:`parse_hook_name` checks).
    """
    if not isinstance(name, str):
        return name
    if name in _FROM_TRANSFORMERLENS:
        return _FROM_TRANSFORMERLENS[name]
    match = _NAME.fullmatch(name)
    if match and match.group(2) in _FROM_TRANSFORMERLENS:
        return f"blocks.{match.group(1)}.{_FROM_TRANSFORMERLENS[match.group(2)]}"
    return name


def hook_point_names(num_layers: int) -> list[str]:
    """Every block point of a model with ``num_layers`` blocks, in forward order.

    Parameters
    ----------
    num_layers : int
        The model's number of blocks ``L``.

    Returns
    -------
    list of str
        ``blocks.{i}.<point>`` for ``i`` in ``0..L-1`` and each point of :data:`HOOK_POINTS`
        (model-level points not included).
    """
    return [f"blocks.{layer}.{point.suffix}" for layer in range(num_layers) for point in HOOK_POINTS]


def parse_hook_name(name: str, num_layers: int) -> tuple[int, HookPoint]:
    """``"blocks.3.attn.z"`` (or its TransformerLens alias ``"blocks.3.attn.hook_z"``) →
    ``(3, HookPoint("attn.z", ...))``; a model-level name (``"ln_final.out"``, ``"pool.probs"``) →
    ``(num_layers, point)`` (after every block); AnalysisError naming the valid names otherwise.

    Parameters
    ----------
    name : str
        A hook-point name, ours or its TransformerLens alias.
    num_layers : int
        The model's number of blocks ``L``.

    Returns
    -------
    tuple of (int, HookPoint)
        ``(layer, point)``; ``layer`` is ``num_layers`` for a model-level point.

    Raises
    ------
    AnalysisError
        ``name`` is not a hook point, or names a block outside ``0..num_layers-1``.
    """
    name = canonical_name(name)
    if name in _MODEL_BY_NAME:
        return num_layers, _MODEL_BY_NAME[name]
    match = _NAME.fullmatch(name) if isinstance(name, str) else None
    point = _BY_SUFFIX.get(match.group(2)) if match else None
    if match is None or point is None:
        raise AnalysisError(
            f"{name!r} is not a hook point. Names are 'blocks.{{i}}.<point>' with <point> one of: "
            f"{', '.join(_BY_SUFFIX)} (see analysis.engine.activations.HOOK_POINTS), or a model's "
            f"{', '.join(repr(n) for n in _MODEL_BY_NAME)}; TransformerLens names are accepted too "
            "(analysis.engine.activations.TRANSFORMERLENS_NAMES)."
        )
    layer = int(match.group(1))
    if not 0 <= layer < num_layers:
        raise AnalysisError(f"{name!r}: this model has blocks 0..{num_layers - 1}.")
    return layer, point


def forward_order(name: str, num_layers: int) -> tuple[int, int]:
    """A sort key putting names in the order the forward pass reaches them."""
    layer, point = parse_hook_name(name, num_layers)
    if layer == num_layers:
        return layer, list(_MODEL_BY_NAME).index(point.suffix)
    return layer, _ORDER[point.suffix]
