"""Texture removal and shape bias: does a model read an object's shape or its texture?

Naseer et al. 2021 ("Intriguing Properties of Vision Transformers", Section 3.2) take the texture away
from images and find ViTs keep more of their accuracy than CNNs. Here, for any image:

* **silhouette**: the object's mask filled flat black on a white ground, as Geirhos et al. 2019's
  silhouettes; it needs the object's mask (known in the demo scenes);
* **edges**: a Sobel gradient-magnitude edge map, dark edges on white (:func:`edge_map`);
* **kuwahara**: the Kuwahara filter, an edge-preserving smoothing that flattens texture inside regions
  and keeps their outlines (:func:`kuwahara`).

:func:`texture_curve` scores each model on the clean images and on each probe. The **shape bias**
(Geirhos et al. 2019, ICLR, "ImageNet-trained CNNs are biased towards texture; increasing shape bias
improves accuracy and robustness") is read on cue-conflict images, whose shape says one class and
whose texture another (:func:`shape_bias`, :func:`shape_bias_of`).

Grey level, wherever a probe needs one, is the ITU-R BT.601 luma ``Y = 0.299·R + 0.587·G + 0.114·B``
(in float, 0–255).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from PIL import Image

from ..base.errors import AnalysisError
from ..base.progress import Progress, tell
from ..model.loading.loaded import LoadedModel

__all__ = [
    "TEXTURE_PROBES",
    "ShapeBias",
    "TextureCurve",
    "TextureError",
    "edge_map",
    "kuwahara",
    "remove_texture",
    "shape_bias",
    "shape_bias_of",
    "sobel_magnitude",
    "texture_curve",
]

#: probe name -> what it leaves of the image
TEXTURE_PROBES = {
    "silhouette": "the object's mask filled flat black on white (needs the object's mask)",
    "edges": "Sobel gradient-magnitude edge map of the grey image, dark edges on white",
    "kuwahara": "Kuwahara filter: each pixel the mean colour of its least-varying quadrant window",
}

#: the luma weights of ITU-R BT.601 (R, G, B)
_LUMA = np.array([0.299, 0.587, 0.114])
#: a Sobel kernel (x-derivative; the y-derivative is its transpose), applied as a correlation
_SOBEL_X = np.array([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]])
_BATCH = 32


class TextureError(AnalysisError):
    """A texture probe or a shape-bias count was given bad input: an unknown probe, a silhouette without
    the object's mask, a mask of another size, or labels that do not match the images."""


def _rgb(image) -> np.ndarray:
    """uint8 ``(H, W, 3)`` of a PIL image or an array (``(H, W)`` grey or ``(H, W, 3)``)."""
    if isinstance(image, Image.Image):
        return np.asarray(image.convert("RGB"), dtype=np.uint8)
    array = np.asarray(image)
    if array.ndim == 2:
        array = np.repeat(array[..., None], 3, axis=2)
    if array.ndim != 3 or array.shape[2] != 3:
        raise TextureError(f"An image of shape {array.shape}: give a PIL image or an (H, W, 3) uint8 array.")
    return np.clip(array, 0, 255).astype(np.uint8)


def _grey(rgb: np.ndarray) -> np.ndarray:
    """float64 ``(H, W)`` BT.601 luma of uint8 ``(H, W, 3)``."""
    return rgb.astype(np.float64) @ _LUMA


def _check_mask(mask, height: int, width: int) -> np.ndarray:
    if mask is None:
        raise TextureError(
            "The silhouette probe needs the object's mask: pass mask= a boolean (H, W) array "
            "(the demo scenes give one), or choose the 'edges' or 'kuwahara' probe."
        )
    mask = np.asarray(mask)
    if mask.shape != (height, width):
        raise TextureError(
            f"A mask of shape {mask.shape} for a {height}x{width} image: give one boolean per pixel, (H, W)."
        )
    if mask.dtype != bool:
        if not np.isin(mask, (0, 1)).all():
            raise TextureError("The mask holds values other than 0 and 1: give a boolean (H, W) array.")
        mask = mask.astype(bool)
    return mask


