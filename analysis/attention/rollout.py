"""Attention rollout (Abnar & Zuidema, 2020), as in the ViT paper's Figure 6, written once for
every record.

Per layer, the heads are fused and the layer's attention is read as one dense matrix over its
tokens (:mod:`analysis.records.token_matrix`: a ViT's ``T = P + gh·gw`` tokens, a windowed
layer's ``gh·gw`` grid cells, each window put back in place and 0 between cells that share none):

    Â = ½·A + ½·I, each row divided by its sum;     R = Â_end ⋯ Â_start

(:mod:`analysis.attention.rollout_rules`). The map is the query's row of ``R`` over the start
layer's grid cells (a ViT's patches: its prefix tokens' columns left out).

**Windowed layers.** Padding keys (zero tokens that pad a grid up to whole windows) are not
cells: their probability is dropped, not spread over the real keys, so a row of ``A`` may sum to
less than one, and the row normalisation of ``Â`` divides it by ``1 − p/2`` (``p`` its padding
mass): the dropped mass is shared out in proportion between the identity and the real keys.
Heads are fused on the windows before the matrix is built (mean, max and min commute with putting
zeros outside the window), and ``discard_ratio`` counts only the pairs the windows define
(:func:`analysis.records.token_matrix.defined_pairs`), never the zeros outside them.

* **Within a stage** (one grid, one token set: every layer of a ViT; SAM's window and global
  blocks) the composition is exact.
* **Across Swin's patch merging** the token set changes (``N`` cells become ``N′ ≈ N/4``)
  through a learned linear layer on the four parents concatenated, with no residual path;
  rollout has no exact rule for it. By default such a range is refused with the reason. With
  ``merge="mean_2x2"`` the merged token takes the mean of its 2×2 parents:

      M[c′, c] = 1 / |P(c′)|  if c ∈ P(c′),  else 0;     M is (N′, N)
      P((r′, x′)) = {(2r′ + i, 2x′ + j) : i, j ∈ {0, 1}, inside the grid}

  (four parents, ¼ each, on an even grid; an odd grid's last row or column has fewer parents,
  because the module pads it with zero tokens, which are not cells). Then
  ``R = Â_end ⋯ Â_(s+1) · M · Â_(s) ⋯ Â_start``: rows stay probability distributions, and the
  result is labelled an approximation (:attr:`RolloutMaps.approximate`, a RuntimeWarning).

:func:`rollout_maps` returns the maps with where they live (grid, stride, the query's grid);
:func:`attention_rollout` and :func:`attention_rollout_by_layer` return the maps alone.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..base.arguments import check_index
from ..base.errors import AnalysisError
from ..model.geometry import LayerGeometry, ViTSpec
from ..records.attention import AttentionRecord, AttentionRecordProtocol
from ..records.queries import Query
from ..records.token_matrix import defined_pairs, layer_heads, token_matrix, token_rows
from .rollout_rules import POST_NORM_WARNING, compose_rollout, fuse_heads, layer_range, mix_identity

__all__ = [
    "MERGE_RULES",
    "MERGE_WARNING",
    "RolloutMaps",
    "attention_rollout",
    "attention_rollout_by_layer",
    "merge_matrix",
    "patch_grid_rollout",
    "rollout_maps",
    "rollout_matrices",
    "rollout_steps",
    "rollout_uniform_level",
]

#: ``"mean_2x2"``: each merged token takes the mean of its 2×2 parents (see the module docstring).
MERGE_RULES = ("mean_2x2",)
MERGE_WARNING = (
    "This rollout crosses patch merging with merge='mean_2x2': each merged token is taken as the mean of "
    "its 2x2 parents, which is not what the model computes (a learned linear layer on the four parents). "
    "Read the map as an approximation; rollout within one stage (stage=k) is exact."
)


@dataclass(frozen=True)
class RolloutMaps:
    """Rollout maps and where they live (what :func:`rollout_maps` returns).

    :attr:`approximate` is True when a merge rule was applied (``merged_before`` not empty).

    Attributes
    ----------
    maps : torch.Tensor
        ``(B, gh, gw)`` float32 (:func:`rollout_maps`) or ``(steps, B, gh, gw)`` float32
        (``by_layer=True``): rows of ``R`` over ``start_layer``'s grid cells.
    grid_size : tuple of int
        ``(gh, gw)`` cells of the map (``start_layer``'s grid).
    stride : tuple of int
        ``(sy, sx)`` input pixels per map cell: cell ``(r, c)`` covers pixels
        ``[r·sy, (r+1)·sy) × [c·sx, (c+1)·sx)``.
    query_grid : tuple of int
        The grid ``(gh, gw)`` of ``end_layer``, where the query lives.
    query_stride : tuple of int
        The stride ``(sy, sx)`` of ``end_layer``, in input pixels per query-grid cell.
    start_layer : int
        The first layer composed (non-negative).
    end_layer : int
        The last layer composed (inclusive, non-negative).
    merged_before : tuple of int, default ()
        Layers before which the merge rule was applied (empty when exact).
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
        """True when a merge rule was applied (``merged_before`` not empty)."""
        return bool(self.merged_before)


def rollout_uniform_level(spec: ViTSpec, start_layer: int = 0) -> float:
    """The weight each token of a rollout map gets when the query's row is spread evenly over the
    tokens the rollout runs over: the "uniform" reference of the map's colour range
    (:func:`analysis.plots.colour_range`).

        u = 1 / (P + gh·gw),   P = prefix tokens, (gh, gw) the grid of ``spec.geometry(start_layer)``

    The map lies on the start layer's grid (:func:`attention_rollout_by_layer`). A ViT: ``1/T``
    (its prefix tokens and every patch of the one grid). A windowed model (Swin, SAM): one over
    the cells of the start layer's stage grid (no prefix tokens).

    Parameters
    ----------
    spec : ViTSpec
        The model's spec.
    start_layer : int, default 0
        The rollout's first layer, whose grid the map lies on (negative counts from the end).

    Returns
    -------
    float
        ``u``, the uniform weight of one token.

    Raises
    ------
    AnalysisError
        ``start_layer`` is not a layer of the model.
    """
    geometry = spec.geometry(check_index("start_layer", start_layer, spec.num_layers, "layers"))
    gh, gw = geometry.grid_size
    return 1.0 / (geometry.prefix_tokens + gh * gw)


def merge_matrix(before: LayerGeometry, after: LayerGeometry) -> torch.Tensor:
    """The mean-of-2×2-parents rule of the module docstring, as a matrix from the cells before a
    patch merging to the cells after it:

        M[c′, c] = 1 / |P(c′)|  if c ∈ P(c′),  else 0

    Parameters
    ----------
    before : LayerGeometry
        The geometry of the last layer before the merging (``N_before = gh·gw`` cells).
    after : LayerGeometry
        The geometry of the first layer after it (``N_after`` cells).

    Returns
    -------
    torch.Tensor
        ``(N_after, N_before)`` float64, each row summing to one over the merged cell's real parents.

    Raises
    ------
    AnalysisError
        The two grids are not related by a 2×2 patch merging (``after.grid_size ==
        ⌈before.grid_size / 2⌉`` and ``after.stride == 2·before.stride``).
    """
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


def _check_record(record) -> None:
    if not isinstance(record, AttentionRecordProtocol):
        raise AnalysisError(
            f"attention_rollout takes the record that capture_attention(vit, pixels) returns, got {type(record).__name__}."
        )


def _plan(record, start_layer, end_layer, stage, merge) -> tuple[int, int, tuple[int, ...]]:
    """``(start, end, merged_before)``: the layers composed, and those before which the token set
    changes (Swin's patch merging); refuses such a range without ``merge``."""
    _check_record(record)
    if merge is not None and merge not in MERGE_RULES:
        raise AnalysisError(
            f"merge must be None (refuse to cross patch merging) or one of {MERGE_RULES}, not {merge!r}."
        )
    if getattr(record, "query_tokens", None) is not None:
        raise AnalysisError("Rollout needs every query row: capture with query_tokens=None.")
    spec = record.spec
    start, end = layer_range(spec, start_layer, end_layer, stage)
    for layer in range(start, end + 1):
        record.layer_position(layer)  # every layer of the range captured, else a clear error
    merged = tuple(
        layer
        for layer in range(start + 1, end + 1)
        if (spec.geometry(layer - 1).grid_size, spec.geometry(layer - 1).stride)
        != (spec.geometry(layer).grid_size, spec.geometry(layer).stride)
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


def _layers(
    record, head_fusion, discard_ratio, start, end, merged, *, last_first: bool = False
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor | None]]:
    """``(layer, Â_layer (B, N, N) float64, carry)`` for start..end (``last_first``: end..start):
    what :func:`compose_rollout` composes."""
    spec = record.spec
    if spec.residual_norm == "post":
        warnings.warn(POST_NORM_WARNING, RuntimeWarning, stacklevel=5)
    if merged:
        warnings.warn(MERGE_WARNING, RuntimeWarning, stacklevel=5)
    for layer in range(end, start - 1, -1) if last_first else range(start, end + 1):
        fused = fuse_heads(layer_heads(record, layer), head_fusion, torch.float64)  # heads reduced, the record's layout
        dense = token_matrix(record, fused, layer)  # (B, N, N) over the layer's tokens
        mixed = mix_identity(dense, discard_ratio, defined_pairs(record, layer) if discard_ratio else None)
        carry = merge_matrix(spec.geometry(layer - 1), spec.geometry(layer)) if layer in merged else None
        yield layer, mixed, carry


def rollout_steps(
    record: AttentionRecord,
    head_fusion: str,
    discard_ratio: float,
    start_layer: int,
    end_layer: int | None,
    stage: int | None = None,
    merge: str | None = None,
) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield ``(layer, R_layer)`` with ``R_layer = Â_layer ⋯ Â_start`` for layer = start..end (or
    every layer of ``stage``; :func:`~analysis.attention.rollout_rules.layer_range`): the running
    products :func:`rollout_matrices` and :func:`attention_rollout_by_layer` read, for a caller
    that wants every partial rollout in one pass.

    Parameters
    ----------
    record : AttentionRecord
        A captured pass (:func:`capture_attention`) with every query row (``query_tokens=None``)
        and every layer of the range: attentions ``(L, B, heads, T, T)`` or, for a windowed model,
        one ``(B, windows, heads, Wt, Wt)`` tensor per layer.
    head_fusion : str
        How each layer's heads are fused: ``"mean"``, ``"max"`` or ``"min"`` over heads.
    discard_ratio : float
        Fraction in ``[0, 1)`` of each fused matrix's weakest pairs set to 0 before the identity
        is mixed in.
    start_layer : int
        First layer composed (negative counts from the end).
    end_layer : int or None
        Last layer composed, inclusive (negative counts from the end); ``None``, the last layer.
    stage : int or None, default None
        Every layer of that stage instead of ``start_layer``..``end_layer``.
    merge : str or None, default None
        ``None`` refuses a range across Swin's patch merging; ``"mean_2x2"`` approximates it
        (:func:`merge_matrix`).

    Yields
    ------
    tuple of (int, torch.Tensor)
        ``(layer, R_layer)``, ``R_layer`` ``(B, N_layer, N_start)`` float64 (a ViT: ``(B, T, T)``).

    Raises
    ------
    AnalysisError
        As :func:`rollout_maps` (raised as the generator runs).

    Warns
    -----
    RuntimeWarning
        A post-norm model, as every rollout does, or a range crossed with ``merge="mean_2x2"``.
    """
    start, end, merged = _plan(record, start_layer, end_layer, stage, merge)
    yield from compose_rollout(_layers(record, head_fusion, discard_ratio, start, end, merged))


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
    """The rolled-out token-to-token matrix ``R = Â_end ⋯ Â_start``: rows are ``end_layer``'s
    tokens, columns ``start_layer``'s.

    Per layer: fuse heads, discard (optional), ``Â = ½·A + ½·I``, then each row of ``Â``
    is divided by its sum over keys (``Â / Â.sum(-1, keepdim=True)``) so that every row of
    ``Â`` and of ``R`` is a probability distribution.

    Parameters
    ----------
    record : AttentionRecord
        A captured pass (:func:`capture_attention`) with every query row (``query_tokens=None``)
        and every layer of the range: attentions ``(L, B, heads, T, T)`` or, for a windowed model,
        one ``(B, windows, heads, Wt, Wt)`` tensor per layer.
    head_fusion : str, default "mean"
        How each layer's heads are fused: ``"mean"``, ``"max"`` or ``"min"`` over heads.
    discard_ratio : float, default 0.0
        Fraction in ``[0, 1)`` of each fused matrix's weakest pairs set to 0 before the identity
        is mixed in.
    start_layer : int, default 0
        First layer composed (negative counts from the end).
    end_layer : int or None, default None
        Last layer composed, inclusive (negative counts from the end); ``None``, the last layer.
    stage : int or None, default None
        Every layer of that stage instead of ``start_layer``..``end_layer``.
    merge : str or None, default None
        As in the module docstring: ``None`` refuses a range across Swin's patch merging;
        ``"mean_2x2"`` approximates it (:func:`merge_matrix`).

    Returns
    -------
    torch.Tensor
        ``(B, N_end, N_start)`` float64 (a ViT: ``(B, T, T)``).

    Raises
    ------
    AnalysisError
        As :func:`rollout_maps`.

    Warns
    -----
    RuntimeWarning
        A post-norm model, or a range crossed with ``merge="mean_2x2"``.
    """
    rollout = None
    for _, step_rollout in rollout_steps(record, head_fusion, discard_ratio, start_layer, end_layer, stage, merge):
        rollout = step_rollout  # the last step's
    assert rollout is not None, "layer_range gives start <= end: one step at least"
    return rollout


def _query_row(record, rollout: torch.Tensor, layer: int, query, start: int) -> torch.Tensor:
    """``(B, N_layer, N_start)`` -> ``(B, gh, gw)``: the mean of the query's rows over the start
    layer's grid cells (its prefix tokens' columns left out), float32."""
    return _on_start_grid(record, rollout[:, token_rows(record, layer, query), :].mean(dim=1), start)


def _on_start_grid(record, over_keys: torch.Tensor, start: int) -> torch.Tensor:
    """``(B, N_start)`` -> ``(B, gh, gw)`` float32: the start layer's grid cells (prefix tokens' columns left out)."""
    first = record.spec.geometry(start)
    return over_keys[:, first.prefix_tokens :].reshape(-1, *first.grid_size).float()


def _carried_down(record, steps, query) -> torch.Tensor:
    """The query's row of ``R = Â_top · C_top · Â_top-1 ⋯ Â_start`` (:func:`compose_rollout`),
    averaged over the query's rows (read on the top layer's grid), ``(B, N_start)`` float64,
    without forming ``R``: ``steps`` are ``(layer, Â_layer, carry)`` from the top layer down to
    the start, and the row vector ``u = mean_q(e_q)ᵀ · Â_top`` is carried down, ``u ← u · C`` across
    a merge and ``u ← u · Â_layer``, one vector-matrix product a layer: ``O(L·N²)`` instead of
    ``R``'s ``O(L·N³)`` (DINOv2-S at 518 px, N = 1,370: 12 products of 1,370² instead of 1,370³).
    The mean over rows commutes with the products (both linear), so this is the row
    :func:`_query_row` reads from ``R``, up to float64 rounding."""
    row, carry = None, None
    for layer, mixed, layer_carry in steps:
        if row is None:
            row = mixed[:, token_rows(record, layer, query), :].mean(dim=1, keepdim=True)  # (B, 1, N_top)
        else:
            if carry is not None:
                row = row @ carry.to(
                    row
                )  # across the merge before the layer above: (B, 1, T_above) · (T_above, T_layer)
            row = row @ mixed
        carry = layer_carry
    assert row is not None, "layer_range gives start <= end"
    return row[:, 0]


def _rolled_out_rows_by_layer(record, head_fusion, discard_ratio, start, end, merged, query) -> list[torch.Tensor]:
    """:func:`_carried_down` for every end layer of start..end, each ``(B, N_start)``: every ``Â``
    held at once (L matrices of ``N²`` float64) and each end layer's row carried down,
    ``O(L²·N²)`` against ``O(L·N³)`` for the products ``R_layer`` themselves (DINOv2-S at 518 px:
    78 vector-matrix products of 1,370² instead of 12 matrix products of 1,370³)."""
    steps = list(_layers(record, head_fusion, discard_ratio, start, end, merged))  # [(layer, Â, carry)], start first
    return [_carried_down(record, reversed(steps[: index + 1]), query) for index in range(len(steps))]


def rollout_maps(
    record: AttentionRecord,
    *,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    start_layer: int = 0,
    end_layer: int | None = None,
    query: Query | None = None,
    stage: int | None = None,
    merge: str | None = None,
    by_layer: bool = False,
) -> RolloutMaps:
    """Rollout of one query with where it lives (see the module docstring).

    ``R = Â_end ⋯ Â_start`` as in :func:`rollout_matrices`: per layer, the heads fused, the
    weakest pairs discarded (optional), ``Â = ½·A + ½·I`` with each row divided by its sum.
    ``maps`` is the query's row of ``R`` on ``start_layer``'s grid, not rescaled (a ViT's prefix
    tokens' columns left out). Warns (RuntimeWarning) on a post-norm model, and when the range
    crosses patch merging with ``merge="mean_2x2"`` (:attr:`RolloutMaps.approximate`).

    Parameters
    ----------
    record : AttentionRecord
        A captured pass (:func:`capture_attention`) with every query row
        (``query_tokens=None``) and every layer of the range: attentions ``(L, B, heads, T, T)``
        or, for a windowed model, one ``(B, windows, heads, Wt, Wt)`` tensor per layer.
    head_fusion : str, default "mean"
        How each layer's heads are fused: ``"mean"``, ``"max"`` or ``"min"`` over heads.
    discard_ratio : float, default 0.0
        Fraction in ``[0, 1)`` of each fused matrix's weakest pairs set to 0 before the identity
        is mixed in (off-diagonal pairs; on a windowed layer only the pairs its windows define).
    start_layer : int, default 0
        First layer composed (negative counts from the end).
    end_layer : int or None, default None
        Last layer composed, inclusive (negative counts from the end); ``None``, the last layer.
    query : int, (y, x), str or None, default None
        A ViT's ``None`` (the class token when the model has one, else the mean over patch
        queries), ``"cls"``, ``"mean"``, ``"prefix:<i>"``, a patch index or an input pixel
        ``(y, x)`` (the patch that contains it); a windowed record's cell of ``end_layer``'s grid,
        an input pixel ``(y, x)`` or ``"mean"`` / ``None`` (every cell: a windowed model has no
        class token).
    stage : int or None, default None
        Every layer of that stage (negative counts from the last stage; a ViT has stage 0 only)
        instead of ``start_layer``..``end_layer``, which must then be left at their defaults.
    merge : str or None, default None
        ``None`` refuses a range across Swin's patch merging; ``"mean_2x2"`` crosses it with each
        merged token the mean of its 2×2 parents (:func:`merge_matrix`), an approximation.
    by_layer : bool, default False
        The rollout after each layer of the range in one pass, ``maps (steps, B, gh, gw)``; entry
        ``i`` equals the rollout with ``end_layer = start + i``, its query read on that layer's
        grid (so a cell index is refused when those grids differ: use a pixel or ``"mean"``).
        Needs ``end_layer=None``.

    Returns
    -------
    RolloutMaps
        ``maps`` ``(B, gh, gw)`` float32, or ``(steps, B, gh, gw)`` with ``by_layer=True``
        (``steps = end_layer - start_layer + 1``), with the grid and stride of the map and of the
        query, the layers composed and those before which the merge rule was applied.

    Raises
    ------
    AnalysisError
        ``record`` not a captured record, or one that kept only some query rows or lacks a layer
        of the range; a range across patch merging with ``merge=None``; an unknown ``merge`` or
        ``head_fusion``; ``discard_ratio`` outside ``[0, 1)``; a layer range or ``stage`` that does
        not exist, or ``stage`` with ``start_layer`` / ``end_layer``; ``by_layer=True`` with
        ``end_layer``; a query the model does not have, or a cell index with ``by_layer=True``
        across grids that differ.

    Warns
    -----
    RuntimeWarning
        A post-norm model (rollout's ``½·A + ½·I`` assumes pre-norm blocks), or a range crossed
        with ``merge="mean_2x2"``.
    """
    if by_layer and end_layer is not None:
        raise AnalysisError("by_layer=True rolls out to the last layer (of the stage): pass end_layer=None.")
    start, end, merged = _plan(record, start_layer, end_layer, stage, merge)
    spec = record.spec
    if by_layer:
        grids = {spec.geometry(layer).grid_size for layer in range(start, end + 1)}
        if len(grids) > 1 and not (query is None or query == "mean" or isinstance(query, tuple)):
            raise AnalysisError(
                f"query={query!r}: a cell index means a different place on each stage's grid ({sorted(grids)}); "
                "pass an input pixel (y, x) or 'mean'."
            )
    if by_layer:
        rows = _rolled_out_rows_by_layer(record, head_fusion, discard_ratio, start, end, merged, query)
        maps = torch.stack([_on_start_grid(record, row, start) for row in rows])
    else:  # one query's row: carried down through the layers as a vector (each Â made as it is needed)
        steps = _layers(record, head_fusion, discard_ratio, start, end, merged, last_first=True)
        maps = _on_start_grid(record, _carried_down(record, steps, query), start)
    first, last = spec.geometry(start), spec.geometry(end)
    return RolloutMaps(
        maps=maps,
        grid_size=first.grid_size,
        stride=first.stride,
        query_grid=last.grid_size,
        query_stride=last.stride,
        start_layer=start,
        end_layer=end,
        merged_before=merged,
    )


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
    """Attention rollout of one query over the start layer's grid: :func:`rollout_maps`'s
    ``maps`` (a ViT: its patch grid; a windowed record: the grid of ``start_layer``'s stage, the
    query on ``end_layer``'s grid).

    ``R = Â_end ⋯ Â_start`` as in :func:`rollout_matrices` (Abnar & Zuidema, 2020; see the module
    docstring), read at the query's row.

    Parameters
    ----------
    record : AttentionRecord
        A captured pass (:func:`capture_attention`) with every query row
        (``query_tokens=None``) and every layer of the range: attentions ``(L, B, heads, T, T)``
        or, for a windowed model, one ``(B, windows, heads, Wt, Wt)`` tensor per layer.
    head_fusion : str, default "mean"
        How each layer's heads are fused: ``"mean"``, ``"max"`` or ``"min"`` over heads.
    discard_ratio : float, default 0.0
        Fraction in ``[0, 1)`` of each fused matrix's weakest pairs set to 0 before the identity
        is mixed in.
    start_layer : int, default 0
        First layer composed (negative counts from the end).
    end_layer : int or None, default None
        Last layer composed, inclusive (negative counts from the end); ``None``, the last layer.
    query : int, (y, x), str or None, default None
        As in :func:`rollout_maps`: ``None`` is the class token when the model has one, else the
        mean over patch (or cell) queries; also ``"cls"``, ``"mean"``, ``"prefix:<i>"``, a patch
        (cell) index or an input pixel ``(y, x)``.
    stage : int or None, default None
        Every layer of that stage instead of ``start_layer``..``end_layer``.
    merge : str or None, default None
        ``None`` refuses a range across Swin's patch merging; ``"mean_2x2"`` approximates it.

    Returns
    -------
    torch.Tensor
        ``(B, gh, gw)`` float32 on ``start_layer``'s grid, not rescaled.

    Raises
    ------
    AnalysisError
        As :func:`rollout_maps`.

    Warns
    -----
    RuntimeWarning
        A post-norm model, or a range crossed with ``merge="mean_2x2"``.
    """
    return rollout_maps(
        record,
        head_fusion=head_fusion,
        discard_ratio=discard_ratio,
        start_layer=start_layer,
        end_layer=end_layer,
        query=query,
        stage=stage,
        merge=merge,
    ).maps


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
    """The rollout after each layer, in one pass (:func:`rollout_maps` with ``by_layer=True``).

    Entry ``i`` equals ``attention_rollout(record, ..., end_layer=start_layer + i)``, but all
    partial products ``Â_end ⋯ Â_start`` are built incrementally (L matrix products, not L²/2).

    Parameters
    ----------
    record : AttentionRecord
        A captured pass (:func:`capture_attention`) with every query row
        (``query_tokens=None``) and every layer of the range: attentions ``(L, B, heads, T, T)``
        or, for a windowed model, one ``(B, windows, heads, Wt, Wt)`` tensor per layer.
    head_fusion : str, default "mean"
        How each layer's heads are fused: ``"mean"``, ``"max"`` or ``"min"`` over heads.
    discard_ratio : float, default 0.0
        Fraction in ``[0, 1)`` of each fused matrix's weakest pairs set to 0 before the identity
        is mixed in.
    start_layer : int, default 0
        First layer composed (negative counts from the end); the rollout runs to the last layer.
    query : int, (y, x), str or None, default None
        As in :func:`rollout_maps`, read on each step's layer grid: a cell index is refused when
        the grids of the range differ (use a pixel ``(y, x)`` or ``"mean"``).
    stage : int or None, default None
        The layers of that stage only, instead of ``start_layer`` to the last layer.
    merge : str or None, default None
        ``None`` refuses a range across Swin's patch merging; ``"mean_2x2"`` approximates it.

    Returns
    -------
    torch.Tensor
        ``(steps, B, gh, gw)`` float32 on ``start_layer``'s grid, ``steps`` the layers of the range.

    Raises
    ------
    AnalysisError
        As :func:`rollout_maps`.

    Warns
    -----
    RuntimeWarning
        A post-norm model, or a range crossed with ``merge="mean_2x2"``.
    """
    return rollout_maps(
        record,
        head_fusion=head_fusion,
        discard_ratio=discard_ratio,
        start_layer=start_layer,
        query=query,
        stage=stage,
        merge=merge,
        by_layer=True,
    ).maps


def patch_grid_rollout(record: AttentionRecord) -> torch.Tensor:
    """The attention rollout on the model's own patch grid (``spec.grid_size``, the patch
    embedding's, the grid a salient token drop ranks patches on,
    :func:`analysis.robustness.probe`'s ``saliency``): the first stage's rollout (every layer of a
    ViT, whose one stage it is), for the default query (a ViT's class token, else the mean cell).

    Parameters
    ----------
    record : AttentionRecord
        A captured pass (:func:`capture_attention`) with every query row (``query_tokens=None``)
        and every layer of the first stage.

    Returns
    -------
    torch.Tensor
        ``(B, gh, gw)`` float32 on ``spec.grid_size``, not rescaled.

    Raises
    ------
    AnalysisError
        As :func:`attention_rollout`.

    Warns
    -----
    RuntimeWarning
        A post-norm model.
    """
    return attention_rollout(record, stage=0)
