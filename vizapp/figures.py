"""Plotly figure builders: numpy in, ``go.Figure`` out (no streamlit, no torch).

Geometry conventions shared by every image figure:

* the model-input image covers ``[0, W] x [0, H]`` in input pixels (y pointing down);
* a patch map ``(gh, gw)`` is a heatmap whose cell ``(r, c)`` covers exactly
  ``[c·pw, (c+1)·pw] x [r·ph, (r+1)·ph]``, i.e. heatmap cells are patches;
* "mosaics" lay many small maps out as tiles of one big heatmap (one cell per patch,
  thin separators between tiles), which stays crisp and light at any grid size.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from PIL import Image
from plotly.colors import get_colorscale, hex_to_rgb, sample_colorscale, unlabel_rgb
from plotly.subplots import make_subplots

from vizapp.records import RecordStore

__all__ = [
    "COLORSCALES",
    "colour_stops",
    "image_data_uri",
    "patch_centres",
    "attention_overlay",
    "mosaic",
    "map_panels",
    "predictions_bar",
    "similarity_tile",
    "similarity_vs_distance",
    "rgb_patch_grid",
    "explained_variance",
    "attention_distance_scatter",
    "perturbation_curves",
]

COLORSCALES = ("Viridis", "Inferno", "Cividis", "Magma", "Plasma")
SEPARATOR = "rgba(255,255,255,0.9)"
HIGHLIGHT = "#ff4b4b"
MAX_HEATMAP_CELLS = 160_000  # above this a mosaic is sent as a colour-mapped PNG instead
MAX_IMAGE_SIDE = 1024  # a PNG mosaic's longer side, in pixels (tiles are box-averaged to fit)
_FONT = dict(size=12)
_CLICK_MARKER = dict(color="rgba(0,0,0,0)", size=8)
_SERIES_COLOURS = ("#440154", "#21918c", "#e16462", "#fca636", "#3b528b", "#5ec962")


# --------------------------------------------------------------------------- helpers


def image_data_uri(image: np.ndarray, *, lossless: bool = False) -> str:
    """``(H, W, 3)`` uint8 -> data URI (PNG for small images or ``lossless``, else JPEG q92)."""
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
    """Row-major ``(x, y)`` pixel centres of every patch."""
    gh, gw = grid_size
    ph, pw = patch_size
    ys, xs = np.meshgrid((np.arange(gh) + 0.5) * ph, (np.arange(gw) + 0.5) * pw, indexing="ij")
    return xs.ravel(), ys.ravel()


@functools.lru_cache(maxsize=32)
def _stops(name: str) -> tuple[tuple[float, str], ...]:
    return tuple((float(position), "rgb({}, {}, {})".format(*_rgb_triplet(colour)))
                 for position, colour in get_colorscale(name))


def _rgb_triplet(colour: str) -> tuple[int, int, int]:
    if colour.startswith("#"):
        return tuple(hex_to_rgb(colour))
    return tuple(int(round(float(v))) for v in unlabel_rgb(colour)[:3])


def colour_stops(name: str) -> list[list]:
    """The named plotly scale as explicit ``[position, "rgb(r, g, b)"]`` stops.

    Streamlit's front end swaps a few placeholder hex colours of its chart theme (``#000004``
    among them) wherever they appear in a figure, whatever ``theme=`` says; Magma's and
    Inferno's first stop is exactly ``#000004`` and came out pink. Writing every stop as
    ``rgb(...)`` keeps the scale as it is.
    """
    return [list(stop) for stop in _stops(name)]


def _reduction(shape: tuple[int, int], gh: int, gw: int) -> int:
    """The smallest integer factor dividing both tile sides that brings ``shape`` within
    :data:`MAX_IMAGE_SIDE` (1 when it already fits; the largest common divisor otherwise)."""
    need = math.ceil(max(shape) / MAX_IMAGE_SIDE)
    common = math.gcd(gh, gw)
    for factor in range(max(need, 1), common + 1):
        if common % factor == 0:
            return factor
    return common if need > 1 else 1


def _box_reduce(big: np.ndarray, factor: int) -> np.ndarray:
    """Mean over ``factor x factor`` blocks (NaN-aware), ``(H, W) -> (H/f, W/f)``."""
    if factor == 1:
        return big
    h, w = big.shape
    blocks = big.reshape(h // factor, factor, w // factor, factor)
    with np.errstate(invalid="ignore"):
        return np.nanmean(blocks, axis=(1, 3)) if np.isnan(big).any() else blocks.mean(axis=(1, 3))


_PICTURES = RecordStore(max_entries=32, max_bytes=64 * 2**20, size=len)  # PNG data URIs of colour-mapped arrays


def _colorized_uri(z: np.ndarray, colorscale: str, zmin: float, zmax: float) -> str:
    """PNG data URI of :func:`_colorize` (lossless), kept per digest of the values: a rerun
    that only moves a highlight does not re-encode the same picture."""
    digest = hashlib.sha1(np.ascontiguousarray(z, dtype=np.float32).tobytes()).hexdigest()
    key = (digest, z.shape, colorscale, float(zmin), float(zmax))
    return _PICTURES.get(key, lambda: image_data_uri(_colorize(z, colorscale, zmin, zmax), lossless=True))


def _colorize(z: np.ndarray, colorscale: str, zmin: float, zmax: float) -> np.ndarray:
    """Map ``z`` through ``colorscale`` to uint8 RGB; NaN becomes white."""
    lut = np.array(
        [[int(v) for v in c[c.index("(") + 1 : -1].split(",")[:3]] for c in sample_colorscale(colorscale, 256)],
        dtype=np.uint8,
    )  # (256, 3)
    scaled = (np.nan_to_num(z, nan=zmin) - zmin) / max(zmax - zmin, 1e-12)
    index = np.clip(np.round(scaled * 255), 0, 255).astype(np.int64)
    rgb = lut[index]
    rgb[np.isnan(z)] = 255
    return rgb


def _image_axes(width: int, height: int, *, titles: bool = True) -> dict:
    """Layout for pixel axes with y pointing down, square pixels, no padding."""
    return dict(
        xaxis=dict(range=[0, width], constrain="domain", showgrid=False, zeroline=False,
                   title=dict(text="x (input px)" if titles else None)),
        yaxis=dict(range=[height, 0], scaleanchor="x", constrain="domain", showgrid=False, zeroline=False,
                   title=dict(text="y (input px)" if titles else None)),
    )


# plotly_white's look, written out: a named template is deep-copied and validated on every
# figure (19 ms each, a third of a ViT-L rerun), these few properties cost well under 1 ms.
_AXIS_STYLE = dict(gridcolor="#EBF0F8", linecolor="#EBF0F8", zerolinecolor="#EBF0F8", zerolinewidth=2, ticks="",
                   automargin=True)
_PAGE_STYLE = dict(
    template=None, paper_bgcolor="white", plot_bgcolor="white", hoverlabel=dict(align="left"),
    colorway=["#636efa", "#EF553B", "#00cc96", "#ab63fa", "#FFA15A", "#19d3f3", "#FF6692", "#B6E880", "#FF97FF", "#FECB52"],
)


def styled_layout(**layout) -> dict:
    """``layout`` with the app's plain white style: every ``xaxis*`` / ``yaxis*`` given gets
    plotly_white's axis colours unless it sets its own (plain x and y axes are added)."""
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
        title=dict(text=title, x=0.0, xanchor="left", font=dict(size=14)) if title else None,
        height=height,
        margin=dict(l=10, r=10, t=40 if title else 10, b=10),
        hovermode="closest",
        **extra,
    )


