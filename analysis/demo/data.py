"""Procedural "find the shape" scenes for the bundled demo ViT.

Every sample is a small RGB image with **one labelled object** -- a shape from one of
:data:`CLASS_NAMES` at a random position, scale, rotation and colour -- drawn on top of
a cluttered, textured background. Because we draw the scene ourselves we know exactly
which pixels belong to the object, so explanations (attention rollout, ...) can be
scored against a ground-truth mask.

The clutter is built so that the label cannot be read off a global statistic:

* the background is a random two-colour gradient plus low-frequency blotches, random
  stripes and pixel noise;
* distractors use the same colour distribution as the object and come in shape
  families that are **not** classes: thin line strokes, tiny specks and small
  irregular blobs (random 5-7 vertex polygons with jittered radii), all clearly
  smaller than the object;
* the object is drawn last, so it is never occluded; its mask is the set of pixels the
  object's own draw call wrote (drawn with the same coordinates into a 1-bit mask, no
  anti-aliasing); every mask pixel holds the object's (gently shaded) colour before the
  final, image-wide pixel noise, and that colour is kept at least ``_MIN_CONTRAST`` away
  from the mean colour of the pixels it covers so the object is always visible.

Generation is deterministic: sample ``i`` of ``generate_samples(n, seed)`` depends only
on ``(seed, i)``, so ``generate_samples(10, s)`` is a prefix of
``generate_samples(100, s)``.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image, ImageDraw

__all__ = [
    "CLASS_NAMES",
    "DEFAULT_SIZE",
    "generate_samples",
    "generate_arrays",
    "render_sample",
    "draw_object",
    "random_background",
    "draw_distractors",
]

CLASS_NAMES: list[str] = ["circle", "ring", "bar", "triangle", "cross", "star"]
DEFAULT_SIZE = 48

# Object radius as a fraction of the image side (circumradius-ish), distractor limits.
_OBJ_RADIUS = (0.22, 0.34)
_BLOB_RADIUS = (0.05, 0.08)
_MIN_CONTRAST = 70.0  # object colour vs mean colour of the pixels it covers


def _rotate(points: np.ndarray, angle: float) -> np.ndarray:
    c, s = math.cos(angle), math.sin(angle)
    return points @ np.array([[c, s], [-s, c]])


def _regular_polygon(k: int, radius: float, angle: float) -> np.ndarray:
    t = angle + np.arange(k) * (2 * math.pi / k)
    return np.stack([np.cos(t), np.sin(t)], axis=1) * radius


def _polygon(draw: ImageDraw.ImageDraw, pts: np.ndarray, cx: float, cy: float, fill) -> None:
    draw.polygon([(float(x + cx), float(y + cy)) for x, y in pts], fill=fill)


def draw_object(draw: ImageDraw.ImageDraw, cls: int, cx: float, cy: float, r: float, angle: float, fill) -> None:
    """Draw class ``cls``'s shape centred at ``(cx, cy)`` with size ``r``.

    Parameters
    ----------
    draw : PIL.ImageDraw.ImageDraw
        The canvas to draw on (an RGB image, or a 1-bit mask with ``fill=1``).
    cls : int
        An index into :data:`CLASS_NAMES`.
    cx : float
        Centre, x in pixels.
    cy : float
        Centre, y in pixels.
    r : float
        Size in pixels, about the circumradius (a circle's or ring's radius).
    angle : float
        Rotation in radians (no effect on a circle or ring).
    fill : Any
        The colour, as ``PIL`` takes it for ``draw``'s image mode.
    """
    name = CLASS_NAMES[cls]
    if name == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif name == "bar":
        # A thick rectangle, 2.6 : 1.
        a, b = r * 1.15, r * 0.44
        pts = np.array([[-a, -b], [a, -b], [a, b], [-a, b]])
        _polygon(draw, _rotate(pts, angle), cx, cy, fill)
    elif name == "triangle":
        _polygon(draw, _regular_polygon(3, r * 1.15, angle), cx, cy, fill)
    elif name == "cross":
        a, b = r * 1.1, r * 0.4
        pts = np.array(
            [[-b, -a], [b, -a], [b, -b], [a, -b], [a, b], [b, b], [b, a], [-b, a], [-b, b], [-a, b], [-a, -b], [-b, -b]]
        )
        _polygon(draw, _rotate(pts, angle), cx, cy, fill)
    elif name == "ring":
        # Annulus: outer disc minus inner disc, drawn as a thick ellipse outline.
        width = max(2, int(round(r * 0.45)))
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], outline=fill, width=width)
    elif name == "star":
        t = angle + np.arange(10) * (math.pi / 5)
        rad = np.where(np.arange(10) % 2 == 0, r * 1.25, r * 0.5)
        pts = np.stack([np.cos(t) * rad, np.sin(t) * rad], axis=1)
        _polygon(draw, pts, cx, cy, fill)
    else:  # pragma: no cover - CLASS_NAMES and this function must agree
        raise ValueError(name)


def _random_colour(rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, 256, size=3)


def random_background(rng: np.random.Generator, size: int) -> np.ndarray:
    """A textured background: a two-colour gradient, coarse blotches and, sometimes, stripes.

    Parameters
    ----------
    rng : numpy.random.Generator
        Where every random choice comes from.
    size : int
        Side of the square background in pixels.

    Returns
    -------
    numpy.ndarray
        ``(size, size, 3)`` float32, about ``[0, 255]`` but not clipped (the blotches and stripes may
        go past it).
    """
    c0, c1 = _random_colour(rng).astype(np.float32), _random_colour(rng).astype(np.float32)
    theta = rng.uniform(0, 2 * math.pi)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / (size - 1)
    g = np.cos(theta) * xx + np.sin(theta) * yy
    g = (g - g.min()) / max(float(g.max() - g.min()), 1e-6)
    img = c0 * (1 - g[..., None]) + c1 * g[..., None]
    # Low-frequency blotches: a coarse random grid upsampled (nearest, then box-smoothed).
    k = int(rng.integers(3, 6))
    coarse = rng.normal(0, 35, size=(k, k, 3)).astype(np.float32)
    rep = -(-size // k)
    up = np.repeat(np.repeat(coarse, rep, axis=0), rep, axis=1)[:size, :size]
    smoothed = (up + np.roll(up, 2, axis=0) + np.roll(up, 2, axis=1) + np.roll(up, (2, 2), axis=(0, 1))) / 4
    img += smoothed
    # Stripes with a random frequency / orientation / amplitude.
    if rng.random() < 0.6:
        phi = rng.uniform(0, 2 * math.pi)
        freq = rng.uniform(0.25, 0.9)
        amp = rng.uniform(8, 30)
        img += amp * np.sin(freq * size * (np.cos(phi) * xx + np.sin(phi) * yy) + rng.uniform(0, 6.3))[..., None]
    return img


def draw_distractors(draw: ImageDraw.ImageDraw, rng: np.random.Generator, size: int) -> None:
    """Draw the clutter that no class owns (thin strokes, specks, small irregular blobs) on a
    ``size``×``size`` canvas: the same for the demo samples and the text scenes.

    Parameters
    ----------
    draw : PIL.ImageDraw.ImageDraw
        The RGB canvas to draw on.
    rng : numpy.random.Generator
        Where every random choice comes from.
    size : int
        Side of the square canvas in pixels (stroke width and speck size scale with it).
    """
    unit = max(1, int(round(size / 32)))  # stroke width / speck size scale with the image
    # Thin strokes (1 px wide lines / polylines).
    for _ in range(int(rng.integers(2, 6))):
        x0, y0 = rng.uniform(-2, size + 2, size=2)
        length = rng.uniform(0.2, 0.6) * size
        a = rng.uniform(0, 2 * math.pi)
        pts = [(x0, y0)]
        for _seg in range(int(rng.integers(1, 3))):
            a += rng.uniform(-1.0, 1.0)
            x0, y0 = x0 + math.cos(a) * length / 2, y0 + math.sin(a) * length / 2
            pts.append((x0, y0))
        draw.line([(float(x), float(y)) for x, y in pts], fill=tuple(_random_colour(rng).tolist()), width=unit)
    # Specks (single pixels or 2x2).
    for _ in range(int(rng.integers(4, 12))):
        x, y = rng.integers(0, size, size=2)
        s = int(rng.integers(0, unit + 1))
        draw.rectangle([int(x), int(y), int(x) + s, int(y) + s], fill=tuple(_random_colour(rng).tolist()))
    # Small irregular blobs (not a class: 5-7 jittered vertices, much smaller than objects).
    for _ in range(int(rng.integers(2, 5))):
        k = int(rng.integers(5, 8))
        r = rng.uniform(*_BLOB_RADIUS) * size
        t = np.sort(rng.uniform(0, 2 * math.pi, size=k))
        rad = r * rng.uniform(0.5, 1.3, size=k)
        blob = np.stack([np.cos(t) * rad, np.sin(t) * rad], axis=1)
        cx, cy = rng.uniform(0, size, size=2)
        _polygon(draw, blob, cx, cy, tuple(_random_colour(rng).tolist()))


def render_sample(
    seed: int, index: int, size: int = DEFAULT_SIZE, *, clutter: bool = True
) -> tuple[np.ndarray, int, np.ndarray]:
    """Render sample ``index`` of stream ``seed``: its image, label and object mask.

    The object's class and geometry come from their own random stream, so they (and the
    mask) do not depend on ``clutter``.

    Parameters
    ----------
    seed : int
        The stream.
    index : int
        The sample's index in the stream; the sample depends only on ``(seed, index)``.
    size : int, default DEFAULT_SIZE
        Side of the square image in pixels.
    clutter : bool, default True
        ``False`` draws the same object on a plain mid-grey (128) background without distractors
        or noise -- handy for checking that the mask is exactly the object's pixels.

    Returns
    -------
    tuple of (numpy.ndarray, int, numpy.ndarray)
        ``(image, label, mask)``: ``(size, size, 3)`` uint8, the class index into
        :data:`CLASS_NAMES`, ``(size, size)`` bool.
    """
    rng_obj = np.random.default_rng((int(seed), int(index), 0))
    rng = np.random.default_rng((int(seed), int(index), 1))
    label = int(rng_obj.integers(0, len(CLASS_NAMES)))
    r = rng_obj.uniform(*_OBJ_RADIUS) * size
    margin = r * 0.8
    cx, cy = rng_obj.uniform(margin, size - margin, size=2)
    angle = rng_obj.uniform(0, 2 * math.pi)
    mask_img = Image.new("1", (size, size), 0)
    draw_object(ImageDraw.Draw(mask_img), label, cx, cy, r, angle, 1)
    mask = np.array(mask_img, dtype=bool)

    if clutter:
        bg = random_background(rng, size)
        canvas = Image.fromarray(np.clip(bg, 0, 255).astype(np.uint8), "RGB")
        draw_distractors(ImageDraw.Draw(canvas), rng, size)
    else:
        canvas = Image.new("RGB", (size, size), (128, 128, 128))

    img = np.array(canvas, dtype=np.float32)
    # Object colour: random, but at least _MIN_CONTRAST (max over channels) away from
    # the mean colour of what it covers, so the object is visible; a few redraws at most.
    under = img[mask].mean(axis=0) if mask.any() else np.full(3, 128.0, dtype=np.float32)
    colour = _random_colour(rng_obj)
    for _ in range(8):
        if np.abs(colour - under).max() >= _MIN_CONTRAST:
            break
        colour = _random_colour(rng_obj)
    else:
        colour = np.where(under < 128, 255, 0)
    # Object with a gentle shading so it is not a perfectly flat patch.
    shade = 1.0 + rng_obj.uniform(-0.12, 0.12) * ((np.mgrid[0:size, 0:size][0] - cy) / size)
    obj = np.clip(colour[None, None, :].astype(np.float32) * shade[..., None], 0, 255)
    img[mask] = obj[mask]
    if clutter:
        img += rng.normal(0, 6, size=img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8), label, mask


def generate_arrays(
    n: int, seed: int, *, size: int = DEFAULT_SIZE, start: int = 0, clutter: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Like :func:`generate_samples` but as arrays.

    Parameters
    ----------
    n : int
        Number of samples.
    seed : int
        The stream.
    size : int, default DEFAULT_SIZE
        Side of the square images in pixels.
    start : int, default 0
        Offset of the sample index: row ``i`` is sample ``start + i``.
    clutter : bool, default True
        As in :func:`render_sample`.

    Returns
    -------
    tuple of numpy.ndarray
        ``(images, labels, masks)``: ``(n, size, size, 3)`` uint8, ``(n,)`` int64,
        ``(n, size, size)`` bool.
    """
    images = np.empty((n, size, size, 3), dtype=np.uint8)
    labels = np.empty((n,), dtype=np.int64)
    masks = np.empty((n, size, size), dtype=bool)
    for i in range(n):
        images[i], labels[i], masks[i] = render_sample(seed, start + i, size, clutter=clutter)
    return images, labels, masks


def generate_samples(
    n: int, seed: int, *, size: int = DEFAULT_SIZE, clutter: bool = True
) -> tuple[list[Image.Image], list[int], np.ndarray]:
    """``n`` scenes from stream ``seed`` (samples ``0 .. n−1`` of :func:`render_sample`).

    Parameters
    ----------
    n : int
        Number of scenes.
    seed : int
        The stream.
    size : int, default DEFAULT_SIZE
        Side of the square images in pixels.
    clutter : bool, default True
        As in :func:`render_sample`.

    Returns
    -------
    tuple of (list of PIL.Image.Image, list of int, numpy.ndarray)
        ``(images, labels, masks)``: RGB images, class indices into :data:`CLASS_NAMES`, and an
        ``(n, size, size)`` bool array marking the labelled object's pixels.
    """
    images, labels, masks = generate_arrays(n, seed, size=size, clutter=clutter)
    return [Image.fromarray(im, "RGB") for im in images], [int(x) for x in labels], masks
