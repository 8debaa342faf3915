"""What every figure shares: the colour scales (as explicit stops), the plain white page
style, colour mapping to PNG pixels, and the geometry helpers.

Geometry conventions of every image figure in :mod:`analysis.plots`:

* the model-input image covers ``[0, W] x [0, H]`` in input pixels (y pointing down);
* a patch map ``(gh, gw)`` is a heatmap whose cell ``(r, c)`` covers exactly
  ``[c·pw, (c+1)·pw] x [r·ph, (r+1)·ph]``, i.e. heatmap cells are patches;
* "mosaics" lay many small maps out as tiles of one big heatmap (one cell per patch,
  thin separators between tiles), which stays crisp and light at any grid size.
"""

from __future__ import annotations

import base64
import functools
import io

import numpy as np
import plotly.graph_objects as go
from PIL import Image
from plotly.colors import get_colorscale, hex_to_rgb, sample_colorscale, unlabel_rgb

from .layout import chars_fitting, colorbar_geometry, wrap_label

__all__ = [
    "CHART_FONT_SIZE",
    "COLORSCALES",
    "HIGHLIGHT",
    "SEPARATOR",
    "CLICK_MARKER",
    "SERIES_COLOURS",
    "colour_lut",
    "colour_stops",
    "colorize",
    "image_data_uri",
    "patch_centres",
    "styled_layout",
    "styled_figure",
    "restyle_figure",
    "image_axes",
    "highlight_rect",
    "image_colorbar",
    "as_background",
]

COLORSCALES = ("Viridis", "Inferno", "Cividis", "Magma", "Plasma")
SEPARATOR = "rgba(255,255,255,0.9)"
HIGHLIGHT = "#ff4b4b"
_FONT = dict(size=12)
CHART_FONT_SIZE = _FONT["size"]  # px: the figures' text (titles, ticks, colour-bar titles)
#: the invisible markers that make every cell of a heatmap or image clickable.
CLICK_MARKER = dict(color="rgba(0,0,0,0)", size=8)
#: the line colours of the charts' series, in order (viridis/plasma hues, distinct in print).
SERIES_COLOURS = ("#440154", "#21918c", "#e16462", "#fca636", "#3b528b", "#5ec962")


