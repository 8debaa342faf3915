"""The image–text score as a sum over layers, heads and tokens (Gandelsman et al. 2024).

With the image embedding ``u = readout(x_L)`` and the residual stream after the last block a sum
of what each part wrote (:mod:`analysis.circuits.attribution`),

    x_L = e + Σ_l Σ_h a_{l,h} + Σ_l a_l^bias + Σ_l m_l,

the score ``s = exp(t)·cos(u, v) + b = w · u + b`` with ``w = exp(t)·v̂ / ‖u‖`` (``‖u‖`` and the
readout's LayerNorm scales **frozen at their values on this forward pass**, as the direct logit
attribution freezes them) is linear in the parts:

    s = Σ_{l,h,t} c_{l,h,t}  +  Σ_t c_emb,t  +  Σ_{l,t} c_mlp,l,t  +  Σ_{l,t} c_bias,l,t  +  c_const  +  b

``c_{l,h,t}`` is head ``h`` of block ``l``'s direct contribution written at token ``t``, read
through the final norm and projection (Gandelsman, Efros & Steinhardt 2024, "Interpreting CLIP's
image representation via text-based decomposition", eq. 2-4, there with the class token's
attention weights folded in; here per query token, summed it is the same). The remainder terms are
named: the embeddings (patch, class and position), the MLPs, the attention output biases, the
readout's shifts (``β`` of the norms, projection bias) and SigLIP's logit bias ``b``. The code is
:func:`analysis.circuits.output_attribution`, the direct logit attribution with the text
direction in place of a class row; the terms sum to the score to float32 rounding.

An attention-pooling head (SigLIP: a learned probe attends over the tokens, ``a = W_proj·(P·v) + b``,
then ``u = a + mlp(norm(a))``) is read with its attention probabilities ``P`` frozen at this input's
values, so ``a`` is linear in the tokens; its MLP branch ``mlp(norm(a))`` is one more named remainder
term, ``pool_mlp``, not split over the parts (it is not linear).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..circuits.attribution import DirectLogitAttribution, output_attribution
from ..model.geometry import ViTSpec, input_spec
from ..model.loading.loaded_clip import TextEncoding
from .prompts import one_prompt, require_clip

__all__ = ["TextDecomposition", "text_decomposition", "REMAINDER_TERMS"]

#: the terms of the score besides the heads, by name (fields of :class:`TextDecomposition`).
REMAINDER_TERMS = ("embedding", "mlps", "head_bias", "constant", "pool_mlp", "logit_bias")


@dataclass(frozen=True)
class TextDecomposition:
    """One prompt's score ``s`` of each image, term by term.

    Attributes
    ----------
    terms : DirectLogitAttribution
        The direct contributions, each along the text direction ``w = exp(t)·v̂/‖u‖``, float32 on the CPU:
        ``heads (B, L, heads, T)``, ``embedding (B, T)``, ``mlps (B, L, T)``, ``head_bias (B, L, T)``,
        ``constant (B,)`` (:class:`~analysis.circuits.DirectLogitAttribution`; ``terms.target_logit``
        is ``s − b``), ``heads_by_source (B, L, heads, T)``: each head's term split over the
        tokens it attended to (Gandelsman et al.'s spatial decomposition; the patches' share is
        the ``"decomposition"`` map), and ``pool_mlp (B,)`` for an attention-pooling head (else ``None``).
    logit_bias : float
        ``b``, SigLIP's learned bias (0 for CLIP).
    score : torch.Tensor
        ``(B,)`` the model's own score ``s``.
    spec : ViTSpec
        The token geometry (``spec.split_prefix`` separates the class token from the patches).
    """

    terms: DirectLogitAttribution
    logit_bias: float
    score: torch.Tensor
    spec: ViTSpec

    def heads(self) -> torch.Tensor:
        """``(B, L, heads)`` each head's contribution, summed over tokens."""
        return self.terms.per_head()

    def remainder(self) -> dict[str, torch.Tensor]:
        """The named non-head terms, each ``(B,)``: the embeddings, the MLPs, the attention output
        biases, the readout's shifts (``constant``), an attention-pooling head's MLP branch
        (``pool_mlp``, SigLIP only) and the logit bias."""
        t = self.terms
        bias = torch.full_like(t.constant, self.logit_bias)
        terms = {
            "embedding": t.embedding.sum(-1),
            "mlps": t.mlps.sum((1, 2)),
            "head_bias": t.head_bias.sum((1, 2)),
            "constant": t.constant,
            "logit_bias": bias,
        }
        if t.pool_mlp is not None:
            terms["pool_mlp"] = t.pool_mlp
        return terms

    def head_maps(self) -> torch.Tensor:
        """``(B, L, heads, gh, gw)``: each head's term split over the patches it attended to
        (``terms.heads_by_source`` without the prefix tokens' share, on the patch grid): head
        ``(l, h)``'s own patch map, in units of the score. Summed over layers and heads it is
        the ``"decomposition"`` map of :func:`~analysis.text.explain_text`."""
        by_source = self.terms.heads_by_source  # (B, L, heads, T)
        patches = self.spec.split_prefix(by_source, 3)[1]  # (B, L, heads, N)
        return patches.float().cpu().reshape(*patches.shape[:3], *self.spec.grid_size)

    def total(self) -> torch.Tensor:
        """``(B,)`` the sum of every term: equals :attr:`score` (tested at 1e-4)."""
        return self.terms.total() + self.logit_bias


def text_decomposition(clip, pixels: torch.Tensor, prompt) -> TextDecomposition:
    """Decompose each image's score with ``prompt``; see the module docstring.

    Parameters
    ----------
    clip : LoadedCLIP
        A two-tower model (:func:`~analysis.load_clip`); its image tower must be a global-attention ViT
        with a linear readout or an attention-pooling head.
    pixels : torch.Tensor
        ``(B, 3, H, W)`` images preprocessed for the image tower.
    prompt : str, token ids or TextEncoding
        One prompt: a string, one row of token ids, or a
        :class:`~analysis.model.loading.TextEncoding` of one prompt.

    Returns
    -------
    TextDecomposition
        The terms of each image's score, ``score`` ``(B,)``; :meth:`TextDecomposition.total` equals it to
        float32 rounding.

    Raises
    ------
    NoTextTowerError
        ``clip`` is an image-only model.
    TextPromptError
        ``prompt`` is empty, not one prompt, or text for a model without a tokenizer.
    AnalysisError
        ``pixels`` does not fit the image tower, or the tower is one the direct attribution refuses
        (windowed, heads mixed by an inner norm).
    """
    clip = require_clip(clip, "text_decomposition")
    spec = input_spec(clip.image, pixels)
    text = prompt if isinstance(prompt, TextEncoding) else one_prompt(clip, prompt)
    direction = F.normalize(text.embeddings.float(), dim=-1)  # (1, E) v̂

    def text_weights(output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``w_b = exp(t)·v̂/‖u_b‖`` (B, E), so that ``w_b · u_b = exp(t)·cos(u_b, v)``."""
        norms = output.float().norm(dim=-1, keepdim=True)  # (B, 1), frozen
        weights = clip.logit_scale * direction.to(output.device) / norms
        return weights, torch.zeros(output.shape[0], dtype=torch.long)

    terms = output_attribution(
        clip.image, pixels, text_weights, what="text_decomposition", by_source=True, attention_pool=True
    )
    bias = 0.0 if clip.logit_bias is None else float(clip.logit_bias)
    return TextDecomposition(terms=terms, logit_bias=bias, score=terms.target_logit + bias, spec=spec)
