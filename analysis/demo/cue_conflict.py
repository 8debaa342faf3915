"""Cue-conflict scenes for the demo models: an object whose shape says one class and whose texture
another (Geirhos et al. 2019, ICLR, "ImageNet-trained CNNs are biased towards texture").

Each demo class (:data:`analysis.demo.data.CLASS_NAMES`) owns one texture, a two-colour pattern of
period ``T = size / 8`` pixels (6 px in the 48 px scenes), its phase random per scene
(``u = x + φx``, ``v = y + φy``; a pixel takes the pattern's second colour where the rule holds):

* circle: **dots**, a square grid of discs, ``(u mod T − T/2)² + (v mod T − T/2)² < (0.3·T)²``;
* ring: **checks**, squares of side ``T/2``, ``(⌊2u/T⌋ + ⌊2v/T⌋)`` odd;
* bar: **diagonal stripes** at 45°, ``(u + v) mod T < T/2``;
* triangle: **waves**, horizontal bands bent by a sine, ``(v + (T/3)·sin(πu/T)) mod T < T/2``;
* cross: **vertical stripes**, ``u mod T < T/2``;
* star: **zigzag**, horizontal bands bent by a triangle wave,
  ``(v + |u mod T − T/2|) mod T < T/2``.

A scene is drawn like the demo's (:func:`analysis.demo.data.render_sample`): the demo's background and
clutter, then one object of the demo's sizes drawn with :func:`analysis.demo.data.draw_object` into a
1-bit mask whose pixels are filled with a texture, then the image-wide pixel noise. Both texture colours
are kept at least 70 (max over channels) away from the mean colour of the pixels the object covers, so
the outline stays visible. :func:`cue_conflict_scene` fills the object with another class's texture,
:func:`textured_scene` with its own class's (shape and texture agree: scenes to train a demo model
that may read either cue). :func:`texture_swatch` has no object at all: the whole frame is one class's
texture (texture without shape, to check that a model reads texture). Scene ``i`` of a stream depends
only on ``(seed, i)``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from PIL import Image, ImageDraw

from ..base.errors import AnalysisError
from .data import CLASS_NAMES, DEFAULT_SIZE, draw_distractors, draw_object, random_background

__all__ = [
    "CLASS_TEXTURES",
    "Scene",
    "Swatch",
    "class_texture",
    "cue_conflict_scene",
    "cue_conflict_scenes",
    "textured_scene",
    "textured_scenes",
    "texture_swatch",
    "texture_swatches",
]

#: class name -> its texture
CLASS_TEXTURES: dict[str, str] = {
    "circle": "dots: a square grid of discs",
    "ring": "checks: a checkerboard of squares",
    "bar": "diagonal stripes at 45°",
    "triangle": "waves: horizontal bands bent by a sine",
    "cross": "vertical stripes",
    "star": "zigzag: horizontal bands bent by a triangle wave",
}

# The demo scenes' object radius, as a fraction of the image side (as analysis.demo.data draws it).
_OBJECT_RADIUS = (0.22, 0.34)
_MIN_CONTRAST = 70.0  # each texture colour vs the mean colour of the pixels the object covers
_NOISE = 6.0  # the demo scenes' image-wide pixel noise (standard deviation, 0-255 units)


class Scene(NamedTuple):
    """A textured scene: its image, the class of its object's shape and of its texture, and the
    object's pixels.

    Attributes
    ----------
    image : numpy.ndarray
        ``(H, W, 3)`` uint8 image.
    shape_class : int
        Class of the object's shape (an index into :data:`analysis.demo.data.CLASS_NAMES`).
    texture_class : int
        Class of the texture filling the object.
    mask : numpy.ndarray
        ``(H, W)`` bool, the object's pixels.
    """

    image: np.ndarray
    shape_class: int
    texture_class: int
    mask: np.ndarray


class Swatch(NamedTuple):
    """A texture without a shape: the whole frame one class's texture, and that class.

    Attributes
    ----------
    image : numpy.ndarray
        ``(H, W, 3)`` uint8 image.
    texture_class : int
        Class of the texture (an index into :data:`analysis.demo.data.CLASS_NAMES`).
    """

    image: np.ndarray
    texture_class: int


def _pattern(texture_class: int, size: int, phase: tuple[float, float]) -> np.ndarray:
    """Boolean ``(size, size)``: where texture ``texture_class`` takes its second colour (the rules above)."""
    period = size / 8
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    u, v = xx + phase[0], yy + phase[1]
    name = CLASS_NAMES[texture_class]
    if name == "circle":
        return (np.mod(u, period) - period / 2) ** 2 + (np.mod(v, period) - period / 2) ** 2 < (0.3 * period) ** 2
    if name == "ring":
        return (np.floor(2 * u / period) + np.floor(2 * v / period)) % 2 == 1
    if name == "bar":
        return np.mod(u + v, period) < period / 2
    if name == "triangle":
        return np.mod(v + period / 3 * np.sin(math.pi * u / period), period) < period / 2
    if name == "cross":
        return np.mod(u, period) < period / 2
    if name == "star":
        return np.mod(v + np.abs(np.mod(u, period) - period / 2), period) < period / 2
    raise AssertionError(name)  # pragma: no cover - CLASS_NAMES and CLASS_TEXTURES must agree


def _check_class(texture_class: int) -> int:
    if not 0 <= int(texture_class) < len(CLASS_NAMES):
        raise AnalysisError(
            f"texture_class={texture_class!r}: a texture is one of the demo classes, 0 to {len(CLASS_NAMES) - 1}."
        )
    return int(texture_class)


def class_texture(
    texture_class: int, size: int = DEFAULT_SIZE, *, colours=((0, 0, 0), (255, 255, 255)), phase=(0.0, 0.0)
) -> np.ndarray:
    """Texture ``texture_class`` as an image, in two colours, shifted by a phase (the rules of the
    module docstring).

    Parameters
    ----------
    texture_class : int
        An index into ``CLASS_NAMES``.
    size : int, default DEFAULT_SIZE
        Side of the square image in pixels (the texture's period is ``size / 8``).
    colours : pair of RGB triples, default ((0, 0, 0), (255, 255, 255))
        First: the ground, second: the pattern; values 0-255.
    phase : (float, float), default (0.0, 0.0)
        ``(φx, φy)``, the shift in pixels.

    Returns
    -------
    numpy.ndarray
        ``(size, size, 3)`` uint8.

    Raises
    ------
    AnalysisError
        ``texture_class`` is not one of the demo classes.
    """
    pattern = _pattern(_check_class(texture_class), int(size), (float(phase[0]), float(phase[1])))
    ground, ink = (np.asarray(c, dtype=np.uint8) for c in colours)
    return np.where(pattern[..., None], ink, ground).astype(np.uint8)


def _contrasting_colour(rng: np.random.Generator, under: np.ndarray) -> np.ndarray:
    """A random colour at least ``_MIN_CONTRAST`` (max over channels) from ``under``; black or white
    (whichever is farther) after eight misses."""
    for _ in range(8):
        colour = rng.integers(0, 256, size=3)
        if np.abs(colour - under).max() >= _MIN_CONTRAST:
            return colour
    return np.where(under < 128, 255, 0)


def _scene(seed: int, index: int, size: int, *, conflict: bool) -> Scene:
    # Streams of their own (2, 3), so a textured scene is not the demo scene of the same (seed, index).
    rng_obj = np.random.default_rng((int(seed), int(index), 2))
    rng = np.random.default_rng((int(seed), int(index), 3))
    shape = int(rng_obj.integers(0, len(CLASS_NAMES)))
    # Another class, uniformly: a shift of 1 to K-1 (drawn either way, so both kinds share the rest).
    shift = 1 + int(rng_obj.integers(0, len(CLASS_NAMES) - 1))
    texture = (shape + shift) % len(CLASS_NAMES) if conflict else shape
    r = rng_obj.uniform(*_OBJECT_RADIUS) * size
    margin = r * 0.8
    cx, cy = rng_obj.uniform(margin, size - margin, size=2)
    angle = rng_obj.uniform(0, 2 * math.pi)
    mask_img = Image.new("1", (size, size), 0)
    draw_object(ImageDraw.Draw(mask_img), shape, cx, cy, r, angle, 1)
    mask = np.array(mask_img, dtype=bool)

    background = random_background(rng, size)
    canvas = Image.fromarray(np.clip(background, 0, 255).astype(np.uint8), "RGB")
    draw_distractors(ImageDraw.Draw(canvas), rng, size)
    img = np.array(canvas, dtype=np.float32)
    under = img[mask].mean(axis=0) if mask.any() else np.full(3, 128.0, dtype=np.float32)
    colours = (_contrasting_colour(rng_obj, under), _contrasting_colour(rng_obj, under))
    phase = tuple(rng_obj.uniform(0, size / 8, size=2))
    fill = class_texture(texture, size, colours=colours, phase=phase).astype(np.float32)
    img[mask] = fill[mask]
    img += rng.normal(0, _NOISE, size=img.shape).astype(np.float32)
    return Scene(np.clip(img, 0, 255).astype(np.uint8), shape, texture, mask)


def _check_count(n: int) -> None:
    if int(n) != n or n < 0:
        raise AnalysisError(f"n={n!r}: the number of scenes is a whole number, 0 or more.")


def cue_conflict_scene(seed: int, index: int, size: int = DEFAULT_SIZE) -> Scene:
    """Cue-conflict scene ``index`` of stream ``seed``: an object of one class's shape filled with the
    texture of another class (chosen uniformly among the others).

    Parameters
    ----------
    seed : int
        The stream.
    index : int
        The scene's index in the stream; the scene depends only on ``(seed, index)``.
    size : int, default DEFAULT_SIZE
        Side of the square scene in pixels.

    Returns
    -------
    Scene
        ``image`` ``(size, size, 3)`` uint8, ``shape_class``, ``texture_class`` (never the shape's)
        and ``mask`` ``(size, size)`` bool.
    """
    return _scene(seed, index, int(size), conflict=True)


def cue_conflict_scenes(n: int, seed: int, size: int = DEFAULT_SIZE) -> list[Scene]:
    """Scenes ``0 .. n−1`` of :func:`cue_conflict_scene`; a prefix of any longer list of the same ``seed``.

    Parameters
    ----------
    n : int
        Number of scenes, 0 or more.
    seed : int
        The stream.
    size : int, default DEFAULT_SIZE
        Side of the square scenes in pixels.

    Returns
    -------
    list of Scene
        ``n`` scenes, each ``(image, shape_class, texture_class, mask)``.

    Raises
    ------
    AnalysisError
        ``n`` is negative or not a whole number.
    """
    _check_count(n)
    return [cue_conflict_scene(seed, i, size) for i in range(int(n))]


def textured_scene(seed: int, index: int, size: int = DEFAULT_SIZE) -> Scene:
    """Scene ``index`` of stream ``seed`` whose object is filled with its own class's texture: shape and
    texture agree (the same object, background and colours as :func:`cue_conflict_scene` of that
    ``(seed, index)``; only the texture differs).

    Parameters
    ----------
    seed : int
        The stream.
    index : int
        The scene's index in the stream.
    size : int, default DEFAULT_SIZE
        Side of the square scene in pixels.

    Returns
    -------
    Scene
        ``image`` ``(size, size, 3)`` uint8, ``shape_class == texture_class``, ``mask``
        ``(size, size)`` bool.
    """
    return _scene(seed, index, int(size), conflict=False)


def textured_scenes(n: int, seed: int, size: int = DEFAULT_SIZE) -> list[Scene]:
    """Scenes ``0 .. n−1`` of :func:`textured_scene`.

    Parameters
    ----------
    n : int
        Number of scenes, 0 or more.
    seed : int
        The stream.
    size : int, default DEFAULT_SIZE
        Side of the square scenes in pixels.

    Returns
    -------
    list of Scene
        ``n`` scenes whose shape and texture agree.

    Raises
    ------
    AnalysisError
        ``n`` is negative or not a whole number.
    """
    _check_count(n)
    return [textured_scene(seed, i, size) for i in range(int(n))]


def texture_swatch(seed: int, index: int, size: int = DEFAULT_SIZE) -> Swatch:
    """Swatch ``index`` of stream ``seed``: the whole ``size × size`` frame filled with the texture of a
    uniformly drawn class, in two random colours at least 70 apart (max over channels), its phase random,
    then the demo scenes' pixel noise. No object, no outline and no background: a model that names the
    texture's class here reads the texture, since no shape is left to read.

    Parameters
    ----------
    seed : int
        The stream (its own: swatch ``i`` is not related to scene ``i`` of the same seed).
    index : int
        The swatch's index in the stream.
    size : int, default DEFAULT_SIZE
        Side of the square swatch in pixels.

    Returns
    -------
    Swatch
        ``image`` ``(size, size, 3)`` uint8 and its ``texture_class``.
    """
    size = int(size)
    rng = np.random.default_rng((int(seed), int(index), 4))  # a stream of its own (scenes use 0 to 3)
    texture = int(rng.integers(0, len(CLASS_NAMES)))
    ground = rng.integers(0, 256, size=3)
    colours = (ground, _contrasting_colour(rng, ground.astype(np.float32)))
    phase = tuple(rng.uniform(0, size / 8, size=2))
    img = class_texture(texture, size, colours=colours, phase=phase).astype(np.float32)
    img += rng.normal(0, _NOISE, size=img.shape).astype(np.float32)
    return Swatch(np.clip(img, 0, 255).astype(np.uint8), texture)


def texture_swatches(n: int, seed: int, size: int = DEFAULT_SIZE) -> list[Swatch]:
    """Swatches ``0 .. n−1`` of :func:`texture_swatch`.

    Parameters
    ----------
    n : int
        Number of swatches, 0 or more.
    seed : int
        The stream.
    size : int, default DEFAULT_SIZE
        Side of the square swatches in pixels.

    Returns
    -------
    list of Swatch
        ``n`` swatches.

    Raises
    ------
    AnalysisError
        ``n`` is negative or not a whole number.
    """
    _check_count(n)
    return [texture_swatch(seed, i, size) for i in range(int(n))]