def _figure(traces: list, *, title: str | None, height: int, **layout) -> go.Figure:
    """One-shot construction: plotly validates the whole figure once (much faster than
    incremental ``add_*``/``update_*`` calls, which matters for a 150 ms rerun budget)."""
    return go.Figure(data=traces, layout=_base_layout(title=title, height=height, **layout))


def _layout(fig: go.Figure, *, title: str | None, height: int, **extra) -> go.Figure:
    fig.update_layout(**_base_layout(title=title, height=height, **extra))
    return fig


def _rect(x0: float, y0: float, x1: float, y1: float) -> dict:
    """The outline that marks the selected patch or tile."""
    return dict(type="rect", x0=x0, y0=y0, x1=x1, y1=y1, line=dict(color=HIGHLIGHT, width=2.5), layer="above")


def _colorbar(title: str) -> dict:
    return dict(title=dict(text=title, side="right"), thickness=14, len=0.9, outlinewidth=0, ticks="")


def _smooth_layer(upsampled: np.ndarray, colorscale: str, lo: float, hi: float, opacity: float, **axes) -> dict:
    """A map already upsampled to ``(H, W)`` input pixels, sent as one colour-mapped PNG
    (a heatmap of H·W cells would be megabytes of JSON)."""
    rgb = _colorize(np.asarray(upsampled, dtype=np.float64), colorscale, lo, hi)  # (H, W, 3)
    return dict(type="image", source=image_data_uri(rgb, lossless=True), x0=0.5, y0=0.5, dx=1, dy=1,
                opacity=opacity, hoverinfo="skip", name="attention (bilinear)", **axes)


def _colorbar_carrier(lo: float, hi: float, *, colorscale: str | None = None, colorbar: dict | None = None,
                      coloraxis: str | None = None, **axes) -> dict:
    """An invisible trace whose only job is to show the colour bar of a PNG layer."""
    marker = dict(color=[lo, hi], size=0.001, opacity=0)
    if coloraxis:
        marker["coloraxis"] = coloraxis
    else:
        marker.update(colorscale=colour_stops(colorscale), cmin=lo, cmax=hi, showscale=True, colorbar=colorbar)
    return dict(type="scatter", x=[None, None], y=[None, None], mode="markers", marker=marker,
                hoverinfo="skip", showlegend=False, name="colour bar", **axes)


