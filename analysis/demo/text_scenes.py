"""Captioned demo scenes for the bundled demo CLIP: one or two named objects, a caption that names one.

The scenes are the demo ViT's (:mod:`.data`: the same shapes, cluttered background and
distractors) with two changes so that text can describe them:

* each object's colour is one of :data:`COLOURS` (a named colour, jittered by up to ±20 per
  channel), kept at least 70 levels (max over channels) away from the mean colour it covers,
  like the demo scenes;
* a scene holds one object or two objects of **different** classes and colours, one in each
  half of the image (left/right or top/bottom, chosen at random), so a caption that names
  one of them picks it out. Each object's mask is the pixels its own draw call wrote; the
  two masks never overlap (each object's bounding disc stays in its half).

A caption names one object (:func:`caption`): ``"a star"``, ``"a red star"``, ``"a star on the
left"`` or ``"a red star on the top left"``; its position word is where the object's centre
lies (:func:`position_words`: a third of the side from the middle). :data:`CLASS_PROMPTS` are
the zero-shot prompts (``"a {shape}"``).

Deterministic per ``(seed, index)``, like the demo scenes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from .data import CLASS_NAMES, DEFAULT_SIZE, draw_distractors, draw_object, random_background

__all__ = [
    "COLOURS",
    "CLASS_PROMPTS",
    "TextScene",
    "SceneObject",
    "render_text_scene",
    "generate_text_scenes",
    "position_words",
    "caption",
    "caption_fields",
    "caption_text",
    "describes",
    "caption_words",
]

#: the named colours objects are painted in (RGB before jitter).
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 170, 50),
    "blue": (40, 70, 230),
    "yellow": (240, 220, 30),
    "white": (245, 245, 245),
    "black": (15, 15, 15),
    "orange": (250, 140, 20),
    "purple": (150, 50, 200),
}
#: the zero-shot prompt of each class, in CLASS_NAMES order.
CLASS_PROMPTS: list[str] = [f"a {name}" for name in CLASS_NAMES]
_TEMPLATES = ("a {shape}", "a {colour} {shape}", "a {shape} on the {where}", "a {colour} {shape} on the {where}")
_SINGLE_RADIUS = (0.17, 0.34)  # object radius / side, one object (the demo scenes use 0.22-0.34)
_PAIR_RADIUS = (0.15, 0.21)  # two objects, one per half
_BOUND = 1.25  # a star's outer radius is 1.25 r: every shape lies within 1.25 r of its centre
_MIN_CONTRAST = 70.0
_MIDDLE = 1 / 6  # within a sixth of the side from the centre counts as the middle along that axis


@dataclass(frozen=True)
class SceneObject:
    """One object of a :class:`TextScene`.

    Attributes
    ----------
    label : int
        Its class, an index into :data:`analysis.demo.data.CLASS_NAMES` (``shape`` is the name).
    colour : str
        Its colour's name, a key of :data:`COLOURS`.
    centre : (float, float)
        ``(cx, cy)`` in pixels.
    mask : numpy.ndarray
        ``(H, W)`` bool, the pixels its own draw call wrote.
    """

    label: int
    colour: str
    centre: tuple[float, float]
    mask: np.ndarray

    @property
    def shape(self) -> str:
        return CLASS_NAMES[self.label]


@dataclass(frozen=True)
class TextScene:
    """A captionable scene: its image and its one or two objects.

    Attributes
    ----------
    image : numpy.ndarray
        ``(H, W, 3)`` uint8 image.
    objects : tuple of SceneObject
        One object, or two of different classes and colours (masks that never overlap).
    """

    image: np.ndarray
    objects: tuple[SceneObject, ...]


def position_words(cx: float, cy: float, size: int) -> str:
    """Where a centre lies: ``"left"``, ``"top right"``, ``"middle"``... (vertical word first).

    Along each axis, within a sixth of the side from the centre is the middle (no word).

    Parameters
    ----------
    cx : float
        Centre, x in pixels.
    cy : float
        Centre, y in pixels.
    size : int
        Side of the square scene in pixels.

    Returns
    -------
    str
        ``"top"`` / ``"bottom"``, ``"left"`` / ``"right"``, both (``"top left"``), or ``"middle"``.
    """
    dx, dy = cx / size - 0.5, cy / size - 0.5
    vertical = "" if abs(dy) < _MIDDLE else ("top" if dy < 0 else "bottom")
    horizontal = "" if abs(dx) < _MIDDLE else ("left" if dx < 0 else "right")
    return " ".join(w for w in (vertical, horizontal) if w) or "middle"


def caption_fields(obj: SceneObject, size: int, rng: np.random.Generator) -> tuple[str, str | None, str | None]:
    """What a random template of :data:`_TEMPLATES` says of ``obj``.

    Parameters
    ----------
    obj : SceneObject
        The object to describe.
    size : int
        Side of the square scene in pixels (for :func:`position_words`).
    rng : numpy.random.Generator
        Picks the template (one draw).

    Returns
    -------
    tuple of (str, str or None, str or None)
        ``(shape, colour or None, position words or None)``: ``None`` where the template does not
        name it.
    """
    template = _TEMPLATES[int(rng.integers(len(_TEMPLATES)))]
    return (
        obj.shape,
        obj.colour if "{colour}" in template else None,
        position_words(*obj.centre, size) if "{where}" in template else None,
    )


def caption_text(fields: tuple[str, str | None, str | None]) -> str:
    """``("star", "red", "left")`` -> ``"a red star on the left"`` (``None`` fields left out).

    Parameters
    ----------
    fields : tuple of (str, str or None, str or None)
        ``(shape, colour, where)``, as :func:`caption_fields` returns.

    Returns
    -------
    str
        The caption.
    """
    shape, colour, where = fields
    return f"a {colour + ' ' if colour else ''}{shape}{' on the ' + where if where else ''}"


def describes(fields: tuple[str, str | None, str | None], obj: SceneObject, size: int) -> bool:
    """Whether a caption's fields are true of ``obj`` (every field it names matches).

    Parameters
    ----------
    fields : tuple of (str, str or None, str or None)
        ``(shape, colour, where)``, as :func:`caption_fields` returns; a ``None`` field matches
        anything.
    obj : SceneObject
        The object.
    size : int
        Side of the square scene in pixels (for :func:`position_words`).

    Returns
    -------
    bool
        ``True`` when the shape and every named colour and position match ``obj``.
    """
    shape, colour, where = fields
    return (
        shape == obj.shape
        and (colour is None or colour == obj.colour)
        and (where is None or where == position_words(*obj.centre, size))
    )


def caption(obj: SceneObject, size: int, rng: np.random.Generator) -> str:
    """A caption of ``obj`` by a random template of :data:`_TEMPLATES`.

    Parameters
    ----------
    obj : SceneObject
        The object to name.
    size : int
        Side of the square scene in pixels (for :func:`position_words`).
    rng : numpy.random.Generator
        Picks the template (one draw).

    Returns
    -------
    str
        ``"a star"``, ``"a red star"``, ``"a star on the left"`` or ``"a red star on the top left"``.
    """
    return caption_text(caption_fields(obj, size, rng))


def caption_words() -> list[str]:
    """Every word a caption can use (the demo CLIP's vocabulary), in a fixed order.

    Returns
    -------
    list of str
        ``"a"``, ``"on"``, ``"the"``, the class names, the colour names, then the position words, each
        once.
    """
    words = ["a", "on", "the", *CLASS_NAMES, *COLOURS, "top", "bottom", "left", "right", "middle"]
    return list(dict.fromkeys(words))


def _object_colour(rng: np.random.Generator, under: np.ndarray, exclude: str | None) -> tuple[str, np.ndarray]:
    names = [n for n in COLOURS if n != exclude]
    order = rng.permutation(len(names))
    for i in order:
        rgb = np.clip(np.array(COLOURS[names[i]], dtype=np.float32) + rng.uniform(-20, 20, 3), 0, 255)
        if np.abs(rgb - under).max() >= _MIN_CONTRAST:
            return names[i], rgb
    name = "white" if under.mean() < 128 and exclude != "white" else "black"  # pragma: no cover - very rare
    return name, np.array(COLOURS[name], dtype=np.float32)


def render_text_scene(seed: int, index: int, size: int = DEFAULT_SIZE, *, objects: int | None = None) -> TextScene:
    """Scene ``index`` of stream ``seed`` (see the module docstring).

    Parameters
    ----------
    seed : int
        The stream.
    index : int
        The scene's index in the stream; the scene depends only on ``(seed, index)``.
    size : int, default DEFAULT_SIZE
        Side of the square scene in pixels.
    objects : int or None, default None
        1 or 2 fixes the number of objects; ``None`` draws it (half the scenes have two).

    Returns
    -------
    TextScene
        ``image`` ``(size, size, 3)`` uint8 and its objects, each with a ``(size, size)`` bool mask.

    Raises
    ------
    ValueError
        ``objects`` is neither 1, 2 nor ``None``.
    """
    rng_obj = np.random.default_rng((int(seed), int(index), 10))
    rng = np.random.default_rng((int(seed), int(index), 11))
    count = int(rng_obj.integers(1, 3)) if objects is None else int(objects)
    if count not in (1, 2):
        raise ValueError(f"objects must be 1 or 2, not {objects}")
    labels = rng_obj.choice(len(CLASS_NAMES), size=count, replace=False)
    geometry = []  # (label, cx, cy, r, angle)
    if count == 1:
        r = rng_obj.uniform(*_SINGLE_RADIUS) * size
        cx, cy = rng_obj.uniform(0.8 * r, size - 0.8 * r, size=2)
        geometry.append((int(labels[0]), cx, cy, r, rng_obj.uniform(0, 2 * math.pi)))
    else:
        split_x = bool(rng_obj.integers(2))  # left/right halves, else top/bottom
        for half, label in enumerate(labels):
            r = rng_obj.uniform(*_PAIR_RADIUS) * size
            low, high = (0.8 * r, size / 2 - _BOUND * r) if half == 0 else (size / 2 + _BOUND * r, size - 0.8 * r)
            along, across = rng_obj.uniform(low, high), rng_obj.uniform(0.8 * r, size - 0.8 * r)
            cx, cy = (along, across) if split_x else (across, along)
            geometry.append((int(label), cx, cy, r, rng_obj.uniform(0, 2 * math.pi)))

    canvas = Image.fromarray(np.clip(random_background(rng, size), 0, 255).astype(np.uint8), "RGB")
    draw_distractors(ImageDraw.Draw(canvas), rng, size)
    img = np.array(canvas, dtype=np.float32)
    result, previous = [], None
    for label, cx, cy, r, angle in geometry:
        mask_img = Image.new("1", (size, size), 0)
        draw_object(ImageDraw.Draw(mask_img), label, cx, cy, r, angle, 1)
        mask = np.array(mask_img, dtype=bool)
        under = img[mask].mean(axis=0) if mask.any() else np.full(3, 128.0, dtype=np.float32)
        name, rgb = _object_colour(rng_obj, under, previous)
        shade = 1.0 + rng_obj.uniform(-0.12, 0.12) * ((np.mgrid[0:size, 0:size][0] - cy) / size)
        img[mask] = np.clip(rgb[None, None, :] * shade[..., None], 0, 255)[mask]
        result.append(SceneObject(label, name, (float(cx), float(cy)), mask))
        previous = name
    img += rng.normal(0, 6, size=img.shape).astype(np.float32)
    return TextScene(np.clip(img, 0, 255).astype(np.uint8), tuple(result))


def generate_text_scenes(
    n: int, seed: int, *, size: int = DEFAULT_SIZE, objects: int | None = None, start: int = 0
) -> list[TextScene]:
    """Scenes ``start .. start + n - 1`` of stream ``seed`` (see :func:`render_text_scene`).

    Parameters
    ----------
    n : int
        Number of scenes.
    seed : int
        The stream.
    size : int, default DEFAULT_SIZE
        Side of the square scenes in pixels.
    objects : int or None, default None
        As in :func:`render_text_scene`.
    start : int, default 0
        Index of the first scene.

    Returns
    -------
    list of TextScene
        ``n`` scenes.

    Raises
    ------
    ValueError
        ``objects`` is neither 1, 2 nor ``None``.
    """
    return [render_text_scene(seed, start + i, size, objects=objects) for i in range(n)]
