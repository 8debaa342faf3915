"""Every record's layers in one token layout: a layer's attention as a dense ``(B, N, N)`` matrix
over the layer's tokens, what an analysis that composes layers (rollout) reads, whatever the record.

* A ViT's record (:class:`~analysis.records.attention.AttentionRecord`): ``N = T``, the tokens
  ``[prefix, patches]`` of every layer; the maps are that matrix already.
* A windowed record (:class:`~analysis.records.windowed.WindowedAttentionRecord`, Swin and SAM):
  ``N = gh·gw``, the cells of the layer's grid; each window is put back in place
  (:func:`~analysis.records.windowed.cells_matrix`), 0 between cells that share no window.

Either way a layer's tokens are ``spec.geometry(layer).prefix_tokens`` prefix tokens, then the
cells of ``spec.geometry(layer).grid_size`` row-major. The two layouts meet here, once; the
analyses above call these functions and never ask which kind of record they hold.
"""

from __future__ import annotations

import torch

from ..base.arguments import check_index
from ..base.errors import AnalysisError
from .attention import AttentionRecord, AttentionRecordProtocol
from .queries import query_rows_for
from .windowed import WindowedAttentionRecord, cells_matrix, query_cells, window_pairs

__all__ = [
    "layer_heads",
    "layer_windows",
    "hook_windows",
    "token_matrix",
    "defined_pairs",
    "token_rows",
    "query_windows",
]


def layer_heads(record: AttentionRecordProtocol, layer: int) -> torch.Tensor:
    """Layer ``layer``'s probabilities with the heads first. Reduce the heads (dim 1), then
    :func:`token_matrix`: heads fused on the windows cost ``1/heads`` of fusing them on the dense
    matrix, and give the same values (0 outside a window in every head).

    Parameters
    ----------
    record : AttentionRecord or WindowedAttentionRecord
        A captured pass (:func:`capture_attention`): attentions ``(L, B, heads, Q, T)`` or, for a
        windowed model, one ``(B, windows, heads, Wt, Wt)`` tensor per layer.
    layer : int
        Model layer index (one the record kept; negative counts from the end).

    Returns
    -------
    torch.Tensor
        ``(B, heads, ...)``: a ViT's ``(B, heads, Q, T)``; a windowed record's
        ``(B, heads, windows, Wt, Wt)``.

    Raises
    ------
    AnalysisError
        ``layer`` not a layer the record kept.
    """
    maps = record.layer_maps(layer)
    return maps.transpose(1, 2) if isinstance(record, WindowedAttentionRecord) else maps


def layer_windows(record: AttentionRecordProtocol, layer: int) -> torch.Tensor:
    """Layer ``layer``'s probabilities as windows of token slots, the slots those of
    ``spec.geometry(layer).window_cells()`` (−1: a prefix or padding slot, not a cell): a windowed
    record's own; a ViT's as one window of its ``T`` tokens, prefix first.

    Parameters
    ----------
    record : AttentionRecord or WindowedAttentionRecord
        A captured pass (:func:`capture_attention`): attentions ``(L, B, heads, Q, T)`` or, for a
        windowed model, one ``(B, windows, heads, Wt, Wt)`` tensor per layer. Every cell's row is
        needed: a ViT record that kept only some query rows must have kept every patch's (its
        missing prefix rows are then 0).
    layer : int
        Model layer index (one the record kept; negative counts from the end).

    Returns
    -------
    torch.Tensor
        ``(B, windows, heads, Wt, Wt)``; a ViT's ``(B, 1, heads, T, T)``.

    Raises
    ------
    AnalysisError
        ``layer`` not a layer the record kept; a ViT record that did not keep every patch's row.
    """
    if isinstance(record, WindowedAttentionRecord):
        return record.layer_windows(layer)
    maps = record.layer_maps(layer)  # (B, heads, Q, T)
    kept = getattr(record, "query_tokens", None)
    if kept is not None:
        spec = record.spec
        prefix = spec.num_prefix_tokens
        record.query_rows(range(prefix, prefix + spec.num_patches))  # type: ignore[attr-defined]  # names any patch row not kept
        full = maps.new_zeros(*maps.shape[:2], maps.shape[-1], maps.shape[-1])
        full[:, :, list(kept)] = maps
        maps = full
    return maps[:, None]


