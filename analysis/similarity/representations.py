"""Representation similarity between every layer of two models (or of one model with itself),
over a set of images: the instrument of Raghu et al. 2021, "Do Vision Transformers See Like
Convolutional Neural Networks?" (NeurIPS), with linear CKA (:mod:`analysis.similarity.cka`).

A layer's representation of an image is its whole output there, flattened: a transformer's
residual stream after each block (``blocks.{i}.resid_post`` of :mod:`analysis.engine.activations`:
``(T, D)`` for a ViT, the stage grid ``(gh, gw, C)`` for Swin and SAM), a CNN's output of each
stage (timm's ``forward_intermediates``, the stages its ``feature_info`` names). Each model
preprocesses the images with its own configuration.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..base.archives import IMAGE_SUFFIXES
from ..base.arguments import check_int
from ..base.errors import AnalysisError, ImageLoadError
from ..base.images import load_image
from ..demo.data import generate_samples
from ..engine.activations import run_with_cache
from ..model.loading import LoadedViT
from .cka import CKAAccumulator

__all__ = [
    "SimilarityResult",
    "accumulate_similarity",
    "block_outputs",
    "layer_names",
    "minibatches",
    "representation_similarity",
    "resolve_images",
]

DEMO_IMAGES = 64  # images="demo": this many generated demo scenes (stream 0)


@dataclass(frozen=True)
class SimilarityResult:
    """Linear CKA between the layers of two models over a set of images.

    What :func:`representation_similarity` returns.

    Attributes
    ----------
    matrix : numpy.ndarray
        ``(La, Lb)`` float64; ``matrix[i, j]`` compares layer ``layers_a[i]`` of the first model
        with layer ``layers_b[j]`` of the second (NaN where a layer's representation does not vary
        over the images).
    layers_a : tuple of str
        One name per compared layer of the first model (``"block 3"``, ``"layer2"``), along
        ``La``.
    layers_b : tuple of str
        One name per compared layer of the second model, along ``Lb``.
    estimator : str
        ``"minibatch"`` or ``"full"``.
    images : int
        How many images the matrix counts (the minibatch estimator leaves out a last batch of
        fewer than 4).
    """

    matrix: np.ndarray
    layers_a: tuple[str, ...]
    layers_b: tuple[str, ...]
    estimator: str
    images: int


def _is_transformer(model) -> bool:
    return isinstance(model, LoadedViT)


def _cnn_stages(model) -> list[str]:
    info = getattr(model.model, "feature_info", None)
    if not hasattr(model.model, "forward_intermediates") or info is None:
        raise AnalysisError(
            f"{getattr(model, 'name', type(model).__name__)}: representation similarity reads a transformer's blocks "
            "(load_vit) or a timm CNN's stages (load_cnn, a timm model with forward_intermediates)."
        )
    return [str(stage["module"]) for stage in info]


def layer_names(model) -> list[str]:
    """One name per layer whose output :func:`block_outputs` gives.

    Parameters
    ----------
    model : LoadedViT or LoadedCNN
        A transformer (:func:`~analysis.load_vit`) or a timm CNN (:func:`analysis.robustness.load_cnn`).

    Returns
    -------
    list of str
        ``"block i"`` for each block of a transformer (with its stage for a model of several stages:
        ``"block 4 (stage 2)"``), the stage modules of a CNN's ``feature_info`` (``"layer1"``, ...).

    Raises
    ------
    AnalysisError
        ``model`` is neither a transformer nor a timm CNN with ``forward_intermediates`` and
        ``feature_info``.
    """
    if _is_transformer(model):
        spec = model.spec
        stages = {spec.geometry(layer).stage for layer in range(spec.num_layers)}
        return [
            f"block {layer}" + (f" (stage {spec.geometry(layer).stage})" if len(stages) > 1 else "")
            for layer in range(spec.num_layers)
        ]
    return _cnn_stages(model)


def block_outputs(model, pixels: torch.Tensor, layers: Sequence[int]) -> list[torch.Tensor]:
    """The representations of ``layers`` for a batch of images: each layer's whole output, flattened
    per image (a transformer's ``blocks.{i}.resid_post``, a CNN's stage output).

    Parameters
    ----------
    model : LoadedViT or LoadedCNN
        A transformer (:func:`~analysis.load_vit`) or a timm CNN (:func:`analysis.robustness.load_cnn`).
    pixels : torch.Tensor
        ``(B, 3, H, W)`` images preprocessed by ``model.preprocess``.
    layers : Sequence of int
        Indices into :func:`layer_names` (not checked here).

    Returns
    -------
    list of torch.Tensor
        One ``(B, features)`` float32 tensor per layer, on the CPU: ``features = T·D`` for a ViT,
        ``gh·gw·C`` for a windowed model's stage grid, ``C·h·w`` for a CNN stage.

    Raises
    ------
    AnalysisError
        ``model`` is neither a transformer nor a timm CNN with ``forward_intermediates``.
    """
    if _is_transformer(model):
        names = [f"blocks.{layer}.resid_post" for layer in layers]
        cache = run_with_cache(model, pixels, names)
        return [cache[name].reshape(pixels.shape[0], -1).float().cpu() for name in names]
    _cnn_stages(model)
    with torch.no_grad():
        stages = model.model.forward_intermediates(pixels.to(model.device), intermediates_only=True)
    return [stages[layer].reshape(pixels.shape[0], -1).float().cpu() for layer in layers]


def resolve_images(images) -> list[Image.Image] | list[Path]:
    """``images`` as a list.

    Parameters
    ----------
    images : iterable of PIL.Image.Image or paths, str or os.PathLike
        A list (or other iterable) of PIL images or paths, kept as they are; a folder: its image
        files (not searched below it), sorted by name; ``"demo"``: :data:`DEMO_IMAGES` generated demo
        scenes of stream 0 (``"demo:N"`` for ``N``).

    Returns
    -------
    list of PIL.Image.Image or list of pathlib.Path
        The images or paths, in order.

    Raises
    ------
    AnalysisError
        A path that is not a folder, a folder without images, a single PIL image, or ``"demo:N"``
        with ``N`` below 1.
    ValueError
        ``"demo:N"`` with an ``N`` that is not an integer.
    """
    if isinstance(images, str) and (images == "demo" or images.startswith("demo:")):
        count = DEMO_IMAGES if images == "demo" else check_int("demo images", int(images.split(":", 1)[1]), minimum=1)
        return generate_samples(count, seed=0)[0]
    if isinstance(images, (str, os.PathLike)):
        folder = Path(images)
        if not folder.is_dir():
            raise AnalysisError(f"images={str(images)!r} is neither a folder of images nor 'demo'.")
        found = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not found:
            raise AnalysisError(f"The folder {folder} holds no image ({', '.join(IMAGE_SUFFIXES)}).")
        return found
    if isinstance(images, Image.Image):
        raise AnalysisError("images must be several images: wrap a single image in a list.")
    return list(images)


def _chosen(model, layers: Sequence[int] | None, which: str) -> list[int]:
    count = len(layer_names(model))
    if layers is None:
        return list(range(count))
    chosen = [check_int(f"{which} layer", layer) for layer in layers]
    bad = [layer for layer in chosen if not -count <= layer < count]
    if bad or not chosen:
        raise AnalysisError(
            f"{which}: layers {bad or '[]'} are not among this model's {count} layers (0..{count - 1})."
        )
    return [layer % count for layer in chosen]


def _pixels(model, batch: Iterable) -> torch.Tensor:
    return torch.cat([model.preprocess(image) for image in batch])


def _decoded(batch: Sequence, skipped: list[str] | None) -> list[Image.Image]:
    """The batch's images, decoded; one that cannot be read is left out and named in ``skipped``
    (``"name: reason"``), or raises ImageLoadError when ``skipped`` is None."""
    images = []
    for item in batch:
        if isinstance(item, Image.Image):
            images.append(item)
            continue
        try:
            images.append(load_image(item))
        except ImageLoadError as exc:
            if skipped is None:
                raise
            skipped.append(f"{item if isinstance(item, (str, os.PathLike)) else 'an image'}: {exc}")
    return images


def accumulate_similarity(
    model_a,
    batches: Iterable[Sequence],
    model_b=None,
    *,
    layers_a: Sequence[int] | None = None,
    layers_b: Sequence[int] | None = None,
    estimator: str = "minibatch",
    progress: Callable[[int], None] | None = None,
    skipped: list[str] | None = None,
) -> tuple[CKAAccumulator, tuple[str, ...], tuple[str, ...]]:
    """The CKA accumulator fed ``batches``, with the names of the layers compared: what
    :func:`representation_similarity` and the command line (one process per share of the
    minibatches, :meth:`CKAAccumulator.reduce`) build on.

    Parameters
    ----------
    model_a : LoadedViT or LoadedCNN
        A transformer (:func:`~analysis.load_vit`) or a timm CNN (:func:`analysis.robustness.load_cnn`).
    batches : Iterable of Sequence
        The minibatches, each a list of PIL images or image paths / bytes (one forward pass and,
        with ``"minibatch"``, one HSIC estimate each).
    model_b : LoadedViT, LoadedCNN or None, default None
        The second model; ``None`` compares ``model_a`` with itself (each layer read once).
    layers_a : Sequence of int or None, default None
        Indices into :func:`layer_names` of ``model_a`` (negative ones count from the end);
        ``None``: every layer.
    layers_b : Sequence of int or None, default None
        The same for ``model_b`` (``model_a`` when ``model_b`` is ``None``).
    estimator : str, default "minibatch"
        ``"minibatch"`` or ``"full"`` (:class:`CKAAccumulator`).
    progress : Callable[[int], None] or None, default None
        Called with the number of images of each batch (skipped ones included) after it.
    skipped : list of str or None, default None
        A list that names each image that could not be decoded (``"name: reason"``), left out of its
        minibatch; without it such an image raises.

    Returns
    -------
    tuple of (CKAAccumulator, tuple of str, tuple of str)
        ``(accumulator, names_a, names_b)``: the fed accumulator (its :meth:`~CKAAccumulator.matrix`
        is ``(La, Lb)``) and the names of the compared layers of each model.

    Raises
    ------
    AnalysisError
        ``estimator`` unknown, a layer index outside its model (or no layer), a model that is
        neither a transformer nor a timm CNN with ``forward_intermediates``.
    ImageLoadError
        An image cannot be decoded and ``skipped`` is ``None``.
    """
    second = model_a if model_b is None else model_b
    chosen_a, chosen_b = _chosen(model_a, layers_a, "model_a"), _chosen(second, layers_b, "model_b")
    accumulator = CKAAccumulator(estimator)
    union = sorted(set(chosen_a) | set(chosen_b))  # one model with itself: each layer read once
    with torch.no_grad():
        for given in batches:
            batch = _decoded(given, skipped)
            if not batch:
                continue
            if model_b is None:
                by_layer = dict(zip(union, block_outputs(model_a, _pixels(model_a, batch), union)))
                features_a = [by_layer[layer] for layer in chosen_a]
                features_b = None if chosen_a == chosen_b else [by_layer[layer] for layer in chosen_b]
            else:
                features_a = block_outputs(model_a, _pixels(model_a, batch), chosen_a)
                features_b = block_outputs(model_b, _pixels(model_b, batch), chosen_b)
            accumulator.add(features_a, features_b)
            if progress is not None:
                progress(len(given))
    names_a, names_b = layer_names(model_a), layer_names(second)
    return accumulator, tuple(names_a[layer] for layer in chosen_a), tuple(names_b[layer] for layer in chosen_b)


def minibatches(items: Sequence, batch_size: int) -> list[Sequence]:
    """``items`` in consecutive minibatches of ``batch_size`` (the last one may be shorter).

    Parameters
    ----------
    items : Sequence
        Images or paths, sliced as they are.
    batch_size : int
        Items per minibatch (not checked; at least 1).

    Returns
    -------
    list of Sequence
        The slices of ``items``, in order.
    """
    return [items[start : start + batch_size] for start in range(0, len(items), batch_size)]


def representation_similarity(
    model_a,
    images,
    model_b=None,
    *,
    layers_a: Sequence[int] | None = None,
    layers_b: Sequence[int] | None = None,
    estimator: str = "minibatch",
    batch_size: int = 32,
    kernel: str = "linear",
    progress: Callable[[int, int], None] | None = None,
) -> SimilarityResult:
    """Linear CKA between every layer of ``model_a`` and every layer of ``model_b`` over ``images``.

    Each layer's representation of an image is its whole output there, flattened (see the module
    docstring); each model preprocesses the images with its own configuration.

    Parameters
    ----------
    model_a : LoadedViT or LoadedCNN
        A :class:`~analysis.model.loading.LoadedViT` (any family, windowed ones included) or a timm
        CNN (:func:`analysis.robustness.load_cnn`).
    images : iterable of PIL.Image.Image or paths, str or os.PathLike
        A list (or other iterable) of PIL images or image paths, a folder of images, or ``"demo"``
        (``"demo:N"`` for ``N`` generated scenes; see :func:`resolve_images`). At least 2 images.
    model_b : LoadedViT, LoadedCNN or None, default None
        The second model, as ``model_a``; ``None`` compares ``model_a`` with itself (a symmetric
        matrix with a diagonal of 1).
    layers_a : sequence of int or None, default None
        Indices into :func:`layer_names` of ``model_a`` (negative ones count from the end);
        ``None``: every layer.
    layers_b : sequence of int or None, default None
        The same for ``model_b`` (``model_a`` when ``model_b`` is ``None``).
    estimator : str, default "minibatch"
        ``"minibatch"`` (Nguyen et al. 2021: unbiased HSIC per minibatch of ``batch_size`` images,
        averaged; one batch in memory) or ``"full"`` (Kornblith et al. 2019 on the whole set;
        every image's representations in memory).
    batch_size : int, default 32
        Images per forward pass, and per minibatch of the estimator (at least 4 with
        ``estimator="minibatch"``, at least 1 with ``"full"``).
    kernel : str, default "linear"
        ``"linear"`` (the only one: CKA with a linear kernel).
    progress : callable or None, default None
        Called with ``(images done, images in all)`` after each batch.

    Returns
    -------
    SimilarityResult
        The ``(La, Lb)`` float64 CKA matrix with the compared layers' names, the estimator and
        the number of images counted.

    Raises
    ------
    AnalysisError
        ``kernel`` is not ``"linear"``, ``estimator`` is neither ``"minibatch"`` nor ``"full"``,
        ``batch_size`` is too small, ``images`` holds fewer than 2 images (or is a single image,
        or a path that is not a folder of images), the minibatch estimator got no minibatch of at
        least 4 images, a layer index is outside its model, or a model is neither a transformer
        nor a timm CNN with ``forward_intermediates``.
    ImageLoadError
        An image path cannot be decoded.
    """
    if kernel != "linear":
        raise AnalysisError(f"kernel must be 'linear' (linear CKA), not {kernel!r}.")
    batch_size = check_int("batch_size", batch_size, minimum=4 if estimator == "minibatch" else 1)
    items = resolve_images(images)
    if len(items) < 2:
        raise AnalysisError(f"Representation similarity needs at least 2 images, got {len(items)}.")
    done = 0

    def advance(count: int) -> None:
        nonlocal done
        done += count
        if progress is not None:
            progress(done, len(items))

    accumulator, names_a, names_b = accumulate_similarity(
        model_a,
        minibatches(items, batch_size),
        model_b,
        layers_a=layers_a,
        layers_b=layers_b,
        estimator=estimator,
        progress=advance,
    )
    return SimilarityResult(
        matrix=accumulator.matrix().numpy(),
        layers_a=names_a,
        layers_b=names_b,
        estimator=estimator,
        images=accumulator.images_used,
    )
