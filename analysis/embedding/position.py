"""Cosine similarity of position encodings (ViT paper, Figure 7 centre), for every kind.

* A learned absolute table (ViT, DeiT, DINOv2, EVA-02, PE, NaFlex): the paper's figure,
  the similarity of the table's rows of each pair of patches.
* Rotary embeddings (DINOv3, EVA-02, PE, rope ViTs): there is no table, but every patch
  position p has a well-defined rotary feature vector r(p) = [sin(θ·p), cos(θ·p)] (the
  ``rope`` tensor the model passes to its attention, over all frequencies θ). We show the
  cosine similarity of those vectors. Since sin·sin + cos·cos = cos(θ·(p − p′)), it is the
  mean over frequencies of cos(θ·(p − p′)): a function of the displacement only.
* Relative-position bias (BEiT, vit_relpos): positions exist only as a bias on attention
  scores that depends on the displacement; there is no per-position vector to compare.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from timm.layers import resample_abs_pos_embed

from ..base.arguments import check_int
from ..base.errors import AnalysisError
from ..model.geometry import patch_embedding_module

__all__ = [
    "patch_position_embeddings",
    "rotary_position_features",
    "position_embedding_similarity",
    "position_encoding_kinds",
    "similarity_by_distance",
    "similarity_distance_bins",
    "DistanceBins",
]


def position_encoding_kinds(vit) -> tuple[str, ...]:
    """The encodings :func:`position_embedding_similarity` can show: "table" and/or "rope".

    Read from ``vit.spec.position_embedding``: ``"table"`` when it has a learned absolute table,
    ``"rope"`` when it has rotary embeddings.

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`~analysis.load_vit`).

    Returns
    -------
    tuple of str
        ``("table",)``, ``("rope",)``, ``("table", "rope")`` (in that order: the first is the default
        ``kind``), or ``()`` for a model with neither (a relative-position bias only, or no position at all).
    """
    kind = vit.spec.position_embedding
    return tuple(k for k, present in (("table", "learned" in kind), ("rope", "rope" in kind)) if present)


def _learned_table(vit) -> tuple[torch.Tensor, tuple[int, int]]:
    """``(1, P + N, D)`` position table and its patch grid ``(gh, gw)``."""
    model = vit.model
    pos_embed = getattr(model, "pos_embed", None)
    if isinstance(pos_embed, torch.Tensor) and pos_embed.ndim == 3:
        gh, gw = (int(g) for g in model.patch_embed.grid_size)
        return pos_embed.detach().float().cpu(), (gh, gw)
    embed_table = (
        pos_embed if isinstance(pos_embed, torch.Tensor) else getattr(patch_embedding_module(model), "pos_embed", None)
    )
    if isinstance(embed_table, torch.Tensor) and embed_table.ndim == 4:  # SAM, NaFlex: (1, gh, gw, D), its own grid
        gh, gw = int(embed_table.shape[1]), int(embed_table.shape[2])
        return embed_table.detach().float().cpu().reshape(1, gh * gw, -1), (gh, gw)
    raise AnalysisError(_no_table_message(vit))


def _no_table_message(vit) -> str:
    kind = vit.spec.position_embedding
    if "rope" in kind:
        return f"{vit.name} has no learned position table; it uses rotary embeddings: use kind='rope'."
    if "relative" in kind:
        return (
            f"{vit.name} encodes positions only as a relative-position bias on attention scores (it depends on "
            "the displacement between two patches), so there is no per-position embedding to compare."
        )
    return f"{vit.name} has no position embedding at all."


def patch_position_embeddings(vit, *, grid_size: tuple[int, int] | None = None) -> torch.Tensor:
    """The learned position embeddings of the patch tokens as a grid, ``(gh, gw, D)`` float32.

    Prefix positions (class / distillation tokens) are dropped; models with
    ``no_embed_class`` have none. With ``grid_size``, the patch embeddings are first
    resampled to that grid (bicubic, antialiased, as timm does when fine-tuning at a
    higher resolution).

    Parameters
    ----------
    vit : LoadedViT
        A model with a learned absolute table: ``pos_embed`` ``(1, P + N, D)``, or a
        ``(1, gh, gw, D)`` table on its own grid (SAM, NaFlex).
    grid_size : (int, int) or None, default None
        The ``(gh, gw)`` grid to resample the table to; ``None``, the table's own grid.

    Returns
    -------
    torch.Tensor
        ``(gh, gw, D)`` float32 on the CPU, detached.

    Raises
    ------
    AnalysisError
        If the model has no learned table (the message says whether it uses rotary embeddings
        or a relative-position bias instead), the table has fewer positions than the grid's
        patches, or ``grid_size`` is not a pair of positive integers.
    """
    embed, old_grid = _learned_table(vit)  # (1, prefix_in_embed + N, D)
    num_patches = old_grid[0] * old_grid[1]
    prefix_in_embed = embed.shape[1] - num_patches
    if prefix_in_embed < 0:
        raise AnalysisError(
            f"pos_embed has {embed.shape[1]} positions, fewer than the {num_patches} patches of a {old_grid} grid."
        )
    patches = embed[:, prefix_in_embed:]  # (1, N, D)
    grid = _checked_grid(grid_size, old_grid)
    if grid != old_grid:
        patches = resample_abs_pos_embed(patches, new_size=list(grid), old_size=list(old_grid), num_prefix_tokens=0)
    return patches.reshape(grid[0], grid[1], -1)


def _checked_grid(grid_size, default: tuple[int, int]) -> tuple[int, int]:
    if grid_size is None:
        return (default[0], default[1])
    if isinstance(grid_size, (str, bytes)) or not hasattr(grid_size, "__len__") or len(grid_size) != 2:
        raise AnalysisError(f"grid_size must be a (rows, columns) pair, got {grid_size!r}.")
    grid = (
        check_int("grid_size rows", grid_size[0], minimum=1),
        check_int("grid_size columns", grid_size[1], minimum=1),
    )
    return grid


@torch.no_grad()
def rotary_position_features(vit, *, grid_size: tuple[int, int] | None = None, layer: int = 0) -> torch.Tensor:
    """Each patch position's rotary feature vector, ``(gh, gw, F)`` float32.

    Read from the model itself: the ``rope`` tensor its forward passes to block ``layer``'s
    attention (``[sin, cos]`` over all frequencies; per-head frequencies, as in mixed-mode
    RoPE, are concatenated), at the engine's point ``blocks.{layer}.attn.rope``
    (:func:`analysis.engine.activations.run.hooks_around`: this call's thread only). The forward,
    of an all-zero ``(1, 3, gh·ph, gw·pw)`` input, stops there.

    Parameters
    ----------
    vit : LoadedViT
        A model with rotary position embeddings (DINOv3, EVA-02, PE, rope ViTs).
    grid_size : (int, int) or None, default None
        The ``(gh, gw)`` patch grid to compute the features on; ``None``, the model's
        ``spec.grid_size``. Another grid needs a model that accepts other input sizes (loaded with
        ``dynamic_img_size=True``).
    layer : int, default 0
        The block whose attention's ``rope`` tensor is read (negative from the end).

    Returns
    -------
    torch.Tensor
        ``(gh, gw, F)`` float32 on the CPU, detached, with ``F`` every ``[sin, cos]`` feature of one
        position (all heads' frequencies side by side).

    Raises
    ------
    AnalysisError
        For a model without rotary embeddings, a ``grid_size`` that is not a pair of positive integers or
        that the model cannot take, a ``layer`` that does not exist, or a model that passes no rotary
        tensor (or one of another number of positions) to that block's attention.
    """
    if "rope" not in vit.spec.position_embedding:
        raise AnalysisError(f"{vit.name} has no rotary position embedding (it uses {vit.spec.position_embedding}).")
    spec = vit.spec
    grid = _checked_grid(grid_size, spec.grid_size)
    if grid != spec.grid_size and not spec.dynamic_img_size:
        raise AnalysisError(
            f"{vit.name} takes only {spec.grid_size[0]}x{spec.grid_size[1]} patch grids: load it with "
            "dynamic_img_size=True to see its rotary features on another grid."
        )
    from ..engine.activations.run import StopForward, hooks_around
    from ..model.adapters import block_sites

    sites = block_sites(vit.model, vit.name)
    if not -len(sites) <= layer < len(sites):
        raise AnalysisError(f"Layer {layer} does not exist: the model has {len(sites)} layers.")
    seen: list[torch.Tensor] = []

    def grab(rope) -> None:
        seen.append(rope)
        raise StopForward  # nothing after this block is needed

    pixels = torch.zeros(1, 3, grid[0] * spec.patch_size[0], grid[1] * spec.patch_size[1], device=vit.device)
    with hooks_around(vit.model, {f"blocks.{layer % len(sites)}.attn.rope": grab}, sites=sites):
        vit.model(pixels)
    rope = seen[0] if seen else None
    if not isinstance(rope, torch.Tensor):
        raise AnalysisError(f"{vit.name} did not pass a rotary embedding to block {layer}'s attention.")
    count = grid[0] * grid[1]
    rope = rope.detach().float().cpu()
    while rope.ndim > 2 and rope.shape[0] == 1:  # batch / head singletons
        rope = rope[0]
    if rope.shape[-2] != count:
        raise AnalysisError(f"The rotary tensor has {rope.shape[-2]} positions, expected {count} patches.")
    features = rope.movedim(-2, 0).reshape(count, -1)  # (N, ...·F): per-head frequencies side by side
    return features.reshape(grid[0], grid[1], -1)


def position_embedding_similarity(
    vit, *, grid_size: tuple[int, int] | None = None, kind: str | None = None
) -> torch.Tensor:
    """Cosine similarity between the position encodings of every pair of patches.

        S[i, j, k, l] = ⟨e_ij, e_kl⟩ / (‖e_ij‖·‖e_kl‖)

    with ``e_ij`` the encoding of the patch in row i, column j: the learned table's row
    (``kind="table"``, the paper's Figure 7) or the rotary feature vector ``[sin(θ·p), cos(θ·p)]``
    (``kind="rope"``; see the module docstring). Tile ``S[i, j]`` is the figure's small image for
    patch (i, j). Prefix positions (class / distillation tokens) are left out.

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`~analysis.load_vit`), with a learned position table or rotary embeddings
        (:func:`position_encoding_kinds`).
    grid_size : (int, int) or None, default None
        The ``(gh, gw)`` patch grid; ``None``, the table's own grid (``kind="table"``) or the model's
        (``kind="rope"``). With ``kind="table"`` the table's patch rows are first resampled to it
        (bicubic, antialiased, as timm does when fine-tuning at a higher resolution); with
        ``kind="rope"`` the rotary features are computed on it (:func:`rotary_position_features`, at
        layer 0).
    kind : {"table", "rope"} or None, default None
        Which encoding; ``None`` picks the table when there is one, else the rotary features.

    Returns
    -------
    torch.Tensor
        ``S``, ``(gh, gw, gh, gw)`` float32 on the CPU (computed in float64).

    Raises
    ------
    AnalysisError
        For a model without the encoding asked (with ``kind=None``: with neither, a relative-position
        bias only or no position at all), an unknown ``kind``, a ``grid_size`` that is not a pair of
        positive integers (or, with ``kind="rope"``, that the model cannot take), or a table with
        all-zero positions (as before training), where cosine similarity is undefined.
    """
    kinds = position_encoding_kinds(vit)
    if kind is None:
        if not kinds:
            raise AnalysisError(_no_table_message(vit))
        kind = kinds[0]
    if kind == "table":
        grid_embed = patch_position_embeddings(vit, grid_size=grid_size)  # (gh, gw, D)
    elif kind == "rope":
        grid_embed = rotary_position_features(vit, grid_size=grid_size)  # (gh, gw, F)
    else:
        raise AnalysisError(f"kind must be 'table', 'rope' or None, not {kind!r}.")
    gh, gw, _ = grid_embed.shape
    _refuse_zero_positions(vit, grid_embed)
    unit = F.normalize(grid_embed.reshape(gh * gw, -1).double(), dim=-1)  # (N, D)
    return (unit @ unit.T).reshape(gh, gw, gh, gw).float()


def _refuse_zero_positions(vit, grid_embed: torch.Tensor) -> None:
    """Cosine similarity is undefined for a position whose encoding is the zero vector."""
    zero = int((grid_embed.reshape(-1, grid_embed.shape[-1]).abs().amax(-1) == 0).sum())
    if zero == grid_embed.shape[0] * grid_embed.shape[1]:
        raise AnalysisError(
            f"The position table of {vit.name} is all zero (as it is before training: these weights have learned "
            "nothing about position), so there is no similarity between positions to show. Load trained weights "
            "to see it."
        )
    if zero:
        raise AnalysisError(
            f"{zero} of the {grid_embed.shape[0] * grid_embed.shape[1]} positions of {vit.name}'s position table are "
            "all zero, and cosine similarity is undefined for a zero vector."
        )


def _checked_similarity(similarity, unit: float, bin_width: float | None, function: str) -> np.ndarray:
    similarity = np.asarray(similarity)
    if similarity.ndim != 4 or similarity.shape[:2] != similarity.shape[2:]:
        raise AnalysisError(
            f"{function} expects a (gh, gw, gh, gw) similarity grid "
            f"(position_embedding_similarity's), got shape {similarity.shape}."
        )
    if not unit > 0 or (bin_width is not None and not bin_width > 0):
        raise AnalysisError(f"unit and bin_width must be positive, got unit={unit!r}, bin_width={bin_width!r}.")
    return similarity


def _displacement_sums(similarity: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per distinct squared distance ``dy² + dx²`` (in grid steps, sorted): the sum of the
    similarities of all ordered pairs of patches at that distance, the sum of their squares,
    and the number of pairs."""
    gh, gw = similarity.shape[:2]
    values = similarity.astype(np.float64)
    # Sum over all pairs with displacement (dy, dx), without a (N², N²) index: along each
    # diagonal of the (row, row') plane, then along each diagonal of the (col, col') plane.
    planes = [values.transpose(0, 2, 1, 3), (values * values).transpose(0, 2, 1, 3)]  # [r, r', c, c']
    squared, totals, squares, pairs = [], [], [], []
    for dy in range(-(gh - 1), gh):
        by_cols = [np.diagonal(plane, offset=dy, axis1=0, axis2=1).sum(-1) for plane in planes]  # (gw, gw) each
        for dx in range(-(gw - 1), gw):
            squared.append(dy * dy + dx * dx)
            totals.append(np.trace(by_cols[0], offset=dx))
            squares.append(np.trace(by_cols[1], offset=dx))
            pairs.append((gh - abs(dy)) * (gw - abs(dx)))
    keys, inverse = np.unique(np.asarray(squared), return_inverse=True)  # exact integers: no float noise
    return (
        keys,
        np.bincount(inverse, weights=np.asarray(totals)),
        np.bincount(inverse, weights=np.asarray(squares)),
        np.bincount(inverse, weights=np.asarray(pairs, dtype=np.float64)),
    )


def similarity_by_distance(
    similarity: np.ndarray, unit: float = 1.0, bin_width: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Mean cosine similarity as a function of the distance between patch centres.

    The mean is over all ordered pairs of patches at that distance. Distances are Euclidean in grid
    steps, multiplied by ``unit``.

    Parameters
    ----------
    similarity : numpy.ndarray
        ``(gh, gw, gh, gw)`` (:func:`position_embedding_similarity`; anything ``numpy.asarray``
        reads, a CPU tensor too).
    unit : float, default 1.0
        The length of one grid step (positive), e.g. ``original_grid / resampled_grid`` to express a
        resampled grid in the original grid's patches.
    bin_width : float or None, default None
        ``None``: one entry per distinct distance. A width (positive, in the same unit): the bins of
        :func:`similarity_distance_bins` instead.

    Returns
    -------
    tuple of (numpy.ndarray, numpy.ndarray)
        ``(distances, mean_similarity)``, both ``(n,)`` float64 and sorted by distance: one entry per
        distinct distance (self-similarity at distance 0 included), or with ``bin_width`` one per
        non-empty bin, ``(pair-weighted mean distance, mean similarity)``.

    Raises
    ------
    AnalysisError
        If ``similarity`` is not ``(gh, gw, gh, gw)``, or ``unit`` or ``bin_width`` is not positive.
    """
    if bin_width is not None:
        bins = similarity_distance_bins(similarity, unit, bin_width)
        return bins.distance, bins.mean
    similarity = _checked_similarity(similarity, unit, bin_width, "similarity_by_distance")
    keys, sums, _, counts = _displacement_sums(similarity)
    return np.sqrt(keys) * unit, sums / counts


class DistanceBins(NamedTuple):
    """Similarity against distance, pooled in bins (:func:`similarity_distance_bins`); every
    field is ``(bins,)``, sorted by distance, empty bins left out.

    Attributes
    ----------
    lower : numpy.ndarray
        ``(bins,)`` float64: the bin's lower edge, ``[lower, upper)``; 0 for the self-similarity bin.
    upper : numpy.ndarray
        ``(bins,)`` float64: the bin's upper edge (excluded); 0 for the self-similarity bin.
    distance : numpy.ndarray
        ``(bins,)`` float64: the mean distance of the bin's pairs.
    mean : numpy.ndarray
        ``(bins,)`` float64: the mean similarity of the bin's pairs.
    std : numpy.ndarray
        ``(bins,)`` float64: the standard deviation of their similarities (population: divided by the
        count).
    count : numpy.ndarray
        ``(bins,)`` int64: the number of ordered pairs ``(p, p′)`` in the bin (the field shadows
        ``tuple.count``).
    """

    lower: np.ndarray  # the bin's lower edge [lower, upper); 0 and 0 for the self-similarity bin
    upper: np.ndarray
    distance: np.ndarray  # the mean distance of the bin's pairs
    mean: np.ndarray  # the mean similarity of the bin's pairs
    std: np.ndarray  # their standard deviation (population: divided by the count)
    count: np.ndarray  # type: ignore[assignment]  # the number of ordered pairs (p, p′) in the bin, int64 (shadows tuple.count)


def similarity_distance_bins(similarity: np.ndarray, unit: float = 1.0, bin_width: float = 1.0) -> DistanceBins:
    """Cosine similarity against distance, as a mean with its spread per distance bin.

    The pairs are all ordered pairs of patches ``(p, p′)`` (each pair of distinct patches counts
    once in each direction), at distance ``d = unit · √(Δrow² + Δcol²)``. Pairs with ``d = 0``
    (each patch with itself) form their own bin; every other pair falls in bin
    ``[k·w, (k + 1)·w)`` with ``k = ⌊d / w⌋`` and ``w = bin_width`` (same unit as ``d``). Per
    non-empty bin: the mean distance and mean similarity of its pairs, the population standard
    deviation ``√(mean(s²) − mean(s)²)`` of their similarities, and their count.

    With ``unit = 1`` and ``bin_width = 1``, bins are one patch wide; ``unit`` expresses another
    grid (a resampled one) in the model grid's patches, so both share an axis.

    Parameters
    ----------
    similarity : numpy.ndarray
        ``(gh, gw, gh, gw)`` (:func:`position_embedding_similarity`; anything ``numpy.asarray``
        reads, a CPU tensor too).
    unit : float, default 1.0
        The length of one grid step (positive).
    bin_width : float, default 1.0
        The bins' width ``w`` (positive), in the same unit as ``d``.

    Returns
    -------
    DistanceBins
        Per non-empty bin, sorted by distance (the self-similarity bin first): its edges, mean
        distance, mean similarity, standard deviation and count, each ``(bins,)``.

    Raises
    ------
    AnalysisError
        If ``similarity`` is not ``(gh, gw, gh, gw)``, or ``unit`` or ``bin_width`` is not positive.
    """
    similarity = _checked_similarity(similarity, unit, bin_width, "similarity_distance_bins")
    keys, sums, squares, counts = _displacement_sums(similarity)
    distances = np.sqrt(keys) * unit
    bins = np.where(keys == 0, -1, np.floor(distances / bin_width).astype(np.int64))
    labels, which = np.unique(bins, return_inverse=True)
    count = np.bincount(which, weights=counts)
    mean = np.bincount(which, weights=sums) / count
    variance = np.bincount(which, weights=squares) / count - mean * mean
    lower = np.where(labels < 0, 0.0, labels * float(bin_width))
    return DistanceBins(
        lower=lower,
        upper=np.where(labels < 0, 0.0, lower + bin_width),
        distance=np.bincount(which, weights=distances * counts) / count,
        mean=mean,
        std=np.sqrt(np.clip(variance, 0.0, None)),
        count=np.round(count).astype(np.int64),
    )
