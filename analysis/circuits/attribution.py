"""Direct logit attribution: the target logit as a sum over the embedding, every head and every MLP.

The residual stream after the last block is a sum of what each part wrote into it
(:mod:`analysis.engine.activations.points`)::

    x_L = e + Σ_l (Σ_h a_{l,h} + a_l^bias) + Σ_l m_l

with ``e = resid_pre`` of block 0 (patch, class and position embeddings), ``m_l`` block
``l``'s ``mlp.out``, and ``a_{l,h} = γ_l ⊙ (z_{l,h} · W_O[:, h]ᵀ)`` head ``h``'s share of the
attention branch (``z`` its output, ``W_O`` the output projection's columns for that head, ``γ_l``
the block's layer scale, 1 without one), ``a_l^bias = γ_l ⊙ b_O``. The readout — final norm,
pooling over tokens (class token or mean of patches), the pooled norm and the linear head —
is affine once each LayerNorm's scale ``σ`` is **frozen at its value on the real forward pass**:

    LN(x) = γ ⊙ (x − mean(x)) / σ + β     ⇒     logit_c = Σ_parts r_c(part) + const_c

where ``r_c`` is the readout's linear part (per token, before pooling) and ``const_c`` collects
the norms' ``β`` and the head's bias. So the attribution is exact **only with the norm scales
frozen**; it says what each part writes along the target's direction given this input's
normalisation, not what removing a part would do (that is :func:`head_ablation`). Method:
Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits" (direct path terms), as
TransformerLens's ``ActivationCache.decompose_resid`` / ``logit_attrs``; the frozen scale as
there (``apply_ln_to_stack`` with the cached scale).

Post-norm blocks (``x + norm(attn(x))``) are not linear in their heads: per-head terms are
refused for them, as are attention-pooling heads (SigLIP ``map``) and max pooling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..base.arguments import resolve_layers
from ..base.errors import AnalysisError
from ..engine.activations import run_with_cache
from ..engine.activations.points import POOL_NAME
from ..explanations.gradients import resolve_targets
from ..model.adapters.registry import block_sites
from ..model.windowed_support import refuse_windowed
from .ablation import check_separable_heads

__all__ = [
    "DirectLogitAttribution",
    "direct_logit_attribution",
    "output_attribution",
    "head_output_vectors",
    "OutputVectorParts",
    "output_vector_parts",
    "HEAD_VECTORS",
]

#: how the final norm's shifts are shared among the parts of an output vector
#: (:func:`output_vector_parts`); the first is the default.
HEAD_VECTORS = ("centred", "textspan")


@dataclass(frozen=True)
class DirectLogitAttribution:
    """Each part's direct contribution to the target logit (or logit difference), per token (what
    :func:`direct_logit_attribution` and :func:`output_attribution` return; float32 on the CPU).

    ``embedding.sum(-1) + heads.sum((1, 2, 3)) + head_bias.sum((1, 2)) + mlps.sum((1, 2)) +
    constant`` (``+ pool_mlp`` when there is one) equals ``target_logit`` (float rounding; tested
    at 1e-4).

    Attributes
    ----------
    embedding : torch.Tensor
        ``(B, T)`` the embeddings' terms (block 0's input), per token.
    heads : torch.Tensor
        ``(B, L, heads, T)`` head ``h`` of block ``l``, per token (the token where the head
        *wrote*, i.e. the query position).
    head_bias : torch.Tensor
        ``(B, L, T)`` each block's output-projection bias (times its layer scale).
    mlps : torch.Tensor
        ``(B, L, T)`` each block's MLP.
    constant : torch.Tensor
        ``(B,)`` the norms' shifts ``β`` and the head's bias, through the readout.
    target_logit : torch.Tensor
        ``(B,)`` the model's own logit (or logit difference) being decomposed.
    targets : torch.Tensor
        ``(B,)`` long, the class, or ``(B, 2)`` the pair ``(a, b)`` of ``logit_a − logit_b``
        (:func:`output_attribution`: whatever its ``weights_of`` names).
    heads_by_source : torch.Tensor or None, default None
        ``(B, L, heads, T)`` the same head terms by the token each head *read* (the key position:
        ``c_{l,h,s} = Σ_q P_{l,h}[q, s] · r_q(γ_l ⊙ W_O[:, h] v_{l,h,s})``), when asked for
        (``by_source=True``), else ``None``. Summed over tokens it equals ``heads`` summed over
        tokens.
    pool_mlp : torch.Tensor or None, default None
        ``(B,)`` an attention-pooling head's MLP branch ``mlp(norm(a))`` along the target, a
        remainder not split over the parts (``attention_pool=True`` only), else ``None``.
    """

    embedding: torch.Tensor
    heads: torch.Tensor
    head_bias: torch.Tensor
    mlps: torch.Tensor
    constant: torch.Tensor
    target_logit: torch.Tensor
    targets: torch.Tensor
    heads_by_source: torch.Tensor | None = None
    pool_mlp: torch.Tensor | None = None

    def total(self) -> torch.Tensor:
        """``(B,)`` the sum of every term (equals ``target_logit``)."""
        total = (
            self.embedding.sum(-1)
            + self.heads.sum((1, 2, 3))
            + self.head_bias.sum((1, 2))
            + self.mlps.sum((1, 2))
            + self.constant
        )
        return total if self.pool_mlp is None else total + self.pool_mlp

    def per_head(self) -> torch.Tensor:
        """``(B, L, heads)`` each head's term summed over tokens."""
        return self.heads.sum(-1)

    def per_layer(self) -> torch.Tensor:
        """``(B, L, 2)`` each block's attention (heads and bias) and MLP terms, summed over tokens."""
        return torch.stack([self.heads.sum((2, 3)) + self.head_bias.sum(-1), self.mlps.sum(-1)], dim=-1)


