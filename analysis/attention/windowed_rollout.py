"""Attention rollout for windowed records (Swin v1/v2, SAM).

Each layer's windows are first put back on the layer's grid as one dense matrix over its
``N = gh·gw`` cells (:func:`dense_attention`):

    A[q, k] = windows[w, s, t]   for the window ``w`` holding query cell ``q`` at slot ``s``
                                 and key cell ``k`` at slot ``t``;   0 for every other key

so a query attends to nothing outside its window (and the shift mask's pairs are already 0).
**Padding keys** (zero tokens that pad a grid up to whole windows) are not cells: their
probability is dropped, not spread over the real keys, so a row of ``A`` may sum to less
than one. The row normalisation of ``Â = ½·A + ½·I`` (:func:`analysis.attention.rollout_rules.mix_identity`,
the same step as a ViT's) then divides each row by ``1 − p/2`` (``p`` its padding mass),
i.e. the dropped mass is shared out in proportion between the identity and the real keys.
Heads are fused on the windows before the matrix is built (mean, max and min commute with
putting zeros outside the window), and ``discard_ratio`` counts only the pairs the windows
define (:func:`window_pairs`), never the zeros outside them.

The composition is :func:`analysis.attention.rollout_rules.compose_rollout`, the one a ViT uses:

* **Within a stage** (one grid, one token set) it is exact, as for a ViT. SAM's window
  blocks and global blocks share one grid, so a rollout over all of SAM's layers is exact.
* **Across Swin's patch merging** the token set changes (``N`` cells become ``N′ ≈ N/4``)
  through a learned linear layer on the four parents concatenated, with no residual path;
  rollout has no exact rule for it. By default such a range is refused with the reason. With
  ``merge="mean_2x2"`` the merged token takes the mean of its 2×2 parents:

      M[c′, c] = 1 / |P(c′)|  if c ∈ P(c′),  else 0;     M is (N′, N)
      P((r′, x′)) = {(2r′ + i, 2x′ + j) : i, j ∈ {0, 1}, inside the grid}

  (four parents, ¼ each, on an even grid; an odd grid's last row or column has fewer
  parents, because the module pads it with zero tokens, which are not cells). Then
  ``R = Â_end ⋯ Â_(s+1) · M · Â_(s) ⋯ Â_start``: rows stay probability distributions,
  and the result is labelled an approximation (``WindowedRollout.approximate``, a
  RuntimeWarning).

Each result says where it lives: the map is a row of ``R`` over the cells of
``start_layer``'s grid (``grid_size``, ``stride`` in input pixels); the query is a cell of
``end_layer``'s grid (``query_grid``, ``query_stride``), a pixel ``(y, x)`` or ``"mean"``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..base.errors import AnalysisError
from ..model.geometry import LayerGeometry
from ..records.windowed import WindowedAttentionRecord, query_cells
from .rollout_rules import POST_NORM_WARNING, compose_rollout, fuse_heads, layer_range, mix_identity

__all__ = [
    "MERGE_RULES",
    "MERGE_WARNING",
    "WindowedRollout",
    "dense_attention",
    "window_pairs",
    "merge_matrix",
    "windowed_rollout_matrices",
    "windowed_rollout",
    "windowed_rollout_by_layer",
]

#: ``"mean_2x2"``: each merged token takes the mean of its 2×2 parents (see the module docstring).
MERGE_RULES = ("mean_2x2",)
MERGE_WARNING = (
    "This rollout crosses patch merging with merge='mean_2x2': each merged token is taken as the mean of "
    "its 2x2 parents, which is not what the model computes (a learned linear layer on the four parents). "
    "Read the map as an approximation; rollout within one stage (stage=k) is exact."
)


@dataclass(frozen=True)
class WindowedRollout:
    """A windowed rollout and where it lives.

    Attributes:
        maps: ``(B, gh, gw)`` float32 (``windowed_rollout``) or ``(steps, B, gh, gw)``
            (``windowed_rollout_by_layer``): rows of ``R`` over ``start_layer``'s cells.
        grid_size: ``(gh, gw)`` cells of the map (``start_layer``'s grid).
        stride: ``(sy, sx)`` input pixels per map cell: cell ``(r, c)`` covers pixels
            ``[r·sy, (r+1)·sy) × [c·sx, (c+1)·sx)``.
        query_grid, query_stride: the grid and stride of ``end_layer``, where the query lives.
        start_layer, end_layer: the layers composed (inclusive).
        merged_before: layers before which the merge rule was applied (empty when exact).
        approximate: True when a merge rule was applied (``merged_before`` not empty).
    """

    maps: torch.Tensor
    grid_size: tuple[int, int]
    stride: tuple[int, int]
    query_grid: tuple[int, int]
    query_stride: tuple[int, int]
    start_layer: int
    end_layer: int
    merged_before: tuple[int, ...] = ()

    @property
    def approximate(self) -> bool:
        return bool(self.merged_before)


def _densify(values: torch.Tensor, geometry: LayerGeometry) -> torch.Tensor:
    """``(..., windows, Wt, Wt)`` per-window values -> ``(..., N, N)`` over the grid's cells,
    0 outside each query's window; rows and columns of padding / prefix slots are dropped."""
    cells = geometry.window_cells().to(values.device)  # (windows, Wt), −1: padding
    n = geometry.grid_size[0] * geometry.grid_size[1]
    queries = cells[:, :, None].expand(-1, -1, cells.shape[1])  # (windows, Wt, Wt)
    keys = cells[:, None, :].expand(-1, cells.shape[1], -1)
    real = (queries >= 0) & (keys >= 0)
    dense = values.new_zeros(*values.shape[:-3], n * n)
    dense[..., queries[real] * n + keys[real]] = values[..., real]  # each (cell, cell) pair at most once
    return dense.reshape(*values.shape[:-3], n, n)


def dense_attention(windows: torch.Tensor, geometry: LayerGeometry) -> torch.Tensor:
    """One layer's ``(B, windows, heads, Wt, Wt)`` probabilities as ``(B, heads, N, N)`` over
    the layer's ``N = gh·gw`` cells (row-major): ``A[q, k]`` is the probability query cell
    ``q`` gave key cell ``k`` in their shared window, 0 when they share none. Padding keys'
    probability is dropped (a row may sum to less than one)."""
    return _densify(windows.transpose(1, 2), geometry)  # (B, heads, windows, Wt, Wt) -> (B, heads, N, N)


def window_pairs(geometry: LayerGeometry) -> torch.Tensor:
    """``(N, N)`` bool: the (query cell, key cell) pairs the layer's attention is defined on
    (same window, kept by the shift mask), without the diagonal: what ``discard_ratio`` may
    discard."""
    allowed = geometry.allowed()  # (windows, Wt, Wt)
    pairs = _densify(allowed, geometry)
    return pairs & ~torch.eye(pairs.shape[-1], dtype=torch.bool)


def merge_matrix(before: LayerGeometry, after: LayerGeometry) -> torch.Tensor:
    """``(N_after, N_before)`` float64: the mean-of-2×2-parents rule of the module docstring.

    Raises AnalysisError when the two grids are not related by a 2×2 patch merging
    (``after.grid_size == ⌈before.grid_size / 2⌉`` and ``after.stride == 2·before.stride``)."""
    (gh, gw), (mh, mw) = before.grid_size, after.grid_size
    if (mh, mw) != (-(-gh // 2), -(-gw // 2)) or after.stride != (2 * before.stride[0], 2 * before.stride[1]):
        raise AnalysisError(
            f"merge='mean_2x2' needs a 2x2 patch merging between the layers, but the grid goes from {gh}x{gw} cells "
            f"of {before.stride[0]}x{before.stride[1]} px to {mh}x{mw} of {after.stride[0]}x{after.stride[1]} px."
        )
    matrix = torch.zeros(mh * mw, gh * gw, dtype=torch.float64)
    rows = torch.arange(gh)[:, None].expand(gh, gw).reshape(-1)  # parent cell (r, c) of each column
    cols = torch.arange(gw)[None, :].expand(gh, gw).reshape(-1)
    matrix[(rows // 2) * mw + cols // 2, rows * gw + cols] = 1.0
    return matrix / matrix.sum(dim=1, keepdim=True)  # each merged token: mean of its real parents


def _same_token_set(a: LayerGeometry, b: LayerGeometry) -> bool:
    return a.grid_size == b.grid_size and a.stride == b.stride


def _plan(record: WindowedAttentionRecord, start_layer, end_layer, stage, merge) -> tuple[int, int, tuple[int, ...]]:
    """``(start, end, merged_before)``; refuses a range across patch merging without ``merge``."""
    if not isinstance(record, WindowedAttentionRecord):
        raise AnalysisError(f"windowed rollout takes a WindowedAttentionRecord, got {type(record).__name__}.")
    spec = record.spec
    start, end = layer_range(spec, start_layer, end_layer, stage)
    for layer in range(start, end + 1):
        record.layer_position(layer)  # every layer of the range captured, else a clear error
    merged = tuple(
        layer
        for layer in range(start + 1, end + 1)
        if not _same_token_set(spec.geometry(layer - 1), spec.geometry(layer))
    )
    if merged and merge is None:
        before, after = spec.geometry(merged[0] - 1), spec.geometry(merged[0])
        stages = sorted({spec.geometry(layer).stage for layer in range(start, end + 1)})
        raise AnalysisError(
            f"attention_rollout over layers {start}..{end}: the token set changes before layer {merged[0]} "
            f"(patch merging, {before.grid_size[0]}x{before.grid_size[1]} cells of {before.stride[0]} px -> "
            f"{after.grid_size[0]}x{after.grid_size[1]} of {after.stride[0]} px), through a learned layer that "
            f"rollout has no exact rule for. Roll out within one stage (stage=k, one of {stages}, or start_layer/"
            "end_layer inside it), or pass merge='mean_2x2' for an approximation (each merged token the mean "
            "of its 2x2 parents)."
        )
    return start, end, merged


def _steps(
    record, head_fusion, discard_ratio, start, end, merged
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor | None]]:
    spec = record.spec
    if spec.residual_norm == "post":
        warnings.warn(POST_NORM_WARNING, RuntimeWarning, stacklevel=5)
    if merged:
        warnings.warn(MERGE_WARNING, RuntimeWarning, stacklevel=5)
    for layer in range(start, end + 1):
        geometry = spec.geometry(layer)
        if geometry.prefix_tokens:  # their rows and columns would be dropped with the padding slots
            raise AnalysisError(
                f"Layer {layer} has {geometry.prefix_tokens} prefix tokens in its windows: windowed "
                "rollout covers grid cells only, so this model is not supported."
            )
        windows = record.windows[record.layer_position(layer)]  # (B, windows, heads, Wt, Wt)
        fused = fuse_heads(windows.double().transpose(1, 2), head_fusion)  # (B, windows, Wt, Wt)
        dense = _densify(fused, geometry)  # (B, N, N)
        mixed = mix_identity(dense, discard_ratio, window_pairs(geometry) if discard_ratio else None)
        carry = merge_matrix(spec.geometry(layer - 1), geometry) if layer in merged else None
        yield layer, mixed, carry


def windowed_rollout_matrices(
    record: WindowedAttentionRecord,
    *,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    start_layer: int = 0,
    end_layer: int | None = None,
    stage: int | None = None,
    merge: str | None = None,
) -> tuple[torch.Tensor, tuple[int, int, tuple[int, ...]]]:
    """``(R (B, N_end, N_start) float64, (start, end, merged_before))``: rows are the cells of
    ``end_layer``'s grid, columns those of ``start_layer``'s; every row sums to one."""
    start, end, merged = _plan(record, start_layer, end_layer, stage, merge)
    rollout = None
    for _, step_rollout in compose_rollout(_steps(record, head_fusion, discard_ratio, start, end, merged)):
        rollout = step_rollout  # the last step's
    assert rollout is not None, "layer_range gives start <= end: one step at least"
    return rollout, (start, end, merged)


def _row(rollout: torch.Tensor, geometry: LayerGeometry, query) -> torch.Tensor:
    """``(B, N_end, N_start)`` -> ``(B, N_start)``: the mean of the query cells' rows."""
    return rollout[:, query_cells(geometry, query), :].mean(dim=1)


def _result(record, maps, start, end, merged) -> WindowedRollout:
    first, last = record.spec.geometry(start), record.spec.geometry(end)
    return WindowedRollout(
        maps=maps,
        grid_size=first.grid_size,
        stride=first.stride,
        query_grid=last.grid_size,
        query_stride=last.stride,
        start_layer=start,
        end_layer=end,
        merged_before=merged,
    )


def windowed_rollout(
    record: WindowedAttentionRecord,
    *,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    start_layer: int = 0,
    end_layer: int | None = None,
    query=None,
    stage: int | None = None,
    merge: str | None = None,
) -> WindowedRollout:
    """Rollout of one query of a windowed record (see the module docstring).

    ``R`` as in :func:`windowed_rollout_matrices`; ``query``: a cell of ``end_layer``'s grid,
    an input pixel ``(y, x)``, or ``"mean"`` / ``None`` (every cell: a windowed model has no
    class token). ``maps`` is the query's row of ``R`` on ``start_layer``'s grid, not rescaled.
    """
    rollout, (start, end, merged) = windowed_rollout_matrices(
        record,
        head_fusion=head_fusion,
        discard_ratio=discard_ratio,
        start_layer=start_layer,
        end_layer=end_layer,
        stage=stage,
        merge=merge,
    )
    first = record.spec.geometry(start)
    maps = _row(rollout, record.spec.geometry(end), query).reshape(-1, *first.grid_size).float()
    return _result(record, maps, start, end, merged)


def windowed_rollout_by_layer(
    record: WindowedAttentionRecord,
    *,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    start_layer: int = 0,
    query=None,
    stage: int | None = None,
    merge: str | None = None,
) -> WindowedRollout:
    """The rollout after each layer of ``start_layer``..last (or of ``stage``) in one pass:
    ``maps (steps, B, gh, gw)`` on ``start_layer``'s grid; entry ``i`` equals
    ``windowed_rollout(..., end_layer=start + i).maps``. The query is read on each entry's own
    layer grid, so a cell index is refused when those grids differ (use a pixel or ``"mean"``)."""
    start, end, merged = _plan(record, start_layer, None, stage, merge)
    grids = {record.spec.geometry(layer).grid_size for layer in range(start, end + 1)}
    if len(grids) > 1 and not (query is None or query == "mean" or isinstance(query, tuple)):
        raise AnalysisError(
            f"query={query!r}: a cell index means a different place on each stage's grid ({sorted(grids)}); "
            "pass an input pixel (y, x) or 'mean'."
        )
    first = record.spec.geometry(start)
    maps = [
        _row(rollout, record.spec.geometry(layer), query).reshape(-1, *first.grid_size).float()
        for layer, rollout in compose_rollout(_steps(record, head_fusion, discard_ratio, start, end, merged))
    ]
    return _result(record, torch.stack(maps), start, end, merged)
