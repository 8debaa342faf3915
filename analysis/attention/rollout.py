"""Attention rollout (Abnar & Zuidema, 2020), as in the ViT paper's Figure 6.

A ViT's record composes every layer over one token set. A windowed record (Swin, SAM;
:mod:`analysis.records.windowed`) is composed by :mod:`analysis.attention.windowed_rollout`, which builds each
layer's dense attention over its grid cells from the windows and hands the matrices to the
same composition (:func:`~analysis.attention.rollout_rules.compose_rollout`); :func:`attention_rollout` and
:func:`attention_rollout_by_layer` send such records there.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import torch

from ..base.arguments import check_index
from ..base.errors import AnalysisError
from ..model.geometry import ViTSpec
from ..records.attention import AttentionRecord
from ..records.checks import check_record
from ..records.queries import Query, query_rows_for
from ..records.windowed import WindowedAttentionRecord
from .rollout_rules import (
    POST_NORM_WARNING,
    compose_rollout,
    layer_range,
    rollout_step,
)
from .windowed_rollout import MERGE_RULES, windowed_rollout, windowed_rollout_by_layer, windowed_rollout_matrices

__all__ = [
    "attention_rollout",
    "patch_grid_rollout",
    "attention_rollout_by_layer",
    "rollout_matrices",
    "rollout_steps",
    "rollout_uniform_level",
]


def rollout_uniform_level(spec: ViTSpec, start_layer: int = 0) -> float:
    """The weight each token of a rollout map gets when the query's row is spread evenly over the
    tokens the rollout runs over: the "uniform" reference of the map's colour range
    (:func:`analysis.plots.colour_range`).

        u = 1 / (P + gh·gw),   P = prefix tokens, (gh, gw) the grid of ``spec.geometry(start_layer)``

    The map lies on the start layer's grid (:func:`attention_rollout_by_layer`). A ViT: ``1/T``
    (its prefix tokens and every patch of the one grid). A windowed model (Swin, SAM): one over
    the cells of the start layer's stage grid (no prefix tokens).

    Raises:
        AnalysisError: ``start_layer`` is not a layer of the model.
    """
    geometry = spec.geometry(check_index("start_layer", start_layer, spec.num_layers, "layers"))
    gh, gw = geometry.grid_size
    return 1.0 / (geometry.prefix_tokens + gh * gw)


def rollout_steps(
    record: AttentionRecord,
    head_fusion: str,
    discard_ratio: float,
    start_layer: int,
    end_layer: int | None,
    stage: int | None = None,
) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield ``(layer, R_layer)`` with ``R_layer = Â_layer ⋯ Â_start`` ``(B, T, T)`` float64 for
    layer = start..end (or every layer of ``stage``; :func:`~analysis.attention.rollout_rules.layer_range`) of a
    ViT record: the running products :func:`rollout_matrices` and :func:`attention_rollout_by_layer`
    read, for a caller that wants every partial rollout in one pass. Warns (RuntimeWarning) on a
    post-norm model, as every rollout does."""
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


def _check_merge(merge) -> None:
    if merge is not None and merge not in MERGE_RULES:
        raise AnalysisError(
            f"merge must be None (refuse to cross patch merging) or one of {MERGE_RULES}, not {merge!r}."
        )


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
    :func:`analysis.attention.windowed_rollout.windowed_rollout`.
    """
    _check_merge(merge)
    if isinstance(record, WindowedAttentionRecord):  # the windowed record composes on stage grids
        return windowed_rollout_matrices(
            record,
            head_fusion=head_fusion,
            discard_ratio=discard_ratio,
            start_layer=start_layer,
            end_layer=end_layer,
            stage=stage,
            merge=merge,
        )[0]
    rollout = None
    for _, step_rollout in rollout_steps(record, head_fusion, discard_ratio, start_layer, end_layer, stage):
        rollout = step_rollout  # the last step's
    assert rollout is not None, "layer_range gives start <= end: one step at least"
    return rollout


def _query_grid(record: AttentionRecord, rollout: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """``(B, T, T)`` rolled-out matrix -> ``(B, gh, gw)``: the query's row over patch tokens."""
    spec = record.spec
    over_keys = rollout[:, rows, :].mean(dim=1)  # (B, T)
    gh, gw = spec.grid_size
    return spec.split_prefix(over_keys, 1)[1].reshape(-1, gh, gw).float()


def patch_grid_rollout(record: AttentionRecord) -> torch.Tensor:
    """``(B, gh, gw)``: the attention rollout on the model's own patch grid (``spec.grid_size``, the
    patch embedding's), the map a salient token drop ranks patches by
    (:func:`analysis.robustness.probe`'s ``saliency``).

    A ViT: :func:`attention_rollout` with its defaults (every layer, the class token or, without
    one, the mean patch query). A windowed record (Swin, SAM): the rollout of its first stage for
    the mean cell (``stage=0, query="mean"``), exact (no patch merging inside a stage) and on the
    stem's patch grid, the grid token drops use.
    """
    if isinstance(record, WindowedAttentionRecord):  # stage grids: the stem's stage lies on the patch grid
        return attention_rollout(record, stage=0, query="mean")
    return attention_rollout(record)


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
    the grids differ); see :func:`analysis.attention.windowed_rollout.windowed_rollout_by_layer`.
    """
    _check_merge(merge)
    if isinstance(record, WindowedAttentionRecord):  # the windowed record composes on stage grids
        return windowed_rollout_by_layer(
            record,
            head_fusion=head_fusion,
            discard_ratio=discard_ratio,
            start_layer=start_layer,
            query=query,
            stage=stage,
            merge=merge,
        ).maps
    check_record(record, "attention_rollout")
    rows = query_rows_for(record, query)
    steps = rollout_steps(record, head_fusion, discard_ratio, start_layer, None, stage)
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
    ``query=None`` (the default of every one-query map, :func:`analysis.records.queries.default_query`)
    is the class token when the model has one, else the mean over patch queries; otherwise
    ``"cls"``, ``"mean"``, ``"prefix:<i>"`` or a patch index.

    A windowed record (Swin, SAM): the map lies on ``start_layer``'s grid
    (``record.spec.geometry(start_layer).grid_size`` cells of ``.stride`` input pixels), the
    query is a cell of ``end_layer``'s grid, a pixel ``(y, x)`` or ``"mean"``. A range that
    crosses Swin's patch merging is refused unless ``merge="mean_2x2"`` (an approximation,
    with a warning). :func:`analysis.attention.windowed_rollout.windowed_rollout` returns the same map
    with its grid, stride and approximation flag.
    """
    _check_merge(merge)
    if isinstance(record, WindowedAttentionRecord):  # the windowed record composes on stage grids
        return windowed_rollout(
            record,
            head_fusion=head_fusion,
            discard_ratio=discard_ratio,
            start_layer=start_layer,
            end_layer=end_layer,
            query=query,
            stage=stage,
            merge=merge,
        ).maps
    check_record(record, "attention_rollout")
    rows = query_rows_for(record, query)
    rollout = rollout_matrices(
        record,
        head_fusion=head_fusion,
        discard_ratio=discard_ratio,
        start_layer=start_layer,
        end_layer=end_layer,
        stage=stage,
    )
    return _query_grid(record, rollout, rows)
