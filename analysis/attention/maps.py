"""One query's attention over the patch grid."""

from __future__ import annotations

import torch

from ..base.arguments import check_index
from ..base.errors import AnalysisError
from ..records.attention import AttentionRecord
from ..records.checks import check_record
from ..records.queries import Query
from ..records.token_matrix import query_windows

__all__ = ["attention_map", "attention_rows", "pooling_attention_map"]


def attention_map(
    record: AttentionRecord, layer: int, *, head: int | None = None, query: Query | None = None
) -> torch.Tensor:
    """Attention of one query over the patch tokens, as an image-shaped grid.

        map[b, i, j] = A[layer, b, head, q, prefix + i·gw + j]

    with ``head=None`` averaging ``A`` over heads first and ``query="mean"`` averaging over
    all patch queries. ``query=None`` is the class token when the model has one, else the
    mean over patch queries (:func:`analysis.records.queries.default_query`, as in rollout). Prefix keys (class / distillation / register tokens) are left out,
    so a map does not sum to one when the query also attends to them.

    One rule for every record (:func:`analysis.records.token_matrix.query_windows`): the query's
    rows in each window of the layer, averaged, each key slot put on its cell of the layer's grid.
    A ViT's layer is one window of all its tokens; a windowed layer's map (Swin, SAM) lies on its
    stage grid, zero outside the query's window, and keys at padding slots are not on the grid, so
    it may sum to less than one.

    Parameters
    ----------
    record : AttentionRecord
        A captured pass (:func:`capture_attention`), attentions ``(L, B, heads, Q, T)`` or, for a
        windowed model, one ``(B, windows, heads, Wt, Wt)`` tensor per layer.
    layer : int
        Model layer index (one the record kept).
    head : int or None, default None
        One head; ``None`` averages over the layer's heads.
    query : int, (y, x), "mean" or None, default None
        A token index (on a windowed layer: a cell index on its stage grid); an input-pixel
        position ``(y, x)``, the patch that contains it; ``"mean"``, every patch query averaged;
        ``None``, the class token when the model has one, else ``"mean"``.

    Returns
    -------
    torch.Tensor
        ``(B, gh, gw)`` float32 on the layer's grid (a ViT's patch grid, a windowed layer's stage grid).
    """
    rows, query_slots, key_cells, count = query_windows(record, layer, query, head=head)  # (B, windows, heads, R, Wt)
    mean_head = rows.float().mean(dim=2)  # (B, windows, R, Wt)
    if query_slots is None:  # every row is the query's
        per_key = mean_head.sum(dim=2) / count  # (B, windows, Wt)
    else:  # the query's slots of each window, without a masked copy of the rows
        per_key = torch.einsum("bwrk,wr->bwk", mean_head, query_slots.to(mean_head.dtype)) / count
    keys = key_cells >= 0  # prefix and padding slots are not on the grid
    gh, gw = record.spec.geometry(layer).grid_size
    out = per_key.new_zeros(per_key.shape[0], gh * gw)
    out.index_add_(1, key_cells[keys], per_key[:, keys])
    return out.reshape(-1, gh, gw)


def pooling_attention_map(record: AttentionRecord, *, head: int | None = None, probe: int = 0) -> torch.Tensor | None:
    """The attention-pooling head's map over the patch grid (SigLIP / PE ``map`` pooling: a
    learned probe query attends over the last block's output tokens):

        map[b, i, j] = P[b, head, probe, prefix + i·gw + j]

    with ``head=None`` averaging ``P`` over the pooling head's own heads. Prefix keys are left
    out, as in :func:`attention_map`.

    Parameters
    ----------
    record : AttentionRecord
        A captured pass (:func:`capture_attention`) of a ViT; its ``pool_attention``
        ``(B, heads, probes, T)`` holds the pooling head's probabilities (recorded whatever
        ``layers`` the capture kept).
    head : int or None, default None
        One of the pooling head's own heads (negative counts from the end); ``None`` averages
        over them.
    probe : int, default 0
        Which learned probe query (negative counts from the end).

    Returns
    -------
    torch.Tensor or None
        ``(B, gh, gw)`` float32 on ``spec.grid_size``, or ``None`` for a model without an
        attention-pooling head.

    Raises
    ------
    AnalysisError
        ``record`` is not an :class:`AttentionRecord`, or is a windowed model's (Swin, SAM);
        ``head`` or ``probe`` is out of range.
    """
    spec = check_record(record, "pooling_attention_map").spec
    if record.pool_attention is None:
        return None
    pool = record.pool_attention  # (B, heads, probes, T)
    probe = check_index("probe", probe, pool.shape[2], "probe queries")
    if head is not None:
        head = check_index("head", head, pool.shape[1], "pooling heads")
        pool = pool[:, head : head + 1]
    gh, gw = spec.grid_size
    return spec.split_prefix(pool[:, :, probe], -1)[1].float().mean(dim=1).reshape(-1, gh, gw)


def attention_rows(record: AttentionRecord, layer: int, *, keys: str = "patches") -> torch.Tensor:
    """Every query's attention over the patch keys of one layer, per head and their mean:

        rows[b, h, q, k] = A[layer, b, h, q, prefix + k]     (h < heads)
        rows[b, heads, q, k] = mean_h A[layer, b, h, q, prefix + k]

    ``q`` runs over all ``T`` tokens in model order (the prefix tokens, then the patches
    row-major), ``k`` over the ``N`` patch keys row-major on ``spec.grid_size``. Row
    ``prefix + p`` is :func:`attention_map` of patch query ``p``; row ``i < prefix`` that of
    ``"prefix:<i>"``. Column ``k`` over the patch queries is "who looks at patch k".

    Parameters
    ----------
    record : AttentionRecord
        A captured pass (:func:`capture_attention`), attentions ``(L, B, heads, Q, T)``, with every
        query row captured (``capture_attention(..., query_tokens=None)``, ``Q = T``). Windowed
        records (Swin, SAM) are refused: their attention is per window.
    layer : int
        Model layer index (one the record kept; negative counts from the end).
    keys : str, default "patches"
        ``"patches"``: the ``N`` patch keys only; ``"all"``: every key, the prefix tokens first
        (the full ``T × T`` matrix per head, as a bertviz-style view draws it).

    Returns
    -------
    torch.Tensor
        ``(B, heads + 1, T, N)`` float32; ``(B, heads + 1, T, T)`` with ``keys="all"``. Index
        ``heads`` along dim 1 is the mean over heads.

    Raises
    ------
    AnalysisError
        A windowed record; ``keys`` neither ``"patches"`` nor ``"all"``; a record that kept only
        some query rows; ``layer`` not captured.
    """
    from ..model.windowed_support import refuse_windowed

    refuse_windowed(record, "attention_rows")
    spec = check_record(record, "attention_rows").spec
    if keys not in ("patches", "all"):
        raise AnalysisError(f'attention_rows: keys must be "patches" or "all", got {keys!r}.')
    attention = record.attentions[record.layer_position(layer)]  # (B, heads, Q, T)
    rows = record.query_rows(range(spec.num_tokens))
    every = attention[:, :, rows].float()  # (B, heads, T, T)
    with_mean = torch.cat([every, every.mean(dim=1, keepdim=True)], dim=1)  # (B, heads + 1, T, T)
    if keys == "all":
        return with_mean
    return spec.split_prefix(with_mean, -1)[1].contiguous()  # (B, heads + 1, T, N)