def hook_windows(probs: torch.Tensor) -> torch.Tensor:
    """One ``blocks.{l}.attn.probs`` hook's probabilities as windows of token slots, the layout of
    :func:`layer_windows`: a windowed layer's ``(B, windows, heads, Wt, Wt)`` as they come, a
    global layer's ``(B, heads, Q, T)`` as its one window ``(B, 1, heads, Q, T)`` (a view).

    Parameters
    ----------
    probs : torch.Tensor
        ``(B, heads, Q, T)`` (a ViT's layer: ``Q`` the rows the forward kept) or
        ``(B, windows, heads, Wt, Wt)`` (a windowed layer, :func:`~analysis.records.windowed.window_probabilities`).

    Returns
    -------
    torch.Tensor
        ``(B, windows, heads, Q, Wt)``.
    """
    return probs if probs.ndim == 5 else probs[:, None]


def token_matrix(record: AttentionRecordProtocol, values: torch.Tensor, layer: int) -> torch.Tensor:
    """Layer ``layer``'s values as one dense matrix over the layer's ``N`` tokens (a ViT: ``N = T``;
    a windowed layer: its ``gh·gw`` grid cells, 0 between cells that share no window).

    Parameters
    ----------
    record : AttentionRecord or WindowedAttentionRecord
        The captured pass whose layout ``values`` is in.
    values : torch.Tensor
        Layer ``layer``'s values in the record's layout with the heads reduced (what
        :func:`layer_heads` gives, less its dim 1): ``(B, T, T)``, or ``(B, windows, Wt, Wt)``.
    layer : int
        Model layer index.

    Returns
    -------
    torch.Tensor
        ``(B, N, N)`` in ``values``'s dtype.

    Raises
    ------
    AnalysisError
        A ViT record that kept only some query rows (``query_tokens``), or a windowed layer with
        prefix tokens in its windows (not on the grid).
    """
    if isinstance(record, WindowedAttentionRecord):
        geometry = record.spec.geometry(layer)
        if geometry.prefix_tokens:
            raise AnalysisError(
                f"Layer {layer} has {geometry.prefix_tokens} prefix tokens in its windows: a windowed layer's token "
                "matrix covers grid cells only, so this model is not supported."
            )
        return cells_matrix(values, geometry)
    if getattr(record, "query_tokens", None) is not None:
        raise AnalysisError("This needs every query row of each layer: capture with query_tokens=None.")
    return values


def defined_pairs(record: AttentionRecordProtocol, layer: int) -> torch.Tensor | None:
    """The (query, key) token pairs layer ``layer``'s attention is defined on, without the
    diagonal (what rollout's ``discard_ratio`` may discard).

    Parameters
    ----------
    record : AttentionRecord or WindowedAttentionRecord
        A captured pass.
    layer : int
        Model layer index.

    Returns
    -------
    torch.Tensor or None
        ``(N, N)`` bool, a windowed layer's same-window pairs kept by the shift mask
        (:func:`~analysis.records.windowed.window_pairs`); ``None`` for global attention, where
        every pair is.
    """
    if isinstance(record, WindowedAttentionRecord):
        return window_pairs(record.spec.geometry(layer))
    return None


def token_rows(record: AttentionRecordProtocol, layer: int, query) -> list[int]:
    """The rows of layer ``layer``'s token matrix (:func:`token_matrix`) that make up ``query``
    (callers average them).

    Parameters
    ----------
    record : AttentionRecord or WindowedAttentionRecord
        A captured pass.
    layer : int
        Model layer index (a windowed layer's grid; a ViT's rows are the same in every layer).
    query : int, (y, x), str or None
        A ViT's query as :func:`~analysis.records.queries.resolve_query` takes it (``None``: the
        class token, else every patch); a windowed layer's cell index, input pixel ``(y, x)``,
        ``"mean"`` or ``None`` (every cell; :func:`~analysis.records.windowed.query_cells`).

    Returns
    -------
    list of int
        Row indices: a ViT's positions along the record's ``Q`` axis, a windowed layer's
        row-major cells.

    Raises
    ------
    AnalysisError
        A query the model does not have (or, on a ViT, a token whose row the record did not keep).
    """
    if isinstance(record, WindowedAttentionRecord):
        return query_cells(record.spec.geometry(layer), query)
    return query_rows_for(record, query)  # type: ignore[arg-type]  # a ViT record


