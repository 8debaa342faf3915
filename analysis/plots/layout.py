"""Layout rules that keep a figure's labels apart and its colour bars beside their images.

The figures are drawn by the browser at the width of their page column, which the server
does not know. The image figures are therefore planned for a chart :data:`CHART_WIDTH_PX`
wide (the app's main column on a 1280-px-wide window); on a chart at least that wide:

* an image's height limits its size (:func:`image_rows_height`): it fills its axes'
  height, so a colour bar as long as those axes' domain (:func:`colorbar_geometry`) is as
  tall as the image;
* a panel title wrapped to its panel's width (:func:`wrap_label`, :func:`chars_fitting`)
  stays within its panel, and the room above a row of panels is as tall as its titles;
* a colour-bar title wrapped to the bar's length fits beside it.

Text widths are estimated as :data:`CHAR_WIDTH` × font size per character (a generous
average for the app's sans-serif font), so an estimate errs towards more lines.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

__all__ = [
    "CHART_WIDTH_PX",
    "CHAR_WIDTH",
    "LABEL_WIDTH",
    "LINE_HEIGHT",
    "chars_fitting",
    "colorbar_geometry",
    "column_width",
    "image_figure_height",
    "image_figure_margin",
    "image_rows_height",
    "line_count",
    "plain_label",
    "wrap_label",
]

#: the chart width (CSS px) the image figures are planned for
CHART_WIDTH_PX = 820
#: estimated width of one character, as a fraction of the font size
CHAR_WIDTH = 0.55
#: the height of one line of text, as a multiple of the font size
LINE_HEIGHT = 1.3
#: the default line length (characters) of :func:`wrap_label`
LABEL_WIDTH = 22
#: estimated px beside an image with pixel axes: y tick labels and title on the left, the
#: colour bar (bar, ticks, a two-line title) on the right; below: x tick labels and title
IMAGE_LEFT_PX, IMAGE_RIGHT_PX, IMAGE_BOTTOM_PX = 60, 110, 55


def wrap_label(text: str, width: int = LABEL_WIDTH) -> str:
    """Break ``text`` at spaces into lines of at most ``width`` characters (longer words stay
    whole), joined with ``<br>`` for plotly; HTML-escaped.

    Parameters
    ----------
    text : str
        The label; runs of whitespace become one space (or a line break).
    width : int, default LABEL_WIDTH
        The longest line, in characters (:data:`LABEL_WIDTH`, 22).

    Returns
    -------
    str
        The lines joined with ``<br>``, each HTML-escaped (``&``, ``<``, ``>``).
    """
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "<br>".join(html.escape(line, quote=False) for line in lines) or html.escape(text, quote=False)


def plain_label(label: str) -> str:
    """The text of a label :func:`wrap_label` wrapped: its lines joined by spaces, unescaped.

    Parameters
    ----------
    label : str
        A plotly label, ``<br>``-separated lines with HTML escapes.

    Returns
    -------
    str
        The plain text.
    """
    return html.unescape(label.replace("<br>", " "))


def line_count(label: str) -> int:
    """Lines of a plotly label (``<br>``-separated).

    Parameters
    ----------
    label : str
        A plotly label.

    Returns
    -------
    int
        The number of ``<br>``-separated lines; 0 for an empty label.
    """
    return label.count("<br>") + 1 if label else 0


def chars_fitting(width_px: float, font_size: float) -> int:
    """Characters of text at ``font_size`` that fit in ``width_px``: ``width_px / (CHAR_WIDTH ·
    font_size)``, at least 8 (a shorter line would break most words).

    Parameters
    ----------
    width_px : float
        The room, in px.
    font_size : float
        The font size, in px.

    Returns
    -------
    int
        The number of characters, rounded down, at least 8.
    """
    return max(8, int(width_px / (CHAR_WIDTH * font_size)))


def image_rows_height(aspects: Sequence[float], panel_width_px: float, *, cap_px: float) -> float:
    """Height (px) of a row of images, each ``panel_width_px`` wide at most, that their width
    cannot limit: at most ``cap_px``, and no taller than the flattest image (``aspects`` are
    height / width) drawn at the panel width: ``min(cap_px, panel_width_px · min(aspects))``
    (at least 40 px). Drawn at that height every image is limited by its height, so it fills
    its axes' height exactly.

    Parameters
    ----------
    aspects : sequence of float
        Each image's height / width; at least one.
    panel_width_px : float
        The widest a panel can be, in px.
    cap_px : float
        The tallest the row may be, in px.

    Returns
    -------
    float
        ``max(40, min(cap_px, panel_width_px · min(aspects)))``, in px.

    Raises
    ------
    ValueError
        If ``aspects`` is empty.
    """
    return max(40.0, min(cap_px, panel_width_px * min(aspects)))


def image_figure_height(
    height: int, image_size: tuple[int, int], chart_width: float, *, titled: bool
) -> tuple[int, float]:
    """``(figure height, plot-area height)`` in px of one image ``(H, W)`` with pixel axes and
    a colour bar: at most ``height``, and no taller than a chart ``chart_width`` px wide can
    draw it (:func:`image_rows_height` of the plot area's estimated width), so that its height
    limits it. Use it with :func:`image_figure_margin`.

    Parameters
    ----------
    height : int
        The tallest the figure may be, in px.
    image_size : (int, int)
        The image's ``(H, W)``.
    chart_width : float
        The chart's width, in px (e.g. :data:`CHART_WIDTH_PX` or :func:`column_width`); the plot
        area is that less the room for tick labels and the colour bar, at least 120 px.
    titled : bool
        Whether the figure has a title (a taller top margin).

    Returns
    -------
    (int, float)
        The figure height (rounded) and the plot area's height, in px.
    """
    margin = image_figure_margin(titled)
    plot_width = max(chart_width - IMAGE_LEFT_PX - IMAGE_RIGHT_PX, 120.0)
    plot_height = image_rows_height(
        [image_size[0] / image_size[1]], plot_width, cap_px=height - margin["t"] - margin["b"]
    )
    return int(round(plot_height + margin["t"] + margin["b"])), plot_height


def image_figure_margin(titled: bool) -> dict:
    """The margins :func:`image_figure_height` plans for (plotly may widen them to fit labels,
    which only makes the image smaller).

    Parameters
    ----------
    titled : bool
        Whether the figure has a title (a top margin of 40 px, else 10).

    Returns
    -------
    dict
        Plotly's ``margin``: ``l``, ``r``, ``t``, ``b`` in px.
    """
    return dict(l=10, r=10, t=40 if titled else 10, b=IMAGE_BOTTOM_PX)


def column_width(fraction: float) -> float:
    """The planned width (px) of a page column that takes ``fraction`` of the main column
    (``st.columns([3, 2])``: 3/5), less the gap between columns.

    Parameters
    ----------
    fraction : float
        The column's share of the main column, in (0, 1].

    Returns
    -------
    float
        ``CHART_WIDTH_PX · fraction − 16``, in px.
    """
    return CHART_WIDTH_PX * fraction - 16


def colorbar_geometry(domain: tuple[float, float], plot_height_px: float) -> tuple[dict, float]:
    """Where a colour bar beside images on the y ``domain`` (fractions of the plot height)
    goes: ``(len, y, yanchor, lenmode)`` as plotly colour-bar properties, centred on the
    domain and as long as it, and the bar's estimated length in px (``plot_height_px`` ×
    the domain's span) for wrapping its title.

    Parameters
    ----------
    domain : (float, float)
        The images' y domain ``(bottom, top)``, as fractions of the plot height.
    plot_height_px : float
        The plot area's height, in px (0 when unknown: the length is then 0).

    Returns
    -------
    (dict, float)
        The colour bar's ``len``, ``lenmode``, ``y`` and ``yanchor``, and its length in px.
    """
    lo, hi = float(domain[0]), float(domain[1])
    return dict(len=hi - lo, lenmode="fraction", y=(lo + hi) / 2, yanchor="middle"), (hi - lo) * plot_height_px
