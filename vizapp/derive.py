"""Small numpy derivations the pages need (no streamlit, no torch)."""

from __future__ import annotations

import numpy as np

__all__ = ["similarity_by_distance", "map_layer", "map_query", "colour_range", "MAP_RANGES", "MAP_CELLS"]

# How a patch map is drawn on the image (the sidebar's "Map cells"): values of
# ``analysis.upsample_map``'s modes.
MAP_CELLS = {
    "nearest": "exact patch cells",
    "bilinear": "smooth (bilinear)",
}

# How a map's values are spread over the colour scale (the sidebar's "Map colour range").
MAP_RANGES = {
    "zero": "0 to the map's maximum",
    "minmax": "the map's minimum to maximum",
    "shared": "0 to the maximum over all layers and heads",
}


def colour_range(mode: str, shown: np.ndarray, everything: np.ndarray | None = None) -> tuple[float, float, str]:
    """``(lo, hi, label)`` of the colour scale for the map ``shown``.

    ``"zero"`` (default for probabilities): ``[0, max(shown)]``, so a near-uniform map stays
    pale instead of filling the scale. ``"minmax"``: ``[min, max]`` of ``shown``, the most
    contrast. ``"shared"``: ``[0, max(everything)]`` (e.g. every layer and head for this
    query), so maps compare by colour. The label says which, with the numbers.
    """
    values = shown if mode != "shared" or everything is None else everything
    lo = float(np.nanmin(shown)) if mode == "minmax" else 0.0
    hi = float(np.nanmax(values))
    if hi <= lo:
        hi = lo + 1e-12
    name = {"zero": "0–max", "minmax": "min–max", "shared": "0–max of all layers, heads"}.get(mode, mode)
    return lo, hi, f"{name}: {lo:.3g}–{hi:.3g}"


def similarity_by_distance(
    similarity: np.ndarray, unit: float = 1.0, bin_width: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Mean cosine similarity as a function of the distance between patch centres.

    similarity: ``(gh, gw, gh, gw)``. Distances are Euclidean in grid steps, multiplied by
    ``unit`` (e.g. ``original_grid / resampled_grid`` to express a resampled grid in the
    original grid's patches). Returns ``(distances, mean_similarity)``, sorted by distance,
    one entry per distinct distance (self-similarity at distance 0 included).

    ``bin_width`` (in the same unit): pool distances into bins ``[k·w, (k+1)·w)`` instead,
    each reported at the pair-weighted mean distance of its pairs (distance 0 keeps its own
    bin). A resampled grid has many near-equal distances whose means zig-zag; bins smooth that
    without moving any pair.
    """
    gh, gw = similarity.shape[:2]
    # Sum over all pairs with displacement (dy, dx), without a (N², N²) index: along each
    # diagonal of the (row, row') plane, then along each diagonal of the (col, col') plane.
    by_rows = similarity.astype(np.float64).transpose(0, 2, 1, 3)  # (gh, gh, gw, gw): [r, r', c, c']
    dys, dxs, totals, pairs = [], [], [], []
    for dy in range(-(gh - 1), gh):
        cols = np.diagonal(by_rows, offset=dy, axis1=0, axis2=1).sum(-1)  # (gw, gw): summed over r
        for dx in range(-(gw - 1), gw):
            dys.append(dy)
            dxs.append(dx)
            totals.append(np.trace(cols, offset=dx))
            pairs.append((gh - abs(dy)) * (gw - abs(dx)))
    squared = np.asarray(dys) ** 2 + np.asarray(dxs) ** 2  # exact integers: group without float noise
    keys, inverse = np.unique(squared, return_inverse=True)
    sums = np.bincount(inverse, weights=np.asarray(totals))
    counts = np.bincount(inverse, weights=np.asarray(pairs, dtype=np.float64))
    distances = np.sqrt(keys) * unit
    if bin_width is None:
        return distances, sums / counts
    bins = np.where(distances == 0, 0, np.floor(distances / bin_width).astype(np.int64) + 1)
    _, which = np.unique(bins, return_inverse=True)
    pair_counts = np.bincount(which, weights=counts)
    centres = np.bincount(which, weights=distances * counts) / pair_counts
    return centres, np.bincount(which, weights=sums) / pair_counts


def map_layer(layer: int, from_layers: int, to_layers: int) -> int:
    """The layer at the same relative depth in a model with ``to_layers`` layers."""
    if from_layers <= 1 or to_layers <= 1:
        return min(layer, to_layers - 1)
    return int(round(layer * (to_layers - 1) / (from_layers - 1)))


def map_query(
    query: str | int, from_grid: tuple[int, int], to_grid: tuple[int, int], to_has_class_token: bool
) -> str | int:
    """The same query in another model: the class token (or the mean without one), or the
    patch at the same relative position of the image."""
    if query == "cls":
        return "cls" if to_has_class_token else "mean"
    if query == "mean" or (isinstance(query, str) and query.startswith("prefix:")):
        return "cls" if query == "prefix:0" and to_has_class_token else "mean"  # registers differ per model
    r, c = divmod(int(query), from_grid[1])
    r2 = min(int((r + 0.5) * to_grid[0] / from_grid[0]), to_grid[0] - 1)
    c2 = min(int((c + 0.5) * to_grid[1] / from_grid[1]), to_grid[1] - 1)
    return r2 * to_grid[1] + c2
