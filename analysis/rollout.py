"""Attention rollout (Abnar & Zuidema, 2020), as in the ViT paper's Figure 6.

A ViT's record composes every layer over one token set. A windowed record (Swin, SAM;
:mod:`analysis.windowed`) is composed by :mod:`analysis.windowed_rollout`, which builds each
layer's dense attention over its grid cells from the windows and hands the matrices to the
same composition (:func:`compose_rollout`); :func:`attention_rollout` and
:func:`attention_rollout_by_layer` send such records there.
"""

from __future__ import annotations

import warnings

from collections.abc import Iterable, Iterator

import torch

from .capture import AttentionRecord
from .checks import check_int, check_record
from .errors import AnalysisError
from .queries import Query, query_rows_for

__all__ = [
    "attention_rollout", "attention_rollout_by_layer", "rollout_matrices", "rollout_step", "fuse_heads", "discard_lowest",
    "mix_identity", "compose_rollout", "layer_range",
]

HEAD_FUSIONS = ("mean", "max", "min")
POST_NORM_WARNING = (
    "This model normalises each residual branch after attention (post-norm, x + norm(attn(x))): "
    "rollout's ½·A + ½·I assumes pre-norm blocks (x + attn(norm(x))), where the identity and "
    "attention paths are of comparable size. Read this rollout as a heuristic."
)


def fuse_heads(attention: torch.Tensor, head_fusion: str) -> torch.Tensor:
    """``(B, heads, T, T)`` -> ``(B, T, T)`` by the mean, max or min over heads."""
    if head_fusion == "mean":
        return attention.mean(dim=1)
    if head_fusion == "max":
        return attention.amax(dim=1)
    if head_fusion == "min":
        return attention.amin(dim=1)
    raise AnalysisError(f"head_fusion must be one of {HEAD_FUSIONS}, not {head_fusion!r}.")


def discard_lowest(fused: torch.Tensor, discard_ratio: float, candidates: torch.Tensor | None = None) -> torch.Tensor:
    """Zero the ``floor(discard_ratio · T·(T−1))`` smallest off-diagonal entries of each
    ``(T, T)`` matrix in ``fused (B, T, T)``. The diagonal (a token's attention to itself)
    is never discarded. Returns a new tensor.

    ``candidates`` ``(T, T)`` bool, when given, are the pairs that may be discarded instead of
    every off-diagonal pair (a windowed layer: the pairs its windows define, so the zeros
    outside a query's window are not counted): the ``floor(discard_ratio · #candidates)``
    smallest candidates are zeroed."""
    if not 0.0 <= discard_ratio < 1.0:
        raise AnalysisError(f"discard_ratio must be in [0, 1), not {discard_ratio}.")
    batch, tokens, _ = fused.shape
    if candidates is None:
        count = int(discard_ratio * tokens * (tokens - 1))
        excluded = torch.eye(tokens, dtype=torch.bool, device=fused.device)
    else:
        count = int(discard_ratio * int(candidates.sum()))
        excluded = ~candidates.to(fused.device)
    if count == 0:
        return fused.clone()
    candidates = fused.masked_fill(excluded, float("inf")).reshape(batch, -1)  # excluded pairs never chosen
    lowest = candidates.topk(count, dim=-1, largest=False).indices  # (B, count)
    flat = fused.reshape(batch, -1).clone()
    flat.scatter_(1, lowest, 0.0)
    return flat.reshape(batch, tokens, tokens)


def mix_identity(fused: torch.Tensor, discard_ratio: float = 0.0, candidates: torch.Tensor | None = None) -> torch.Tensor:
    """``fused (B, T, T)`` (heads already fused) -> ``Â = ½·discard(fused) + ½·I``, each row
    divided by its sum over keys, float64. ``candidates``: see :func:`discard_lowest`."""
    fused = discard_lowest(fused.double(), discard_ratio, candidates)  # (B, T, T)
    eye = torch.eye(fused.shape[-1], dtype=fused.dtype, device=fused.device)
    mixed = 0.5 * fused + 0.5 * eye
    return mixed / mixed.sum(dim=-1, keepdim=True)  # rows (queries) sum to one over keys


def rollout_step(attention: torch.Tensor, head_fusion: str = "mean", discard_ratio: float = 0.0) -> torch.Tensor:
    """One layer's ``Â``: ``(B, heads, T, T)`` attention -> ``(B, T, T)`` float64,
    ``Â = ½·fuse(A) + ½·I`` (after the optional discard), each row divided by its sum over keys."""
    return mix_identity(fuse_heads(attention.double(), head_fusion), discard_ratio)