def _flat(mask) -> np.ndarray:
    """uint8 ``(H, W, 3)``: black (0) where ``mask`` is true, white (255) elsewhere."""
    mask = np.asarray(mask, dtype=bool)
    return np.repeat(np.where(mask, 0, 255).astype(np.uint8)[..., None], 3, axis=2)


def sobel_magnitude(grey: np.ndarray) -> np.ndarray:
    """float64 ``(H, W)`` gradient magnitude ``M = √(Gx² + Gy²)`` of a grey image, where ``Gx`` and
    ``Gy`` are the 3×3 Sobel kernels ``[[−1, 0, 1], [−2, 0, 2], [−1, 0, 1]]`` and its transpose applied as
    a correlation (``G(y, x) = Σ_{i,j∈{−1,0,1}} K(i, j)·I(y+i, x+j)``), the border replicated.

    Parameters
    ----------
    grey : numpy.ndarray
        ``(H, W)`` grey image, any real dtype (e.g. BT.601 luma in 0–255).

    Returns
    -------
    numpy.ndarray
        ``(H, W)`` float64, 0 or more.
    """
    height, width = grey.shape
    padded = np.pad(grey.astype(np.float64), 1, mode="edge")  # (H+2, W+2)
    gx = np.zeros((height, width))
    gy = np.zeros((height, width))
    for i in range(3):
        for j in range(3):
            window = padded[i : i + height, j : j + width]
            gx += _SOBEL_X[i, j] * window
            gy += _SOBEL_X[j, i] * window
    return np.sqrt(gx**2 + gy**2)


def edge_map(image, *, threshold: float = 0.2) -> Image.Image:
    """The image's edges, dark on white.

    The grey level ``Y`` (BT.601 luma) gives the Sobel magnitude ``M = √(Gx² + Gy²)``
    (:func:`sobel_magnitude`, border replicated); a pixel is an edge, black (0), when
    ``M > 0`` and ``M ≥ threshold · max M`` over the image, and white (255) otherwise. A flat image
    has no edges (all white).

    Parameters
    ----------
    image : PIL.Image.Image or numpy.ndarray
        A PIL image, or an ``(H, W)`` grey or ``(H, W, 3)`` array (clipped to 0–255, as uint8).
    threshold : float, default 0.2
        In ``(0, 1]``: the fraction of the largest gradient magnitude that makes an edge.

    Returns
    -------
    PIL.Image.Image
        RGB, ``H × W``, black edges on white.

    Raises
    ------
    TextureError
        ``threshold`` outside ``(0, 1]``; an array that is neither ``(H, W)`` nor ``(H, W, 3)``.
    """
    if not 0 < threshold <= 1:
        raise TextureError(
            f"threshold={threshold!r}: the edge threshold is a fraction of the largest gradient, in (0, 1]."
        )
    magnitude = sobel_magnitude(_grey(_rgb(image)))
    edges = (magnitude > 0) & (magnitude >= threshold * magnitude.max())
    return Image.fromarray(_flat(edges), "RGB")


