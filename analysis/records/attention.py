"""The record of one forward pass's attention: :class:`AttentionRecord`.

What :func:`analysis.engine.capture.capture_attention` returns for a ViT (a windowed model's record is
:class:`analysis.records.windowed.WindowedAttentionRecord`). The type lives below the engine that fills
it, so the analyses, queries and checks that read a record need not import the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

import torch

from ..base.arguments import check_index
from ..base.errors import AnalysisError
from ..model.geometry import LayerGeometry, ViTSpec

__all__ = ["AttentionRecord", "AttentionRecordProtocol"]


@runtime_checkable
class AttentionRecordProtocol(Protocol):
    """What every family's attention record answers: :class:`AttentionRecord` (global attention,
    one ``(L, B, heads, Q, T)`` stack) and :class:`analysis.records.windowed.WindowedAttentionRecord`
    (one ``(B, windows, heads, Wt, Wt)`` tensor per layer). An analysis asks the record for a
    layer's position, maps and geometry, and branches on the record's type at most once, where
    the two layouts need two implementations.

    Attributes
    ----------
    logits : torch.Tensor
        ``(B, classes)`` the model's output for the same forward pass.
    spec : ViTSpec
        The token geometry of this input, with ``spec.geometry(l)`` each layer's.
    layers : tuple of int
        Model layer index of each captured layer, in the record's order.
    """

    logits: torch.Tensor
    spec: ViTSpec
    layers: tuple[int, ...]

    def layer_position(self, layer: int) -> int:
        """Position among the captured layers of model layer ``layer``."""
        ...

    def layer_maps(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s attention probabilities, in the record's own layout."""
        ...

    def geometry(self, layer: int) -> LayerGeometry:
        """The :class:`~analysis.model.geometry.LayerGeometry` that layer ``layer`` attended with."""
        ...


@dataclass(frozen=True)
class AttentionRecord:
    """Attention captured from one forward pass.

    What :func:`analysis.engine.capture.capture_attention` returns for a global-attention model (a
    windowed model's record is :class:`analysis.records.windowed.WindowedAttentionRecord`).

    Attributes
    ----------
    attentions : torch.Tensor
        ``(L, B, heads, Q, T)`` softmax probabilities, stored in the capture's ``dtype`` (float32
        by default). ``Q == T`` (every query token) unless the capture asked for ``query_tokens``;
        rows sum to one over keys.
    logits : torch.Tensor
        ``(B, classes)`` float32: the model's output for the same forward pass.
    spec : ViTSpec
        The token geometry of *this* input (differs from the model's default for
        ``dynamic_img_size`` models fed another resolution).
    layers : tuple of int
        Model layer index of each entry along ``L`` (increasing from a capture;
        :meth:`select_layers` gives any other order).
    query_tokens : tuple of int or None, default None
        Token index of each row along ``Q``, or ``None`` for all ``T`` tokens.
    pool_attention : torch.Tensor or None, default None
        ``(B, heads, probes, T)`` attention of an attention-pooling head (SigLIP/PE ``map`` pooling:
        learned probe queries over the output tokens), else ``None``.
    """

    attentions: torch.Tensor
    logits: torch.Tensor
    spec: ViTSpec
    layers: tuple[int, ...]
    query_tokens: tuple[int, ...] | None = None
    pool_attention: torch.Tensor | None = None

    def layer_position(self, layer: int) -> int:
        """Position along ``L`` of model layer ``layer`` (negative indices count from the end)."""
        layer = check_index("layer", layer, self.spec.num_layers, "layers")
        try:
            return self.layers.index(layer)
        except ValueError:
            raise AnalysisError(
                f"Layer {layer} was not captured (captured: {list(self.layers)}). "
                "Capture it with capture_attention(..., layers=None) for all layers."
            ) from None

    def layer_maps(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s ``(B, heads, Q, T)`` probabilities: ``attentions[layer_position(layer)]``."""
        return self.attentions[self.layer_position(layer)]

    def geometry(self, layer: int) -> LayerGeometry:
        """Layer ``layer``'s geometry (a ViT's: one global window over the patch grid, prefix in front)."""
        return self.spec.geometry(self.layers[self.layer_position(layer)])

    def select_layers(self, layers: Sequence[int]) -> AttentionRecord:
        """The same record over some of its layers, in the order given. Consecutive layers are
        a view of the maps (nothing copied); other selections gather their maps. Every analysis
        that takes a record takes the result."""
        positions = [self.layer_position(layer) for layer in layers]
        if not positions:
            raise AnalysisError("select_layers needs at least one layer.")
        first = positions[0]
        if positions == list(range(first, first + len(positions))):
            attentions = self.attentions[first : first + len(positions)]
        else:
            attentions = self.attentions[torch.as_tensor(positions, dtype=torch.long)]
        return replace(self, attentions=attentions, layers=tuple(self.layers[p] for p in positions))

    def query_rows(self, tokens: Sequence[int]) -> list[int]:
        """Positions along ``Q`` of the given token indices."""
        if self.query_tokens is None:
            return list(tokens)
        lookup = {t: i for i, t in enumerate(self.query_tokens)}
        missing = [t for t in tokens if t not in lookup]
        if missing:
            raise AnalysisError(
                f"Query tokens {missing[:5]} were not captured (only {len(self.query_tokens)} query rows "
                "were kept). Capture again with query_tokens=None for every query."
            )
        return [lookup[t] for t in tokens]
