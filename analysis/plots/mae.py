"""Figures of a masked autoencoder (MAE, He et al. 2022): the Figure 2 row (original, masked
input, reconstruction, composite) on one pixel scale, a patch map over one of those pictures
(the per-patch error, the attention of a visible query), and the loss against the mask ratio.

Pixels come in the image's own units, 0..1 (``x·std + mean``, as
:func:`analysis.mae.display.unit_pixels` returns them): every picture of a row is mapped by the
same rule, ``round(255·clip(x, 0, 1))``, so equal colours are equal values; NaN pixels (hidden
patches, never shown to the model) are drawn in :data:`HIDDEN_GREY`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from .layout import CHART_WIDTH_PX, image_figure_height, image_figure_margin
from .overlays import panel_geometry
from .style import (
    CLICK_MARKER,
    SERIES_COLOURS,
    colour_stops,
    highlight_rect,
    image_axes,
    image_colorbar,
    image_data_uri,
    patch_centres,
    styled_figure,
)

__all__ = ["HIDDEN_GREY", "unit_to_uint8", "clipped_fraction", "mae_panels", "mae_patch_map", "mae_loss_by_ratio"]

#: How a hidden patch is drawn in the masked input (MAE's own figures use grey too).
HIDDEN_GREY = (128, 128, 128)


def unit_to_uint8(image: np.ndarray) -> np.ndarray:
    """``(H, W, 3)`` float in 0..1 -> uint8 by ``round(255·clip(x, 0, 1))``; NaN -> :data:`HIDDEN_GREY`.

    Parameters
    ----------
    image : numpy.ndarray
        ``(H, W, 3)`` pixels in the image's own units, 0..1; a pixel with a NaN channel is hidden.

    Returns
    -------
    numpy.ndarray
        ``(H, W, 3)`` uint8 RGB.
    """
    image = np.asarray(image, dtype=np.float64)
    missing = np.isnan(image).any(axis=-1)  # (H, W)
    out = np.round(255 * np.clip(np.nan_to_num(image, nan=0.0), 0.0, 1.0)).astype(np.uint8)
    out[missing] = HIDDEN_GREY
    return out


def clipped_fraction(image: np.ndarray) -> float:
    """The share of the finite values of ``image`` outside 0..1 (drawn clipped).

    Parameters
    ----------
    image : numpy.ndarray
        Pixel values of any shape, e.g. ``(H, W, 3)``; NaN and infinite ones are ignored.

    Returns
    -------
    float
        The fraction in [0, 1]; 0.0 when no value is finite.
    """
    values = np.asarray(image, dtype=np.float64)
    values = values[np.isfinite(values)]
    return float(((values < 0) | (values > 1)).mean()) if values.size else 0.0


def _click_targets(grid_size, patch_size, panel: int, hidden: np.ndarray, axes: dict, hint: str, title: str) -> dict:
    gh, gw = grid_size
    xs, ys = patch_centres(grid_size, patch_size)
    index = np.arange(gh * gw)
    state = np.where(hidden, "hidden", "visible")
    return dict(
        type="scatter",
        x=xs,
        y=ys,
        mode="markers",
        marker=CLICK_MARKER,
        showlegend=False,
        name=title,
        customdata=np.stack([index, np.full_like(index, panel), hidden, index // gw, index % gw], axis=1).astype(
            np.float64
        ),  # (N, 5); floats: plotly returns them as a list
        text=state,
        hovertemplate=title + "<br>patch %{customdata[0]:.0f} (row %{customdata[3]:.0f}, col "
        "%{customdata[4]:.0f}), %{text}<extra>" + hint + "</extra>",
        **axes,
    )


def mae_panels(
    images: Sequence[np.ndarray],
    titles: Sequence[str],
    grid_size: tuple[int, int],
    patch_size: tuple[int, int],
    hidden: np.ndarray,
    *,
    outline: Sequence[int] = (),
    click_hint: str = "click: hide or reveal this patch",
    panel_height: int = 240,
) -> go.Figure:
    """The pictures side by side on one pixel scale (:func:`unit_to_uint8`, lossless PNG). Every
    panel has transparent click targets on its patch centres,
    ``customdata = [patch, panel, hidden (0/1), row, col]``.

    Parameters
    ----------
    images : sequence of numpy.ndarray
        The pictures, each ``(H, W, 3)`` in 0..1 (NaN: hidden).
    titles : sequence of str
        One title per picture.
    grid_size : (int, int)
        The patch grid ``(gh, gw)``.
    patch_size : (int, int)
        A patch's ``(ph, pw)`` in pixels.
    hidden : numpy.ndarray
        ``(N,)`` bool (or ``(gh, gw)``, flattened), ``N = gh·gw``: the hidden patches, row-major.
    outline : sequence of int, default ()
        Patch indices outlined on every panel (e.g. the ones the user flipped).
    click_hint : str, default "click: hide or reveal this patch"
        The hover's side note on the click targets.
    panel_height : int, default 240
        The tallest a panel may be (px).

    Returns
    -------
    plotly.graph_objects.Figure
        One image trace per picture, then one scatter of click targets per picture.

    Raises
    ------
    ValueError
        If ``images`` and ``titles`` differ in length.
    """
    hidden = np.asarray(hidden, dtype=bool).ravel()
    n = len(images)
    (_, gw), (ph, pw) = grid_size, patch_size
    sizes = [np.asarray(image).shape[:2] for image in images]
    geometry = panel_geometry(1, n, list(range(n)), list(titles), sizes, panel_height, CHART_WIDTH_PX)
    x_domains, y_domains, annotations = geometry["x_domains"], geometry["y_domains"], geometry["annotations"]
    traces, targets, shapes, layout = [], [], [], {}
    for i, (image, title) in enumerate(zip(images, titles, strict=True)):
        suffix = "" if i == 0 else str(i + 1)
        axes = dict(xaxis=f"x{suffix}", yaxis=f"y{suffix}")
        height, width = np.asarray(image).shape[:2]
        traces.append(
            dict(
                type="image",
                source=image_data_uri(unit_to_uint8(image), lossless=True),
                x0=0.5,
                y0=0.5,
                dx=1,
                dy=1,
                hoverinfo="skip",
                name=title,
                **axes,
            )
        )
        targets.append(_click_targets(grid_size, patch_size, i, hidden, axes, click_hint, title))
        for patch in outline:
            r, c = divmod(int(patch), gw)
            shapes.append(
                {
                    **highlight_rect(c * pw, r * ph, (c + 1) * pw, (r + 1) * ph),
                    "xref": axes["xaxis"],
                    "yref": axes["yaxis"],
                }
            )
        axis_layout = image_axes(width, height, titles=i == 0)
        layout[f"xaxis{suffix}"] = {**axis_layout["xaxis"], "domain": x_domains[i], "anchor": f"y{suffix}"}
        layout[f"yaxis{suffix}"] = {
            **axis_layout["yaxis"],
            "domain": y_domains[0],
            "anchor": f"x{suffix}",
            "scaleanchor": f"x{suffix}",
        }
    return styled_figure(
        traces + targets,
        title=None,
        height=geometry["height"],
        shapes=shapes,
        hoverdistance=-1,
        clickmode="event+select",
        dragmode="pan",
        annotations=annotations,
        margin=geometry["margin"],
        **layout,
    )


def mae_patch_map(
    background: np.ndarray,
    values: np.ndarray,
    patch_size: tuple[int, int],
    hidden: np.ndarray,
    *,
    zmin: float,
    zmax: float,
    colorbar_title: str,
    colorscale: str = "Viridis",
    title: str | None = None,
    opacity: float = 0.75,
    outline: int | None = None,
    click_hint: str = "",
    height: int = 420,
    chart_width: float = CHART_WIDTH_PX,
) -> go.Figure:
    """A patch map (NaN cells drawn empty: the background shows) over a picture, on the stated
    range ``zmin..zmax``; click targets as in :func:`mae_panels` (panel 0) with the cell's value
    appended, ``customdata = [patch, 0, hidden, row, col, value]``. Sized as
    :func:`attention_overlay` (at most ``height``, short enough for a chart ``chart_width`` px wide).

    Parameters
    ----------
    background : numpy.ndarray
        ``(H, W, 3)`` picture in 0..1 (:func:`unit_to_uint8`; NaN: hidden).
    values : numpy.ndarray
        ``(gh, gw)`` map, e.g. the per-patch error; NaN cells are not drawn.
    patch_size : (int, int)
        A patch's ``(ph, pw)`` in pixels.
    hidden : numpy.ndarray
        ``(gh·gw,)`` bool (or ``(gh, gw)``, flattened): the hidden patches, row-major.
    zmin : float
        The colour scale's bottom.
    zmax : float
        The colour scale's top.
    colorbar_title : str
        The colour bar's title.
    colorscale : str, default "Viridis"
        A plotly colour scale's name.
    title : str or None, default None
        Figure title; ``None``, none.
    opacity : float, default 0.75
        The map's opacity over the picture.
    outline : int or None, default None
        A patch index to outline (the query); ``None`` or an index off the grid, none.
    click_hint : str, default ""
        The hover's side note on the click targets.
    height : int, default 420
        The tallest the figure may be (px).
    chart_width : float, default CHART_WIDTH_PX
        The chart's width (px) the figure is planned for.

    Returns
    -------
    plotly.graph_objects.Figure
        The picture, the heatmap and the click targets, on pixel axes.
    """
    values = np.asarray(values, dtype=np.float64)
    (gh, gw), (ph, pw) = values.shape, patch_size
    height_px, width_px = np.asarray(background).shape[:2]
    height, plot_height = image_figure_height(height, (height_px, width_px), chart_width, titled=bool(title))
    hidden = np.asarray(hidden, dtype=bool).ravel()
    targets = _click_targets((gh, gw), (ph, pw), 0, hidden, {}, click_hint, title or "patch")
    targets["customdata"] = np.concatenate([targets["customdata"], values.reshape(-1, 1)], axis=1)
    targets["hovertemplate"] = targets["hovertemplate"].replace("<extra>", "<br>value %{customdata[5]:.4g}<extra>")
    traces = [
        dict(
            type="image",
            source=image_data_uri(unit_to_uint8(background), lossless=True),
            x0=0.5,
            y0=0.5,
            dx=1,
            dy=1,
            hoverinfo="skip",
            name="image",
        ),
        dict(
            type="heatmap",
            z=values,
            x0=pw / 2,
            dx=pw,
            y0=ph / 2,
            dy=ph,
            opacity=opacity,
            zmin=zmin,
            zmax=zmax,
            colorscale=colour_stops(colorscale),
            zsmooth=False,
            hoverinfo="skip",
            colorbar=image_colorbar(colorbar_title, plot_height=plot_height),
            name="map",
        ),
        targets,
    ]
    shapes = []
    if outline is not None and 0 <= outline < gh * gw:
        r, c = divmod(int(outline), gw)
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


def mae_loss_by_ratio(
    ratios: Sequence[float],
    losses: np.ndarray,
    names: Sequence[str],
    *,
    y_title: str,
    current_ratio: float | None = None,
    height: int = 380,
) -> go.Figure:
    """Reconstruction loss against mask ratio: one thin grey line per image and their mean (NaN
    ignored) in colour. The y axis starts at 0.

    Parameters
    ----------
    ratios : sequence of float
        The ``R`` mask ratios, in [0, 1].
    losses : numpy.ndarray
        ``(n, R)`` losses, one row per image.
    names : sequence of str
        The ``n`` images' names (in the hover).
    y_title : str
        The y axis's title (the loss).
    current_ratio : float or None, default None
        A ratio marked with a dotted vertical line; ``None``, none.
    height : int, default 380
        Figure height (px).

    Returns
    -------
    plotly.graph_objects.Figure
        One line per image, then the mean line (when there is an image).

    Raises
    ------
    ValueError
        If ``names`` and the rows of ``losses`` differ in number.
    """
    losses = np.asarray(losses, dtype=np.float64)
    ratios = [float(r) for r in ratios]
    traces = [
        dict(
            type="scatter",
            x=ratios,
            y=row,
            mode="lines",
            name=name,
            showlegend=False,
            line=dict(color="rgba(120,120,120,0.35)", width=1),
            hovertemplate=f"{name}<br>ratio %{{x:.2f}}<br>loss %{{y:.4g}}<extra></extra>",
        )
        for name, row in zip(names, losses, strict=True)
    ]
    if len(losses):
        traces.append(
            dict(
                type="scatter",
                x=ratios,
                y=np.nanmean(losses, axis=0),
                mode="lines+markers",
                name=f"mean over {len(losses)} images",
                line=dict(color=SERIES_COLOURS[1], width=3),
                marker=dict(size=7),
                hovertemplate="ratio %{x:.2f}<br>mean loss %{y:.4g}<extra></extra>",
            )
        )
    shapes = []
    if current_ratio is not None:
        shapes.append(
            dict(
                type="line",
                yref="paper",
                y0=0,
                y1=1,
                x0=current_ratio,
                x1=current_ratio,
                line=dict(color="#9e9e9e", dash="dot", width=1),
            )
        )
    top = float(np.nanmax(losses)) * 1.05 if losses.size and np.isfinite(losses).any() else 1.0
    return styled_figure(
        traces,
        title=None,
        height=height,
        legend=dict(orientation="h", y=1.12, x=0),
        shapes=shapes,
        xaxis=dict(title=dict(text="mask ratio (share of patches hidden)"), range=[0, 1], showgrid=True),
        yaxis=dict(title=dict(text=y_title), range=[0, top], showgrid=True),
    )
