"""Patch maps drawn over the model-input image: one map (:func:`attention_overlay`) or
several on one shared colour scale (:func:`map_panels`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import plotly.graph_objects as go

from .layout import (
    CHART_WIDTH_PX,
    IMAGE_BOTTOM_PX,
    IMAGE_LEFT_PX,
    IMAGE_RIGHT_PX,
    LINE_HEIGHT,
    chars_fitting,
    image_figure_height,
    image_figure_margin,
    image_rows_height,
    line_count,
    wrap_label,
)
from .ranges import clipped_cells, colour_bar_ticks
from .style import (
    CLICK_MARKER,
    as_background,
    colorize,
    colour_lut,
    colour_stops,
    highlight_rect,
    image_axes,
    image_colorbar,
    image_data_uri,
    patch_centres,
    styled_figure,
)

__all__ = ["attention_overlay", "map_panels", "clipped_outline"]


def clipped_outline(
    attention: np.ndarray, stride: tuple[int, int], zmax: float | None, colorscale: str, **axes
) -> dict | None:
    """One line trace outlining every cell of the ``(gh, gw)`` map above ``zmax`` (the cells a
    robust colour range clips to its top colour, :func:`analysis.plots.clipped_cells`), cell
    ``(r, c)`` outlined at ``[c·sw, (c+1)·sw] × [r·sh, (r+1)·sh]`` input pixels: exactly the edges
    of the cell the heatmap draws (``x0 = sw/2``, ``dx = sw``), of its image pixels (``x0 = 0.5``,
    ``dx = 1``: pixel ``i`` spans ``[i, i+1]``) and of the query patch's highlight. The line is dark
    on a light top colour and white on a dark one.

    Parameters
    ----------
    attention : numpy.ndarray
        ``(gh, gw)`` map; NaN cells are never above.
    stride : (int, int)
        A cell's ``(sh, sw)`` in input pixels (the patch size).
    zmax : float or None
        The colour scale's top; ``None``, nothing is outlined.
    colorscale : str
        The map's plotly colour scale (its top colour picks the line's).
    **axes : Any
        The trace's axes, e.g. ``xaxis="x2", yaxis="y2"``.

    Returns
    -------
    dict or None
        A dotted ``scatter`` line trace, or ``None`` when ``zmax`` is ``None`` or no cell is above.
    """
    if zmax is None:
        return None
    gh, gw = np.asarray(attention).shape
    above = clipped_cells(attention, zmax)
    if not above.size:
        return None
    sh, sw = stride
    xs: list[float | None] = []
    ys: list[float | None] = []
    for cell in above.tolist():
        r, c = divmod(cell, gw)
        x0, y0, x1, y1 = c * sw, r * sh, (c + 1) * sw, (r + 1) * sh
        xs += [x0, x1, x1, x0, x0, None]
        ys += [y0, y0, y1, y1, y0, None]
    top = colour_lut(colorscale)[-1].astype(float)
    light = 0.2126 * top[0] + 0.7152 * top[1] + 0.0722 * top[2] > 140
    return dict(
        type="scatter",
        x=xs,
        y=ys,
        mode="lines",
        hoverinfo="skip",
        showlegend=False,
        line=dict(color="rgb(20, 20, 20)" if light else "white", width=1.5, dash="dot"),
        name=f"{above.size} above the colour range",
        **axes,
    )


def _smooth_layer(upsampled: np.ndarray, colorscale: str, lo: float, hi: float, opacity: float, **axes) -> dict:
    """A map already upsampled to ``(H, W)`` input pixels, sent as one colour-mapped PNG
    (a heatmap of H·W cells would be megabytes of JSON)."""
    rgb = colorize(np.asarray(upsampled, dtype=np.float64), colorscale, lo, hi)  # (H, W, 3)
    return dict(
        type="image",
        source=image_data_uri(rgb, lossless=True),
        x0=0.5,
        y0=0.5,
        dx=1,
        dy=1,
        opacity=opacity,
        hoverinfo="skip",
        name="attention (bilinear)",
        **axes,
    )


def _colorbar_carrier(
    lo: float,
    hi: float,
    *,
    colorscale: str | None = None,
    colorbar: dict | None = None,
    coloraxis: str | None = None,
    **axes,
) -> dict:
    """An invisible trace whose only job is to show the colour bar of a PNG layer."""
    marker: dict[str, Any] = dict(color=[lo, hi], size=0.001, opacity=0)
    if coloraxis:
        marker["coloraxis"] = coloraxis
    else:
        assert colorscale is not None, "a colour bar needs its colour axis or its colour scale"
        marker.update(colorscale=colour_stops(colorscale), cmin=lo, cmax=hi, showscale=True, colorbar=colorbar)
    return dict(
        type="scatter",
        x=[None, None],
        y=[None, None],
        mode="markers",
        marker=marker,
        hoverinfo="skip",
        showlegend=False,
        name="colour bar",
        **axes,
    )


def attention_overlay(
    background: str | np.ndarray,
    image_size: tuple[int, int],
    attention: np.ndarray,
    patch_size: tuple[int, int],
    *,
    opacity: float = 0.6,
    colorscale: str = "Viridis",
    zmin: float | None = None,
    zmax: float | None = None,
    title: str | None = None,
    colorbar_title: str = "attention weight (probability)",
    query_patch: int | None = None,
    height: int = 560,
    upsampled: np.ndarray | None = None,
    chart_width: float = CHART_WIDTH_PX,
    uniform: float | None = None,
) -> go.Figure:
    """The model-input image with a patch map on top.

    The last trace is one transparent marker per patch centre (row-major, so point
    index = patch index, also in ``customdata[0]``; ``customdata = [patch, 0, row, col, value]``):
    clicking selects the patch under the cursor (``hoverdistance=-1`` picks the nearest centre,
    i.e. the containing patch). Cells above ``zmax`` (a robust range's clipped cells) are outlined
    (:func:`clipped_outline`); NaN cells (tokens left out of the map) are not drawn.
    The figure is at most ``height`` px tall, and short enough that on a chart ``chart_width``
    px wide the image's height limits it (:func:`image_figure_height`): the colour bar, as
    long as the plot area, is then as tall as the image.

    Parameters
    ----------
    background : str or numpy.ndarray
        The model-input image, as an ``(H, W, 3)`` uint8 array
        (``np.asarray(vit.model_input_image(image))``) or a data URI (:func:`image_data_uri`).
    image_size : (int, int)
        The image's ``(H, W)`` in input pixels.
    attention : numpy.ndarray
        ``(gh, gw)`` map; cell ``(r, c)`` is drawn exactly over patch ``(r, c)``.
    patch_size : (int, int)
        A patch's ``(ph, pw)`` in input pixels.
    opacity : float, default 0.6
        The map's opacity over the image.
    colorscale : str, default "Viridis"
        A plotly colour scale's name.
    zmin : float or None, default None
        The colour scale's bottom; ``None``, the map's minimum.
    zmax : float or None, default None
        The colour scale's top; ``None``, the map's maximum (and no outline).
    title : str or None, default None
        Figure title; ``None``, none.
    colorbar_title : str, default "attention weight (probability)"
        The colour bar's title, wrapped to the bar's length.
    query_patch : int or None, default None
        A patch index outlined (the query); ``None`` or an index off the grid, none.
    height : int, default 560
        The tallest the figure may be (px).
    upsampled : numpy.ndarray or None, default None
        The same map at ``(H, W)`` pixels (e.g. bilinear), drawn instead of the patch cells as a
        colour-mapped PNG, while hover and clicks still read the patch values.
    chart_width : float, default CHART_WIDTH_PX
        The chart's width (px) the figure is planned for.
    uniform : float or None, default None
        The value of uniform attention (``1/T``), marked on the colour bar
        (:func:`~analysis.plots.ranges.colour_bar_ticks`); ``None``, not marked.

    Returns
    -------
    plotly.graph_objects.Figure
        The image, the map (a heatmap, or a PNG with an invisible colour-bar trace), the outline
        of the clipped cells if any, and the click targets, on pixel axes.
    """
    height_px, width_px = image_size
    height, plot_height = image_figure_height(height, (height_px, width_px), chart_width, titled=bool(title))
    attention = np.asarray(attention)
    gh, gw = attention.shape
    ph, pw = patch_size
    xs, ys = patch_centres((gh, gw), (ph, pw))
    index = np.arange(gh * gw)
    colorbar = image_colorbar(colorbar_title, plot_height=plot_height)
    if uniform:
        finite = attention[np.isfinite(attention)]
        bar_lo = float(finite.min()) if zmin is None and finite.size else float(zmin or 0.0)
        bar_hi = float(finite.max()) if zmax is None and finite.size else float(zmax or 0.0)
        colorbar.update(colour_bar_ticks(bar_lo, bar_hi, uniform=uniform))
    if upsampled is None:
        layers = [
            dict(
                type="heatmap",
                z=attention,
                x0=pw / 2,
                dx=pw,
                y0=ph / 2,
                dy=ph,
                opacity=opacity,
                colorscale=colour_stops(colorscale),
                zmin=zmin,
                zmax=zmax,
                zsmooth=False,
                hoverinfo="skip",
                colorbar=colorbar,
                name="attention",
            )
        ]
    else:
        lo = float(attention.min()) if zmin is None else float(zmin)
        hi = float(attention.max()) if zmax is None else float(zmax)
        layers = [
            _smooth_layer(upsampled, colorscale, lo, hi, opacity),
            _colorbar_carrier(lo, hi, colorscale=colorscale, colorbar=colorbar),
        ]
    outline = clipped_outline(attention, (ph, pw), zmax, colorscale)
    traces = [
        dict(
            type="image", source=as_background(background), x0=0.5, y0=0.5, dx=1, dy=1, hoverinfo="skip", name="input"
        ),
        *layers,
        *([outline] if outline else []),
        dict(
            type="scatter",
            x=xs,
            y=ys,
            mode="markers",
            marker=CLICK_MARKER,
            showlegend=False,
            name="patches",
            customdata=np.stack([index, np.zeros_like(index), index // gw, index % gw, attention.ravel()], axis=1),
            hovertemplate="patch %{customdata[0]:.0f} (row %{customdata[2]:.0f}, col %{customdata[3]:.0f})"
            "<br>value %{customdata[4]:.4g}<extra>click: make it the query</extra>",
        ),
    ]
    shapes = []
    if query_patch is not None and 0 <= query_patch < gh * gw:
        r, c = divmod(int(query_patch), gw)
        shapes.append(highlight_rect(c * pw, r * ph, (c + 1) * pw, (r + 1) * ph))
    return styled_figure(
        traces,
        title=title,
        height=height,
        hoverdistance=-1,
        clickmode="event+select",
        dragmode="pan",
        shapes=shapes,
        margin=image_figure_margin(bool(title)),
        **image_axes(width_px, height_px),
    )


def map_panels(
    background: str | np.ndarray | Sequence[str | np.ndarray],
    image_size: tuple[int, int] | Sequence[tuple[int, int]],
    maps: Sequence[np.ndarray],
    patch_size: tuple[int, int] | Sequence[tuple[int, int]],
    titles: Sequence[str],
    *,
    ncols: int = 4,
    opacity: float = 0.6,
    colorscale: str = "Viridis",
    zmin: float | None = None,
    zmax: float | None = None,
    colorbar_title: str = "attention weight (probability)",
    panel_height: int = 260,
    query_patches: Sequence[int | None] | None = None,
    slots: Sequence[int] | None = None,
    color_groups: Sequence[int] | None = None,
    group_ranges: Sequence[tuple[float, float, str]] | None = None,
    upsampled: Sequence[np.ndarray | None] | None = None,
    chart_width: float = CHART_WIDTH_PX,
) -> go.Figure:
    """Several patch maps over their images, side by side on ONE shared colour scale.

    Each panel has transparent click targets on its patch centres with
    ``customdata = [patch, panel, value]``; the cells above its scale's top are outlined
    (:func:`clipped_outline`).

    Layout (:mod:`analysis.plots.layout`): each image is at most ``panel_height`` px tall and
    no taller than a chart ``chart_width`` px wide lets its width draw it, so its height limits
    it and each colour bar is exactly as tall as the rows of its panels; titles are wrapped to
    their panel's width, with room above each row for the longest.

    Parameters
    ----------
    background : str, numpy.ndarray or sequence of them
        The image (an ``(H, W, 3)`` uint8 array or a data URI, as in :func:`attention_overlay`),
        one for all panels or one per panel.
    image_size : (int, int) or sequence of (int, int)
        ``(H, W)``, one for all panels or one per panel (two models of different geometry on the
        same image).
    maps : sequence of numpy.ndarray
        One ``(gh, gw)`` map per panel, on that panel's grid.
    patch_size : (int, int) or sequence of (int, int)
        ``(ph, pw)``, one for all panels or one per panel.
    titles : sequence of str
        One title per panel (``""``: none).
    ncols : int, default 4
        Panels per row (at most the number of slots used).
    opacity : float, default 0.6
        The maps' opacity over the images.
    colorscale : str, default "Viridis"
        A plotly colour scale's name, for every colour scale.
    zmin : float or None, default None
        The shared scale's bottom; ``None``, the minimum over all maps.
    zmax : float or None, default None
        The shared scale's top; ``None``, the maximum over all maps.
    colorbar_title : str, default "attention weight (probability)"
        The shared colour bar's title (without ``group_ranges``).
    panel_height : int, default 260
        The tallest an image may be (px).
    query_patches : sequence of (int or None) or None, default None
        ``query_patches[i]``, a patch index of panel i's grid, is outlined.
    slots : sequence of int or None, default None
        ``slots[i]`` places panel i in grid cell ``slots[i]`` (row-major); ``None``, panel i in cell
        i. A second model can so start on a new row.
    color_groups : sequence of int or None, default None
        ``color_groups[i]`` picks panel i's colour scale in ``group_ranges``; ``None``, group 0 for all.
    group_ranges : sequence of (float, float, str) or None, default None
        ``group_ranges[g] = (lo, hi, colour bar title)``, one colour bar per group beside its
        rows; ``None``, one scale ``zmin``..``zmax`` over all panels.
    upsampled : sequence of (numpy.ndarray or None) or None, default None
        ``upsampled[i]``, when given, is panel i's map at its image's ``(H, W)`` pixels, drawn
        instead of the patch cells (see :func:`attention_overlay`).
    chart_width : float, default CHART_WIDTH_PX
        The chart's width (px) the figure is planned for.

    Returns
    -------
    plotly.graph_objects.Figure
        Per panel its image, map and outline, then the click targets of every panel.

    Raises
    ------
    ValueError
        If per-panel ``background``, ``image_size`` or ``patch_size`` lists differ from ``maps`` in length.
    """
    n = len(maps)
    one = isinstance(background, str) or (isinstance(background, np.ndarray) and background.ndim == 3)
    backgrounds = [as_background(b) for b in ([background] * n if one else background)]
    maps = [np.asarray(m) for m in maps]
    # one (a, b) for all panels, or one per panel (an element's type tells which: mypy cannot)
    sizes = cast("list[tuple[int, int]]", [image_size] * n if isinstance(image_size[0], int) else list(image_size))
    patches = cast("list[tuple[int, int]]", [patch_size] * n if isinstance(patch_size[0], int) else list(patch_size))
    slots = list(range(n)) if slots is None else [int(s) for s in slots]
    ncols = max(1, min(ncols, max(slots) + 1))
    nrows = max(slots) // ncols + 1
    lo = float(min(m.min() for m in maps)) if zmin is None else zmin
    hi = float(max(m.max() for m in maps)) if zmax is None else zmax
    groups = [0] * n if color_groups is None else [int(g) for g in color_groups]
    ranges = list(group_ranges) if group_ranges is not None else [(lo, hi, colorbar_title)]
    geometry = panel_geometry(nrows, ncols, slots, titles, sizes, panel_height, chart_width)
    x_domains, y_domains, title_annotations = geometry["x_domains"], geometry["y_domains"], geometry["annotations"]
    traces = []
    click_targets = []
    shapes = []
    axes = {}
    for i, (bg, size, patch, attention) in enumerate(zip(backgrounds, sizes, patches, maps, strict=True)):
        row, col = divmod(slots[i], ncols)
        ph, pw = patch
        suffix = "" if slots[i] == 0 else str(slots[i] + 1)
        traces.append(
            dict(
                type="image",
                source=bg,
                x0=0.5,
                y0=0.5,
                dx=1,
                dy=1,
                hoverinfo="skip",
                xaxis=f"x{suffix}",
                yaxis=f"y{suffix}",
            )
        )
        coloraxis = "coloraxis" if groups[i] == 0 else f"coloraxis{groups[i] + 1}"
        smooth = upsampled[i] if upsampled is not None else None
        if smooth is None:
            traces.append(
                dict(
                    type="heatmap",
                    z=attention,
                    x0=pw / 2,
                    dx=pw,
                    y0=ph / 2,
                    dy=ph,
                    opacity=opacity,
                    coloraxis=coloraxis,
                    zsmooth=False,
                    name=titles[i],
                    xaxis=f"x{suffix}",
                    yaxis=f"y{suffix}",
                    hoverinfo="skip",
                )
            )
        else:
            g_lo, g_hi, _ = ranges[groups[i]]
            traces.append(
                _smooth_layer(smooth, colorscale, g_lo, g_hi, opacity, xaxis=f"x{suffix}", yaxis=f"y{suffix}")
            )
            traces.append(_colorbar_carrier(g_lo, g_hi, coloraxis=coloraxis, xaxis=f"x{suffix}", yaxis=f"y{suffix}"))
        outline = clipped_outline(
            attention, (ph, pw), ranges[groups[i]][1], colorscale, xaxis=f"x{suffix}", yaxis=f"y{suffix}"
        )
        if outline:
            traces.append(outline)
        gh, gw = attention.shape
        xs, ys = patch_centres((gh, gw), (ph, pw))
        index = np.arange(gh * gw)
        click_targets.append(
            dict(
                type="scatter",
                x=xs,
                y=ys,
                mode="markers",
                marker=CLICK_MARKER,
                showlegend=False,
                xaxis=f"x{suffix}",
                yaxis=f"y{suffix}",
                name=titles[i],
                customdata=np.stack([index, np.full_like(index, i), attention.ravel()], axis=1),
                hovertemplate=titles[i] + "<br>patch %{customdata[0]:.0f}<br>value %{customdata[2]:.4g}"
                "<extra>click: make it the query</extra>",
            )
        )
        query = query_patches[i] if query_patches is not None else None
        if query is not None and 0 <= query < gh * gw:
            r, c = divmod(int(query), gw)
            shapes.append(
                {
                    **highlight_rect(c * pw, r * ph, (c + 1) * pw, (r + 1) * ph),
                    "xref": f"x{suffix}",
                    "yref": f"y{suffix}",
                }
            )
        first_col_last_row = row == nrows - 1 and col == 0
        axes[f"xaxis{suffix}"] = dict(
            range=[0, size[1]],
            showgrid=False,
            zeroline=False,
            showticklabels=row == nrows - 1,
            constrain="domain",
            title=dict(text="x (input px)" if first_col_last_row else None),
            domain=x_domains[col],
            anchor=f"y{suffix}",
        )
        axes[f"yaxis{suffix}"] = dict(
            range=[size[0], 0],
            showgrid=False,
            zeroline=False,
            showticklabels=col == 0,
            scaleanchor=f"x{suffix}",
            constrain="domain",
            title=dict(text="y (input px)" if first_col_last_row else None),
            domain=y_domains[row],
            anchor=f"x{suffix}",
        )
    color_axes = {}
    for g, (g_lo, g_hi, g_title) in enumerate(ranges):  # one colour bar per group, beside its rows
        rows = {slots[i] // ncols for i in range(n) if groups[i] == g} or set(range(nrows))
        domain = (min(y_domains[r][0] for r in rows), max(y_domains[r][1] for r in rows))
        color_axes["coloraxis" if g == 0 else f"coloraxis{g + 1}"] = dict(
            colorscale=colour_stops(colorscale),
            cmin=g_lo,
            cmax=g_hi,
            colorbar=image_colorbar(g_title, domain=domain, plot_height=geometry["plot_height"]),
        )
    # one-shot construction (make_subplots + add_traces validated everything twice: 60 ms for 4 panels)
    return styled_figure(
        traces + click_targets,
        title=None,
        height=geometry["height"],
        shapes=shapes,
        hoverdistance=-1,
        clickmode="event+select",
        dragmode="pan",
        annotations=title_annotations,
        margin=geometry["margin"],
        **color_axes,
        **axes,
    )


_PANEL_TITLE_FONT = 14


def panel_geometry(
    nrows: int,
    ncols: int,
    slots: Sequence[int],
    titles: Sequence[str],
    sizes: Sequence[tuple[int, int]],
    panel_height: int,
    chart_width: float,
) -> dict:
    """Domains, title annotations, margins and height of an ``nrows x ncols`` panel grid
    (row 0 on top) planned for a chart ``chart_width`` px wide: panels ``panel_height`` px
    tall at most (:func:`~analysis.plots.layout.image_rows_height`), titles wrapped to the
    panel width, each row's titles in the gap above it."""
    plot_width = max(chart_width - IMAGE_LEFT_PX - IMAGE_RIGHT_PX, 120.0)
    h_gap = 0.02 * plot_width
    panel_width = (plot_width - h_gap * (ncols - 1)) / ncols
    wrapped = [wrap_label(t, chars_fitting(panel_width, _PANEL_TITLE_FONT)) if t else "" for t in titles]
    lines = max((line_count(t) for t in wrapped), default=0)
    title_px = lines * LINE_HEIGHT * _PANEL_TITLE_FONT + (6 if lines else 0)
    row_px = image_rows_height([h / w for h, w in sizes], panel_width, cap_px=panel_height)
    gap_px = title_px + 8
    plot_height = nrows * row_px + (nrows - 1) * gap_px
    x_domains = [
        [c * (panel_width + h_gap) / plot_width, (c * (panel_width + h_gap) + panel_width) / plot_width]
        for c in range(ncols)
    ]
    y_domains = [
        [1 - (r * (row_px + gap_px) + row_px) / plot_height, 1 - r * (row_px + gap_px) / plot_height]
        for r in range(nrows)
    ]
    annotations = [
        dict(
            text=title,
            x=sum(x_domains[slot % ncols]) / 2,
            y=y_domains[slot // ncols][1],
            xref="paper",
            yref="paper",
            xanchor="center",
            yanchor="bottom",
            showarrow=False,
            font=dict(size=_PANEL_TITLE_FONT),
        )
        for slot, title in zip(slots, wrapped)
        if title
    ]
    margin = dict(l=10, r=10, t=int(title_px) + 6, b=IMAGE_BOTTOM_PX)
    return dict(
        x_domains=x_domains,
        y_domains=y_domains,
        annotations=annotations,
        margin=margin,
        plot_height=plot_height,
        height=int(round(plot_height + margin["t"] + margin["b"])),
    )