def query_windows(
    record: AttentionRecord | WindowedAttentionRecord, layer: int, query, *, head: int | None = None
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, int]:
    """The attention rows that make up ``query`` in layer ``layer``'s windows, whatever the record:

    * ``rows (B, windows, heads, R, Wt)``: rows of each window, keys over its ``Wt`` slots; a ViT's
      one window of its ``T`` tokens with ``R`` the query's rows of those the record kept
      (:func:`~analysis.records.queries.query_rows_for`: ``None`` the class token, else every patch);
      a windowed layer's own windows, ``R = Wt``;
    * ``query_slots (windows, R)`` bool: which of those rows belong to the query (a windowed layer's
      slots of its cells, :func:`~analysis.records.windowed.query_cells`: a cell, a pixel ``(y, x)`` or
      ``"mean"``), or ``None`` when every row does (a ViT's);
    * ``key_cells (windows, Wt)`` long: the grid cell of each key slot, −1 for prefix and padding
      slots (``spec.geometry(layer).window_cells()``);
    * ``count``: how many query tokens the rows hold (callers average over them).

    Parameters
    ----------
    record : AttentionRecord or WindowedAttentionRecord
        A captured pass (:func:`capture_attention`): attentions ``(L, B, heads, Q, T)`` or, for a
        windowed model, one ``(B, windows, heads, Wt, Wt)`` tensor per layer.
    layer : int
        Model layer index (one the record kept; negative counts from the end).
    query : int, (y, x), str or None
        A ViT's query as :func:`~analysis.records.queries.resolve_query` takes it; a windowed
        layer's cell index on its grid, input pixel ``(y, x)``, ``"mean"`` or ``None`` (every cell).
    head : int or None, default None
        Keep that head only (``heads`` becomes 1; negative counts from the end), checked against
        the layer's heads; ``None``, every head.

    Returns
    -------
    tuple of (torch.Tensor, torch.Tensor or None, torch.Tensor, int)
        ``(rows, query_slots, key_cells, count)`` as above.

    Raises
    ------
    AnalysisError
        ``record`` neither record type; ``layer`` not captured; a query the model does not have
        (or whose rows the record did not keep); ``head`` out of range.
    """
    if not isinstance(record, (AttentionRecord, WindowedAttentionRecord)):
        raise AnalysisError(
            f"This takes the AttentionRecord that capture_attention(vit, pixels) returns, got {type(record).__name__}."
        )
    position = record.layer_position(layer)
    query_slots: torch.Tensor | None = None
    if isinstance(record, WindowedAttentionRecord):
        geometry = record.spec.geometry(record.layers[position])
        rows = record.windows[position]  # (B, windows, heads, Wt, Wt)
        cells = geometry.window_cells().to(rows.device)
        wanted = torch.zeros(geometry.grid_size[0] * geometry.grid_size[1], dtype=torch.bool, device=rows.device)
        wanted[query_cells(geometry, query)] = True
        query_slots = (cells >= 0) & wanted[cells.clamp(min=0)]  # (windows, Wt)
        count, heads_name = int(wanted.sum()), f"heads in stage {geometry.stage}"
    else:
        geometry = record.spec.geometry(layer)
        token_rows = query_rows_for(record, query)
        maps = record.attentions[position]  # (B, heads, Q, T)
        rows, cells, count = maps[:, None, :, token_rows], geometry.window_cells().to(maps.device), len(token_rows)
        heads_name = "heads"
    if head is not None:
        head = check_index("head", head, rows.shape[2], heads_name)
        rows = rows[:, :, head : head + 1]
    return rows, query_slots, cells, count
