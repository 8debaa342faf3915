"""Many small maps as the tiles of one picture (:func:`mosaic`), the position-embedding
similarity mosaic and single tile, and RGB grids of patch-embedding filters."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import plotly.graph_objects as go

from .layout import (
    CHART_WIDTH_PX,
    LINE_HEIGHT,
    chars_fitting,
    image_figure_height,
    image_figure_margin,
    image_rows_height,
    line_count,
    wrap_label,
)
from .style import (
    CHART_FONT_SIZE,
    CLICK_MARKER,
    SEPARATOR,
    colorize,
    colour_stops,
    highlight_rect,
    image_colorbar,
    image_data_uri,
    styled_figure,
)
from .ticks import (
    DENSE_GRID,  # noqa: F401 - the docstrings' :data:`DENSE_GRID` is found through it
    grid_tick_step,
    grid_ticks,
)

__all__ = [
    "mosaic",
    "MosaicLayout",
    "position_similarity_mosaic",
    "similarity_tile",
    "rgb_patch_grid",
    "filter_components_grid",
    "colorized_png",
    "MAX_HEATMAP_CELLS",
    "MAX_IMAGE_SIDE",
    "MIN_TILE_PIXELS",
    "THUMBNAIL_PIXELS",
    "THUMBNAIL_MARGIN",
    "ZOOM_HINT",
]

MAX_HEATMAP_CELLS = 160_000  # above this a mosaic is sent as a colour-mapped PNG instead
MAX_IMAGE_SIDE = 1024  # a PNG mosaic's longer side, in pixels (tiles are box-averaged to fit)


MIN_TILE_PIXELS = 8  # a PNG mosaic keeps at least this many pixels per tile side (its pattern stays visible)
THUMBNAIL_PIXELS = 120  # a thumbnail mosaic's tiles are at least this many screen pixels on their shorter side
# a thumbnail mosaic's fixed margins (px): row labels and title left, colour bar right, column labels on top
THUMBNAIL_MARGIN = dict(l=36, r=100, t=56, b=12)
#: The widest a thumbnail mosaic may be (px): the app's main column in a 1440 px window. A wider
#: figure would be shrunk to the column by the page, its picture with it but not its colour bar.
THUMBNAIL_MAX_WIDTH = 980
#: Plotly draws a plot area up to a pixel narrower than the figure less its margins: tiles aim this much higher.
ROUNDING_SLACK_PX = 0.5
COLORBAR_TITLE_LINE_PX = 18  # each further line of a colour bar's (wrapped, sideways) title widens the bar by this much
POSITION_TILE_PX = 9  # the position mosaic's tiles are at least this many px a side
ZOOM_HINT = "Drag a box to zoom in (cells stay square), double-click to zoom back out."


def _tile_pixels(nrows: int, ncols: int, gh: int, gw: int) -> tuple[int, int]:
    """Pixels per tile ``(ph, pw)`` of a PNG mosaic, each axis on its own: a tile's own cells
    where the mosaic fits :data:`MAX_IMAGE_SIDE` along that axis; else the tile shrunk until it
    fits, but never below :data:`MIN_TILE_PIXELS` (the picture then grows past the limit) and
    never above its own cells. The picture's pixels need not be square: the figure places
    them at ``gh/ph`` by ``gw/pw`` cells each."""
    ph = min(gh, max(MIN_TILE_PIXELS, MAX_IMAGE_SIDE // nrows))
    pw = min(gw, max(MIN_TILE_PIXELS, MAX_IMAGE_SIDE // ncols))
    return ph, pw


def _area_weights(cells: int, pixels: int) -> np.ndarray:
    """``(pixels, cells)`` weights of an area (box) resample along one axis: output pixel p
    covers ``[p·cells/pixels, (p+1)·cells/pixels)`` in cell units; each weight is the overlap
    with a cell divided by the pixel's width, so every row sums to one."""
    edges = np.arange(pixels + 1) * (cells / pixels)
    lower = np.maximum(edges[:-1, None], np.arange(cells)[None, :])
    upper = np.minimum(edges[1:, None], np.arange(cells)[None, :] + 1)
    return np.clip(upper - lower, 0, None) * (pixels / cells)