def kuwahara(image, *, radius: int = 2) -> Image.Image:
    """The Kuwahara filter (Kuwahara et al. 1976): texture smoothed away, edges kept.

    Around each pixel ``(y, x)`` lie four overlapping ``(r+1)×(r+1)`` quadrant windows,
    rows ``[y−r, y]`` or ``[y, y+r]`` by columns ``[x−r, x]`` or ``[x, x+r]`` (``r = radius``,
    the border replicated). The pixel takes the mean colour (each of R, G, B, rounded) of the window
    whose grey level ``Y`` (BT.601 luma) has the least variance ``mean(Y²) − mean(Y)²``; on a tie the
    first of top-left, top-right, bottom-left, bottom-right. Vectorised over all pixels at once.

    Parameters
    ----------
    image : PIL.Image.Image or numpy.ndarray
        A PIL image, or an ``(H, W)`` grey or ``(H, W, 3)`` array (clipped to 0–255, as uint8).
    radius : int, default 2
        ``r``, a whole number of pixels, 1 or more.

    Returns
    -------
    PIL.Image.Image
        RGB, ``H × W``.

    Raises
    ------
    TextureError
        ``radius`` not a whole number ``>= 1``; an array that is neither ``(H, W)`` nor ``(H, W, 3)``.
    """
    if int(radius) != radius or radius < 1:
        raise TextureError(f"radius={radius!r}: the Kuwahara radius is a whole number of pixels, 1 or more.")
    r = int(radius)
    rgb = _rgb(image)
    height, width = rgb.shape[:2]
    padded = np.pad(rgb.astype(np.float64), ((r, r), (r, r), (0, 0)), mode="edge")  # (H+2r, W+2r, 3)
    grey = padded @ _LUMA  # (H+2r, W+2r)
    # Every (r+1)x(r+1) window by its top-left corner (a, b) of the padded image: (H+r, W+r, ...).
    grey_windows = sliding_window_view(grey, (r + 1, r + 1))  # (H+r, W+r, r+1, r+1)
    variance = grey_windows.var(axis=(-2, -1))  # (H+r, W+r)
    colour = sliding_window_view(padded, (r + 1, r + 1), axis=(0, 1)).mean(axis=(-2, -1))  # (H+r, W+r, 3)
    # Pixel (y, x) sits at (y+r, x+r) of the padded image: its quadrants start at (y+dy, x+dx).
    offsets = [(0, 0), (0, r), (r, 0), (r, r)]  # top-left, top-right, bottom-left, bottom-right
    variances = np.stack([variance[dy : dy + height, dx : dx + width] for dy, dx in offsets])  # (4, H, W)
    colours = np.stack([colour[dy : dy + height, dx : dx + width] for dy, dx in offsets])  # (4, H, W, 3)
    best = variances.argmin(axis=0)  # (H, W)
    chosen = np.take_along_axis(colours, best[None, :, :, None], axis=0)[0]  # (H, W, 3)
    return Image.fromarray(np.clip(np.rint(chosen), 0, 255).astype(np.uint8), "RGB")


def _check_probe(probe: str) -> None:
    if probe not in TEXTURE_PROBES:
        raise TextureError(f"Unknown texture probe {probe!r}: choose one of {', '.join(TEXTURE_PROBES)}.")


def remove_texture(image, probe: str, *, mask=None, radius: int = 2, threshold: float = 0.2) -> Image.Image:
    """``image`` (PIL or uint8 array) with its texture taken away by ``probe`` (a key of
    :data:`TEXTURE_PROBES`), as an RGB PIL image of the same size.

    Parameters
    ----------
    image : PIL.Image.Image or numpy.ndarray
        The picture: a PIL image, or an ``(H, W)`` grey or ``(H, W, 3)`` uint8 array.
    probe : str
        ``"silhouette"``, ``"edges"`` or ``"kuwahara"``.
    mask : numpy.ndarray or None, default None
        The object's pixels, boolean (or 0/1) ``(H, W)``; the silhouette needs it, the others ignore it.
    radius : int, default 2
        The Kuwahara radius (:func:`kuwahara`).
    threshold : float, default 0.2
        The edge threshold, a fraction of the largest gradient (:func:`edge_map`).

    Returns
    -------
    PIL.Image.Image
        RGB, ``H × W``.

    Raises
    ------
    TextureError
        An unknown probe; a silhouette without a mask, or with a mask of another size or with values
        other than 0 and 1; a bad ``radius`` or ``threshold`` for the probe that uses it; an array that
        is neither ``(H, W)`` nor ``(H, W, 3)``.
    """
    _check_probe(probe)
    if probe == "silhouette":
        rgb = _rgb(image)
        return Image.fromarray(_flat(_check_mask(mask, *rgb.shape[:2])), "RGB")
    if probe == "edges":
        return edge_map(image, threshold=threshold)
    return kuwahara(image, radius=radius)