def direct_logit_attribution(
    vit, pixels: torch.Tensor, *, target=None, versus=None, fold_value_biases: bool = False
) -> DirectLogitAttribution:
    """Decompose the target logit of each image into direct contributions (module docstring).

    By default each head's value bias ``b_V,h`` stays in its head's term (``z_h = P_h·v_h`` with
    ``v_h = W_V,h x + b_V,h``). With ``fold_value_biases=True``, TransformerLens's convention
    (``fold_value_biases=True`` of ``HookedTransformer.from_pretrained``): since each row of
    ``P_h`` sums to 1, ``b_V,h`` reaches the output as the constant ``γ ⊙ W_O[:, h] b_V,h``, which
    moves from head ``h``'s term into ``head_bias``:

        a_{l,h} = γ ⊙ W_O[:, h] (z_h − b_V,h);    a_l^bias = γ ⊙ (b_O + Σ_h W_O[:, h] b_V,h)

    The sum over all parts is the same in both.

    The forward pass runs in float32 (no autocast), so the terms sum to the logit to float32
    rounding; a lower precision would break the decomposition by more than its checks allow.

    Parameters
    ----------
    vit : LoadedViT
        The model (:class:`~analysis.model.loading.LoadedViT`), with a linear class head.
    pixels : torch.Tensor
        ``(B, 3, H, W)`` preprocessed input (``vit.preprocess(image)``).
    target : int, sequence of int, torch.Tensor or None, default None
        The class decomposed (:func:`~analysis.explanations.gradients.resolve_targets`): a class,
        one per image, or ``None`` for each image's predicted class.
    versus : int, sequence of int, torch.Tensor or None, default None
        A second class (or one per image): decompose ``logit_target − logit_versus``; ``None``,
        the target logit alone.
    fold_value_biases : bool, default False
        Move each head's value-bias term into ``head_bias`` (TransformerLens's convention, above).

    Returns
    -------
    DirectLogitAttribution
        Per token: ``embedding`` ``(B, T)``, ``heads`` ``(B, L, heads, T)``, ``head_bias`` and
        ``mlps`` ``(B, L, T)``; ``constant`` and ``target_logit`` ``(B,)``; ``targets`` ``(B,)``,
        or ``(B, 2)`` with ``versus``.

    Raises
    ------
    AnalysisError
        A windowed model (Swin, SAM); no class head; heads that are not separable
        (:func:`~analysis.circuits.ablation.check_separable_heads`) or do not sum to the attention
        branch (post-norm blocks); no linear output projection; a readout that is not norm → pool →
        norm → linear head (attention or max pooling, a distilled two-head model, a norm that is
        not a LayerNorm); ``fold_value_biases=True`` without a value projection read here; a bad
        ``target`` or ``versus``.
    """
    refuse_windowed(vit, "direct_logit_attribution")
    spec = vit.spec
    if not spec.has_classifier:
        raise AnalysisError(f"Direct logit attribution needs class scores; this model has a {spec.head} head.")

    def class_weights(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        targets = resolve_targets(target, logits.cpu(), spec).to(logits.device)
        weights = F.one_hot(targets, logits.shape[-1]).float()  # (B, classes)
        if versus is None:
            return weights, targets
        versus_targets = resolve_targets(versus, logits.cpu(), spec).to(logits.device)
        return weights - F.one_hot(versus_targets, logits.shape[-1]).float(), torch.stack([targets, versus_targets], -1)

    return output_attribution(
        vit, pixels, class_weights, what="direct_logit_attribution", fold_value_biases=fold_value_biases
    )


def output_attribution(
    vit,
    pixels: torch.Tensor,
    weights_of,
    *,
    what: str = "output_attribution",
    by_source: bool = False,
    attention_pool: bool = False,
    fold_value_biases: bool = False,
) -> DirectLogitAttribution:
    """Decompose ``y_b = Σ_k w_{b,k} · output_{b,k}``, a weighted sum of the model's outputs, into
    direct contributions (module docstring). Needs a linear readout (class or embedding head);
    ``target_logit`` is ``y``.

    The forward pass runs in float32 (no autocast), so the terms sum to ``y`` to float32
    rounding; a lower precision would break the decomposition by more than its checks allow.

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`), with a linear class or embedding head.
    pixels : torch.Tensor
        ``(B, 3, H, W)`` preprocessed input (``vit.preprocess(image)``).
    weights_of : callable
        ``weights_of(output (B, K)) -> (w (B, K), targets)``: picks the weights from the real
        forward pass's output (a class's one-hot row; an image–text score's text direction) and
        names what ``targets`` records.
    what : str, default "output_attribution"
        The analysis named in errors.
    by_source : bool, default False
        Also split each head's term over the tokens it attended to (``heads_by_source``;
        Gandelsman et al. 2024's spatial decomposition).
    attention_pool : bool, default False
        Read an attention-pooling head with its probabilities frozen, its MLP branch a named
        remainder (``pool_mlp``; see :class:`_Readout`); ``False``: such a head is refused.
    fold_value_biases : bool, default False
        As :func:`direct_logit_attribution` (TransformerLens's convention).

    Returns
    -------
    DirectLogitAttribution
        The terms of ``y`` per token (``embedding`` ``(B, T)``, ``heads`` ``(B, L, heads, T)``, ...),
        ``target_logit`` ``y`` ``(B,)`` and ``targets`` as ``weights_of`` returned them.

    Raises
    ------
    AnalysisError
        A windowed model (Swin, SAM); heads that are not separable or do not sum to the attention
        branch (post-norm blocks); no linear output projection; a readout that is not norm → pool
        → norm → linear head as read (an attention-pooling head without ``attention_pool=True``,
        or one with no frozen linear form; max pooling; a distilled two-head model; a norm that is
        not a LayerNorm); ``fold_value_biases=True`` without a value projection read here.
    """
    refuse_windowed(vit, what)
    model, spec = vit.model, vit.spec
    check_separable_heads(vit, what)
    layers = spec.num_layers
    names = ["blocks.0.resid_pre", f"blocks.{layers - 1}.resid_post"]
    names += [f"blocks.{layer}.{point}" for layer in range(layers) for point in ("attn.z", "attn.out", "mlp.out")]
    if by_source:
        names += [f"blocks.{layer}.{point}" for layer in range(layers) for point in ("attn.probs", "attn.v")]
    pooled_by_attention = attention_pool and getattr(model, "attn_pool", None) is not None
    if pooled_by_attention:
        names.append(POOL_NAME)
    cache = run_with_cache(vit, pixels, names=names, precision="float32", to_cpu=False)
    logits = cache.output.float()
    weights, targets = weights_of(logits)
    weights = weights.float().to(logits.device)

    with torch.no_grad():
        readout = _Readout(
            model,
            cache[f"blocks.{layers - 1}.resid_post"].float(),
            spec,
            attention_pool=attention_pool,
            pool_probs=cache[POOL_NAME] if pooled_by_attention else None,
        )
        direction, offset = readout.direction(weights)  # (B, D) rows through the head, (B,) its bias
        project = lambda part: readout.linear(part.float(), direction)  # noqa: E731  (B, T, D) -> (B, T)
        sites = block_sites(model)
        heads, head_bias, mlps, by_sources = [], [], [], []
        reads = readout.per_token_direction(direction) if by_source else None  # (B, T, D)
        for layer, site in enumerate(sites):
            per_head, bias_term, weight, scale = _head_parts(model, cache, layer, site)
            value_bias = _value_bias(site, layer, per_head.shape[1]).to(per_head.device) if fold_value_biases else None
            if value_bias is not None:  # (heads, d): γ ⊙ W_O[:, h] b_V,h moves from each head to the bias
                constants = (
                    torch.einsum("hd,ehd->he", value_bias, weight.float().unflatten(1, value_bias.shape)) * scale
                )
                per_head = per_head - constants[None, :, None, :]
                bias_term = bias_term + constants.sum(0)
            heads.append(
                torch.stack([project(per_head[:, h]) for h in range(per_head.shape[1])], dim=1)
            )  # (B, heads, T)
            if reads is not None:
                by_sources.append(_by_source(cache, layer, weight, scale, reads, value_bias))
            head_bias.append(project(bias_term))
            mlps.append(project(cache[f"blocks.{layer}.mlp.out"]))
        embedding = project(cache["blocks.0.resid_pre"])
        constant = readout.constant(direction) + offset
        pool_mlp = readout.pool_remainder(direction)
    return DirectLogitAttribution(
        embedding=embedding.cpu(),
        heads=torch.stack(heads, 1).cpu(),
        head_bias=torch.stack(head_bias, 1).cpu(),
        mlps=torch.stack(mlps, 1).cpu(),
        constant=constant.cpu(),
        target_logit=(weights * logits).sum(-1).cpu(),
        targets=torch.as_tensor(targets).cpu(),
        heads_by_source=torch.stack(by_sources, 1).cpu() if by_sources else None,
        pool_mlp=None if pool_mlp is None else pool_mlp.cpu(),
    )


def _by_source(
    cache, layer: int, weight: torch.Tensor, scale, reads: torch.Tensor, value_bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``(B, heads, T)``: block ``layer``'s head terms by the key token each head read,
    ``Σ_q P[h, q, s] · (γ ⊙ W_O[:, h] v[h, s]) · g_q`` with ``g_q`` (``reads``, ``(B, T, D)``) the
    readout's linear map at query token ``q``; ``value_bias`` ``(heads, d)``: folded out of ``v``."""
    probs = cache[f"blocks.{layer}.attn.probs"].float()  # (B, heads, T, T)
    values = cache[f"blocks.{layer}.attn.v"].float()  # (B, kv_heads, T, d)
    heads = probs.shape[1]
    if values.shape[1] != heads:  # grouped-query values, repeated per head
        values = values.repeat_interleave(heads // values.shape[1], dim=1)
    if value_bias is not None:
        values = values - value_bias[None, :, None, :]
    written = torch.einsum("bhsd,ehd->bhse", values, weight.float().unflatten(1, (heads, values.shape[-1]))) * scale
    read = torch.einsum("bhse,bqe->bhqs", written, reads)  # (B, heads, T_query, T_key)
    return (read * probs).sum(2)


def head_output_vectors(
    vit, pixels: torch.Tensor, layers=None, *, attention_pool: bool = False, head_vectors: str = HEAD_VECTORS[0]
) -> torch.Tensor:
    """Each head's direct contribution to the model's output vector (an embedding, or the logits),
    summed over the tokens it wrote to, through the readout with its norms' scales frozen and
    without their shifts (module docstring): the vectors that :func:`output_attribution` reads
    along one direction.

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`), with a linear class or embedding head.
    pixels : torch.Tensor
        ``(B, 3, H, W)`` preprocessed input (``vit.preprocess(image)``).
    layers : int, sequence of int or None, default None
        Model layer indices, in the order asked (negative counts from the end); ``None``, every
        layer.
    attention_pool : bool, default False
        As :func:`output_attribution`.
    head_vectors : str, default "centred"
        ``"centred"`` (each part centred on its own) or ``"textspan"`` (TextSpan's convention; see
        :func:`output_vector_parts`), one of :data:`HEAD_VECTORS`.

    Returns
    -------
    torch.Tensor
        ``(B, len(layers), heads, outputs)`` float32 on the CPU.

    Raises
    ------
    AnalysisError
        An unknown ``head_vectors``; a bad ``layers``; the refusals of :func:`output_attribution`
        (``"textspan"``: of :func:`output_vector_parts`).
    """
    if head_vectors not in HEAD_VECTORS:
        raise AnalysisError(f"head_vectors={head_vectors!r} is not a convention; use one of {', '.join(HEAD_VECTORS)}.")
    if head_vectors == "textspan":
        parts = output_vector_parts(vit, pixels, head_vectors="textspan", attention_pool=attention_pool)
        return parts.heads[:, list(resolve_layers(layers, vit.spec.num_layers))]
    refuse_windowed(vit, "head_output_vectors")
    model, spec = vit.model, vit.spec
    check_separable_heads(vit, "head_output_vectors")
    last = spec.num_layers - 1
    layers = list(resolve_layers(layers, spec.num_layers))  # in the order asked
    names = [f"blocks.{last}.resid_post"] + [
        f"blocks.{layer}.{point}" for layer in layers for point in ("attn.z", "attn.out")
    ]
    pooled_by_attention = attention_pool and getattr(model, "attn_pool", None) is not None
    if pooled_by_attention:
        names.append(POOL_NAME)
    cache = run_with_cache(vit, pixels, names=list(dict.fromkeys(names)), precision="float32", to_cpu=False)
    sites = block_sites(model)
    with torch.no_grad():
        readout = _Readout(
            model,
            cache[f"blocks.{last}.resid_post"].float(),
            spec,
            attention_pool=attention_pool,
            pool_probs=cache[POOL_NAME] if pooled_by_attention else None,
        )
        vectors = []
        for layer in layers:
            per_head = _head_parts(model, cache, layer, sites[layer])[0]  # (B, heads, T, D)
            vectors.append(torch.stack([readout.vector(per_head[:, h]) for h in range(per_head.shape[1])], 1))
    return torch.stack(vectors, 1).cpu()


@dataclass(frozen=True)
class OutputVectorParts:
    """The model's output vector (an image embedding, or the logits) as a sum of direct parts
    (what :func:`output_vector_parts` returns; float32 on the CPU).

    Attributes
    ----------
    embedding : torch.Tensor
        ``(B, E)`` the embeddings (block 0's input).
    heads : torch.Tensor
        ``(B, L, heads, E)`` each head, summed over the tokens it wrote to.
    head_bias : torch.Tensor
        ``(B, L, E)`` each block's output-projection bias (zero under ``"textspan"``, which shares
        it among the block's heads).
    mlps : torch.Tensor
        ``(B, L, E)`` each block's MLP.
    constant : torch.Tensor
        ``(B, E)`` the norms' shifts and the head's bias (zero under ``"textspan"``, which shares
        them among the parts).
    pool_mlp : torch.Tensor or None
        ``(B, E)`` an attention-pooling head's MLP branch (``attention_pool=True``), else ``None``.
    output : torch.Tensor
        ``(B, E)`` what the parts sum to: the model's output ``u`` (``"centred"``) or ``u/‖u‖``
        (``"textspan"``).
    head_vectors : str
        The convention, one of :data:`HEAD_VECTORS`.
    """

    embedding: torch.Tensor
    heads: torch.Tensor
    head_bias: torch.Tensor
    mlps: torch.Tensor
    constant: torch.Tensor
    pool_mlp: torch.Tensor | None
    output: torch.Tensor
    head_vectors: str

    def total(self) -> torch.Tensor:
        """``(B, E)`` the sum of every part (equals :attr:`output`; tested at 1e-5)."""
        total = self.embedding + self.heads.sum((1, 2)) + self.head_bias.sum(1) + self.mlps.sum(1) + self.constant
        return total if self.pool_mlp is None else total + self.pool_mlp


def output_vector_parts(
    vit, pixels: torch.Tensor, *, head_vectors: str = HEAD_VECTORS[0], attention_pool: bool = False
) -> OutputVectorParts:
    """The output vector ``u`` of each image as a sum of the embeddings', heads', output biases',
    MLPs' and the readout's direct parts, the final norm's scale ``σ`` frozen (module docstring).
    The two conventions differ in where the norm's mean and shifts go:

    * ``"centred"`` (default): each part ``p`` is centred on its own mean and the shifts are one
      ``constant`` part: ``r(p) = W·(γ ⊙ (p − mean(p))/σ)``, ``constant = W·β + b``; they sum to ``u``.
    * ``"textspan"``: TextSpan's repository (``prs_hook.py``): the norm's mean ``μ`` of the
      pooled token and its shift ``β`` (and the head's bias ``b``) are shared equally among the
      ``N = 2L + 1`` parts (the embeddings, ``L`` attention blocks, ``L`` MLPs), a block's share
      and its output bias ``b_O`` equally among its ``H`` heads, and every part is divided by the
      image embedding's norm ``‖u‖``:

          r(p, k) = (W·(γ ⊙ (p − k·μ/N)/σ + k·β/N) + k·b/N) / ‖u‖,   k = 1 (embeddings, MLPs), 1/H (a head,
          whose ``p`` includes ``γ_l ⊙ b_O/H``)

      they sum to ``u/‖u‖``. Defined for a class-token readout through a LayerNorm and a linear
      projection (CLIP); other readouts are refused with the reason.

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`), with a linear class or embedding head.
    pixels : torch.Tensor
        ``(B, 3, H, W)`` preprocessed input (``vit.preprocess(image)``).
    head_vectors : str, default "centred"
        ``"centred"`` or ``"textspan"``, one of :data:`HEAD_VECTORS`.
    attention_pool : bool, default False
        As :func:`output_attribution` (``"centred"`` only).

    Returns
    -------
    OutputVectorParts
        The parts ``(B, E)`` (``heads`` ``(B, L, heads, E)``, ``head_bias`` and ``mlps``
        ``(B, L, E)``) and the ``output`` ``(B, E)`` they sum to.

    Raises
    ------
    AnalysisError
        An unknown ``head_vectors``; ``"textspan"`` with a readout other than the class token
        through a LayerNorm and a linear head; the refusals of :func:`output_attribution`.
    """
    if head_vectors not in HEAD_VECTORS:
        raise AnalysisError(f"head_vectors={head_vectors!r} is not a convention; use one of {', '.join(HEAD_VECTORS)}.")
    refuse_windowed(vit, "output_vector_parts")
    model, spec = vit.model, vit.spec
    check_separable_heads(vit, "output_vector_parts")
    textspan = head_vectors == "textspan"
    if textspan:
        _require_textspan_readout(model)
    layers = spec.num_layers
    names = ["blocks.0.resid_pre", f"blocks.{layers - 1}.resid_post"]
    names += [f"blocks.{layer}.{point}" for layer in range(layers) for point in ("attn.z", "attn.out", "mlp.out")]
    pooled_by_attention = attention_pool and getattr(model, "attn_pool", None) is not None
    if pooled_by_attention:
        names.append(POOL_NAME)
    cache = run_with_cache(vit, pixels, names=names, precision="float32", to_cpu=False)
    output = cache.output.float()  # (B, E)
    final = cache[f"blocks.{layers - 1}.resid_post"].float()
    with torch.no_grad():
        readout = _Readout(
            model,
            final,
            spec,
            attention_pool=attention_pool,
            pool_probs=cache[POOL_NAME] if pooled_by_attention else None,
        )
        sites = block_sites(model)
        heads, head_bias, mlps = [], [], []
        parts = [_head_parts(model, cache, layer, site) for layer, site in enumerate(sites)]
        if textspan:
            share = _TextSpanShare(model, readout, final, output, 2 * layers + 1)
            for per_head, bias_term, _, _ in parts:
                count = per_head.shape[1]
                heads.append(share(per_head[:, :, 0] + bias_term[:, None, 0] / count, 1.0 / count))  # (B, H, E)
                head_bias.append(torch.zeros_like(output))
            mlps = [share(cache[f"blocks.{layer}.mlp.out"][:, 0].float(), 1.0) for layer in range(layers)]
            embedding = share(cache["blocks.0.resid_pre"][:, 0].float(), 1.0)
            constant, pool_mlp, total = torch.zeros_like(output), None, output / output.norm(dim=-1, keepdim=True)
        else:
            for per_head, bias_term, _, _ in parts:
                heads.append(torch.stack([readout.vector(per_head[:, h]) for h in range(per_head.shape[1])], 1))
                head_bias.append(readout.vector(bias_term))
            mlps = [readout.vector(cache[f"blocks.{layer}.mlp.out"].float()) for layer in range(layers)]
            embedding = readout.vector(cache["blocks.0.resid_pre"].float())
            constant, pool_mlp, total = readout.constant_vector(), readout.pool_remainder_vector(), output
    return OutputVectorParts(
        embedding=embedding.cpu(),
        heads=torch.stack(heads, 1).cpu(),
        head_bias=torch.stack(head_bias, 1).cpu(),
        mlps=torch.stack(mlps, 1).cpu(),
        constant=constant.cpu(),
        pool_mlp=None if pool_mlp is None else pool_mlp.cpu(),
        output=total.cpu(),
        head_vectors=head_vectors,
    )


def _require_textspan_readout(model: Any) -> None:
    """AnalysisError unless the readout is TextSpan's: the class token through a LayerNorm and a linear head."""
    norm, head = getattr(model, "norm", None), getattr(model, "head", None)
    fc_norm = getattr(model, "fc_norm", None)
    if (
        getattr(model, "attn_pool", None) is not None
        or getattr(model, "global_pool", None) != "token"
        or not isinstance(norm, nn.LayerNorm)
        or not (fc_norm is None or isinstance(fc_norm, nn.Identity))
        or not isinstance(head, nn.Linear)
    ):
        raise AnalysisError(
            "head_vectors='textspan' follows TextSpan's code for CLIP: the class token through the final "
            "LayerNorm and a linear projection; this model reads its output otherwise (another pooling, "
            "an attention-pooling head or a second norm): use head_vectors='centred'."
        )


class _TextSpanShare:
    """TextSpan's per-part readout ``r(p, k)`` (:func:`output_vector_parts`): ``p`` ``(B, ..., D)``
    a part at the class token, ``k`` its share of the final norm's mean and shifts."""

    def __init__(self, model: Any, readout: _Readout, final: torch.Tensor, output: torch.Tensor, parts: int) -> None:
        norm, head = model.norm, model.head
        self.mean = final[:, 0].mean(-1)  # (B,) μ of the pooled token
        assert readout.norm_scale is not None, "TextSpan's readout has a final norm (checked)"
        self.scale = readout.norm_scale[:, 0, 0]  # (B,) σ, frozen
        self.gamma = norm.weight.float() if norm.weight is not None else torch.ones_like(final[0, 0])
        self.beta = norm.bias.float() if norm.bias is not None else torch.zeros_like(final[0, 0])
        self.weight = head.weight.float()  # (E, D)
        self.bias = head.bias.float() if head.bias is not None else torch.zeros(head.out_features, device=final.device)
        self.length = output.norm(dim=-1)  # (B,) ‖u‖
        self.parts = parts

    def __call__(self, part: torch.Tensor, share: float) -> torch.Tensor:
        extra = (1,) * (part.ndim - 2)  # broadcast the per-image values over any middle axes (heads)
        mean = self.mean.reshape(-1, *extra, 1) * share / self.parts
        normed = self.gamma * (part - mean) / self.scale.reshape(-1, *extra, 1) + self.beta * share / self.parts
        return (normed @ self.weight.T + self.bias * share / self.parts) / self.length.reshape(-1, *extra, 1)


# --------------------------------------------------------------------------- model pieces


def _head_parts(model: Any, cache, layer: int, site):  # a timm ViT: blocks read by name
    """Block ``layer``'s attention branch split by head: ``(B, heads, T, D)`` each head's output
    ``γ ⊙ W_O[:, h] z_h``, ``(B, T, D)`` the projection bias term, the projection weight and the
    layer scale; checked to sum to the branch the block added."""
    z = cache[f"blocks.{layer}.attn.z"].float()  # (B, T, heads, d)
    weight, bias = _projection(site, layer)  # (D, heads·d), (D,)
    scale = _layer_scale(model.blocks[layer])  # (D,) or a scalar 1
    per_head = torch.einsum("bthd,ehd->bhte", z, weight.float().unflatten(1, z.shape[2:])) * scale  # (B, heads, T, D)
    bias_term = (bias.float() * scale).expand(z.shape[0], z.shape[1], -1)  # (B, T, D)
    branch = cache[f"blocks.{layer}.attn.out"].float()
    error = (per_head.sum(1) + bias_term - branch).abs().max()
    if float(error) > 1e-4 * (1.0 + float(branch.abs().max())):
        raise AnalysisError(
            f"Block {layer}'s attention branch ({type(model.blocks[layer]).__name__}) is not a sum of its heads' "
            f"outputs through the projection (off by {float(error):.2g}; post-norm blocks normalise it): "
            "per-head direct logit attribution is not defined for this model."
        )
    return per_head, bias_term, weight, scale


def _projection(site, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight ``(D, heads·d)`` and bias ``(D,)`` of the output projection the site's adapter names."""
    projection = site.adapter.output_projection(site.module)
    if not isinstance(projection, nn.Linear):
        raise AnalysisError(
            f"Block {layer}'s attention has no linear output projection (its adapter, {site.adapter.name}, "
            "names none): DLA is not defined for it."
        )
    bias = (
        projection.bias
        if projection.bias is not None
        else torch.zeros(projection.out_features, device=projection.weight.device)
    )
    return projection.weight, bias


def _value_bias(site, layer: int, heads: int) -> torch.Tensor:
    """``(heads, d)`` the value projection's bias ``b_V`` of block ``layer``'s attention, per head
    (grouped-query values repeated per head; zeros without a bias), read from the module's own
    parameters: a fused ``qkv`` linear layer (its last third) or separate q, k, v layers joined as
    ``qkv`` (its last), timm's separate ``v_bias`` (EVA, BEiT) or a ``v_proj`` linear layer."""
    module = site.module
    width = _projection(site, layer)[0].shape[1]  # heads · d
    qkv: Any = getattr(module, "qkv", None)
    bias = None
    if isinstance(getattr(module, "v_bias", None), torch.Tensor):
        bias = module.v_bias
    elif isinstance(qkv, nn.Linear) and qkv.out_features == 3 * width:
        bias = None if qkv.bias is None else qkv.bias[2 * width :]
    elif isinstance(getattr(qkv, "parts", None), nn.ModuleList) and isinstance(qkv.parts[-1], nn.Linear):
        bias = qkv.parts[-1].bias  # separate q, k, v projections joined (a converted Hugging Face model)
    elif isinstance(getattr(module, "v_proj", None), nn.Linear):
        bias = module.v_proj.bias
    else:
        raise AnalysisError(
            f"Block {layer}'s attention ({type(module).__name__}) has no value projection read here (a qkv "
            "linear layer, v_bias or v_proj): fold_value_biases=True is not defined for it; use fold_value_biases=False."
        )
    if bias is None:
        return torch.zeros(heads, width // heads)
    bias = bias.detach().float().reshape(-1, width // heads)  # (kv_heads, d)
    return bias.repeat_interleave(heads // bias.shape[0], dim=0) if bias.shape[0] != heads else bias


def _layer_scale(block: nn.Module):
    """The factor between the projection's output and what the attention branch adds:
    ``ls1.gamma`` (timm LayerScale), ``gamma_1`` (EVA, BEiT), or 1."""
    gamma = getattr(getattr(block, "ls1", None), "gamma", None)
    if gamma is None:
        gamma = getattr(block, "gamma_1", None)
    return gamma.float() if isinstance(gamma, torch.Tensor) else 1.0


class _Readout:
    """The model's readout ``head(fc_norm(pool(norm(x))))`` with both norms' scales frozen at
    their values on ``final`` ``(B, T, D)``, the last block's output; checked against the model.

    ``attention_pool=True`` also reads an attention-pooling head (SigLIP's ``map``: one learned
    probe ``q`` over the tokens, ``a = W_proj·concat_h(Σ_t P[h, t]·W_v,h·x̂_t) + b``, then
    ``a + mlp(norm(a))``) with its probabilities ``P`` (``pool_probs``, the forward pass's
    ``pool.probs``) frozen at their values on this input: ``a``
    is then linear in the tokens, and ``mlp(norm(a))`` is one named remainder (:meth:`pool_remainder`),
    not split over the parts."""

    def __init__(
        self,
        model: Any,
        final: torch.Tensor,
        spec,
        *,
        attention_pool: bool = False,
        pool_probs: torch.Tensor | None = None,
    ) -> None:
        self.model = model  # a timm ViT: its norm, pooling and head read by name
        self.pool: Any = getattr(model, "attn_pool", None)  # timm's attention-pool head, or None
        if self.pool is not None and not attention_pool:
            raise AnalysisError(
                "This model pools its tokens with attention (a 'map' head), which is not linear: "
                "direct logit attribution is not defined for it."
            )
        tokens = final.shape[1]
        self.final_shape = tuple(final.shape)  # (B, T, D)
        weights = torch.zeros(tokens, device=final.device)  # (T,) the pooling's weight on each token
        pool = getattr(model, "global_pool", "token")
        if self.pool is not None:
            weights[:] = 1.0  # unused: the probe's probabilities weigh the tokens
        elif pool == "token":
            weights[0] = 1.0
        elif pool == "avg":
            first = 0 if getattr(model, "pool_include_prefix", False) else spec.num_prefix_tokens
            weights[first:] = 1.0 / (tokens - first)
        else:
            raise AnalysisError(f"Pooling {pool!r} is not linear: direct logit attribution is not defined for it.")
        self.weights = weights
        self.norm, self.fc_norm = self._norm(getattr(model, "norm", None)), self._norm(getattr(model, "fc_norm", None))
        self.norm_scale = self._scale(self.norm, final)  # (B, T, 1)
        normed = self._apply(self.norm, final, self.norm_scale)  # (B, T, D): the norm, exactly
        if self.pool is not None:
            pooled = self._read_attention_pool(normed, pool_probs)
        else:
            pooled = torch.einsum("btd,t->bd", normed, weights)
        self.fc_scale = self._scale(self.fc_norm, pooled)  # (B, 1)
        head = getattr(model, "head", None)
        embedding_identity = isinstance(head, nn.Identity) and attention_pool
        if not (isinstance(head, nn.Linear) or embedding_identity) or getattr(model, "head_dist", None) is not None:
            raise AnalysisError(
                f"{type(model).__name__}'s head is not one linear layer on the pooled token "
                "(e.g. a distilled two-head model): direct logit attribution is not defined for it."
            )
        assert isinstance(head, (nn.Linear, nn.Identity)), "refused above"
        self.head: nn.Linear | nn.Identity = head
        rebuilt = self.head(self._apply(self.fc_norm, pooled, self.fc_scale))
        norm = getattr(model, "norm", None) or nn.Identity()
        real = model.forward_head(norm(final)) if hasattr(model, "forward_head") else None
        if real is None or (rebuilt - real).abs().max() > 1e-4 * (1.0 + real.abs().max()):
            raise AnalysisError(
                f"{type(model).__name__}'s readout is not norm → pool → norm → linear head as read: "
                "direct logit attribution is not defined for it."
            )

    def _read_attention_pool(self, normed: torch.Tensor, probs: torch.Tensor | None) -> torch.Tensor:
        """The pooling head on ``normed`` ``(B, T, D)`` with its probabilities ``probs`` ``(B, heads,
        probes, T)`` from the same forward pass (the cache's ``pool.probs``): keep ``P`` ``(B, heads, T)``,
        ``a = W_proj·(P·v) + b`` and the remainder ``mlp(norm(a))`` ``(B, D)``, checked against the
        head's own output (``a + mlp(norm(a))``). Returns the pooled ``(B, D)``."""
        pool = self.pool
        if (
            getattr(pool, "pos_embed", None) is not None
            or getattr(pool, "pool", "token") != "token"
            or pool.latent.shape[1] != 1
            or not isinstance(pool.proj, nn.Linear)
            or not isinstance(pool.kv, nn.Linear)
        ):
            raise AnalysisError(
                "This attention-pooling head (several probes, its own position table, or no linear "
                "value and output projections) has no frozen linear form here."
            )
        if probs is None:
            raise AnalysisError("The attention-pooling head's probabilities (pool.probs) were not captured.")
        self.pool_probs = probs[:, :, 0].float()  # (B, heads, T)
        a = self._pool_tokens(normed).sum(1) + self._pool_bias()  # (B, D)
        pooled = pool(normed).float()  # (B, D): the head's own output
        mlp = getattr(pool, "mlp", None)
        expected = a if mlp is None else a + mlp(pool.norm(a[:, None]))[:, 0].float()
        if (expected - pooled).abs().max() > 1e-4 * (1.0 + pooled.abs().max()):
            raise AnalysisError(
                "The attention-pooling head is not W_proj·(P·v) + b, then + mlp(norm(·)), as read: "
                "direct attribution is not defined for it."
            )
        self.pool_rest = pooled - a  # (B, D): mlp(norm(a))
        return pooled

    def _pool_tokens(self, normed: torch.Tensor) -> torch.Tensor:
        """``(B, T, D)``: each token's share of the pooled vector, without shifts: the token or mean
        pooling weight, or the probe's probabilities through the pooling head's values and projection."""
        if self.pool is None:
            return normed * self.weights[None, :, None]
        dim = normed.shape[-1]
        heads = self.pool_probs.shape[1]
        values = normed @ self.pool.kv.weight[dim:].float().T  # (B, T, D) W_v·x̂, no bias
        weighted = values.unflatten(-1, (heads, -1)) * self.pool_probs.transpose(1, 2)[..., None]  # (B, T, heads, d)
        return weighted.flatten(-2) @ self.pool.proj.weight.float().T  # (B, T, D)

    def _pool_bias(self) -> torch.Tensor:
        """``(D,)`` the pooling head's shift from the value bias and the projection bias (``Σ_t P = 1``)."""
        dim = self.pool.proj.weight.shape[0]
        value_bias = self.pool.kv.bias[dim:].float() if self.pool.kv.bias is not None else 0.0
        bias = self.pool.proj.weight.float() @ (value_bias * torch.ones(dim, device=self.pool.proj.weight.device))
        return bias + (self.pool.proj.bias.float() if self.pool.proj.bias is not None else 0.0)

    @staticmethod
    def _norm(module):
        if module is None or isinstance(module, nn.Identity):
            return None
        if isinstance(module, nn.LayerNorm):
            return module
        raise AnalysisError(
            f"The readout's {type(module).__name__} is not a LayerNorm: its frozen form is not defined here."
        )

    @staticmethod
    def _scale(norm, x: torch.Tensor) -> torch.Tensor | None:
        """σ = sqrt(Var(x) + eps) over the last axis (LayerNorm's biased variance), frozen."""
        if norm is None:
            return None
        return (x.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()

    @staticmethod
    def _apply(norm, x: torch.Tensor, scale, *, shift: bool = True) -> torch.Tensor:
        """``γ ⊙ (x − mean(x)) / σ (+ β)``: the norm with its scale frozen (identity without a norm)."""
        if norm is None:
            return x
        out = (x - x.mean(-1, keepdim=True)) / scale
        if norm.weight is not None:
            out = out * norm.weight
        if shift and norm.bias is not None:
            out = out + norm.bias
        return out

    def direction(self, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(B, D)`` the head's rows weighted by ``weights`` ``(B, outputs)``, ``(B,)`` its bias so
        weighted (an identity head: ``weights`` themselves, no bias)."""
        if isinstance(self.head, nn.Identity):
            return weights, torch.zeros(weights.shape[0], device=weights.device)
        weight, head_bias = self.head.weight.float(), self.head.bias
        bias = head_bias.float() if head_bias is not None else torch.zeros(weight.shape[0], device=weight.device)
        return weights @ weight, weights @ bias

    def linear(self, part: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
        """``(B, T)``: each token's share of ``part`` ``(B, T, D)`` along ``direction``, through the
        frozen readout without its shifts (the pooling weight folded in per token)."""
        pooled = self._pool_tokens(self._apply(self.norm, part, self.norm_scale, shift=False))
        return torch.einsum(
            "btd,bd->bt", self._apply(self.fc_norm, pooled, self.fc_scale_per_token, shift=False), direction
        )

    def vector(self, part: torch.Tensor) -> torch.Tensor:
        """``(B, outputs)``: ``part`` ``(B, T, D)`` through the frozen readout without its shifts,
        summed over tokens (before the head's bias)."""
        pooled = self._pool_tokens(self._apply(self.norm, part, self.norm_scale, shift=False)).sum(1, keepdim=True)
        pooled = self._apply(self.fc_norm, pooled, self.fc_scale_per_token, shift=False)[:, 0]  # (B, D)
        return pooled if isinstance(self.head, nn.Identity) else pooled @ self.head.weight.float().T

    def per_token_direction(self, direction: torch.Tensor) -> torch.Tensor:
        """``(B, T, D)`` ``g`` with ``linear(part, direction)[b, t] = part[b, t] · g[b, t]``: the
        readout's linear map (frozen norms, pooling weights) as one vector per token, read off as
        the gradient of a linear function (exact)."""
        with torch.enable_grad():
            probe = torch.zeros(
                direction.shape[0],
                self.weights.shape[0],
                direction.shape[-1],
                device=direction.device,
                requires_grad=True,
            )
            (gradient,) = torch.autograd.grad(self.linear(probe, direction).sum(), probe)
        return gradient

    @property
    def fc_scale_per_token(self):
        return None if self.fc_scale is None else self.fc_scale[:, None, :]  # (B, 1, 1)

    def constant(self, direction: torch.Tensor) -> torch.Tensor:
        """``(B,)``: the norms' shifts (and an attention-pooling head's biases) through the rest of
        the readout, along ``direction``."""
        return (self._shift_pooled(direction.shape[0], direction.shape[-1], direction.device) * direction).sum(-1)

    def _shift_pooled(self, batch: int, dim: int, device) -> torch.Tensor:
        """``(B, D)``: the norms' shifts (and an attention-pooling head's biases) after the pooled norm."""
        shift = torch.zeros(batch, 1, dim, device=device)
        beta = self.norm.bias.float() if self.norm is not None and self.norm.bias is not None else None
        if self.pool is not None:
            values = 0.0 if beta is None else self.pool.proj.weight.float() @ (self.pool.kv.weight[dim:].float() @ beta)
            shift = shift + values + self._pool_bias()
        elif beta is not None:
            shift = shift + beta * float(self.weights.sum())
        pooled = self._apply(self.fc_norm, shift, self.fc_scale_per_token, shift=False)[:, 0]
        if self.fc_norm is not None and self.fc_norm.bias is not None:
            pooled = pooled + self.fc_norm.bias.float()
        return pooled

    def _through_head(self, pooled: torch.Tensor, bias: bool) -> torch.Tensor:
        if isinstance(self.head, nn.Identity):
            return pooled
        out = pooled @ self.head.weight.float().T
        return out + self.head.bias.float() if bias and self.head.bias is not None else out

    def constant_vector(self) -> torch.Tensor:
        """``(B, outputs)``: the shifts and the head's bias as one output vector (:meth:`constant`'s vector)."""
        batch, _, dim = self.final_shape
        return self._through_head(self._shift_pooled(batch, dim, self.weights.device), bias=True)

    def pool_remainder_vector(self) -> torch.Tensor | None:
        """``(B, outputs)`` an attention-pooling head's ``mlp(norm(a))`` through the frozen
        ``fc_norm`` and the head, or ``None`` without one."""
        if self.pool is None:
            return None
        rest = self._apply(self.fc_norm, self.pool_rest[:, None], self.fc_scale_per_token, shift=False)[:, 0]
        return self._through_head(rest, bias=False)

    def pool_remainder(self, direction: torch.Tensor) -> torch.Tensor | None:
        """``(B,)`` an attention-pooling head's ``mlp(norm(a))`` along ``direction`` (through the
        frozen ``fc_norm``), or ``None`` without one."""
        if self.pool is None:
            return None
        rest = self._apply(self.fc_norm, self.pool_rest[:, None], self.fc_scale_per_token, shift=False)[:, 0]
        return (rest * direction).sum(-1)
