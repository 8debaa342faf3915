"""A Figure 7 (right) PNG without a browser: mean attention distance per head against depth,
drawn with Pillow (plotly's static export needs Chrome and kaleido, which a server may lack)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

__all__ = ["distance_png", "nice_ticks"]

_HEAD_COLOURS = ("#440154", "#3b528b", "#21918c", "#5ec962", "#fde725", "#e16462", "#fca636", "#0d0887")


def nice_ticks(lo: float, hi: float, count: int = 6) -> list[float]:
    """Round tick values covering ``[lo, hi]`` (steps of 1, 2 or 5 times a power of ten).

    Parameters
    ----------
    lo : float
        Lower end; the first tick is ``lo`` rounded down to a multiple of the step.
    hi : float
        Upper end; the last tick is at or above it.
    count : int, default 6
        About how many ticks: the step is the smallest nice one of at least ``(hi - lo) / (count - 1)``.

    Returns
    -------
    list of float
        The ticks, ascending, evenly spaced.
    """
    span = max(hi - lo, 1e-12)
    raw = span / max(count - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(lo / step) * step
    return [first + i * step for i in range(int(math.ceil((hi - first) / step)) + 1)]


def _font(size: int):
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: one bitmap size
        return ImageFont.load_default()


def _text(
    draw: ImageDraw.ImageDraw, xy: tuple[float, float], text: str, font, anchor: str = "la", fill: str = "#2a3f5f"
) -> None:
    """``draw.text`` with an anchor (``l/m/r`` then ``t/m/b``) placed by the text's own bounding
    box, so it also works with the bitmap default font of older Pillow releases."""
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    x = xy[0] - {"l": left, "m": (left + right) / 2, "r": right}[anchor[0]]
    y = xy[1] - {"t": top, "a": top, "m": (top + bottom) / 2, "b": bottom}[anchor[1]]
    draw.text((x, y), text, fill=fill, font=font)


def distance_png(
    distance: np.ndarray,
    path: Path | str,
    *,
    uniform: float | np.ndarray | None = None,
    title: str = "",
    unit: str = "px",
    size: tuple[int, int] = (900, 600),
) -> Path:
    """Write ``distance`` as a PNG: dots (x = layer, one colour per head) with the uniform-attention
    reference as a dashed line (``uniform`` one value), or as a dashed segment over each layer
    (``uniform`` ``(L,)``: a windowed model's per-layer references).

    Parameters
    ----------
    distance : numpy.ndarray
        ``(L, heads)`` mean attention distances; non-finite entries (a windowed layer's missing
        heads) are not drawn.
    path : pathlib.Path or str
        Where the PNG is written (its folder must exist).
    uniform : float, numpy.ndarray or None, default None
        The uniform-attention reference: one value (a line across every layer), ``(L,)`` (a segment
        per layer), or ``None`` (none drawn).
    title : str, default ""
        Drawn atop the figure.
    unit : str, default "px"
        The distance unit, in the axis label and the reference's legend.
    size : tuple of (int, int), default (900, 600)
        ``(width, height)`` in pixels.

    Returns
    -------
    pathlib.Path
        ``path``.
    """
    distance = np.asarray(distance, dtype=np.float64)
    layers, heads = distance.shape
    per_layer = None
    if uniform is not None and np.ndim(uniform) == 1:
        per_layer, uniform = np.asarray(uniform, dtype=np.float64), None
    line: float | None = None if uniform is None else float(uniform)  # one value for every layer
    width, height = size
    left, right, top, bottom = 90, 30, 60, 70
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    font, small = _font(16), _font(13)
    values = distance[np.isfinite(distance)]
    references = per_layer[np.isfinite(per_layer)] if per_layer is not None else np.zeros(0)
    hi = (
        max(
            float(values.max()) if values.size else 1.0,
            line or 0.0,
            float(references.max()) if references.size else 0.0,
        )
        * 1.05
    )
    ticks = nice_ticks(0.0, hi)
    y_max = ticks[-1]

    def x_of(layer: float) -> float:
        return left + (layer + 0.5) / layers * (width - left - right)

    def y_of(value: float) -> float:
        return height - bottom - value / y_max * (height - top - bottom)

    for tick in ticks:  # grid and y labels
        y = y_of(tick)
        draw.line([(left, y), (width - right, y)], fill="#EBF0F8", width=1)
        _text(draw, (left - 8, y), f"{tick:g}", small, "rm", fill="#2a3f5f")
    step = max(1, math.ceil(layers / 24))
    for layer in range(0, layers, step):
        _text(draw, (x_of(layer), height - bottom + 8), str(layer), small, "mt", fill="#2a3f5f")
    draw.line([(left, top), (left, height - bottom), (width - right, height - bottom)], fill="#2a3f5f", width=1)
    if line is not None and math.isfinite(line):
        y = y_of(line)
        for dash in range(left, width - right, 12):
            draw.line([(dash, y), (min(dash + 6, width - right), y)], fill="#9e9e9e", width=2)
        _text(draw, (width - right - 4, y - 4), f"uniform attention ({line:.3g} {unit})", small, "rb", fill="#6e6e6e")
    if per_layer is not None:
        for layer, value in enumerate(per_layer):
            if math.isfinite(value):
                y, start, stop = y_of(value), x_of(layer - 0.45), x_of(layer + 0.45)
                for dash_start in np.arange(start, stop, 8):
                    draw.line([(dash_start, y), (min(dash_start + 4, stop), y)], fill="#9e9e9e", width=2)
        _text(
            draw,
            (width - right - 4, top - 4),
            f"dashes: uniform attention in each layer's windows ({unit})",
            small,
            "rb",
            fill="#6e6e6e",
        )
    radius = 5
    for head in range(heads):
        colour = _HEAD_COLOURS[head % len(_HEAD_COLOURS)]
        for layer in range(layers):
            value = distance[layer, head]
            if not math.isfinite(value):
                continue
            jitter = (head - (heads - 1) / 2) / max(heads, 1) * 0.5  # heads side by side within a layer
            x, y = x_of(layer + jitter), y_of(value)
            draw.ellipse([x - radius, y - radius, x + radius, y + radius], fill=colour, outline="white")
    _text(draw, (left, 20), title, font, "lm", fill="#2a3f5f")
    x = width - right  # legend, right-aligned: "head 0 1 2 ..." (colours repeat after 8 heads)
    for head in reversed(range(min(heads, len(_HEAD_COLOURS)))):
        _text(draw, (x, 20), str(head), small, "rm", fill="#2a3f5f")
        x -= draw.textlength(str(head), font=small) + 4
        draw.ellipse([x - 2 * radius, 20 - radius, x, 20 + radius], fill=_HEAD_COLOURS[head])
        x -= 2 * radius + 10
    label = "head" if heads <= len(_HEAD_COLOURS) else f"head (mod {len(_HEAD_COLOURS)})"
    _text(draw, (x, 20), label, small, "rm", fill="#2a3f5f")
    _text(draw, ((left + width - right) / 2, height - 22), "network depth (layer)", font, "mm", fill="#2a3f5f")
    axis_label = Image.new("RGB", (height - top - bottom, 24), "white")
    _text(ImageDraw.Draw(axis_label), (axis_label.width / 2, 12), f"mean attention distance ({unit})", font, "mm")
    image.paste(axis_label.rotate(90, expand=True), (12, top))
    path = Path(path)
    image.save(path, format="PNG")
    return path