@dataclass(frozen=True)
class TextureCurve:
    """Top-1 accuracy of each model on clean images and on each texture probe of them.

    Attributes
    ----------
    probes : tuple of str
        The probes measured (keys of :data:`TEXTURE_PROBES`), in order.
    clean : dict of str to float
        Model name -> the clean accuracy.
    accuracy : dict of str to numpy.ndarray
        Model name -> ``(len(probes),)`` float64, one accuracy per probe in the order of ``probes``.
    images : int
        How many images each accuracy is over.
    """

    probes: tuple[str, ...]
    clean: dict[str, float]
    accuracy: dict[str, np.ndarray]
    images: int


def texture_curve(
    models: Mapping[str, LoadedModel],
    images: Sequence,
    labels: Sequence[int],
    *,
    probes: Sequence[str] | None = None,
    masks: Sequence | np.ndarray | None = None,
    radius: int = 2,
    threshold: float = 0.2,
    progress: Progress | None = None,
) -> TextureCurve:
    """Accuracy of each model (``{name: loaded model}``) on ``images`` (PIL or uint8) and on each
    texture probe of them, against their true ``labels`` (indices in every model's classes).

    Each image is probed once (:func:`remove_texture`) and every model sees that same picture through its
    own preprocessing.

    Parameters
    ----------
    models : Mapping of str to LoadedModel
        ``{name: loaded model}``, classifiers (ViTs and CNNs).
    images : Sequence
        PIL images or uint8 ``(H, W, 3)`` (or grey ``(H, W)``) arrays; at least one.
    labels : Sequence of int
        The true classes, one per image.
    probes : Sequence of str or None, default None
        Keys of :data:`TEXTURE_PROBES`; ``None``, all of them when ``masks`` are given, else those
        that need no mask.
    masks : Sequence or numpy.ndarray or None, default None
        One boolean ``(H, W)`` object mask per image (the silhouette needs them).
    radius : int, default 2
        The Kuwahara radius (:func:`kuwahara`).
    threshold : float, default 0.2
        The edge threshold (:func:`edge_map`).
    progress : Progress or None, default None
        Called as ``progress(done, total)`` after the clean step and after each probe
        (:mod:`analysis.base.progress`).

    Returns
    -------
    TextureCurve
        The clean accuracy and one accuracy per probe, per model.

    Raises
    ------
    TextureError
        No images, a label or mask count other than the image count, an unknown probe, or
        the silhouette without masks (or with a mask of another size).
    """
    if not images or len(labels) != len(images):
        raise TextureError(f"{len(images)} images and {len(labels)} labels: give one label per image, at least one.")
    if masks is not None and len(masks) != len(images):
        raise TextureError(f"{len(masks)} masks for {len(images)} images: give one mask per image.")
    if probes is None:
        probes = [p for p in TEXTURE_PROBES if masks is not None or p != "silhouette"]
    for probe in probes:
        _check_probe(probe)
    clean = [Image.fromarray(_rgb(image), "RGB") for image in images]
    truth = np.asarray(labels, dtype=np.int64)
    total = 1 + len(probes)
    scores = {m: [float((model.top1(clean) == truth).mean())] for m, model in models.items()}
    tell(progress, 1, total)
    for step, probe in enumerate(probes, start=2):
        probed = [
            remove_texture(image, probe, mask=None if masks is None else masks[i], radius=radius, threshold=threshold)
            for i, image in enumerate(clean)
        ]
        for m, model in models.items():
            scores[m].append(float((model.top1(probed) == truth).mean()))
        tell(progress, step, total)
    return TextureCurve(
        tuple(probes),
        {m: row[0] for m, row in scores.items()},
        {m: np.asarray(row[1:]) for m, row in scores.items()},
        len(images),
    )


@dataclass(frozen=True)
class ShapeBias:
    """A model's decisions on cue-conflict images (:func:`shape_bias`). ``fraction`` is the shape
    bias ``shape / (shape + texture)`` (NaN when no decision followed either cue; ``note`` says why).

    Attributes
    ----------
    shape : int
        Decisions for the shape's class.
    texture : int
        Decisions for the texture's class.
    neither : int
        Decisions for any other class.
    """

    shape: int
    texture: int
    neither: int

    @property
    def fraction(self) -> float:
        """``shape / (shape + texture)``; NaN when no decision followed either cue (see ``note``)."""
        decided = self.shape + self.texture
        return self.shape / decided if decided else float("nan")

    @property
    def note(self) -> str:
        """Why ``fraction`` is NaN, or ``""``."""
        if self.shape + self.texture:
            return ""
        return (
            f"No decision followed the shape or the texture (all {self.neither} were another class): "
            "the shape bias is undefined."
        )