def compose_rollout(steps: Iterable[tuple[int, torch.Tensor, torch.Tensor | None]]) -> Iterator[tuple[int, torch.Tensor]]:
    """The one composition of rollout: for each ``(layer, Â_layer (B, T, T), carry)`` yield
    ``(layer, R_layer)`` with

        R_start = Â_start;   R_layer = Â_layer · C_layer · R_previous

    where ``C_layer`` is ``carry`` ``(T_layer, T_previous)`` when the token set changes before
    ``layer`` (a windowed model's patch merging, :func:`analysis.windowed_rollout.merge_matrix`)
    and the identity when ``carry`` is None (every ViT layer)."""
    rollout = None
    for layer, mixed, carry in steps:
        if rollout is not None and carry is not None:
            rollout = carry.to(rollout) @ rollout  # (T_layer, T_previous) · (B, T_previous, T_start)
        rollout = mixed if rollout is None else mixed @ rollout
        yield layer, rollout


def layer_range(spec, start_layer: int, end_layer: int | None, stage: int | None = None) -> tuple[int, int]:
    """``(start, end)`` inclusive, non-negative: ``start_layer``..``end_layer`` (end defaults
    to the last layer; negative indices count from the end), or every layer of ``stage``
    (``spec.geometry(l).stage``; negative counts from the last stage; a ViT has stage 0 only)."""
    layers = spec.num_layers
    if stage is not None:
        if check_int("start_layer", start_layer) != 0 or end_layer is not None:
            raise AnalysisError("Pass either stage or start_layer/end_layer, not both.")
        stages = [spec.geometry(layer).stage for layer in range(layers)]
        count = max(stages) + 1
        stage = check_int("stage", stage)
        if not -count <= stage < count:
            raise AnalysisError(f"stage={stage} does not exist: the model has {count} stage(s) (0..{count - 1}).")
        stage %= count
        chosen = [layer for layer, s in enumerate(stages) if s == stage]
        return chosen[0], chosen[-1]
    last = layers - 1 if end_layer is None else check_int("end_layer", end_layer)
    if last < 0:
        last += layers
    start_layer = check_int("start_layer", start_layer)
    if start_layer < 0:
        start_layer += layers
    if not 0 <= start_layer <= last < layers:
        raise AnalysisError(f"Need 0 <= start_layer ({start_layer}) <= end_layer ({last}) < {layers} layers.")
    return start_layer, last


def _rollout_steps(
    record: AttentionRecord, head_fusion: str, discard_ratio: float, start_layer: int, end_layer: int | None,
    stage: int | None = None,
) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield ``(layer, R_layer)`` with ``R_layer = Â_layer ⋯ Â_start`` for layer = start..end."""
    check_record(record, "attention_rollout")
    if record.spec.residual_norm == "post":
        warnings.warn(POST_NORM_WARNING, RuntimeWarning, stacklevel=4)
    if record.query_tokens is not None:
        raise AnalysisError("Rollout needs every query row: capture with query_tokens=None.")
    start_layer, last = layer_range(record.spec, start_layer, end_layer, stage)
    steps = (
        (layer, rollout_step(record.attentions[record.layer_position(layer)], head_fusion, discard_ratio), None)
        for layer in range(start_layer, last + 1)
    )  # (B, T, T) each
    yield from compose_rollout(steps)


def _is_windowed(record) -> bool:
    from .windowed import WindowedAttentionRecord

    return isinstance(record, WindowedAttentionRecord)


def _check_merge(merge) -> None:
    from .windowed_rollout import MERGE_RULES

    if merge is not None and merge not in MERGE_RULES:
        raise AnalysisError(f"merge must be None (refuse to cross patch merging) or one of {MERGE_RULES}, not {merge!r}.")


def rollout_matrices(
    record: AttentionRecord,
    *,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    start_layer: int = 0,
    end_layer: int | None = None,
    stage: int | None = None,
    merge: str | None = None,
) -> torch.Tensor:
    """The rolled-out token-to-token matrix ``R = Â_end ⋯ Â_start``, ``(B, T, T)`` float64.

    Per layer: fuse heads, discard (optional), ``Â = ½·A + ½·I``, then each row of ``Â``
    is divided by its sum over keys (``Â / Â.sum(-1, keepdim=True)``) so that every row of
    ``Â`` and of ``R`` is a probability distribution. ``stage``: every layer of that stage
    instead of ``start_layer``..``end_layer``.

    A windowed record (Swin, SAM) gives ``(B, N_end, N_start)`` over grid cells: rows are the
    cells of ``end_layer``'s grid, columns those of ``start_layer``'s; ``merge`` as in
    :func:`analysis.windowed_rollout.windowed_rollout`.
    """
    _check_merge(merge)
    if _is_windowed(record):
        from .windowed_rollout import windowed_rollout_matrices

        return windowed_rollout_matrices(record, head_fusion=head_fusion, discard_ratio=discard_ratio,
                                         start_layer=start_layer, end_layer=end_layer, stage=stage, merge=merge)[0]
    rollout = None
    for _, rollout in _rollout_steps(record, head_fusion, discard_ratio, start_layer, end_layer, stage):
        pass
    return rollout


def _query_grid(record: AttentionRecord, rollout: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """``(B, T, T)`` rolled-out matrix -> ``(B, gh, gw)``: the query's row over patch tokens."""
    spec = record.spec
    over_keys = rollout[:, rows, :].mean(dim=1)  # (B, T)
    gh, gw = spec.grid_size
    return spec.split_prefix(over_keys, 1)[1].reshape(-1, gh, gw).float()