# --------------------------------------------------------------------------- attention on the image


def attention_overlay(
    background: str,
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
) -> go.Figure:
    """The model-input image with a patch map on top.

    background: data URI of the ``image_size = (H, W)`` model-input image.
    attention: ``(gh, gw)`` map; cell ``(r, c)`` is drawn exactly over patch ``(r, c)``,
    unless ``upsampled`` (the same map at ``(H, W)`` pixels, e.g. bilinear) is given: then
    that is drawn instead, while hover and clicks still read the patch values.
    The last trace is one transparent marker per patch centre (row-major, so point
    index = patch index, also in ``customdata[0]``): clicking selects the patch under
    the cursor (``hoverdistance=-1`` picks the nearest centre, i.e. the containing patch).
    """
    height_px, width_px = image_size
    gh, gw = attention.shape
    ph, pw = patch_size
    xs, ys = patch_centres((gh, gw), (ph, pw))
    index = np.arange(gh * gw)
    if upsampled is None:
        layers = [dict(
            type="heatmap", z=attention, x0=pw / 2, dx=pw, y0=ph / 2, dy=ph, opacity=opacity,
            colorscale=colour_stops(colorscale), zmin=zmin, zmax=zmax, zsmooth=False, hoverinfo="skip",
            colorbar=_colorbar(colorbar_title), name="attention",
        )]
    else:
        lo = float(attention.min()) if zmin is None else float(zmin)
        hi = float(attention.max()) if zmax is None else float(zmax)
        layers = [
            _smooth_layer(upsampled, colorscale, lo, hi, opacity),
            _colorbar_carrier(lo, hi, colorscale=colorscale, colorbar=_colorbar(colorbar_title)),
        ]
    traces = [
        dict(type="image", source=background, x0=0.5, y0=0.5, dx=1, dy=1, hoverinfo="skip", name="input"),
        *layers,
        dict(
            type="scatter", x=xs, y=ys, mode="markers", marker=_CLICK_MARKER, showlegend=False, name="patches",
            customdata=np.stack([index, np.zeros_like(index), index // gw, index % gw, attention.ravel()], axis=1),
            hovertemplate="patch %{customdata[0]:.0f} (row %{customdata[2]:.0f}, col %{customdata[3]:.0f})"
            "<br>value %{customdata[4]:.4g}<extra>click: make it the query</extra>",
        ),
    ]
    shapes = []
    if query_patch is not None and 0 <= query_patch < gh * gw:
        r, c = divmod(int(query_patch), gw)
        shapes.append(_rect(c * pw, r * ph, (c + 1) * pw, (r + 1) * ph))
    return _figure(
        traces, title=title, height=height, hoverdistance=-1, clickmode="event+select", dragmode="pan",
        shapes=shapes, **_image_axes(width_px, height_px),
    )


def map_panels(
    background: str | Sequence[str],
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
) -> go.Figure:
    """Several patch maps over their images, side by side on ONE shared colour scale.

    ``background``, ``image_size`` and ``patch_size`` may be one value for all panels or
    one per panel (two models of different geometry on the same image). Each panel has
    transparent click targets on its patch centres with ``customdata = [patch, panel, value]``;
    ``query_patches[i]`` (a patch index of panel i's grid) is outlined. ``slots[i]`` places
    panel i in grid cell ``slots[i]`` (row-major; default i), so a second model can start on a
    new row. ``color_groups[i]`` picks panel i's colour scale, with ``group_ranges[g] = (lo, hi,
    colour bar title)`` (default: one scale, ``zmin``..``zmax``, over all panels).
    ``upsampled[i]``, when given, is panel i's map at its image's pixels, drawn instead of
    the patch cells (see :func:`attention_overlay`).
    """
    n = len(maps)
    backgrounds = [background] * n if isinstance(background, str) else list(background)
    sizes = [image_size] * n if isinstance(image_size[0], int) else list(image_size)
    patches = [patch_size] * n if isinstance(patch_size[0], int) else list(patch_size)
    slots = list(range(n)) if slots is None else [int(s) for s in slots]
    ncols = max(1, min(ncols, max(slots) + 1))
    nrows = max(slots) // ncols + 1
    lo = float(min(m.min() for m in maps)) if zmin is None else zmin
    hi = float(max(m.max() for m in maps)) if zmax is None else zmax
    groups = [0] * n if color_groups is None else [int(g) for g in color_groups]
    ranges = list(group_ranges) if group_ranges is not None else [(lo, hi, colorbar_title)]
    slot_titles = [""] * (nrows * ncols)
    for slot, title in zip(slots, titles, strict=True):
        slot_titles[slot] = title
    x_domains, y_domains, title_annotations = _grid_domains(nrows, ncols, slot_titles, 0.02, 0.08 / max(nrows, 1))
    traces = []
    click_targets = []
    shapes = []
    axes = {}
    for i, (bg, size, patch, attention) in enumerate(zip(backgrounds, sizes, patches, maps, strict=True)):
        row, col = divmod(slots[i], ncols)
        ph, pw = patch
        suffix = "" if slots[i] == 0 else str(slots[i] + 1)
        traces.append(dict(type="image", source=bg, x0=0.5, y0=0.5, dx=1, dy=1, hoverinfo="skip",
                           xaxis=f"x{suffix}", yaxis=f"y{suffix}"))
        coloraxis = "coloraxis" if groups[i] == 0 else f"coloraxis{groups[i] + 1}"
        smooth = upsampled[i] if upsampled is not None else None
        if smooth is None:
            traces.append(dict(
                type="heatmap", z=attention, x0=pw / 2, dx=pw, y0=ph / 2, dy=ph, opacity=opacity,
                coloraxis=coloraxis, zsmooth=False,
                name=titles[i], xaxis=f"x{suffix}", yaxis=f"y{suffix}", hoverinfo="skip",
            ))
        else:
            g_lo, g_hi, _ = ranges[groups[i]]
            traces.append(_smooth_layer(smooth, colorscale, g_lo, g_hi, opacity, xaxis=f"x{suffix}", yaxis=f"y{suffix}"))
            traces.append(_colorbar_carrier(g_lo, g_hi, coloraxis=coloraxis, xaxis=f"x{suffix}", yaxis=f"y{suffix}"))
        gh, gw = attention.shape
        xs, ys = patch_centres((gh, gw), (ph, pw))
        index = np.arange(gh * gw)
        click_targets.append(dict(
            type="scatter", x=xs, y=ys, mode="markers", marker=_CLICK_MARKER, showlegend=False,
            xaxis=f"x{suffix}", yaxis=f"y{suffix}", name=titles[i],
            customdata=np.stack([index, np.full_like(index, i), attention.ravel()], axis=1),
            hovertemplate=titles[i] + "<br>patch %{customdata[0]:.0f}<br>value %{customdata[2]:.4g}"
            "<extra>click: make it the query</extra>",
        ))
        query = query_patches[i] if query_patches is not None else None
        if query is not None and 0 <= query < gh * gw:
            r, c = divmod(int(query), gw)
            shapes.append({**_rect(c * pw, r * ph, (c + 1) * pw, (r + 1) * ph), "xref": f"x{suffix}", "yref": f"y{suffix}"})
        first_col_last_row = row == nrows - 1 and col == 0
        axes[f"xaxis{suffix}"] = dict(
            range=[0, size[1]], showgrid=False, zeroline=False, showticklabels=row == nrows - 1,
            constrain="domain", title=dict(text="x (input px)" if first_col_last_row else None),
            domain=x_domains[col], anchor=f"y{suffix}",
        )
        axes[f"yaxis{suffix}"] = dict(
            range=[size[0], 0], showgrid=False, zeroline=False, showticklabels=col == 0, scaleanchor=f"x{suffix}",
            constrain="domain", title=dict(text="y (input px)" if first_col_last_row else None),
            domain=y_domains[row], anchor=f"x{suffix}",
        )
    color_axes = {}
    for g, (g_lo, g_hi, g_title) in enumerate(ranges):
        bar = _colorbar(g_title)
        if len(ranges) > 1:  # stacked colour bars, one per model, top to bottom
            bar.update(len=0.9 / len(ranges), y=1 - (g + 0.5) / len(ranges), yanchor="middle")
        color_axes["coloraxis" if g == 0 else f"coloraxis{g + 1}"] = dict(
            colorscale=colour_stops(colorscale), cmin=g_lo, cmax=g_hi, colorbar=bar,
        )
    # one-shot construction (make_subplots + add_traces validated everything twice: 60 ms for 4 panels)
    return _figure(
        traces + click_targets, title=None, height=panel_height * nrows + 60, shapes=shapes, hoverdistance=-1,
        clickmode="event+select", dragmode="pan", annotations=title_annotations, **color_axes, **axes,
    )


def _grid_domains(nrows: int, ncols: int, titles: Sequence[str], h_space: float, v_space: float
                  ) -> tuple[list[list[float]], list[list[float]], list[dict]]:
    """Axis domains of an ``nrows x ncols`` grid of plots (row 0 on top), and one title
    annotation above each titled cell (as ``make_subplots`` lays them out)."""
    width = (1 - h_space * (ncols - 1)) / ncols
    height = (1 - v_space * (nrows - 1)) / nrows
    x_domains = [[c * (width + h_space), c * (width + h_space) + width] for c in range(ncols)]
    y_domains = [[1 - r * (height + v_space) - height, 1 - r * (height + v_space)] for r in range(nrows)]
    annotations = [
        dict(text=title, x=sum(x_domains[i % ncols]) / 2, y=y_domains[i // ncols][1], xref="paper", yref="paper",
             xanchor="center", yanchor="bottom", showarrow=False, font=dict(size=16))
        for i, title in enumerate(titles) if title
    ]
    return x_domains, y_domains, annotations


# --------------------------------------------------------------------------- mosaics


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
) -> go.Figure:
    """Tiles ``(n, gh, gw)`` laid out row-major in ``ncols`` columns as one big map.

    One heatmap cell per patch; thin white lines separate tiles. With
    ``normalize_each`` each tile is divided by its own maximum (colour bar 0..1).
    Above :data:`MAX_HEATMAP_CELLS` cells the mosaic is sent as a colour-mapped PNG.
    The last trace has one transparent marker per tile centre (point index = tile
    index = ``customdata[0]``), so clicking a tile selects it.
    """
    n, gh, gw = tiles.shape
    ncols = max(1, min(ncols, n))
    nrows = math.ceil(n / ncols)
    values = tiles.astype(np.float32)
    if normalize_each:
        peak = np.nanmax(np.abs(values.reshape(n, -1)), axis=1).reshape(n, 1, 1)
        values = values / np.where(peak > 0, peak, 1.0)
    big = np.full((nrows * gh, ncols * gw), np.nan, np.float32)
    for i in range(n):
        r, c = divmod(i, ncols)
        big[r * gh : (r + 1) * gh, c * gw : (c + 1) * gw] = values[i]
    lo = float(np.nanmin(values)) if zmin is None else zmin
    hi = float(np.nanmax(values)) if zmax is None else zmax
    if normalize_each and zmin is None:
        lo, hi = min(0.0, lo), 1.0
    if big.size <= MAX_HEATMAP_CELLS:
        traces = [dict(
            type="heatmap", z=big, x0=0.5, dx=1, y0=0.5, dy=1, colorscale=colour_stops(colorscale), zmin=lo, zmax=hi,
            zsmooth=False, hoverinfo="skip", colorbar=_colorbar(colorbar_title), name="tiles",
        )]
    else:  # a PNG: bytes grow with pixels, not with JSON per cell (a 64x64 grid of tiles was 69 MB)
        factor = _reduction(big.shape, gh, gw)
        shown = _box_reduce(big, factor)
        if factor > 1:
            note = f"tiles shown at 1/{factor} resolution (box average); the data download is exact"
            title = f"{title} · {note}" if title else note
        traces = [
            dict(type="image", source=_colorized_uri(shown, colorscale, lo, hi),
                 x0=0.5 * factor, y0=0.5 * factor, dx=factor, dy=factor, hoverinfo="skip"),
            dict(  # colour bar only
                type="scatter", x=[None], y=[None], mode="markers", showlegend=False, hoverinfo="skip",
                marker=dict(colorscale=colour_stops(colorscale), cmin=lo, cmax=hi, color=[lo], showscale=True,
                            colorbar=_colorbar(colorbar_title)),
            ),
        ]
    width, height_cells = ncols * gw, nrows * gh
    shapes = []
    if max(ncols, nrows) <= 32:  # beyond that, lines would cover the tiles themselves
        separator = dict(color=SEPARATOR, width=1.5 if max(ncols, nrows) <= 16 else 0.75)
        segments = [f"M{c * gw},0V{height_cells}" for c in range(1, ncols)] + [f"M0,{r * gh}H{width}" for r in range(1, nrows)]
        if segments:  # one path for all separators: one shape for plotly to validate, not one per line
            shapes.append(dict(type="path", path="".join(segments), line=separator))
    if highlight is not None and 0 <= highlight < n:
        r, c = divmod(int(highlight), ncols)
        shapes.append(_rect(c * gw, r * gh, (c + 1) * gw, (r + 1) * gh))
    index = np.arange(n)
    peaks = np.nanmax(tiles.reshape(n, -1), axis=1)
    traces.append(dict(
        type="scatter", x=(index % ncols + 0.5) * gw, y=(index // ncols + 0.5) * gh, mode="markers",
        marker=_CLICK_MARKER, showlegend=False, name="tiles", customdata=np.stack([index, peaks], axis=1),
        text=list(tile_names), hovertemplate="%{text}<br>max %{customdata[1]:.4g}<extra>click to open</extra>",
    ))
    xaxis = dict(
        range=[0, width], showgrid=False, zeroline=False, constrain="domain", title=dict(text=x_title),
        showticklabels=col_labels is not None, side="top",
    )
    if col_labels is not None:
        xaxis.update(tickvals=(np.arange(ncols) + 0.5) * gw, ticktext=list(col_labels))
    yaxis = dict(
        range=[height_cells, 0], scaleanchor="x", constrain="domain", showgrid=False, zeroline=False,
        title=dict(text=y_title), showticklabels=row_labels is not None,
    )
    if row_labels is not None:
        yaxis.update(tickvals=(np.arange(nrows) + 0.5) * gh, ticktext=list(row_labels))
    if height is None:
        height = int(np.clip(720 * nrows / max(ncols, 1), 180, 900)) + 60
    return _figure(
        traces, title=title, height=height, hoverdistance=-1, clickmode="event+select", dragmode="pan",
        shapes=shapes, xaxis=xaxis, yaxis=yaxis,
    )


def position_similarity_mosaic(similarity: np.ndarray, *, colorscale: str = "Viridis", highlight: int | None = None
                               ) -> go.Figure:
    """Figure 7 (centre): ``(gh, gw, gh, gw)`` cosine similarities, one tile per patch (row i,
    col j: patch (i, j) against every patch), on the fixed range -1..1."""
    n_h, n_w = similarity.shape[:2]
    small = n_w <= 32
    return mosaic(
        similarity.reshape(n_h * n_w, n_h, n_w),
        n_w,
        tile_names=[f"patch (row {r}, col {c})" for r in range(n_h) for c in range(n_w)],
        colorscale=colorscale, zmin=-1.0, zmax=1.0, colorbar_title="cosine similarity",
        x_title="input patch column", y_title="input patch row",
        col_labels=[str(c) for c in range(n_w)] if small else None,
        row_labels=[str(r) for r in range(n_h)] if small else None,
        highlight=highlight, height=640,
    )


def filter_components_grid(components: np.ndarray, ratio: np.ndarray, *, ncols: int = 7) -> go.Figure:
    """Figure 7 (left): principal components ``(k, C, ph, pw)`` of the patch-embedding filters as RGB tiles."""
    return rgb_patch_grid(components, ncols, tile_names=[f"PC {i + 1}: {r * 100:.2f}% of variance" for i, r in enumerate(ratio)])


# --------------------------------------------------------------------------- predictions


def predictions_bar(names: Sequence[str], probabilities: np.ndarray, *, height: int = 240) -> go.Figure:
    """Top-k predictions as horizontal bars, most probable on top. Long class names (ImageNet's
    "tench, Tinca tinca") are wrapped onto lines of at most ``LABEL_WIDTH`` characters rather
    than clipped; the hover shows the name whole."""
    probs = np.asarray(probabilities, dtype=np.float64)[::-1] * 100
    full = list(names)[::-1]
    wrapped = [wrap_label(name) for name in full]
    lines = max((label.count("<br>") + 1 for label in wrapped), default=1)
    trace = dict(
        type="bar", x=probs, y=list(range(len(full))), orientation="h", text=[f"{p:.1f}%" for p in probs],
        textposition="auto", marker=dict(color="#3b528b"), customdata=full,
        hovertemplate="%{customdata}: %{x:.2f}%<extra></extra>",
    )
    return _figure(
        [trace], title=None, height=max(height, 40 + len(full) * 18 * lines),
        xaxis=dict(title=dict(text="probability (%)"), range=[0, 100], showgrid=True),
        yaxis=dict(automargin=True, tickmode="array", tickvals=list(range(len(full))), ticktext=wrapped),
    )


LABEL_WIDTH = 22


def wrap_label(text: str, width: int = LABEL_WIDTH) -> str:
    """Break ``text`` at spaces into lines of at most ``width`` characters (longer words stay
    whole), joined with ``<br>`` for plotly; HTML-escaped."""
    import html

    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "<br>".join(html.escape(line) for line in lines) or html.escape(text)


# --------------------------------------------------------------------------- position embeddings


def similarity_tile(
    similarity: np.ndarray, patch: tuple[int, int], *, colorscale: str = "Viridis", height: int = 420
) -> go.Figure:
    """One patch's cosine similarity to every patch, ``(gh, gw)``, with the patch outlined."""
    gh, gw = similarity.shape
    r, c = patch
    trace = dict(
        type="heatmap", z=similarity, x0=0, dx=1, y0=0, dy=1, zmin=-1, zmax=1, colorscale=colour_stops(colorscale),
        zsmooth=False, colorbar=_colorbar("cosine similarity"),
        hovertemplate="row %{y}, col %{x}<br>cos %{z:.3f}<extra></extra>",
    )
    return _figure(
        [trace], title=f"Patch (row {r}, col {c})", height=height,
        shapes=[_rect(c - 0.5, r - 0.5, c + 0.5, r + 0.5)],
        xaxis=dict(title=dict(text="patch column"), range=[-0.5, gw - 0.5], constrain="domain", showgrid=False),
        yaxis=dict(title=dict(text="patch row"), range=[gh - 0.5, -0.5], scaleanchor="x", constrain="domain",
                   showgrid=False),
    )


def similarity_vs_distance(curves: Sequence[tuple[str, np.ndarray, np.ndarray]], *, height: int = 360) -> go.Figure:
    """Mean cosine similarity against patch distance, one line per ``(name, distance, similarity)``."""
    traces = [
        dict(
            type="scatter", x=distance, y=similarity, mode="lines+markers", name=name, marker=dict(size=5),
            line=dict(color=_SERIES_COLOURS[i % len(_SERIES_COLOURS)]),
            hovertemplate="distance %{x:.2f}<br>mean cos %{y:.3f}<extra>" + name + "</extra>",
        )
        for i, (name, distance, similarity) in enumerate(curves)
    ]
    return _figure(
        traces, title=None, height=height, legend=dict(orientation="h", y=1.1, x=0),
        xaxis=dict(title=dict(text="distance between patch centres (patches of the model's grid)"), showgrid=True),
        yaxis=dict(title=dict(text="mean cosine similarity"), range=[-1.05, 1.05], showgrid=True),
    )


def perturbation_curves(
    curves: Sequence[tuple[str, np.ndarray, np.ndarray, np.ndarray, float, float]], *, height: int = 380
) -> go.Figure:
    """Deletion (left) and insertion (right) curves, one line per
    ``(name, fractions, deletion, insertion, deletion AUC, insertion AUC)``; the AUCs are in
    the legend. The random baseline, when named ``"random"``, is drawn dashed grey."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=["Deletion (lower is more faithful)",
                                                        "Insertion (higher is more faithful)"],
                        horizontal_spacing=0.08)
    traces = []
    for i, (name, fractions, deletion, insertion, deletion_auc, insertion_auc) in enumerate(curves):
        baseline = name == "random"
        line = dict(color="#9e9e9e", dash="dash") if baseline else dict(color=_SERIES_COLOURS[i % len(_SERIES_COLOURS)])
        for column, values, auc in ((1, deletion, deletion_auc), (2, insertion, insertion_auc)):
            traces.append(dict(
                type="scatter", x=100 * np.asarray(fractions), y=values, mode="lines+markers", marker=dict(size=4),
                line=line, name=f"{name} (AUC {deletion_auc:.3f} / {insertion_auc:.3f})", legendgroup=name,
                showlegend=column == 1, xaxis="x" if column == 1 else "x2", yaxis="y" if column == 1 else "y2",
                hovertemplate="%{x:.0f}% of patches<br>p = %{y:.3f}<extra>" + name + f" · AUC {auc:.3f}</extra>",
            ))
    fig.add_traces(traces)
    axis = dict(range=[0, 100], showgrid=True, title=dict(text="patches removed, most relevant first (%)"))
    fig = _layout(
        fig, title=None, height=height, legend=dict(orientation="h", y=-0.25, x=0),
        xaxis=axis, xaxis2={**axis, "title": dict(text="patches restored, most relevant first (%)")},
        yaxis=dict(range=[0, 1.02], title=dict(text="probability of the class"), showgrid=True),
        yaxis2=dict(range=[0, 1.02], showgrid=True),
    )
    fig.update_layout(margin=dict(t=40))  # room for the subplot titles
    return fig


def robustness_curves(
    curves: Sequence[tuple[str, Sequence[float], np.ndarray]], *, x_title: str, y_title: str,
    chance: float | None = None, height: int = 380,
) -> go.Figure:
    """Score against perturbation level, one line per ``(name, levels, scores)`` (scores in
    [0, 1]); ``chance`` (e.g. 1 / classes) is drawn as a dotted grey line."""
    traces = [
        dict(
            type="scatter", x=list(levels), y=scores, mode="lines+markers", name=name, marker=dict(size=6),
            line=dict(color=_SERIES_COLOURS[i % len(_SERIES_COLOURS)]),
            hovertemplate="level %{x:.3g}<br>%{y:.3f}<extra>" + name + "</extra>",
        )
        for i, (name, levels, scores) in enumerate(curves)
    ]
    shapes = []
    if chance is not None:
        shapes.append(dict(type="line", xref="paper", x0=0, x1=1, y0=chance, y1=chance,
                           line=dict(color="#9e9e9e", dash="dot", width=1)))
    return _figure(
        traces, title=None, height=height, legend=dict(orientation="h", y=1.12, x=0), shapes=shapes,
        xaxis=dict(title=dict(text=x_title), showgrid=True),
        yaxis=dict(title=dict(text=y_title), range=[0, 1.02], showgrid=True),
    )


# --------------------------------------------------------------------------- patch-embedding filters


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
    """
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
            type="scatter", x=(index % ncols) * (pw + gap) + pw / 2, y=(index // ncols) * (ph + gap) + ph / 2,
            mode="markers", marker=_CLICK_MARKER, text=list(tile_names), hovertemplate="%{text}<extra></extra>",
            showlegend=False,
        ),
    ]
    if height is None:
        height = int(np.clip(700 * canvas.shape[0] / canvas.shape[1], 160, 900)) + 30
    return _figure(
        traces, title=None, height=height, hoverdistance=-1,
        xaxis=dict(range=[0, canvas.shape[1]], showticklabels=False, showgrid=False, zeroline=False,
                   constrain="domain"),
        yaxis=dict(range=[canvas.shape[0], 0], scaleanchor="x", showticklabels=False, showgrid=False,
                   zeroline=False, constrain="domain"),
    )


def explained_variance(ratio: np.ndarray, *, height: int = 320) -> go.Figure:
    """Explained variance ratio per principal component (bars, left axis) and cumulative (line, right)."""
    k = np.arange(1, ratio.size + 1)
    traces = [
        dict(type="bar", x=k, y=ratio * 100, name="per component", marker=dict(color="#31688e"),
             hovertemplate="PC %{x}: %{y:.2f}%<extra></extra>"),
        dict(type="scatter", x=k, y=np.cumsum(ratio) * 100, name="cumulative (right axis)", mode="lines+markers",
             line=dict(color="#35b779", width=2), marker=dict(color="#35b779", size=5), yaxis="y2",
             hovertemplate="PC 1..%{x}: %{y:.1f}%<extra></extra>"),
    ]
    return _figure(
        traces, title=None, height=height, legend=dict(orientation="h", y=1.12, x=0),
        xaxis=dict(title=dict(text="principal component"), dtick=max(1, ratio.size // 14)),
        yaxis=dict(title=dict(text="explained variance per component (%)"), rangemode="tozero", showgrid=True),
        yaxis2=dict(title=dict(text="cumulative (%)"), overlaying="y", side="right", range=[0, 100],
                    tickmode="linear", tick0=0, dtick=25, showgrid=False),
    )


# --------------------------------------------------------------------------- attention distance



DISTANCE_UNIT_SHORT = {"px": "px", "patches": "patches", "image": "× image side"}
DISTANCE_UNIT_TITLE = {"px": "input pixels", "patches": "patch sides", "image": "fraction of the image side"}


def attention_distance_scatter(
    series: Sequence[tuple[str, np.ndarray]],
    *,
    references: Sequence[tuple[str, float]] = (),
    unit: str = "px",
    height: int = 460,
) -> go.Figure:
    """Figure 7 (right): one dot per head at each layer, mean attention distance.

    series: ``(name, (L, heads) distances)`` in ``unit`` (a key of
    :data:`analysis.DISTANCE_UNITS`); series are shifted sideways a little so they do not hide
    each other. references: ``(name, value)`` labelled horizontal lines (the distance under
    uniform attention), in the same unit.
    """
    short = DISTANCE_UNIT_SHORT[unit]
    digits = ".1f" if unit == "px" else (".2f" if unit == "patches" else ".3f")
    traces = []
    count = len(series)
    for i, (name, values) in enumerate(series):
        layers, heads = values.shape
        offset = (i - (count - 1) / 2) * (0.5 / count) if count > 1 else 0.0
        layer_ids = np.repeat(np.arange(layers), heads)
        head_ids = np.tile(np.arange(heads), layers)
        traces.append(dict(
            type="scatter", x=layer_ids + offset, y=values.ravel(), mode="markers", name=name,
            marker=dict(size=7, color=_SERIES_COLOURS[i % len(_SERIES_COLOURS)], opacity=0.8,
                        line=dict(width=0.5, color="white")),
            customdata=np.stack([layer_ids, head_ids], axis=1),
            hovertemplate="layer %{customdata[0]}, head %{customdata[1]}<br>%{y:" + digits + "} " + short
            + "<extra>" + name + "</extra>",
        ))
    shapes, annotations = [], []
    for j, (name, value) in enumerate(references):
        shapes.append(dict(type="line", xref="paper", x0=0, x1=1, y0=value, y1=value,
                           line=dict(dash="dash", color="#777", width=1.2)))
        annotations.append(dict(xref="paper", x=1.0 if j % 2 else 0.0, xanchor="right" if j % 2 else "left",
                                y=value, yanchor="bottom", text=f"{name}: {value:{digits}} {short}", showarrow=False,
                                font=dict(color="#555")))
    return _figure(
        traces, title=None, height=height, legend=dict(orientation="h", y=1.1, x=0), shapes=shapes,
        annotations=annotations,
        xaxis=dict(title=dict(text="network depth (layer index)"), dtick=1, showgrid=True),
        yaxis=dict(title=dict(text=f"mean attention distance ({DISTANCE_UNIT_TITLE[unit]})"), rangemode="tozero",
                   showgrid=True),
    )