def _cell_average(big: np.ndarray, nrows: int, ncols: int, gh: int, gw: int, ph: int, pw: int) -> np.ndarray:
    """Each ``(gh, gw)`` tile of ``big`` area-resampled to ``(ph, pw)`` pixels: a pixel is the
    area-weighted mean of the cells of its own tile that it covers, NaN cells left out (a
    pixel over NaN cells only, e.g. an empty slot after the last tile, stays NaN)."""
    if (ph, pw) == (gh, gw):
        return big
    rows, cols = _area_weights(gh, ph), _area_weights(gw, pw)
    tiles = big.reshape(nrows, gh, ncols, gw).astype(np.float64)
    valid = ~np.isnan(tiles)

    def resample(values: np.ndarray) -> np.ndarray:  # (nrows, gh, ncols, gw) -> (nrows, ph, ncols, pw)
        return np.einsum("rpcw,qw->rpcq", np.einsum("ph,rhcw->rpcw", rows, values), cols)

    weight = resample(valid.astype(np.float64))
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(weight > 0, resample(np.where(valid, tiles, 0.0)) / weight, np.nan)
    return out.reshape(nrows * ph, ncols * pw).astype(np.float32)


def colorized_png(z: np.ndarray, colorscale: str, zmin: float, zmax: float) -> str:
    """Lossless PNG data URI of ``z`` mapped through ``colorscale`` on ``zmin..zmax`` (:func:`colorize`).

    Parameters
    ----------
    z : numpy.ndarray
        ``(h, w)`` values; NaN becomes white.
    colorscale : str
        A plotly colour scale's name.
    zmin : float
        The value of the scale's first colour.
    zmax : float
        The value of the scale's last colour.

    Returns
    -------
    str
        A ``data:image/png;base64,...`` URI of the ``(h, w)`` picture.
    """
    return image_data_uri(colorize(z, colorscale, zmin, zmax), lossless=True)


