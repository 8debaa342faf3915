"""Records of windowed attention (Swin v1/v2, SAM's image encoder), and the one map they give today.

A windowed layer attends inside windows of its stage grid (:class:`~analysis.model.geometry.LayerGeometry`
says which cells each window holds, and which pairs the shift mask keeps). The capture
(:func:`analysis.engine.capture.capture_attention`, the same path as for ViTs) returns a
:class:`WindowedAttentionRecord` that keeps each layer's probabilities as the module computed
them, one window at a time:

    record.windows[l]   # (B, windows, heads, Wt, Wt), rows sum to one over each window's keys

Stages differ in grid, heads and window count, so there is one tensor per layer rather than a
stacked ``(L, B, heads, Q, T)`` like a ViT's ``record.attentions``. Pairs the shift mask
removes are exactly 0.

:func:`analysis.attention_map` puts one query's row back on its layer's grid, with zeros
outside the query's window (the same rule as a ViT's, :func:`analysis.records.token_matrix.query_windows`). :func:`analysis.mean_attention_distance` measures these records
per layer and head on each stage grid (with :func:`analysis.uniform_attention_distance_by_layer`
as each layer's reference), and :mod:`analysis.embedding.relative_position` draws the learned
relative-position biases. :func:`analysis.attention_rollout` composes them exactly within a
stage (:mod:`analysis.attention.rollout`), and :func:`analysis.explain` gives Grad-CAM,
input × gradient, integrated gradients and rollout (``"attention"`` and ``"chefer"`` refuse
with the reason). Tokens (:mod:`analysis.tokens.stages`: each block's output on its stage
grid), the streamed dataset distance and the pixel-space robustness perturbations work too.
Absolute position similarity is not defined for these records and refuses them with
:func:`refuse_windowed`, which names the reason.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from ..base.errors import AnalysisError
from ..model.geometry import LayerGeometry, ViTSpec
from ..model.windowed_support import refuse_windowed
from .attention import AttentionRecord
from .queries import check_pixel_query

__all__ = ["WindowedAttentionRecord", "window_probabilities"]


def window_probabilities(probs: torch.Tensor, geometry: LayerGeometry) -> torch.Tensor:
    """One windowed attention call's probabilities per image and window, with the pairs the shift
    mask removes set to exactly 0 (a new tensor when there is a mask: ``probs`` may be the
    module's own, which it still multiplies with ``v``).

    Parameters
    ----------
    probs : torch.Tensor
        ``(B·windows, heads, Wt, Wt)`` the call's probabilities, in timm's batch-major window order.
    geometry : LayerGeometry
        The layer's geometry: its window count, window tokens ``Wt``, heads and shift mask.

    Returns
    -------
    torch.Tensor
        ``(B, windows, heads, Wt, Wt)``, ``probs``'s dtype.

    Raises
    ------
    AnalysisError
        ``probs`` not of the shape the geometry predicts, or the masked pairs carried real
        probability (more than 1e-6 of a row): then the geometry read off the model is not the
        one the module used.
    """
    windows, tokens = geometry.num_windows, geometry.window_tokens
    if probs.shape[0] % windows or tuple(probs.shape[-2:]) != (tokens, tokens) or probs.shape[1] != geometry.num_heads:
        raise AnalysisError(
            f"A stage-{geometry.stage} attention call gave {tuple(probs.shape)} probabilities; its geometry predicts "
            f"(B·{windows}, {geometry.num_heads}, {tokens}, {tokens}). This windowed model is not supported."
        )
    probs = probs.reshape(probs.shape[0] // windows, windows, *probs.shape[1:])
    allowed = geometry.allowed().to(probs.device)[None, :, None]  # (1, windows, 1, Wt, Wt)
    if not bool(allowed.all()):
        leaked = probs.masked_fill(allowed, 0).sum(-1).amax() if probs.numel() else 0.0
        if float(leaked) > 1e-6:
            raise AnalysisError(
                f"The shift mask of a stage-{geometry.stage} layer did not match the module's ({float(leaked):.2g} of a "
                "row on masked pairs): this windowed model is not supported."
            )
        probs = probs.masked_fill(~allowed, 0.0)
    return probs


@dataclass(frozen=True)
class WindowedAttentionRecord:
    """Windowed attention captured from one forward pass (see the module docstring).

    Attributes
    ----------
    windows : tuple of torch.Tensor
        One ``(B, windows, heads, Wt, Wt)`` tensor per captured layer, in the order of
        ``layers``; the geometry of layer ``l`` is ``spec.geometry(l)``.
    logits : torch.Tensor
        ``(B, classes)`` the model's output for the same forward pass.
    spec : ViTSpec
        The model's spec, with ``spec.layer_geometry`` one entry per layer.
    layers : tuple of int
        Model layer index of each entry of ``windows``.
    query_tokens : None, default None
        Always ``None``: every window slot's row is kept (as :class:`AttentionRecord`'s field).
    pool_attention : None, default None
        Always ``None``: a windowed model has no attention-pooling head here (as
        :class:`AttentionRecord`'s field).
    """

    windows: tuple[torch.Tensor, ...]
    logits: torch.Tensor
    spec: ViTSpec
    layers: tuple[int, ...]
    query_tokens: None = None
    pool_attention: None = None

    @property
    def attentions(self) -> torch.Tensor:
        """Not defined: a windowed model has no ``(L, B, heads, T, T)`` attention over all tokens."""
        refuse_windowed(self, "record.attentions (one (L, B, heads, T, T) tensor over all tokens)")
        raise AssertionError("unreachable")  # pragma: no cover

    def layer_position(self, layer: int) -> int:
        """Position in ``windows`` of model layer ``layer`` (negative indices count from the end)."""
        return AttentionRecord.layer_position(self, layer)  # type: ignore[arg-type]  # the same rule, over .layers

    def layer_windows(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s ``(B, windows, heads, Wt, Wt)`` probabilities."""
        return self.windows[self.layer_position(layer)]

    def layer_maps(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s ``(B, windows, heads, Wt, Wt)`` probabilities (:meth:`layer_windows`)."""
        return self.layer_windows(layer)

    def geometry(self, layer: int) -> LayerGeometry:
        """Layer ``layer``'s windows, grid, stride and heads: ``spec.geometry(layer)``."""
        return self.spec.geometry(self.layers[self.layer_position(layer)])


def query_cells(geometry: LayerGeometry, query) -> list[int]:
    """The grid cells (row-major on the layer's grid) that make up ``query``: a cell index,
    an input-pixel position ``(y, x)``, or ``"mean"`` (every cell). ``None``, the default query
    (:func:`~analysis.records.queries.default_query`), is ``"mean"``: a windowed model has no class token."""
    gh, gw = geometry.grid_size
    if isinstance(query, tuple):
        pixel = check_pixel_query(query, (gh * geometry.stride[0], gw * geometry.stride[1]))
        return [geometry.cell_of_pixel(*pixel)]
    if query is None or query == "mean":
        return list(range(gh * gw))
    if isinstance(query, str):
        raise AnalysisError(
            f"query={query!r}: a windowed model (Swin) has no class or prefix tokens; use a cell index on the "
            f"layer's {gh}x{gw} grid, a pixel position (y, x), or 'mean'."
        )
    if isinstance(query, bool) or not isinstance(query, numbers.Integral) or not 0 <= int(query) < gh * gw:
        raise AnalysisError(f"query={query!r} is not a cell of this layer's {gh}x{gw} grid (0..{gh * gw - 1}).")
    return [int(query)]


def cells_matrix(values: torch.Tensor, geometry: LayerGeometry) -> torch.Tensor:
    """``(..., windows, Wt, Wt)`` per-window values -> ``(..., N, N)`` over the layer's ``N = gh·gw``
    grid cells (row-major):

        M[q, k] = values[w, s, t]   for the window ``w`` holding query cell ``q`` at slot ``s``
                                    and key cell ``k`` at slot ``t``;   0 for every other pair

    so a query attends to nothing outside its window (the shift mask's pairs are already 0).
    Rows and columns of padding slots (zero tokens that pad a grid up to whole windows) are
    dropped: a row of attention probabilities may then sum to less than one."""
    cells = geometry.window_cells().to(values.device)  # (windows, Wt), −1: padding / prefix
    n = geometry.grid_size[0] * geometry.grid_size[1]
    queries = cells[:, :, None].expand(-1, -1, cells.shape[1])  # (windows, Wt, Wt)
    keys = cells[:, None, :].expand(-1, cells.shape[1], -1)
    real = (queries >= 0) & (keys >= 0)
    dense = values.new_zeros(*values.shape[:-3], n * n)
    dense[..., queries[real] * n + keys[real]] = values[..., real]  # each (cell, cell) pair at most once
    return dense.reshape(*values.shape[:-3], n, n)


def window_pairs(geometry: LayerGeometry) -> torch.Tensor:
    """``(N, N)`` bool: the (query cell, key cell) pairs the layer's attention is defined on
    (same window, kept by the shift mask), without the diagonal."""
    pairs = cells_matrix(geometry.allowed(), geometry)
    return pairs & ~torch.eye(pairs.shape[-1], dtype=torch.bool)
