"""AttnLRP: attention-aware layer-wise relevance propagation (Achtibat et al., ICML 2024,
"AttnLRP: Attention-Aware Layer-wise Relevance Propagation for Transformers").

The rules, applied as *gradient × input with modified backward passes* (the paper's
Section 3.4 and its reference library LXT do the same): the relevance of a tensor ``x`` is
``R(x) = x ⊙ ĝ(x)``, ``ĝ`` the gradient of the explained logit under these backward rules:

* **linear layers, convolutions, additions, poolings** — the ε-rule in the limit ε → 0, which is
  the plain gradient: ``R(x) = x ⊙ Wᵀ(R(y) / y)`` summed is ``R(y)`` less the bias's share ``b·ĝ(y)``;
* **LayerNorm / GroupNorm / RMSNorm** (the paper's Proposition 3.4, "LN rule") — the per-token
  standard deviation is treated as a constant (detached): the norm is then linear in ``x``, so
  the mean subtraction takes the ε-rule and the ``1/σ`` scaling the identity rule;
* **element-wise non-linearities** (GELU, SiLU, ..., and gates written out as ``x·σ(c·x)``: QuickGELU;
  eq. 9, identity rule) — ``R(x) = R(f(x))``, i.e. the backward multiplies by ``f(x)/x`` instead of ``f′(x)``;
* **products of two input-dependent tensors** (``q·kᵀ``, ``P·v``, a gated MLP's ``act(g)·x``;
  Propositions 3.2–3.3, uniform rule) — each factor receives ``1/n`` of the product's relevance
  (``n`` the number of factors that depend on the input; a factor computed from parameters
  alone, like an attention-pooling head's latent query, takes none). A fused attention call
  ``softmax(scale·q·kᵀ + M)·v`` thus passes ``1/4`` of its gradient to ``q`` and ``k`` and
  ``1/2`` to ``v`` (:func:`lrp_attention`);
* **softmax** (Proposition 3.1, Taylor decomposition at ``x`` with bias) —
  ``R(x) = x ⊙ (R(s) − s · Σ R(s))``, which in gradient × input form is the softmax's plain
  gradient (:func:`softmax_rule`).

**Conservation.** Every rule above passes its output relevance on whole except these bias terms,
which absorb relevance: each bias ``b`` of a linear layer, convolution or norm (``b·ĝ``), every
constant added to the stream (position embeddings, class/register tokens, a relative-position
bias), and each softmax's ``Σ R(s) − Σ R(x) = Σ s⊙ĝ(s) − Σ x⊙ĝ(x)``. So

    Σ_pixels R(x) = y_target − Σ bias terms

exactly (to float rounding): ``tests/test_attnlrp.py`` checks it on every supported family with
the biases zeroed and the softmax terms measured. The relevance at the pixels equals what LXT
computes with its own rules (``lxt.explicit``), checked in the optional ``lxt`` test tier.

**Windowed models** (Swin v1/v2, SwinV2-CR) take the same rules: partitioning into windows,
the cyclic shift and patch merging's regrouping only move values (their gradient moves relevance
with them), patch merging's reduction is a linear layer after a norm, and a shifted window's mask
and the relative-position bias (a table or a meta-network of the coordinates) are constants added
to the scores, absorbed like any bias. The relevance then lies on the stem's patch grid, as
input × gradient's does. ``tests/test_attnlrp.py`` checks conservation on Swin v1, v2 and V2-CR.

**Variants** (keyword options of :func:`attnlrp_relevance`, :func:`attnlrp` and
``explain(..., method="attnlrp", attention=..., gamma=...)``):

* ``attention="attnlrp"`` — the paper's rules above inside attention (uniform rule on ``q·kᵀ`` and
  ``P·v``, the softmax rule); ``attention="cp"`` — CP-LRP (Ali et al., ICML 2022, "XAI for
  Transformers: Better Explanations through Conservative Propagation"): the attention probabilities
  are constants (detached), so ``P·v`` is linear in ``v`` and passes its whole relevance to ``v``;
  the softmax and ``q·kᵀ`` receive none. LXT implements it the same way (``stop_gradient`` on ``q``
  and ``k`` in ``lxt.efficient``; ``attention.detach()`` then the ε-rule on ``P·v`` in
  ``lxt.explicit.special.multi_head_attention_cp``) and uses it inside a ViT's attention (the
  paper's Appendix A.2.3, "Tackling noise in vision transformers").
* ``gamma`` — the generalised LRP-γ rule (Montavon et al. 2019; Andéol et al. 2021, as zennit's
  ``rules.Gamma`` defines it, which LXT's ViT recipe registers on ``Conv2d`` and ``Linear``) on every
  ``F.conv2d`` (``"conv"``) and ``F.linear`` (``"linear"``) call that reads the input: with
  ``x⁺ = max(x, 0)``, ``x⁻ = min(x, 0)``, ``w⁽⁺⁾ = w + γ·max(w, 0)``, ``w⁽⁻⁾ = w + γ·min(w, 0)``, an
  output ``z_j > 0`` shares its relevance ``R_j`` in proportion to the contributions
  ``x_i⁺·w⁽⁺⁾_ij`` and ``x_i⁻·w⁽⁻⁾_ij`` (the ones that raise it, boosted), over the denominator
  ``D_j = Σ_i (x_i⁺ w⁽⁺⁾_ij + x_i⁻ w⁽⁻⁾_ij) + b_j + γ·max(b_j, 0)``; an output ``z_j < 0`` the same
  with ``w⁽⁺⁾`` and ``w⁽⁻⁾`` (and ``min(b_j, 0)``) swapped; ``z_j = 0`` passes none. ``γ = 0`` is the
  ε-rule (the plain gradient). :func:`gamma_rule` writes it in gradient × input form.

**Conservation of the variants.** ``attention="cp"`` absorbs no softmax term: every op inside
attention then passes its relevance on whole (``P·v`` linear in ``v``), so with the biases zeroed
``Σ_pixels R(x) = y_target`` exactly. The γ-rule is conservative except for its modified bias:
a layer passes on ``Σ_j R_j·(1 − b′_j/D_j)``, ``b′_j = b_j + γ·max(b_j, 0)`` (``min`` where
``z_j < 0``); with the biases zeroed it is exact. ``tests/test_attnlrp.py`` checks both.

The rules act while one thread runs one call (a :class:`~torch.overrides.TorchFunctionMode` on
this thread's stack), so a model shared by several threads is never modified.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakTensorKeyDictionary

from ..base.errors import AnalysisError
from ..engine.activations import run_with_hooks
from ..model.adapters.base import AttentionInputs, attend
from ..model.adapters.probabilities import attention_scores
from ..model.geometry import ViTSpec, input_spec
from .gradients import require_classes, resolve_targets

__all__ = [
    "ATTENTION_RULES",
    "DEFAULT_ATTENTION",
    "DEFAULT_GAMMA",
    "AttnLRPRelevance",
    "attnlrp",
    "attnlrp_relevance",
    "score_relevance",
    "lrp_rules",
    "lrp_attention",
    "softmax_rule",
    "gamma_rule",
    "gamma_values",
]

# Element-wise non-linearities that take the identity rule (ReLU's f(x)/x is its gradient already).
IDENTITY_RULE_FUNCTIONS = (F.gelu, F.silu, F.mish, F.hardswish, F.elu, F.selu, F.celu, F.softplus)
# Products: each input-dependent factor takes an equal share (uniform rule).
PRODUCT_FUNCTIONS = (
    torch.matmul,
    torch.Tensor.matmul,
    torch.Tensor.__matmul__,
    torch.bmm,
    torch.Tensor.bmm,
    torch.mul,
    torch.Tensor.mul,
    torch.Tensor.__mul__,
    torch.Tensor.__rmul__,
)
SOFTMAX_FUNCTIONS = (torch.softmax, torch.Tensor.softmax, F.softmax)
SIGMOID_FUNCTIONS = (torch.sigmoid, torch.Tensor.sigmoid, F.sigmoid)
# The γ-rule's layer kinds: the functions each kind covers.
GAMMA_FUNCTIONS = {F.linear: "linear", F.conv2d: "conv"}
#: The rules inside attention: the paper's (``"attnlrp"``) or CP-LRP's (``"cp"``).
ATTENTION_RULES = ("attnlrp", "cp")
#: ``explain(..., method="attnlrp")``'s recipe, chosen by deletion AUC (docs/guides/explanations.md):
#: CP-LRP inside attention and the γ-rule on the convolution and the linear layers.
DEFAULT_ATTENTION = "cp"
DEFAULT_GAMMA: Mapping[str, float | None] = MappingProxyType({"conv": 0.25, "linear": 0.1})


@dataclass(frozen=True)
class AttnLRPRelevance:
    """AttnLRP relevance of one batch, on the CPU.

    Attributes
    ----------
    pixels : torch.Tensor
        ``(B, 3, H, W)`` float32: relevance of each normalised input value, ``x ⊙ ĝ(x)``.
    tokens : torch.Tensor
        ``(B, T)`` float32: relevance of each token of block 0's input (prefix tokens first, summed
        over the width; a windowed model's cells of the stem's grid, row-major).
    map : torch.Tensor
        ``(B, gh, gw)`` float32: ``pixels`` summed over channels and each patch's pixels.
    logits : torch.Tensor
        ``(B, outputs)`` float32: the model's output.
    targets : torch.Tensor
        ``(B,)``: the explained classes, long (:func:`attnlrp_relevance`); of
        :func:`score_relevance`, the explained scores, float32.
    """

    pixels: torch.Tensor
    tokens: torch.Tensor
    map: torch.Tensor
    logits: torch.Tensor
    targets: torch.Tensor


def scaled_gradient(tensor: torch.Tensor, factor: float) -> torch.Tensor:
    """``tensor`` unchanged in value whose backward multiplies the gradient by ``factor``."""
    return tensor.detach() + (tensor - tensor.detach()) * factor


def identity_rule(output: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """``output = f(inputs)`` unchanged in value, with backward ``ĝ(x) = ĝ(y) · f(x)/x`` (eq. 9):
    ``R(x) = x·ĝ(x) = f(x)·ĝ(y) = R(y)``. Where ``x = 0`` the ratio is taken as 0 (``R(x) = 0`` there)."""
    ratio = torch.where(inputs == 0, torch.zeros_like(output), output / torch.where(inputs == 0, 1, inputs))
    return output.detach() + (inputs - inputs.detach()) * ratio.detach()


def uniform_rule(factors: list, depends=lambda t: t.requires_grad) -> list:
    """The factors of a product, each tensor that depends on the input (``depends(t)``; inside
    :class:`LrpRules`, computed from the explained input) with its gradient divided by the number
    of such factors (Propositions 3.2–3.3)."""
    dependent = [f for f in factors if isinstance(f, torch.Tensor) and depends(f)]
    if len(dependent) < 2:
        return factors
    share = 1.0 / len(dependent)
    return [scaled_gradient(f, share) if isinstance(f, torch.Tensor) and depends(f) else f for f in factors]


def softmax_rule(scores: torch.Tensor, dim: int) -> torch.Tensor:
    """The softmax of ``scores`` along ``dim`` with its plain gradient: in gradient × input form
    that is AttnLRP's softmax rule ``R(x) = x ⊙ (R(s) − s·Σ R(s))`` (Proposition 3.1),
    since ``ĝ(x) = s ⊙ (ĝ(s) − Σ s⊙ĝ(s))`` and ``R(s) = s⊙ĝ(s)``. The one place every softmax
    of a rule-following forward goes through.

    Parameters
    ----------
    scores : torch.Tensor
        Scores of any shape, e.g. ``(B, heads, Q, T)``.
    dim : int
        The dimension normalised.

    Returns
    -------
    torch.Tensor
        ``softmax(scores, dim)``, the shape and dtype of ``scores``.
    """
    return torch.softmax(scores, dim=dim)


def lrp_attention(
    inputs: AttentionInputs, depends=lambda t: t.requires_grad, attention: str = "attnlrp"
) -> torch.Tensor:
    """One fused attention call ``softmax(scale·q·kᵀ + M)·v`` computed explicitly under the rules:
    uniform rule on ``q·kᵀ`` and on ``P·v``, :func:`softmax_rule` in between (``attention="attnlrp"``);
    or CP-LRP (``attention="cp"``): ``P`` a constant, ``v`` takes the whole gradient of ``P·v``.

    Parameters
    ----------
    inputs : AttentionInputs
        A fused call's arguments: ``q`` ``(B, heads, Q, d)``, ``k`` and ``v`` ``(B, kv_heads, T, d)``,
        ``scale``, ``mask`` and ``is_causal`` (``q``, ``k``, ``v`` and ``scale`` must be set).
    depends : callable, default ``lambda t: t.requires_grad``
        ``depends(t)``: whether the tensor ``t`` depends on the explained input.
    attention : str, default "attnlrp"
        One of :data:`ATTENTION_RULES`.

    Returns
    -------
    torch.Tensor
        ``(B, heads, Q, d)``, the attention output.
    """
    assert inputs.q is not None and inputs.k is not None and inputs.v is not None, "a fused call's inputs"
    assert inputs.scale is not None, "a fused call's scale"
    if attention == "cp":
        scores = attention_scores(inputs.q, inputs.k, inputs.scale, mask=inputs.mask, is_causal=inputs.is_causal)
        return attend(torch.softmax(scores, dim=-1).detach(), inputs.v)  # (B, heads, Q, d); P constant
    q, k = uniform_rule([inputs.q, inputs.k], depends)
    scores = attention_scores(q, k, inputs.scale, mask=inputs.mask, is_causal=inputs.is_causal)  # (B, heads, Q, T)
    probs = softmax_rule(scores, dim=-1)
    probs, value = uniform_rule([probs, inputs.v], lambda t: t is probs or depends(t))
    return attend(probs, value)


def gamma_rule(
    layer, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, gamma: float, **kwargs
) -> torch.Tensor:
    """``layer(x, weight, bias, **kwargs)`` (``F.linear`` or ``F.conv2d``) unchanged in value, with the
    generalised γ-rule (module docstring; zennit's ``rules.Gamma``) as its backward in gradient ×
    input form: ``x ⊙ ĝ(x)`` is the relevance ``R_i = Σ_j c_ij/D_j · R_j``, ``R_j = y_j·ĝ(y)_j``.

    Written with autograd: ``D⁺ = layer(x⁺, w⁽⁺⁾, b + γb⁺) + layer(x⁻, w⁽⁻⁾)`` and
    ``D⁻ = layer(x⁺, w⁽⁻⁾, b + γb⁻) + layer(x⁻, w⁽⁺⁾)``; the output is ``y`` in value and
    ``(y/D)·D`` in gradient (``D = D⁺`` where ``y > 0``, ``D⁻`` where ``y < 0``, nothing where ``y = 0``),
    so ``ĝ(x)_i = Σ_j ĝ(y)_j·y_j/D_j·∂D_j/∂x_i``, ``x_i⁺ = x_i·[x_i > 0]`` with the mask a constant
    (``ĝ(x)_i = 0`` where ``x_i = 0``, whose relevance is 0, as zennit's).

    Parameters
    ----------
    layer : callable
        ``F.linear`` or ``F.conv2d``.
    x : torch.Tensor
        The layer's input, e.g. ``(B, T, in)`` or ``(B, C, H, W)``.
    weight : torch.Tensor
        The layer's weight, ``(out, in)`` or ``(out, C/groups, kh, kw)``.
    bias : torch.Tensor or None
        ``(out,)``, or ``None``.
    gamma : float
        ``γ ≥ 0``; 0 is the ε-rule (the plain gradient).
    **kwargs : Any
        The layer's other arguments (a convolution's ``stride``, ``padding``, ``dilation``, ``groups``).

    Returns
    -------
    torch.Tensor
        ``layer(x, weight, bias, **kwargs)``, its shape and dtype.
    """
    y = layer(x, weight, bias, **kwargs)
    positive_x, negative_x = x * (x > 0).to(x.dtype), x * (x < 0).to(x.dtype)
    w_pos, w_neg = weight + gamma * weight.clamp(min=0), weight + gamma * weight.clamp(max=0)
    b_pos = b_neg = None
    if bias is not None:
        b_pos, b_neg = bias + gamma * bias.clamp(min=0), bias + gamma * bias.clamp(max=0)
    raising = layer(positive_x, w_pos, b_pos, **kwargs) + layer(negative_x, w_neg, None, **kwargs)  # D⁺
    lowering = layer(positive_x, w_neg, b_neg, **kwargs) + layer(negative_x, w_pos, None, **kwargs)  # D⁻
    y_value = y.detach()
    denominator = torch.where(y_value > 0, raising, lowering)
    stable = denominator.detach()
    ratio = torch.where(y_value == 0, torch.zeros_like(y_value), y_value / torch.where(stable == 0, 1, stable))
    return y_value + (denominator - stable) * ratio


def gamma_values(gamma) -> dict[str, float | None]:
    """``{"conv": γ or None, "linear": γ or None}`` from a ``gamma`` option: ``None`` (no γ-rule),
    one float (both kinds) or a mapping of some of the kinds to a float or ``None``.

    Parameters
    ----------
    gamma : float, mapping of str to float or None, or None
        The option, as :func:`attnlrp_relevance` takes it.

    Returns
    -------
    dict of str to float or None
        Both kinds, ``None`` where the ε-rule (the plain gradient) stays.

    Raises
    ------
    AnalysisError
        A kind other than ``"conv"`` and ``"linear"``, or a γ that is not a finite number ≥ 0.
    """
    kinds = tuple(GAMMA_FUNCTIONS.values())
    if gamma is None:
        values: dict = {}
    elif isinstance(gamma, Mapping):
        unknown = sorted(set(gamma) - set(kinds))
        if unknown:
            raise AnalysisError(f"gamma has unknown layer kinds {unknown}; use some of {', '.join(kinds)}.")
        values = dict(gamma)
    else:
        values = dict.fromkeys(kinds, gamma)
    out: dict[str, float | None] = {}
    for kind in kinds:
        value = values.get(kind)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise AnalysisError(f"gamma[{kind!r}] must be a finite number ≥ 0 (or None), not {value!r}.")
            value = float(value)
        out[kind] = value
    return out


def _check_attention(attention: str) -> str:
    if attention not in ATTENTION_RULES:
        raise AnalysisError(f"attention={attention!r}: use one of {', '.join(map(repr, ATTENTION_RULES))}.")
    return attention


def _sdpa_arguments(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
) -> AttentionInputs:
    """The arguments of ``F.scaled_dot_product_attention`` (eval: no dropout)."""
    return AttentionInputs(
        q=query,
        k=key,
        v=value,
        mask=attn_mask,
        is_causal=bool(is_causal),
        scale=float(scale) if scale is not None else query.shape[-1] ** -0.5,
    )


def _layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """``F.layer_norm`` with the standard deviation detached (the LN rule)."""
    dims = tuple(range(-len(normalized_shape), 0))
    centred = x - x.mean(dims, keepdim=True)
    std = (centred.pow(2).mean(dims, keepdim=True) + eps).sqrt().detach()
    y = centred / std
    if weight is not None:
        y = y * weight
    return y + bias if bias is not None else y


def _rms_norm(x, normalized_shape, weight=None, eps=None):
    """``F.rms_norm`` with the root mean square detached (the LN rule)."""
    dims = tuple(range(-len(normalized_shape), 0))
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    y = x / (x.pow(2).mean(dims, keepdim=True) + eps).sqrt().detach()
    return y * weight if weight is not None else y


def _group_norm(x, num_groups, weight=None, bias=None, eps=1e-5):
    """``F.group_norm`` with each group's standard deviation detached (the LN rule)."""
    grouped = x.reshape(x.shape[0], num_groups, -1)  # (B, G, C/G·spatial)
    centred = grouped - grouped.mean(-1, keepdim=True)
    std = (centred.pow(2).mean(-1, keepdim=True) + eps).sqrt().detach()
    y = (centred / std).reshape(x.shape)
    per_channel = (1, -1) + (1,) * (x.ndim - 2)
    if weight is not None:
        y = y * weight.reshape(per_channel)
    return y + bias.reshape(per_channel) if bias is not None else y


def _normalize(x, p=2.0, dim=1, eps=1e-12, out=None):
    """``F.normalize`` with the norm detached (the identity rule on ``x/‖x‖``, the paper's Proposition 3.4)."""
    return x / x.norm(p, dim, keepdim=True).clamp_min(eps).detach()


_NORMS = {F.layer_norm: _layer_norm, F.group_norm: _group_norm, F.normalize: _normalize}
if hasattr(F, "rms_norm"):  # torch >= 2.4 (the floor, 2.3, has no F.rms_norm, so no module calls it)
    _NORMS[F.rms_norm] = _rms_norm


class LrpRules(TorchFunctionMode):
    """The AttnLRP backward rules (module docstring) for every op this thread runs while it is
    entered; values are unchanged (to float rounding in the norms), only gradients differ.

    Which tensors depend on the explained input is tracked op by op from :meth:`mark` (the
    parameters' ``requires_grad`` does not say: a user's module may leave it on): a rule applies
    to a tensor computed from the input, never to one computed from parameters alone (an
    attention-pooling head's latent query, a learned temperature, a layer scale)."""

    def __init__(self, attention: str = "attnlrp", gamma=None) -> None:
        super().__init__()
        self.attention = _check_attention(attention)
        self.gamma = gamma_values(gamma)
        self.dependent = WeakTensorKeyDictionary()  # tensor -> True: computed from the input
        # gates written out, x·σ(c·x) (QuickGELU, SiLU): σ's output -> its input; c·x -> x
        self.sigmoid_input = WeakTensorKeyDictionary()
        self.scaled_from = WeakTensorKeyDictionary()

    def mark(self, tensor: torch.Tensor) -> torch.Tensor:
        """Declare ``tensor`` the explained input (or computed from it)."""
        self.dependent[tensor] = True
        return tensor

    def depends(self, value) -> bool:
        return isinstance(value, torch.Tensor) and value in self.dependent

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not any(self.depends(leaf) for leaf in _leaves((args, kwargs))):
            return func(*args, **kwargs)  # nothing here comes from the input: no rule applies
        if self.attention == "cp" and func in SOFTMAX_FUNCTIONS and self.depends(args[0] if args else None):
            return func(*args, **kwargs).detach()  # CP-LRP: attention probabilities are constants (not marked)
        result = self.apply_rule(func, args, kwargs)
        for leaf in _leaves(result):
            if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
                self.dependent[leaf] = True
        return result

    def gated_input(self, args) -> torch.Tensor | None:
        """``x`` when the product's two factors are ``x`` and ``σ(x)`` or ``σ(c·x)``, else ``None``."""
        if len(args) != 2 or not all(isinstance(a, torch.Tensor) for a in args):
            return None
        for x, gate in (args, args[::-1]):
            inner = self.sigmoid_input.get(gate)
            if inner is not None and (inner is x or self.scaled_from.get(inner) is x):
                return x
        return None

    def apply_rule(self, func, args, kwargs):
        first = args[0] if args else None
        if func is F.scaled_dot_product_attention:
            return lrp_attention(_sdpa_arguments(*args, **kwargs), self.depends, self.attention)
        if func in GAMMA_FUNCTIONS and self.gamma[GAMMA_FUNCTIONS[func]] is not None and self.depends(first):
            return _gamma_call(func, self.gamma[GAMMA_FUNCTIONS[func]], args, kwargs)
        if func in _NORMS and self.depends(first):
            return _NORMS[func](*args, **kwargs)
        if func in SOFTMAX_FUNCTIONS and self.depends(first):
            return _softmax_call(func, args, kwargs)
        if func in SIGMOID_FUNCTIONS:
            result = func(*args, **kwargs)
            self.sigmoid_input[result] = first
            return result
        if func in PRODUCT_FUNCTIONS:
            gated = self.gated_input(args)
            if gated is not None:  # x·σ(c·x): one element-wise non-linearity of x, the identity rule
                return identity_rule(func(*args, **kwargs), gated)
            result = func(*uniform_rule(list(args), self.depends), **kwargs)
            if len(args) == 2 and isinstance(args[1], (int, float)) and self.depends(first):
                self.scaled_from[result] = first
            elif len(args) == 2 and isinstance(first, (int, float)) and self.depends(args[1]):
                self.scaled_from[result] = args[1]
            return result
        if func in IDENTITY_RULE_FUNCTIONS and self.depends(first):
            return identity_rule(func(*args, **kwargs), first)
        return func(*args, **kwargs)


def _leaves(value):
    """The tensors (and other leaves) inside nested tuples, lists and dicts of an op's arguments."""
    if isinstance(value, (tuple, list)):
        for item in value:
            yield from _leaves(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    else:
        yield value


def _softmax_call(func, args, kwargs):
    """A softmax call routed through :func:`softmax_rule` (dtype argument honoured)."""
    scores = args[0]
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    dtype = kwargs.get("dtype")
    if dim is None or len(args) > 2:
        return func(*args, **kwargs)
    return softmax_rule(scores if dtype is None else scores.to(dtype), dim)


def _gamma_call(func, gamma: float, args, kwargs):
    """An ``F.linear`` / ``F.conv2d`` call through :func:`gamma_rule`."""
    names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    bound = dict(zip(names, args))
    bound.update(kwargs)
    x, weight, bias = bound.pop("input"), bound.pop("weight"), bound.pop("bias", None)
    return gamma_rule(func, x, weight, bias, gamma, **bound)


def lrp_rules(*, attention: str = "attnlrp", gamma=None) -> LrpRules:
    """A fresh :class:`LrpRules` mode: ``with lrp_rules() as rules: rules.mark(x); y = model(x)``
    runs ``model`` with the AttnLRP backward rules on this thread only.

    Parameters
    ----------
    attention : str, default "attnlrp"
        The rules inside attention, one of :data:`ATTENTION_RULES` (module docstring).
    gamma : float, mapping of str to float or None, or None, default None
        The γ-rule's values (:func:`gamma_values`); ``None``, the ε-rule everywhere.

    Returns
    -------
    LrpRules
        A new, not yet entered, torch function mode.

    Raises
    ------
    AnalysisError
        An unknown ``attention`` or a bad ``gamma``.
    """
    return LrpRules(attention, gamma)


def _pool_to_patches(values: torch.Tensor, spec: ViTSpec) -> torch.Tensor:
    """``(B, H, W)`` -> ``(B, gh, gw)`` sums over each patch's pixels (the patch grid read off
    the model's spec; an image padded up to whole patches is padded with zeros)."""
    (gh, gw), (ph, pw) = spec.grid_size, spec.patch_size
    values = F.pad(values, (0, max(0, gw * pw - values.shape[-1]), 0, max(0, gh * ph - values.shape[-2])))
    return values[:, : gh * ph, : gw * pw].reshape(-1, gh, ph, gw, pw).sum((2, 4))


def attnlrp_relevance(
    vit, pixels: torch.Tensor, target=None, *, attention: str = DEFAULT_ATTENTION, gamma=DEFAULT_GAMMA
) -> AttnLRPRelevance:
    """AttnLRP relevance (module docstring) of the ``target`` logits, one forward and one backward
    pass in float32. The default recipe is LXT's for ViTs, CP-LRP inside attention and the γ-rule
    on the convolution (γ 0.25) and the linear layers (γ 0.1), the most faithful by deletion AUC
    (docs/guides/explanations.md); ``attention="attnlrp", gamma=None`` is the paper's rules throughout.

    Conservation: ``relevance.pixels.sum((1, 2, 3)) = logit − bias terms`` (module docstring), the
    bias terms by variant: the paper's rules absorb each bias (``b·ĝ``), the constants added to the
    stream and each softmax's term; CP-LRP no softmax term; the γ-rule its modified biases
    ``Σ_j R_j·b′_j/D_j`` instead of ``b·ĝ``. With the biases zeroed, CP-LRP with or without the γ-rule
    conserves the logit exactly. ``relevance.tokens.sum(1)`` likewise, less the terms of the patch
    embedding and the constants added before block 0.

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`).
    pixels : torch.Tensor
        ``(B, 3, H, W)`` floating preprocessed input (``vit.preprocess(image)``).
    target : int, sequence of int, torch.Tensor or None, default None
        The class to explain: a class index or a ``(B,)`` sequence of them (as in
        :func:`~analysis.explanations.resolve_targets`); ``None``, each image's predicted class.
    attention : str, default DEFAULT_ATTENTION ("cp")
        The rules inside attention: ``"attnlrp"`` (the paper's) or ``"cp"`` (CP-LRP).
    gamma : float, mapping of str to float or None, or None, default DEFAULT_GAMMA
        The γ-rule on ``"conv"`` and ``"linear"`` layers (:func:`gamma_values`): one γ for both, a
        mapping of the kinds to a γ or ``None``; ``None``, the ε-rule (the plain gradient) on both.

    Returns
    -------
    AttnLRPRelevance
        Pixel ``(B, 3, H, W)``, token ``(B, T)`` and patch ``(B, gh, gw)`` relevance, the logits and
        the ``(B,)`` long targets, on the CPU.

    Raises
    ------
    AnalysisError
        A model without classes, ``pixels`` that do not fit the model, a bad ``target``, an unknown
        ``attention`` or a bad ``gamma``.
    """
    spec = input_spec(vit, pixels)
    require_classes(spec, "AttnLRP")
    chosen: list[torch.Tensor] = []

    def class_scores(logits: torch.Tensor) -> torch.Tensor:  # (B,)
        chosen.append(resolve_targets(target, logits.detach().float().cpu(), spec))
        return logits.float().gather(1, chosen[0].to(logits.device)[:, None])[:, 0]

    relevance = score_relevance(vit, pixels, class_scores, attention=attention, gamma=gamma)
    return AttnLRPRelevance(relevance.pixels, relevance.tokens, relevance.map, relevance.logits, chosen[0])


def score_relevance(vit, pixels: torch.Tensor, score, *, attention: str = "attnlrp", gamma=None) -> AttnLRPRelevance:
    """AttnLRP relevance of any per-image score of the model's output, ``score(output) -> (B,)``
    (evaluated under the rules too: an ``F.normalize`` in it takes the identity rule, as an image–text
    cosine does in :func:`analysis.text.explain_text`). Its default is the paper's rules throughout
    (what :func:`analysis.text.explain_text` shows); :func:`attnlrp_relevance`'s is LXT's ViT recipe.

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`).
    pixels : torch.Tensor
        ``(B, 3, H, W)`` floating preprocessed input (``vit.preprocess(image)``).
    score : callable
        ``score(output) -> torch.Tensor``: one score ``(B,)`` per image of the model's
        ``(B, outputs)`` output.
    attention : str, default "attnlrp"
        The rules inside attention: ``"attnlrp"`` (the paper's) or ``"cp"`` (CP-LRP).
    gamma : float, mapping of str to float or None, or None, default None
        The γ-rule on ``"conv"`` and ``"linear"`` layers (:func:`gamma_values`); ``None``, none.

    Returns
    -------
    AttnLRPRelevance
        Its ``logits`` hold the model's output, its ``targets`` the ``(B,)`` float32 scores.

    Raises
    ------
    AnalysisError
        ``pixels`` that do not fit the model, an unknown ``attention`` or a bad ``gamma``.
    """
    rules_mode = lrp_rules(attention=attention, gamma=gamma)  # checks the options first
    spec = input_spec(vit, pixels)
    inputs = pixels.detach().to(vit.device, dtype=torch.float32).clone().requires_grad_(True)
    kept: list[torch.Tensor] = []

    def keep(stream: torch.Tensor) -> None:  # (B, T, D), block 0's input; (B, gh, gw, D) for a windowed model
        kept.append(stream)

    with torch.enable_grad():
        with rules_mode as rules:
            rules.mark(inputs)
            output = run_with_hooks(vit, inputs, {"blocks.0.resid_pre": keep}, precision="float32", differentiable=True)
            scores = score(output)  # (B,)
        pixel_gradient, stream_gradient = torch.autograd.grad(scores.sum(), [inputs, kept[0]])
    pixel_relevance = (inputs.detach() * pixel_gradient).float().cpu()  # (B, 3, H, W)
    token_relevance = (kept[0].detach() * stream_gradient).sum(-1).flatten(1).float().cpu()  # (B, T)
    return AttnLRPRelevance(
        pixels=pixel_relevance,
        tokens=token_relevance,
        map=_pool_to_patches(pixel_relevance.sum(1), spec),
        logits=output.detach().float().cpu(),
        targets=scores.detach().float().cpu(),
    )


def attnlrp(
    vit, pixels: torch.Tensor, target=None, *, attention: str = DEFAULT_ATTENTION, gamma=DEFAULT_GAMMA
) -> tuple[torch.Tensor, torch.Tensor]:
    """AttnLRP relevance (Achtibat et al. 2024) of the normalised input pooled per patch,
    ``map[p] = Σ_{c, (i, j) ∈ p} x[c, i, j]·ĝ[c, i, j]`` (signed: positive is evidence for the
    class), ``ĝ`` the gradient under the AttnLRP rules (module docstring). Sums to the logit less
    the bias terms. A windowed model's map lies on its stem's patch grid
    (:func:`~analysis.explanations.methods.explanation_grid`). The default recipe is LXT's for ViTs
    (CP-LRP inside attention, the γ-rule on the convolution and linear layers); the paper's rules
    throughout are ``attention="attnlrp", gamma=None`` (:func:`attnlrp_relevance`).

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`).
    pixels : torch.Tensor
        ``(B, 3, H, W)`` floating preprocessed input (``vit.preprocess(image)``).
    target : int, sequence of int, torch.Tensor or None, default None
        The class to explain: a class index or a ``(B,)`` sequence of them (as in
        :func:`~analysis.explanations.resolve_targets`); ``None``, each image's predicted class.

    attention : str, default DEFAULT_ATTENTION ("cp")
        The rules inside attention: ``"attnlrp"`` (the paper's) or ``"cp"`` (CP-LRP).
    gamma : float, mapping of str to float or None, or None, default DEFAULT_GAMMA
        The γ-rule on ``"conv"`` and ``"linear"`` layers (:func:`gamma_values`); ``None``, none.

    Returns
    -------
    tuple of torch.Tensor
        ``(maps, targets)``: ``(B, gh, gw)`` float32 maps and ``(B,)`` long targets, on the CPU.

    Raises
    ------
    AnalysisError
        As :func:`attnlrp_relevance`.
    """
    relevance = attnlrp_relevance(vit, pixels, target, attention=attention, gamma=gamma)
    return relevance.map, relevance.targets