@dataclass(frozen=True)
class MosaicLayout:
    """Where a thumbnail mosaic draws its ``nrows × ncols`` tiles (row-major tile ``i`` is row
    ``i // ncols``, column ``i % ncols``). A row of tiles that would be too wide for the page's column at
    ``tile_pixels`` a tile wraps onto ``sub_rows`` rows of ``per_row`` tiles each: tile ``(r, c)`` is drawn at
    row ``r·sub_rows + c // per_row``, column ``c % per_row``. A drawn column then holds the logical columns
    ``c, c + per_row, …`` (its label joins theirs: ``"0 / 6"``).

    Attributes
    ----------
    nrows : int
        Logical rows of tiles.
    ncols : int
        Logical columns of tiles.
    per_row : int
        Tiles per drawn row (``ncols`` when a row does not wrap).
    sub_rows : int
        Drawn rows per logical row (1 when a row does not wrap).
    """

    nrows: int
    ncols: int
    per_row: int
    sub_rows: int

    @classmethod
    def of(
        cls, nrows: int, ncols: int, gh: int, gw: int, *, fit_width: float | None, tile_pixels: int = THUMBNAIL_PIXELS
    ) -> MosaicLayout:
        """Wrap when ``ncols`` tiles of ``tile_pixels`` on their shorter side (cells square) are wider than
        ``fit_width`` px; ``fit_width=None``: never wrap (a figure of a given height)."""
        tile_width = (tile_pixels + ROUNDING_SLACK_PX) / min(gh, gw) * gw
        if fit_width is None or ncols * tile_width <= fit_width:
            return cls(nrows, ncols, ncols, 1)
        per_row = max(1, int(fit_width // tile_width))
        sub_rows = math.ceil(ncols / per_row)
        per_row = math.ceil(ncols / sub_rows)  # balanced: 13 tiles on 2 rows are 7 + 6, not 6 + 6 + 1
        return cls(nrows, ncols, per_row, sub_rows)

    @property
    def shape(self) -> tuple[int, int]:
        """Rows and columns of tiles as drawn."""
        return self.nrows * self.sub_rows, self.per_row

    def place(self, index: int) -> tuple[int, int]:
        """Drawn ``(row, column)`` of row-major tile ``index``."""
        r, c = divmod(index, self.ncols)
        return r * self.sub_rows + c // self.per_row, c % self.per_row

    def column_label(self, labels: Sequence[str], column: int) -> str:
        """The label of drawn ``column``: the labels of the logical columns it holds, joined by ``" / "``."""
        return " / ".join(labels[c] for c in range(column, self.ncols, self.per_row))


def _thumbnail_frame(
    nrows: int, ncols: int, gh: int, gw: int, *, tile_pixels: int, title: str | None, colorbar_title: str
) -> tuple[MosaicLayout, dict, float]:
    """A thumbnail mosaic's layout, margins and screen pixels per cell. The right margin holds the
    colour bar, whose title is wrapped to the bar's length (the plot height): a short mosaic's
    title takes several lines, each :data:`COLORBAR_TITLE_LINE_PX` wider; plotly would otherwise
    push the margin itself and shrink the picture below its colour bar. The layout then wraps rows
    to what the narrower plot area fits (at most two rounds: a taller mosaic has a longer bar)."""
    margin = dict(THUMBNAIL_MARGIN, t=THUMBNAIL_MARGIN["t"] + (30 if title else 0))
    for _ in range(3):
        fit_width = THUMBNAIL_MAX_WIDTH - margin["l"] - margin["r"]
        layout = MosaicLayout.of(nrows, ncols, gh, gw, fit_width=fit_width, tile_pixels=tile_pixels)
        vrows, vcols = layout.shape
        cell = min((tile_pixels + ROUNDING_SLACK_PX) / min(gh, gw), fit_width / (vcols * gw))
        lines = line_count(wrap_label(colorbar_title, chars_fitting(vrows * gh * cell, CHART_FONT_SIZE)))
        right = THUMBNAIL_MARGIN["r"] + (lines - 1) * COLORBAR_TITLE_LINE_PX
        if right == margin["r"]:
            break
        margin["r"] = right
    return layout, margin, cell


def mosaic(
    tiles: np.ndarray,
    ncols: int,
    *,
    tile_names: Sequence[str],
    colorscale: str = "Viridis",
    zmin: float | None = None,
    zmax: float | None = None,
    normalize_each: bool = False,
    colorbar_title: str = "value",
    x_title: str | None = None,
    y_title: str | None = None,
    col_labels: Sequence[str] | None = None,
    row_labels: Sequence[str] | None = None,
    highlight: int | None = None,
    height: int | None = None,
    title: str | None = None,
    png_uri: Callable[[np.ndarray, str, float, float], str] | None = None,
    tile_pixels: int = THUMBNAIL_PIXELS,
    zoom: bool = False,
    chart_width: float = CHART_WIDTH_PX,
) -> go.Figure:
    """Tiles ``(n, gh, gw)`` laid out row-major in ``ncols`` columns as one big map.

    Without ``height`` it is a mosaic of thumbnails: the figure's width and height follow the
    number of columns and rows so that every tile's shorter side is ``tile_pixels`` screen
    pixels (cells square; margins :data:`THUMBNAIL_MARGIN`, the plot area exactly the tiles), or
    less where that would be wider than :data:`THUMBNAIL_MAX_WIDTH`; a row too wide for that wraps
    onto sub-rows (:class:`MosaicLayout`).
    With ``height``, the figure is at most that tall, no taller than a chart ``chart_width`` px
    wide can draw it, at the page's width.

    One heatmap cell per patch; thin white lines separate tiles (up to 32 rows and columns of
    tiles). Above :data:`MAX_HEATMAP_CELLS` cells the mosaic is sent as a colour-mapped PNG
    (each tile cell-averaged down to fit :data:`MAX_IMAGE_SIDE`, said in the title).
    The last trace has one transparent marker per tile centre (point index = tile
    index = ``customdata[0]``, ``customdata[1]`` the tile's maximum), so clicking a tile selects it.

    Parameters
    ----------
    tiles : numpy.ndarray
        ``(n, gh, gw)`` maps; NaN cells are not drawn.
    ncols : int
        Tiles per row (clamped to ``1..n``).
    tile_names : sequence of str
        The ``n`` tiles' names, in the hover.
    colorscale : str, default "Viridis"
        A plotly colour scale's name.
    zmin : float or None, default None
        The colour scale's bottom; ``None``, the tiles' minimum.
    zmax : float or None, default None
        The colour scale's top; ``None``, the tiles' maximum.
    normalize_each : bool, default False
        Divide each tile by its own largest absolute value; without ``zmin`` the colour bar then
        runs from ``min(0, minimum)`` to 1.
    colorbar_title : str, default "value"
        The colour bar's title, wrapped to the bar's length.
    x_title : str or None, default None
        The x axis's title (above the tiles); ``None``, none.
    y_title : str or None, default None
        The y axis's title; ``None``, none.
    col_labels : sequence of str or None, default None
        One label per column, shown for every column up to :data:`DENSE_GRID` of them, else every
        k-th (:func:`grid_tick_step`); ``None``, no labels.
    row_labels : sequence of str or None, default None
        One label per row, as ``col_labels``; a wrapped row is labelled on its first sub-row.
    highlight : int or None, default None
        A tile index outlined; ``None`` or an index out of range, none.
    height : int or None, default None
        The tallest the figure may be (px); ``None``, a mosaic of thumbnails.
    title : str or None, default None
        Figure title; ``None``, none.
    png_uri : callable or None, default None
        ``png_uri(values, colorscale, zmin, zmax) -> str`` makes the PNG of a big mosaic; ``None``,
        :func:`colorized_png` (the app passes one that keeps the pictures it made per digest).
    tile_pixels : int, default THUMBNAIL_PIXELS
        Screen pixels on a thumbnail tile's shorter side (without ``height``).
    zoom : bool, default False
        A drag zooms into a box (:data:`ZOOM_HINT`); else it pans.
    chart_width : float, default CHART_WIDTH_PX
        The chart's width (px) a figure of a given ``height`` is planned for.

    Returns
    -------
    plotly.graph_objects.Figure
        A heatmap (or a PNG image and a colour-bar trace), then the tile click targets.
    """
    tiles = np.asarray(tiles)
    n, gh, gw = tiles.shape
    ncols = max(1, min(ncols, n))
    nrows = math.ceil(n / ncols)
    thumbnails = height is None
    if thumbnails:
        layout, margin, cell = _thumbnail_frame(
            nrows, ncols, gh, gw, tile_pixels=tile_pixels, title=title, colorbar_title=colorbar_title
        )
    else:
        layout = MosaicLayout.of(nrows, ncols, gh, gw, fit_width=None)
    values = tiles.astype(np.float32)
    if normalize_each:
        peak = np.nanmax(np.abs(values.reshape(n, -1)), axis=1).reshape(n, 1, 1)
        values = (values / np.where(peak > 0, peak, 1.0)).astype(np.float32, copy=False)  # float32 already
    vrows, vcols = layout.shape
    big = np.full((vrows * gh, vcols * gw), np.nan, np.float32)
    for i in range(n):
        r, c = layout.place(i)
        big[r * gh : (r + 1) * gh, c * gw : (c + 1) * gw] = values[i]
    lo = float(np.nanmin(values)) if zmin is None else zmin
    hi = float(np.nanmax(values)) if zmax is None else zmax
    if normalize_each and zmin is None:
        lo, hi = min(0.0, lo), 1.0
    traces: list[dict[str, Any]]  # plotly trace specifications
    if big.size <= MAX_HEATMAP_CELLS:
        traces = [
            dict(
                type="heatmap",
                z=big,
                x0=0.5,
                dx=1,
                y0=0.5,
                dy=1,
                colorscale=colour_stops(colorscale),
                zmin=lo,
                zmax=hi,
                zsmooth=False,
                hoverinfo="skip",
                colorbar=image_colorbar(colorbar_title),
                name="tiles",
            )
        ]
    else:  # a PNG: bytes grow with pixels, not with JSON per cell (a 64x64 grid of tiles was 69 MB)
        ph, pw = _tile_pixels(vrows, vcols, gh, gw)
        shown = _cell_average(big, vrows, vcols, gh, gw, ph, pw)
        if (ph, pw) != (gh, gw):
            note = f"each {gh}×{gw} tile drawn at {pw}×{ph} px (cell average); the data download is exact"
            title = f"{title} · {note}" if title else note
        dy, dx = gh / ph, gw / pw  # cells per picture pixel
        traces = [
            dict(
                type="image",
                source=(png_uri or colorized_png)(shown, colorscale, lo, hi),
                x0=0.5 * dx,
                y0=0.5 * dy,
                dx=dx,
                dy=dy,
                hoverinfo="skip",
            ),
            dict(  # colour bar only
                type="scatter",
                x=[None],
                y=[None],
                mode="markers",
                showlegend=False,
                hoverinfo="skip",
                marker=dict(
                    colorscale=colour_stops(colorscale),
                    cmin=lo,
                    cmax=hi,
                    color=[lo],
                    showscale=True,
                    colorbar=image_colorbar(colorbar_title),
                ),
            ),
        ]
    width, height_cells = vcols * gw, vrows * gh
    shapes = []
    if max(vcols, vrows) <= 32:  # beyond that, lines would cover the tiles themselves
        separator = dict(color=SEPARATOR, width=1.5 if max(vcols, vrows) <= 16 else 0.75)
        inner = [r for r in range(1, vrows) if r % layout.sub_rows]  # the rows one wrapped row is split into
        segments = [f"M{c * gw},0V{height_cells}" for c in range(1, vcols)] + [
            f"M0,{r * gh}H{width}" for r in range(1, vrows) if r not in inner
        ]
        if segments:  # one path for all separators: one shape for plotly to validate, not one per line
            shapes.append(dict(type="path", path="".join(segments), line=separator))
        if inner:  # inside a wrapped row: a thin dotted line, so that a row's sub-rows read as one row
            shapes.append(
                dict(
                    type="path",
                    path="".join(f"M0,{r * gh}H{width}" for r in inner),
                    line=dict(color=SEPARATOR, width=0.75, dash="dot"),
                )
            )
    if highlight is not None and 0 <= highlight < n:
        r, c = layout.place(int(highlight))
        shapes.append(highlight_rect(c * gw, r * gh, (c + 1) * gw, (r + 1) * gh))
    if thumbnails:  # the figure grows with the tiles (the page scrolls): every tile tile_pixels on its shorter side
        # (a row too wide for the page's column wraps onto sub-rows, MosaicLayout), unless a single tile is wider than
        # the column (then the column's width sets the tiles, so that the colour bar, as tall as the plot area, stays
        # as tall as the picture)
        plot_height = height_cells * cell
        size = dict(width=int(np.ceil(width * cell)) + margin["l"] + margin["r"])
        height = int(np.ceil(plot_height)) + margin["t"] + margin["b"]
    else:  # no taller than a chart ``chart_width`` px wide can draw it: its height limits it, and the
        # colour bar, as long as the plot area, is as tall as the mosaic
        size = {}
        if title and len(title) > chars_fitting(chart_width - 20, 14):  # a long title: lines as wide as the chart
            title = wrap_label(title, chars_fitting(chart_width - 20, 14))
        lines = line_count(title) if title else 0  # the title's room: as styled_layout places it (pad, lines)
        title_px = 8 + (14 if lines > 1 else 0) + lines * LINE_HEIGHT * 14 + 4 if title else 10
        margin = dict(
            l=10, r=10, b=10, t=int(title_px) + (22 if col_labels is not None else 0) + (32 if x_title else 0)
        )
        plot_height = image_rows_height(
            [height_cells / width], max(chart_width - 70 - 110, 120.0), cap_px=height - margin["t"] - margin["b"]
        )
        height = int(round(plot_height + margin["t"] + margin["b"]))
    colorbar = image_colorbar(colorbar_title, plot_height=plot_height)
    for trace in traces:
        if "colorbar" in trace:
            trace["colorbar"] = colorbar
        elif "colorbar" in trace.get("marker", {}):
            trace["marker"]["colorbar"] = colorbar
    index = np.arange(n)
    placed = np.array([layout.place(i) for i in range(n)]).reshape(n, 2)  # (n, 2): each tile's (row, column) drawn
    peaks = np.nanmax(tiles.reshape(n, -1), axis=1)
    traces.append(
        dict(
            type="scatter",
            x=(placed[:, 1] + 0.5) * gw,
            y=(placed[:, 0] + 0.5) * gh,
            mode="markers",
            marker=CLICK_MARKER,
            showlegend=False,
            name="tiles",
            customdata=np.stack([index, peaks], axis=1),
            text=list(tile_names),
            hovertemplate="%{text}<br>max %{customdata[1]:.4g}<extra>click to open</extra>",
        )
    )
    xaxis = dict(
        range=[0, width],
        showgrid=False,
        zeroline=False,
        constrain="domain",
        title=dict(text=x_title),
        showticklabels=col_labels is not None,
        side="top",
    )
    if col_labels is not None:
        shown_columns = grid_ticks(vcols)
        xaxis.update(
            tickvals=(np.asarray(shown_columns) + 0.5) * gw,
            ticktext=[layout.column_label(list(col_labels), c) for c in shown_columns],
        )
    yaxis = dict(
        range=[height_cells, 0],
        scaleanchor="x",
        constrain="domain",
        showgrid=False,
        zeroline=False,
        title=dict(text=y_title),
        showticklabels=row_labels is not None,
    )
    if row_labels is not None:
        shown_rows = grid_ticks(nrows)  # a wrapped row is labelled on its first sub-row
        yaxis.update(
            tickvals=(np.asarray(shown_rows) * layout.sub_rows + 0.5) * gh,
            ticktext=[list(row_labels)[r] for r in shown_rows],
        )
    if layout.sub_rows > 1 and x_title:
        rows = " / ".join(
            ("upper", "lower") if layout.sub_rows == 2 else (f"row {k + 1}" for k in range(layout.sub_rows))
        )
        xaxis["title"] = dict(text=f"{x_title} ({rows} row of each {y_title or 'row'})")
    if thumbnails:
        xaxis["automargin"] = yaxis["automargin"] = False  # the plot area is exactly the tiles
    figure = styled_figure(
        traces,
        title=title,
        height=height,
        hoverdistance=-1,
        clickmode="event+select",
        dragmode="zoom" if zoom else "pan",
        shapes=shapes,
        xaxis=xaxis,
        yaxis=yaxis,
        margin=margin,
    )
    if size:
        figure.update_layout(**size)
    return figure


def position_similarity_mosaic(
    similarity: np.ndarray,
    *,
    colorscale: str = "Viridis",
    highlight: int | None = None,
    png_uri: Callable[[np.ndarray, str, float, float], str] | None = None,
    chart_width: float = CHART_WIDTH_PX,
) -> go.Figure:
    """Figure 7 (centre): cosine similarities, one tile per patch (row i, col j: patch (i, j)
    against every patch), on the fixed range -1..1. Tiles are labelled by their patch's row and
    column (every k-th above :data:`DENSE_GRID`); a drag zooms. A :func:`mosaic` at most 640 px tall.

    Parameters
    ----------
    similarity : numpy.ndarray
        ``(gh, gw, gh, gw)`` cosine similarities, ``[i, j]`` patch ``(i, j)``'s tile.
    colorscale : str, default "Viridis"
        A plotly colour scale's name.
    highlight : int or None, default None
        A tile (patch) index ``i·gw + j`` outlined; ``None``, none.
    png_uri : callable or None, default None
        As in :func:`mosaic`: ``png_uri(values, colorscale, zmin, zmax) -> str``.
    chart_width : float, default CHART_WIDTH_PX
        The chart's width (px); widened so that a tile is at least 9 px (the page scrolls).

    Returns
    -------
    plotly.graph_objects.Figure
        The mosaic figure.
    """
    similarity = np.asarray(similarity)
    n_h, n_w = similarity.shape[:2]
    return mosaic(
        similarity.reshape(n_h * n_w, n_h, n_w),
        n_w,
        tile_names=[f"patch (row {r}, col {c})" for r in range(n_h) for c in range(n_w)],
        colorscale=colorscale,
        zmin=-1.0,
        zmax=1.0,
        colorbar_title="cosine similarity",
        x_title="input patch column",
        y_title="input patch row",
        col_labels=[str(c) for c in range(n_w)],
        row_labels=[str(r) for r in range(n_h)],
        highlight=highlight,
        height=640,
        png_uri=png_uri,
        zoom=True,
        chart_width=max(chart_width, n_w * POSITION_TILE_PX + 180),  # tiles of at least 9 px (the page scrolls)
    )


def filter_components_grid(components: np.ndarray, ratio: np.ndarray, *, ncols: int = 7) -> go.Figure:
    """Figure 7 (left): principal components of the patch-embedding filters as RGB tiles
    (:func:`rgb_patch_grid`), each named by its share of the variance.

    Parameters
    ----------
    components : numpy.ndarray
        ``(k, C, ph, pw)`` principal components.
    ratio : numpy.ndarray
        ``(k,)`` explained variance ratio of each component.
    ncols : int, default 7
        Tiles per row.

    Returns
    -------
    plotly.graph_objects.Figure
        The RGB grid.
    """
    ratio = np.asarray(ratio)
    return rgb_patch_grid(
        np.asarray(components),
        ncols,
        tile_names=[f"PC {i + 1}: {r * 100:.2f}% of variance" for i, r in enumerate(ratio)],
    )


def similarity_tile(
    similarity: np.ndarray,
    patch: tuple[int, int],
    *,
    colorscale: str = "Viridis",
    height: int = 420,
    chart_width: float = CHART_WIDTH_PX,
) -> go.Figure:
    """One patch's cosine similarity to every patch, ``(gh, gw)``, with the patch outlined
    (sized as :func:`~analysis.plots.overlays.attention_overlay`, for a chart ``chart_width`` px wide);
    every row and column labelled up to :data:`DENSE_GRID`, else every k-th
    (:func:`grid_tick_step`); a drag zooms into a box.

    Parameters
    ----------
    similarity : numpy.ndarray
        ``(gh, gw)`` cosine similarities in [-1, 1].
    patch : (int, int)
        The patch's ``(row, column)``, outlined and named in the title.
    colorscale : str, default "Viridis"
        A plotly colour scale's name.
    height : int, default 420
        The tallest the figure may be (px).
    chart_width : float, default CHART_WIDTH_PX
        The chart's width (px) the figure is planned for.

    Returns
    -------
    plotly.graph_objects.Figure
        One heatmap on the fixed range -1..1.
    """
    similarity = np.asarray(similarity)
    gh, gw = similarity.shape
    height, plot_height = image_figure_height(height, (gh, gw), chart_width, titled=True)
    r, c = patch
    trace = dict(
        type="heatmap",
        z=similarity,
        x0=0,
        dx=1,
        y0=0,
        dy=1,
        zmin=-1,
        zmax=1,
        colorscale=colour_stops(colorscale),
        zsmooth=False,
        colorbar=image_colorbar("cosine similarity", plot_height=plot_height),
        hovertemplate="row %{y}, col %{x}<br>cos %{z:.3f}<extra></extra>",
    )
    return styled_figure(
        [trace],
        title=f"Patch (row {r}, col {c})",
        height=height,
        margin=image_figure_margin(True),
        shapes=[highlight_rect(c - 0.5, r - 0.5, c + 0.5, r + 0.5)],
        dragmode="zoom",
        xaxis=dict(
            title=dict(text="patch column"),
            range=[-0.5, gw - 0.5],
            constrain="domain",
            showgrid=False,
            tickmode="linear",
            tick0=0,
            dtick=grid_tick_step(gw),
        ),
        yaxis=dict(
            title=dict(text="patch row"),
            range=[gh - 0.5, -0.5],
            scaleanchor="x",
            constrain="domain",
            showgrid=False,
            tickmode="linear",
            tick0=0,
            dtick=grid_tick_step(gh),
        ),
    )


def rgb_patch_grid(
    patches: np.ndarray,
    ncols: int,
    *,
    tile_names: Sequence[str],
    gap: int = 1,
    height: int | None = None,
) -> go.Figure:
    """Filters or components ``(k, C, ph, pw)`` as RGB tiles, each min-max scaled to [0, 1].

    One-channel filters are shown in grey; more than three channels show the first three.

    Parameters
    ----------
    patches : numpy.ndarray
        ``(k, C, ph, pw)`` filters or components.
    ncols : int
        Tiles per row (clamped to ``1..k``).
    tile_names : sequence of str
        The ``k`` tiles' names, in the hover.
    gap : int, default 1
        White pixels between tiles.
    height : int or None, default None
        Figure height (px); ``None``, from the grid's aspect (160 to 900 px, plus 30).

    Returns
    -------
    plotly.graph_objects.Figure
        One image trace (the tiles on white) and the hover markers on the tile centres.
    """
    patches = np.asarray(patches)
    k, channels, ph, pw = patches.shape
    rgb = patches[:, :3] if channels >= 3 else np.repeat(patches[:, :1], 3, axis=1)
    flat = rgb.reshape(k, -1)
    lo, hi = flat.min(axis=1).reshape(k, 1, 1, 1), flat.max(axis=1).reshape(k, 1, 1, 1)
    scaled = (rgb - lo) / np.where(hi - lo > 0, hi - lo, 1.0)  # (k, 3, ph, pw) in [0, 1]
    ncols = max(1, min(ncols, k))
    nrows = math.ceil(k / ncols)
    canvas = np.full((nrows * (ph + gap) - gap, ncols * (pw + gap) - gap, 3), 255, np.uint8)
    for i in range(k):
        r, c = divmod(i, ncols)
        y, x = r * (ph + gap), c * (pw + gap)
        canvas[y : y + ph, x : x + pw] = np.round(scaled[i].transpose(1, 2, 0) * 255).astype(np.uint8)
    index = np.arange(k)
    traces = [
        dict(type="image", z=canvas, x0=0.5, y0=0.5, dx=1, dy=1, hoverinfo="skip"),
        dict(
            type="scatter",
            x=(index % ncols) * (pw + gap) + pw / 2,
            y=(index // ncols) * (ph + gap) + ph / 2,
            mode="markers",
            marker=CLICK_MARKER,
            text=list(tile_names),
            hovertemplate="%{text}<extra></extra>",
            showlegend=False,
        ),
    ]
    if height is None:
        height = int(np.clip(700 * canvas.shape[0] / canvas.shape[1], 160, 900)) + 30
    return styled_figure(
        traces,
        title=None,
        height=height,
        hoverdistance=-1,
        xaxis=dict(
            range=[0, canvas.shape[1]], showticklabels=False, showgrid=False, zeroline=False, constrain="domain"
        ),
        yaxis=dict(
            range=[canvas.shape[0], 0],
            scaleanchor="x",
            showticklabels=False,
            showgrid=False,
            zeroline=False,
            constrain="domain",
        ),
    )