def shape_bias(
    predictions: Sequence[int] | np.ndarray,
    shape_labels: Sequence[int] | np.ndarray,
    texture_labels: Sequence[int] | np.ndarray,
) -> ShapeBias:
    """The shape bias of one model's ``predictions`` on cue-conflict images.

    Geirhos et al. 2019 (ICLR, "ImageNet-trained CNNs are biased towards texture; increasing shape bias
    improves accuracy and robustness", Section 2.3): over cue-conflict images, whose shape is of class
    ``shape_labels[i]`` and texture of class ``texture_labels[i]`` (different), count the decisions for
    the shape's class and for the texture's class; the shape bias is
    ``shape decisions / (shape decisions + texture decisions)``. Decisions for any other class count
    as ``neither`` and are left out of the fraction.

    Parameters
    ----------
    predictions : Sequence of int or numpy.ndarray
        ``(N,)`` the model's predicted class per image.
    shape_labels : Sequence of int or numpy.ndarray
        ``(N,)`` the class of each image's shape.
    texture_labels : Sequence of int or numpy.ndarray
        ``(N,)`` the class of each image's texture, not its shape's.

    Returns
    -------
    ShapeBias
        The counts; its ``fraction`` is the shape bias.

    Raises
    ------
    TextureError
        The three sequences differ in length, or an image's shape and texture classes
        agree (it is no cue conflict).
    """
    decisions, shapes, textures = (
        np.asarray(x, dtype=np.int64).reshape(-1) for x in (predictions, shape_labels, texture_labels)
    )
    if not len(decisions) == len(shapes) == len(textures):
        raise TextureError(
            f"{len(decisions)} predictions, {len(shapes)} shape labels and {len(textures)} texture labels: "
            "give one of each per cue-conflict image."
        )
    agree = np.flatnonzero(shapes == textures)
    if agree.size:
        raise TextureError(
            f"Images {agree[:5].tolist()} have the same shape and texture class: a cue-conflict image's "
            "texture must say another class than its shape."
        )
    on_shape = int(np.count_nonzero(decisions == shapes))
    on_texture = int(np.count_nonzero(decisions == textures))
    return ShapeBias(on_shape, on_texture, len(decisions) - on_shape - on_texture)


def shape_bias_of(
    models: Mapping[str, LoadedModel], scenes: Sequence, *, progress: Progress | None = None
) -> dict[str, ShapeBias]:
    """The shape bias (:func:`shape_bias`) of each model over cue-conflict ``scenes``.

    Parameters
    ----------
    models : Mapping of str to LoadedModel
        ``{name: loaded model}``, classifiers.
    scenes : Sequence
        Cue-conflict scenes, each an ``(image, shape_class, texture_class, ...)`` tuple, as
        ``analysis.demo.cue_conflict.cue_conflict_scenes`` makes them (the image PIL or uint8 array).
    progress : Progress or None, default None
        Called as ``progress(done, total)`` after each model (:mod:`analysis.base.progress`).

    Returns
    -------
    dict of str to ShapeBias
        ``{name: ShapeBias}``, one per model.

    Raises
    ------
    TextureError
        No scenes, or a scene whose shape and texture classes agree.
    """
    if not scenes:
        raise TextureError("No cue-conflict scenes: give at least one (image, shape_class, texture_class) scene.")
    images = [Image.fromarray(_rgb(scene[0]), "RGB") for scene in scenes]
    shapes = [int(scene[1]) for scene in scenes]
    textures = [int(scene[2]) for scene in scenes]
    result = {}
    for done, (name, model) in enumerate(models.items(), start=1):
        result[name] = shape_bias(model.top1(images), shapes, textures)
        tell(progress, done, len(models))
    return result