def attention_rollout_by_layer(
    record: AttentionRecord,
    *,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    start_layer: int = 0,
    query: Query | None = None,
    stage: int | None = None,
    merge: str | None = None,
) -> torch.Tensor:
    """The rollout after each layer, in one pass: ``(L - start, B, gh, gw)``.

    Entry ``i`` equals ``attention_rollout(record, ..., end_layer=start_layer + i)``, but all
    partial products ``Â_end ⋯ Â_start`` are built incrementally (L matrix products, not L²/2).
    ``stage``: the layers of that stage only (entry ``i``: after the stage's ``i``-th layer).

    A windowed record: every entry lies on ``start_layer``'s grid (the first layer of
    ``stage``), the query on each entry's own layer grid (a pixel position or ``"mean"`` when
    the grids differ); see :func:`analysis.windowed_rollout.windowed_rollout_by_layer`.
    """
    _check_merge(merge)
    if _is_windowed(record):
        from .windowed_rollout import windowed_rollout_by_layer

        return windowed_rollout_by_layer(record, head_fusion=head_fusion, discard_ratio=discard_ratio,
                                         start_layer=start_layer, query=query, stage=stage, merge=merge).maps
    check_record(record, "attention_rollout")
    rows = query_rows_for(record, query)
    steps = _rollout_steps(record, head_fusion, discard_ratio, start_layer, None, stage)
    return torch.stack([_query_grid(record, rollout, rows) for _, rollout in steps])


def attention_rollout(
    record: AttentionRecord,
    *,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    start_layer: int = 0,
    end_layer: int | None = None,
    query: Query | None = None,
    stage: int | None = None,
    merge: str | None = None,
) -> torch.Tensor:
    """Attention rollout of one query over the patch grid.

    ``R = Â_end ⋯ Â_start`` as in :func:`rollout_matrices` (``end_layer`` defaults to the
    last layer, inclusive; ``stage`` picks every layer of one stage instead). Returns the
    query's row of ``R`` restricted to patch tokens, not rescaled: ``(B, gh, gw)`` float32.
    ``query=None`` (the default of every one-query map, :func:`analysis.queries.default_query`)
    is the class token when the model has one, else the mean over patch queries; otherwise
    ``"cls"``, ``"mean"``, ``"prefix:<i>"`` or a patch index.

    A windowed record (Swin, SAM): the map lies on ``start_layer``'s grid
    (``record.spec.geometry(start_layer).grid_size`` cells of ``.stride`` input pixels), the
    query is a cell of ``end_layer``'s grid, a pixel ``(y, x)`` or ``"mean"``. A range that
    crosses Swin's patch merging is refused unless ``merge="mean_2x2"`` (an approximation,
    with a warning). :func:`analysis.windowed_rollout.windowed_rollout` returns the same map
    with its grid, stride and approximation flag.
    """
    _check_merge(merge)
    if _is_windowed(record):
        from .windowed_rollout import windowed_rollout

        return windowed_rollout(record, head_fusion=head_fusion, discard_ratio=discard_ratio, start_layer=start_layer,
                                end_layer=end_layer, query=query, stage=stage, merge=merge).maps
    check_record(record, "attention_rollout")
    rows = query_rows_for(record, query)
    rollout = rollout_matrices(
        record, head_fusion=head_fusion, discard_ratio=discard_ratio, start_layer=start_layer, end_layer=end_layer,
        stage=stage,
    )
    return _query_grid(record, rollout, rows)