def image_data_uri(image: np.ndarray, *, lossless: bool = False) -> str:
    """``(H, W, 3)`` uint8 -> data URI (PNG for small images or ``lossless``, else JPEG q92).

    Parameters
    ----------
    image : numpy.ndarray
        ``(H, W, 3)`` RGB, read as uint8.
    lossless : bool, default False
        Always PNG; otherwise PNG only up to 128 × 128 pixels, JPEG (quality 92) above.

    Returns
    -------
    str
        ``"data:image/png;base64,..."`` or ``"data:image/jpeg;base64,..."``.
    """
    pil = Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8), "RGB")
    buffer = io.BytesIO()
    if lossless or pil.width * pil.height <= 128 * 128:
        pil.save(buffer, format="PNG")
        mime = "image/png"
    else:
        pil.save(buffer, format="JPEG", quality=92)
        mime = "image/jpeg"
    return f"data:{mime};base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def patch_centres(grid_size: tuple[int, int], patch_size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Row-major ``(x, y)`` pixel centres of every patch.

    Parameters
    ----------
    grid_size : (int, int)
        The patch grid ``(gh, gw)``.
    patch_size : (int, int)
        A patch's ``(ph, pw)`` in input pixels.

    Returns
    -------
    (numpy.ndarray, numpy.ndarray)
        ``xs`` and ``ys``, each ``(gh·gw,)`` float64, patch ``r·gw + c`` at
        ``((c + 0.5)·pw, (r + 0.5)·ph)``.
    """
    gh, gw = grid_size
    ph, pw = patch_size
    ys, xs = np.meshgrid((np.arange(gh) + 0.5) * ph, (np.arange(gw) + 0.5) * pw, indexing="ij")
    return xs.ravel(), ys.ravel()


@functools.lru_cache(maxsize=32)
def _stops(name: str) -> tuple[tuple[float, str], ...]:
    return tuple(
        (float(position), "rgb({}, {}, {})".format(*_rgb_triplet(colour))) for position, colour in get_colorscale(name)
    )


def _rgb_triplet(colour: str) -> tuple[int, int, int]:
    if colour.startswith("#"):
        return tuple(hex_to_rgb(colour))
    red, green, blue = (int(round(float(v))) for v in unlabel_rgb(colour)[:3])
    return red, green, blue


def colour_stops(name: str) -> list[list]:
    """The named plotly scale as explicit ``[position, "rgb(r, g, b)"]`` stops.

    Streamlit's front end swaps a few placeholder hex colours of its chart theme (``#000004``
    among them) wherever they appear in a figure, whatever ``theme=`` says; Magma's and
    Inferno's first stop is exactly ``#000004`` and came out pink. Writing every stop as
    ``rgb(...)`` keeps the scale as it is.

    Parameters
    ----------
    name : str
        A plotly colour scale's name (e.g. one of :data:`COLORSCALES`, or ``"RdBu_r"``).

    Returns
    -------
    list of list
        ``[[position, "rgb(r, g, b)"], ...]``, positions from 0 to 1, a new list on every call.
    """
    return [list(stop) for stop in _stops(name)]


def colour_lut(colorscale: str) -> np.ndarray:
    """``(256, 3)`` uint8: the named scale sampled at 256 evenly spaced positions, the colours
    :func:`colorize` maps to (entry ``round((z − zmin) / (zmax − zmin) · 255)``).

    Parameters
    ----------
    colorscale : str
        A plotly colour scale's name.

    Returns
    -------
    numpy.ndarray
        ``(256, 3)`` uint8 RGB.
    """
    return np.array(
        [[int(v) for v in c[c.index("(") + 1 : -1].split(",")[:3]] for c in sample_colorscale(colorscale, 256)],
        dtype=np.uint8,
    )  # (256, 3)


def colorize(z: np.ndarray, colorscale: str, zmin: float, zmax: float) -> np.ndarray:
    """Map ``z`` through ``colorscale`` to uint8 RGB (:func:`colour_lut`); NaN becomes white.

    Parameters
    ----------
    z : numpy.ndarray
        Values of any shape, e.g. a ``(gh, gw)`` map; NaN allowed.
    colorscale : str
        A plotly colour scale's name.
    zmin : float
        The value of the scale's first colour (lower values are clipped to it).
    zmax : float
        The value of the scale's last colour (higher values are clipped to it).

    Returns
    -------
    numpy.ndarray
        ``(*z.shape, 3)`` uint8 RGB.
    """
    lut = colour_lut(colorscale)  # (256, 3)
    scaled = (np.nan_to_num(z, nan=zmin) - zmin) / max(zmax - zmin, 1e-12)
    index = np.clip(np.round(scaled * 255), 0, 255).astype(np.int64)
    rgb = lut[index]
    rgb[np.isnan(z)] = 255
    return rgb


def image_axes(width: int, height: int, *, titles: bool = True) -> dict:
    """Layout for pixel axes with y pointing down, square pixels, no padding.

    Parameters
    ----------
    width : int
        The image width ``W`` in input pixels: the x range ``[0, W]``.
    height : int
        The image height ``H`` in input pixels: the y range ``[H, 0]``.
    titles : bool, default True
        Whether the axes are titled ("x (input px)", "y (input px)").

    Returns
    -------
    dict
        ``xaxis`` and ``yaxis`` layout properties.
    """
    return dict(
        xaxis=dict(
            range=[0, width],
            constrain="domain",
            showgrid=False,
            zeroline=False,
            title=dict(text="x (input px)" if titles else None),
        ),
        yaxis=dict(
            range=[height, 0],
            scaleanchor="x",
            constrain="domain",
            showgrid=False,
            zeroline=False,
            title=dict(text="y (input px)" if titles else None),
        ),
    )


# plotly_white's look, written out: a named template is deep-copied and validated on every
# figure (19 ms each, a third of a ViT-L rerun), these few properties cost well under 1 ms.
_AXIS_STYLE = dict(
    gridcolor="#EBF0F8", linecolor="#EBF0F8", zerolinecolor="#EBF0F8", zerolinewidth=2, ticks="", automargin=True
)
_PAGE_STYLE = dict(
    template=None,
    paper_bgcolor="white",
    plot_bgcolor="white",
    hoverlabel=dict(align="left"),
    colorway=[
        "#636efa",
        "#EF553B",
        "#00cc96",
        "#ab63fa",
        "#FFA15A",
        "#19d3f3",
        "#FF6692",
        "#B6E880",
        "#FF97FF",
        "#FECB52",
    ],
)


def styled_layout(**layout) -> dict:
    """``layout`` with the app's plain white style: every ``xaxis*`` / ``yaxis*`` given gets
    plotly_white's axis colours unless it sets its own (plain x and y axes are added).

    Parameters
    ----------
    **layout : Any
        Plotly layout properties; they override the page style, ``font`` is merged into it, and
        an axis title given as a dict gets a 15 px ``standoff`` unless it sets one.

    Returns
    -------
    dict
        The layout properties, with ``template=None`` and a white page.
    """
    out = {**_PAGE_STYLE, **layout}
    out["font"] = {"color": "#2a3f5f", **_FONT, **layout.get("font", {})}
    for name in {"xaxis", "yaxis", *(k for k in layout if k.startswith(("xaxis", "yaxis")))}:
        axis = dict(layout.get(name) or {})
        title = axis.get("title")
        if isinstance(title, dict):
            axis["title"] = {"standoff": 15, **title}
        out[name] = {**_AXIS_STYLE, **axis}
    return out


def _base_layout(*, title: str | None, height: int, **extra) -> dict:
    return styled_layout(
        # at the top of the figure: a top margin widened for axis labels never puts them under it.
        # (plotly sets a multi-line title's first baseline, not its top, at the anchor: one line lower)
        title=dict(
            text=title,
            x=0.0,
            xanchor="left",
            font=dict(size=14),
            yref="container",
            y=1.0,
            yanchor="top",
            pad=dict(t=8 + (14 if "<br>" in title else 0)),
        )
        if title
        else None,
        height=height,
        **{"margin": dict(l=10, r=10, t=40 if title else 10, b=10), "hovermode": "closest", **extra},
    )


def styled_figure(traces: list, *, title: str | None, height: int, **layout) -> go.Figure:
    """One-shot construction: plotly validates the whole figure once (much faster than
    incremental ``add_*``/``update_*`` calls, which matters for a 150 ms rerun budget).

    Parameters
    ----------
    traces : list
        The traces, as dicts (with ``type``) or plotly trace objects.
    title : str or None
        Figure title, at the top left; ``None``, none (a smaller top margin).
    height : int
        Figure height (px).
    **layout : Any
        Further layout properties (axes, legend, shapes, margin...), styled by
        :func:`styled_layout`.

    Returns
    -------
    plotly.graph_objects.Figure
        The figure.
    """
    return go.Figure(data=traces, layout=_base_layout(title=title, height=height, **layout))


def restyle_figure(fig: go.Figure, *, title: str | None, height: int, **extra) -> go.Figure:
    """``fig`` with the layout of :func:`styled_figure` (title, height, margins, style) applied.

    Parameters
    ----------
    fig : plotly.graph_objects.Figure
        The figure, updated in place.
    title : str or None
        Figure title; ``None``, none.
    height : int
        Figure height (px).
    **extra : Any
        Further layout properties, as in :func:`styled_figure`.

    Returns
    -------
    plotly.graph_objects.Figure
        ``fig`` itself.
    """
    fig.update_layout(**_base_layout(title=title, height=height, **extra))
    return fig


def highlight_rect(x0: float, y0: float, x1: float, y1: float) -> dict:
    """The outline that marks the selected patch or tile.

    Parameters
    ----------
    x0 : float
        One x edge, in the x axis's units (e.g. input pixels).
    y0 : float
        One y edge, in the y axis's units.
    x1 : float
        The other x edge.
    y1 : float
        The other y edge.

    Returns
    -------
    dict
        A plotly ``rect`` shape in :data:`HIGHLIGHT`, drawn above the traces.
    """
    return dict(type="rect", x0=x0, y0=y0, x1=x1, y1=y1, line=dict(color=HIGHLIGHT, width=2.5), layer="above")


def image_colorbar(title: str, *, domain: tuple[float, float] = (0.0, 1.0), plot_height: float | None = None) -> dict:
    """A colour bar beside images on the y ``domain`` of the plot area: as long as that domain
    and centred on it (:func:`~analysis.plots.layout.colorbar_geometry`). With the plot area's
    ``plot_height`` (px), a title longer than the bar is wrapped to the bar's length.

    Parameters
    ----------
    title : str
        The colour bar's title, on its right side.
    domain : (float, float), default (0.0, 1.0)
        The images' y domain ``(bottom, top)``, as fractions of the plot height.
    plot_height : float or None, default None
        The plot area's height (px); ``None`` (or 0), the title is not wrapped.

    Returns
    -------
    dict
        Plotly colour-bar properties.
    """
    place, length_px = colorbar_geometry(domain, plot_height or 0.0)
    if plot_height and len(title) > chars_fitting(length_px, _FONT["size"]):
        title = wrap_label(title, chars_fitting(length_px, _FONT["size"]))
    return dict(title=dict(text=title, side="right"), thickness=14, outlinewidth=0, ticks="", ypad=0, **place)


def as_background(image) -> str:
    """A figure's background: a data URI as it is, or an ``(H, W, 3)`` uint8 array encoded by
    :func:`image_data_uri`.

    Parameters
    ----------
    image : str or array_like
        A data URI, or an ``(H, W, 3)`` uint8 image (e.g. ``np.asarray(vit.model_input_image(image))``).

    Returns
    -------
    str
        A data URI.
    """
    if isinstance(image, str):
        return image
    return image_data_uri(np.asarray(image, dtype=np.uint8))
