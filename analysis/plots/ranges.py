"""Which values a map's colour scale spans (the app's sidebar "Map colour range").

One rule for every attention-like map (attention, rollout and its Figure 6 view, the
instant view and its widget; the explanation maps use the same top through :func:`robust_scaled`):
the colour scale runs from 0 to the map's robust top, and the colour bar states where uniform
attention lies. Attention maps are probabilities: under uniform attention every key gets ``1/T``
(``T`` keys), so the colour bar's title gives the uniform level and the top in its units
("uniform 0.0051 (top 1.6×)"), and the plotly colour bar marks it with a tick
(:func:`colour_bar_ticks`), numbers that compare across models. The top is at least
:data:`UNIFORM_FLOOR` times the uniform level, so that a map without structure does not fill the
scale: a random ViT's maps stay within 1.15× uniform (their 99th percentile, measured on
ViT-Ti/16) and are drawn at most at three quarters of the scale, while real maps, whose 99th
percentile is 1.6× uniform (an ImageNet ViT-Ti's rollout) to 10× (the DINOv2-S backbone's last
layer), keep their own top. A floor of 4× uniform, used before, left real rollouts dim everywhere.

On real weights a few outlier cells can hold most of a map's mass: the high-norm "artifact"
tokens of Darcet et al. 2024 ("Vision Transformers Need Registers"), or a single patch that a
rollout concentrates on. Stretched from 0 to such a maximum, every other cell is black. The
default range, ``"robust"``, therefore tops out at the :data:`ROBUST_QUANTILE` quantile of the
map's cells, computed without the detected outlier tokens (``left_out``:
:func:`analysis.tokens.outlier_patches`, the Tokens page's rule); the cells above the top are
drawn at the top colour, outlined, and the colour bar says how many there are and how high they
go (:func:`clipped_cells`). The instant view applies the same rule in the browser
(``analysis/views/attention_view_page/index.html``, ``colourRange``), with numpy's linear quantile.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "MAP_RANGES",
    "ROBUST_QUANTILE",
    "UNIFORM_FLOOR",
    "clipped_cells",
    "colour_bar_ticks",
    "colour_range",
    "layer_scaled",
    "robust_scaled",
    "robust_top",
]

#: How a map's values are spread over the colour scale: mode -> what it means (the first is the default).
MAP_RANGES = {
    "robust": "0 to the 99th percentile (at least 1.5× uniform attention), outlier tokens left out (cells above outlined)",
    "zero": "0 to the map's maximum (at least 1.5× uniform attention)",
    "minmax": "the map's minimum to maximum",
    "shared": "0 to the maximum over all layers and heads",
}

#: The ``"robust"`` and ``"zero"`` ranges' top is at least this many times the uniform level ``1/T``.
UNIFORM_FLOOR = 1.5

#: The ``"robust"`` range's top: this quantile of the map's cells (outlier tokens left out).
ROBUST_QUANTILE = 0.99


def _kept_values(shown, left_out, inside=None) -> np.ndarray:
    """The finite values of ``shown`` (one ``(h, w)`` map or a stack ``(..., h, w)``), flattened,
    without the cells at the flat indices ``left_out`` of every ``(h, w)`` map and, when given,
    the cells outside ``inside`` (a boolean ``(h, w)`` map of the drawn cells)."""
    values = np.asarray(shown, dtype=np.float64)
    cells = values.shape[-2] * values.shape[-1] if values.ndim >= 2 else values.size
    values = values.reshape(-1, max(cells, 1))
    keep = np.isfinite(values)
    if inside is not None:
        keep &= np.asarray(inside, dtype=bool).reshape(1, -1)
    if left_out is not None and len(left_out):
        index = np.asarray(left_out, dtype=np.int64)
        keep[:, index[(index >= 0) & (index < cells)]] = False
    return values[keep]


def robust_top(shown, *, left_out=None, inside=None, quantile: float = ROBUST_QUANTILE) -> float:
    """The top of the ``"robust"`` range: ``quantile(values, q)`` over the finite cells of
    ``shown`` that are not in ``left_out``, with numpy's default (linear) interpolation: sorted
    values ``v``, ``p = q·(n − 1)``, ``v[⌊p⌋] + (p − ⌊p⌋)·(v[⌊p⌋+1] − v[⌊p⌋])``.

    Parameters
    ----------
    shown : array_like
        One ``(h, w)`` map or a stack ``(..., h, w)`` of them (all their cells count together).
    left_out : sequence of int or None, default None
        Flat, row-major cell indices of each ``(h, w)`` map (the outlier tokens) that do not count;
        indices outside the map are ignored. When every cell is left out, all of them count.
    inside : array_like or None, default None
        A boolean ``(h, w)`` map of the cells that are drawn (a windowed model's query window);
        the others do not count.
    quantile : float, default ROBUST_QUANTILE
        The quantile ``q`` in [0, 1] (:data:`ROBUST_QUANTILE`, 0.99).

    Returns
    -------
    float
        The quantile; ``0.0`` when no finite cell counts.
    """
    values = _kept_values(shown, left_out, inside)
    if not values.size:
        values = _kept_values(shown, None, inside)  # every cell left out: fall back to all of them
    return float(np.quantile(values, quantile)) if values.size else 0.0


def robust_scaled(grid_map, *, left_out=None) -> tuple[np.ndarray, float]:
    """A signed map's positive evidence on a 0–1 scale topped by its robust top:
    ``(max(m, 0) / t, t)`` with ``t = robust_top(max(m, 0), left_out=left_out)`` (the
    :data:`ROBUST_QUANTILE` quantile of its cells, the outlier tokens' cells left out), or the
    peak ``max(m, 0)`` where that quantile is 0 (a map that is 0 almost everywhere: Grad-CAM
    after its ReLU). Cells above 1 are the clipped cells a colour scale to 1 outlines
    (:func:`clipped_cells`); NaN cells stay NaN; an all-zero map stays 0 with ``t = 0``.

    The explanation maps' counterpart of :func:`colour_range`'s ``"robust"`` mode: one cell (an
    artifact token's) cannot set the top and leave the rest of the map dark, as dividing by the
    peak (:func:`analysis.scale_by_peak`) does on real models.

    Parameters
    ----------
    grid_map : array_like
        A signed ``(gh, gw)`` map (or a stack ``(..., gh, gw)``, one top for all); NaN allowed.
    left_out : sequence of int or None, default None
        Flat, row-major cell indices (the outlier tokens) that do not set the top
        (:func:`robust_top`).

    Returns
    -------
    (numpy.ndarray, float)
        The scaled map, float32 in the shape of ``grid_map`` (values above 1 are clipped cells),
        and the top ``t``.
    """
    values = np.asarray(grid_map, dtype=np.float64)
    positive = np.where(np.isnan(values), np.nan, np.clip(values, 0.0, None))
    top = robust_top(positive, left_out=left_out)
    if not top > 0:
        finite = positive[np.isfinite(positive)]
        top = float(finite.max()) if finite.size else 0.0
    scaled = positive / top if top > 0 else positive
    return scaled.astype(np.float32), top


def clipped_cells(shown, hi: float) -> np.ndarray:
    """Flat (row-major) indices of the cells of ``shown`` above the colour scale's top ``hi``:
    drawn at the top colour, so they are outlined and counted in the colour bar.

    Parameters
    ----------
    shown : array_like
        The map, e.g. ``(gh, gw)``; NaN cells are never above.
    hi : float
        The colour scale's top.

    Returns
    -------
    numpy.ndarray
        ``(k,)`` int64 flat indices, ascending.
    """
    values = np.asarray(shown, dtype=np.float64).ravel()
    return np.flatnonzero(np.isfinite(values) & (values > hi))


def _clip_text(shown, hi: float) -> str:
    above = clipped_cells(shown, hi)  # cells outside a window are 0: never above a positive top
    if not above.size:
        return ""
    top = float(np.nanmax(np.asarray(shown, dtype=np.float64).ravel()[above]))
    cells = "cell" if above.size == 1 else "cells"
    return f"; {above.size} {cells} above (max {top:.3g})"


def _uniform_text(uniform: float | None, hi: float) -> str:
    """``"; uniform 0.0051 (top 1.6×)"``: the uniform level, and the scale's top in its units."""
    return f"; uniform {uniform:.2g} (top {hi / uniform:.2g}×)" if uniform else ""


def colour_bar_ticks(lo: float, hi: float, *, uniform: float | None = None, count: int = 5) -> dict:
    """Plotly colour-bar ticks for the scale ``lo..hi``: about ``count`` round values (steps of
    1, 2, 2.5 or 5 times a power of ten) and, where it lies inside the scale, the uniform level,
    labelled ``"uniform"`` (round values closer to it than a third of a step are dropped).

    Parameters
    ----------
    lo : float
        The scale's bottom.
    hi : float
        The scale's top.
    uniform : float or None, default None
        The uniform level ``1/T``; ``None`` (or 0), not marked.
    count : int, default 5
        About how many round values.

    Returns
    -------
    dict
        ``{"tickvals": [...], "ticktext": [...]}`` for a colour bar's settings, ascending; ``{}``
        when ``hi <= lo``.
    """
    if not hi > lo:
        return {}
    raw = (hi - lo) / max(count - 1, 1)
    power = 10.0 ** np.floor(np.log10(raw))
    step = next(k * power for k in (1, 2, 2.5, 5, 10) if k * power >= raw)
    values = [float(v) for v in np.arange(np.ceil(lo / step) * step, hi + step * 1e-9, step)]
    marks: list[tuple[float, str]] = []
    if uniform and lo <= uniform <= hi:
        marks.append((float(uniform), f"uniform {uniform:.2g}"))
        values = [v for v in values if abs(v - uniform) > step / 3]
    ticks = sorted([(v, f"{v:.3g}") for v in values] + marks)
    return {"tickvals": [v for v, _ in ticks], "ticktext": [t for _, t in ticks]}


def colour_range(
    mode: str,
    shown: np.ndarray,
    everything: np.ndarray | None = None,
    *,
    uniform: float | None = None,
    left_out=None,
    inside=None,
) -> tuple[float, float, str]:
    """``(lo, hi, label)`` of the colour scale for the map ``shown``.

    ``"robust"`` (the app's default): ``[0, max(robust_top(shown, left_out), UNIFORM_FLOOR·uniform)]``,
    the quantile never above the map's maximum: a few outlier cells cannot wash out the rest; the
    label says how many cells lie above the top and how high they go (they are drawn outlined).
    ``"zero"``: ``[0, max(max(shown), UNIFORM_FLOOR·uniform)]``. ``"minmax"``: ``[min, max]`` of
    ``shown``, the most contrast. ``"shared"``: ``[0, max(everything)]`` (e.g. every layer and head
    for this query), so maps compare by colour. The label says which, with the numbers, and the
    uniform level and the top in its units:
    ``"0–p99: 0–0.0083; uniform 0.0051 (top 1.6×); 2 cells above (max 0.0096)"``.

    Parameters
    ----------
    mode : str
        A key of :data:`MAP_RANGES`: ``"robust"``, ``"zero"``, ``"minmax"`` or ``"shared"``; another
        string spans ``[0, max(shown)]``, named by itself in the label.
    shown : numpy.ndarray
        The map drawn, e.g. ``(gh, gw)``; NaN cells are ignored.
    everything : numpy.ndarray or None, default None
        For ``"shared"``: all the maps it shares the scale with, any shape; ``None``, ``shown``.
    uniform : float or None, default None
        The value of uniform attention, ``1/T``; ``None`` for maps that are not probabilities
        (no floor, nothing about it in the label).
    left_out : sequence of int or None, default None
        For ``"robust"``: flat indices of the outlier tokens' cells, which never set the top.
    inside : array_like or None, default None
        For ``"robust"``: a boolean ``(gh, gw)`` map of the drawn cells (a windowed query's
        window), the only ones the quantile counts.

    Returns
    -------
    (float, float, str)
        ``lo``, ``hi`` (above ``lo``: at least ``lo + 1e-12``) and the label.
    """
    values = shown if mode != "shared" or everything is None else everything
    finite_shown = np.asarray(shown, dtype=np.float64)[np.isfinite(shown)]
    finite_values = np.asarray(values, dtype=np.float64)[np.isfinite(values)]
    lo = float(finite_shown.min()) if mode == "minmax" and finite_shown.size else 0.0
    hi = float(finite_values.max()) if finite_values.size else lo  # an all-NaN map: an empty scale from lo
    name = {
        "zero": "0–max",
        "minmax": "min–max",
        "shared": "0–max of all layers, heads",
        "robust": f"0–p{100 * ROBUST_QUANTILE:g}",
    }.get(mode, mode)
    without = ""
    if mode == "robust":
        hi = min(hi, robust_top(shown, left_out=left_out, inside=inside))
        if left_out is not None and len(left_out):
            without = f"; top without {len(left_out)} outlier token{'s' if len(left_out) != 1 else ''}"
    if mode in ("zero", "robust") and uniform and hi < UNIFORM_FLOOR * uniform:
        hi = UNIFORM_FLOOR * uniform
        name = f"0–{UNIFORM_FLOOR:g}× uniform"
    if hi <= lo:
        hi = lo + 1e-12
    clipped = _clip_text(shown, hi) if mode != "minmax" else ""
    return lo, hi, f"{name}: {lo:.3g}–{hi:.3g}{_uniform_text(uniform, hi)}{without}{clipped}"


def layer_scaled(
    maps: np.ndarray, *, uniform: float | None = None, robust: bool = False, left_out=None, inside=None
) -> tuple[np.ndarray, np.ndarray]:
    """``(L, n, gh, gw)`` maps (n maps per layer) -> each layer's maps divided by one shared
    top, ``max(max over the layer's maps, UNIFORM_FLOOR·uniform)``, and the ``(L,)`` tops.

    Within a layer, heads compare by colour; a layer whose maps are all near-uniform stays
    below about ``1/UNIFORM_FLOOR`` of the scale instead of saturating. ``robust``: the top is the
    :data:`ROBUST_QUANTILE` quantile of all the layer's cells without the ``left_out`` cells
    (flat indices into one ``(gh, gw)`` map) and, with ``inside`` (``(gh, gw)`` bool: a windowed
    query's window), of those cells only, as :func:`colour_range`'s ``"robust"`` range; values above
    it come out above 1 (a colour scale to 1 clips them).

    Parameters
    ----------
    maps : numpy.ndarray
        ``(L, n, gh, gw)`` maps, ``n`` per layer.
    uniform : float or None, default None
        The value of uniform attention ``1/T``: each top is at least ``UNIFORM_FLOOR·uniform``;
        ``None``, no floor.
    robust : bool, default False
        The top is the layer's robust top (:func:`robust_top`) instead of its maximum.
    left_out : sequence of int or None, default None
        With ``robust``: flat indices into one ``(gh, gw)`` map that do not count.
    inside : array_like or None, default None
        With ``robust``: ``(gh, gw)`` bool, the only cells that count.

    Returns
    -------
    (numpy.ndarray, numpy.ndarray)
        The scaled maps ``(L, n, gh, gw)`` float32 and the tops ``(L,)`` float32 (a top that is
        not positive becomes 1).
    """
    values = np.asarray(maps, dtype=np.float32)
    if robust:
        tops = np.array([robust_top(layer, left_out=left_out, inside=inside) for layer in values], np.float32)
    else:
        tops = np.nanmax(values.reshape(values.shape[0], -1), axis=1)
    if uniform:
        tops = np.maximum(tops, np.float32(UNIFORM_FLOOR * uniform))
    tops = np.where(tops > 0, tops, 1.0).astype(np.float32)
    return values / tops[:, None, None, None], tops
