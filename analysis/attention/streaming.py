"""Dataset-level attention statistics that stream: memory does not grow with the image count.

``dataset_attention_distance`` reduces each layer's attention to per-image distances inside the
capture hook, as soon as the layer is computed, so no image's attention maps outlive its layer.
Decoding and preprocessing of the next batch run in worker threads while the current batch is
in the forward pass (PIL decoding releases the GIL).

Every layer is reduced by :func:`analysis.attention.distance.layer_attention_distance` as soon
as it is computed, on its windows (a ViT: one window of all its tokens, of which only the patch
rows are captured; Swin, SAM: the windows of the layer's stage grid); the head axis is the widest
layer's, NaN beyond a layer's own heads, as :func:`analysis.mean_attention_distance` gives it for
one batch. The uniform reference is one value per layer
(:func:`analysis.uniform_attention_distance_by_layer`).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Iterator, Sized
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice

import torch
from PIL import Image

from ..base.errors import AnalysisError
from ..base.images import load_image
from ..base.oom import run_with_oom_fallback
from ..base.progress import Progress
from ..engine.activations.run import visit_forward
from ..engine.capture import require_every_layer
from ..model.geometry import input_spec
from ..records.token_matrix import hook_windows
from .distance import layer_attention_distance

__all__ = ["dataset_attention_distance", "distance_heads", "iter_batches", "SkippedImage"]

ON_ERROR = ("raise", "skip")


@dataclass(frozen=True)
class SkippedImage:
    """An image of a set that could not be used: its position in the set and why.

    :func:`dataset_attention_distance` with ``on_error="skip"`` appends one per image it leaves out.

    Attributes
    ----------
    index : int
        The image's position in the iterable given (0 for the first).
    name : str
        What the image was: its path, ``"PIL image <w>x<h>"``, or the type name of anything else
        (bytes, a file object).
    reason : str
        The message of the error that decoding or preprocessing raised.
    """

    index: int
    name: str
    reason: str


def _describe(item) -> str:
    if isinstance(item, (str, os.PathLike)):
        return os.fspath(item)
    if isinstance(item, Image.Image):
        return f"PIL image {item.size[0]}x{item.size[1]}"
    return type(item).__name__


def _to_pixels(vit, item) -> torch.Tensor:
    image = item if isinstance(item, Image.Image) else load_image(item)
    return vit.preprocess(image)[0]  # (3, H, W)


def iter_batches(
    vit, images: Iterable, batch_size: int, workers: int, skipped: list[SkippedImage] | None = None
) -> Iterator[torch.Tensor]:
    """Yield the images as preprocessed batches; the next batch is decoded while the caller works.

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`load_vit`); each image goes through its ``preprocess`` to ``(3, H, W)``.
    images : Iterable
        PIL images or image paths / bytes, decoded in worker threads.
    batch_size : int
        Images per batch (the last may be shorter).
    workers : int
        Decode threads (at least 1 is used).
    skipped : list of SkippedImage or None, default None
        A list: images that fail to decode or preprocess (typed errors) are left out and a
        :class:`SkippedImage` appended for each. ``None``: the first failure is raised.

    Yields
    ------
    torch.Tensor
        ``(b, 3, H, W)`` float pixels on the CPU at the model's input size, ``b <= batch_size`` the
        images of the batch that could be used (a batch none of whose images could be used is not
        yielded).

    Raises
    ------
    ImageLoadError
        With ``skipped=None``, an image that cannot be decoded.
    AnalysisError
        With ``skipped=None``, an image that cannot be preprocessed.
    """
    iterator = enumerate(images)
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="vit-decode") as pool:

        def submit() -> list[tuple[int, object, Future]]:
            return [(i, item, pool.submit(_to_pixels, vit, item)) for i, item in islice(iterator, batch_size)]

        def collect(pending) -> list[torch.Tensor]:
            pixels = []
            for index, item, future in pending:
                try:
                    pixels.append(future.result())
                except ValueError as exc:  # ImageLoadError, AnalysisError: typed and explained
                    if skipped is None:
                        raise
                    skipped.append(SkippedImage(index, _describe(item), str(exc)))
            return pixels

        pending = submit()
        while pending:
            upcoming = submit()  # starts decoding batch n+1 before batch n is returned
            pixels = collect(pending)
            if pixels:
                yield torch.stack(pixels)
            pending = upcoming


def distance_heads(spec) -> int:
    """Length of the head axis of a distance result: the model's heads, or for a windowed model
    the most heads of any layer.

    Parameters
    ----------
    spec : ViTSpec, LoadedViT or AttentionRecord
        The model's :class:`ViTSpec`, or a LoadedViT / record, whose ``spec`` is used.

    Returns
    -------
    int
        ``spec.max_layer_heads``.
    """
    return getattr(spec, "spec", spec).max_layer_heads


def dataset_attention_distance(
    vit,
    images: Iterable,
    *,
    batch_size: int = 32,
    progress: Progress | None = None,
    renormalize: bool = True,
    precision: str = "auto",
    workers: int | None = None,
    on_error: str = "raise",
    skipped: list[SkippedImage] | None = None,
    per_image: bool = False,
) -> torch.Tensor:
    """Mean attention distance over a set of images, streamed batch by batch.

    Equals the mean over images of ``mean_attention_distance(capture_attention(vit, x),
    per_image=True)``, but only one layer of one batch's attention exists at any time. A windowed
    model (Swin, SAM): each layer on its own stage grid, the head axis :func:`distance_heads`
    long, NaN beyond a layer's own heads; read it against
    :func:`~analysis.uniform_attention_distance_by_layer`.

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`load_vit`); each image goes through its ``preprocess`` to ``(3, H, W)``
        pixels at the model's input size, run in batches ``(b, 3, H, W)``.
    images : Iterable
        Any iterable of PIL images or image paths / bytes (decoded in worker threads); a single
        image or path is refused (wrap it in a list).
    batch_size : int, default 32
        Images per forward pass (at least 1). On CUDA out-of-memory the batch is halved, and at
        batch 1 the work falls back to the CPU with a warning.
    progress : callable or None, default None
        Called as ``progress(done, total)`` after each batch, ``done`` counting used and skipped
        images (``total`` is ``None`` when ``images`` has no length).
    renormalize : bool, default True
        As in :func:`~analysis.mean_attention_distance`: each query's attention over cell keys
        divided by its sum, so attention spent on prefix or padding tokens does not shrink the
        distance.
    precision : str, default "auto"
        Autocast for the forward: ``"auto"`` (bfloat16 / float16 on CUDA, float32 elsewhere),
        ``"float32"``, ``"bfloat16"`` or ``"float16"``. The distances are reduced in float64 on
        the CPU, float32 on an accelerator.
    workers : int or None, default None
        Decode threads; ``None``: ``min(4, cpu count)``.
    on_error : str, default "raise"
        ``"raise"``: the first image that cannot be decoded raises its
        :class:`~analysis.base.errors.ImageLoadError`. ``"skip"``: such images are left out of
        the mean, each recorded in ``skipped`` as a :class:`SkippedImage` (index, name, reason); a
        :class:`RuntimeWarning` gives the count when no list is passed.
    skipped : list of SkippedImage or None, default None
        With ``on_error="skip"``, a list the skipped images are appended to (ignored with
        ``"raise"``).
    per_image : bool, default False
        Return every used image's ``(L, heads)`` distances, stacked, instead of the mean.

    Returns
    -------
    torch.Tensor
        ``(L, heads)`` float64, in input pixels, ``L`` every layer of the model (``(N, L, heads)``
        with ``per_image=True``, N the images used, in order).

    Raises
    ------
    AnalysisError
        ``batch_size`` not an integer of at least 1; ``on_error`` neither ``"raise"`` nor
        ``"skip"``; ``skipped`` not a list; ``images`` a single image or path; no images given,
        or none of them usable.
    ImageLoadError
        With ``on_error="raise"``, the first image that cannot be decoded.

    Warns
    -----
    RuntimeWarning
        Images skipped with no ``skipped`` list passed (the count); a batch of one that does not
        fit the device memory, run on the CPU instead.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise AnalysisError(f"batch_size must be an integer of at least 1, got {batch_size!r}.")
    if on_error not in ON_ERROR:
        raise AnalysisError(f"on_error must be one of {ON_ERROR}, got {on_error!r}.")
    if skipped is not None and not isinstance(skipped, list):
        raise AnalysisError(f"skipped must be a list to append SkippedImage records to, got {type(skipped).__name__}.")
    if isinstance(images, (str, bytes, os.PathLike, Image.Image)):
        raise AnalysisError("images must be an iterable of images or paths; wrap a single image in a list.")
    skip_log: list[SkippedImage] | None = None
    if on_error == "skip":
        skip_log = skipped if skipped is not None else []
    first_skipped = len(skip_log) if skip_log is not None else 0
    total = len(images) if isinstance(images, Sized) else None  # Sized: has __len__
    workers = workers or min(4, os.cpu_count() or 1)
    spec = vit.spec
    layers = tuple(range(spec.num_layers))
    prefix = spec.num_prefix_tokens
    # where prefix tokens share the patches' window (a ViT's one window, slot = token index), only the
    # patch rows are kept; windows without prefix slots stay whole
    patch_queries = list(range(prefix, prefix + spec.num_patches)) if prefix else None
    heads = distance_heads(spec)
    compute_dtype = torch.float64 if vit.device.type == "cpu" else torch.float32
    totals = torch.zeros(spec.num_layers, heads, dtype=torch.float64)
    kept: list[torch.Tensor] = []  # per-image (b, L, heads), only with per_image=True
    done = 0

    def run_batch(pixels: torch.Tensor, model, device: torch.device) -> torch.Tensor:
        batch_spec = input_spec(vit, pixels)
        per_layer = torch.full((pixels.shape[0], spec.num_layers, heads), float("nan"), dtype=torch.float64)
        seen: set[int] = set()

        def reduce(layer: int, probs: torch.Tensor) -> None:
            geometry = batch_spec.geometry(layer)
            windows, slots = hook_windows(probs), patch_queries  # (b, windows, heads, Q, Wt)
            if windows.shape[2] != geometry.num_heads or windows.shape[-1] != geometry.window_tokens:
                raise AnalysisError(
                    f"Layer {layer} attended over {windows.shape[-1]} tokens with {windows.shape[2]} heads, but the "
                    f"spec predicts {geometry.window_tokens} tokens and {geometry.num_heads} heads."
                )
            per_image = layer_attention_distance(
                windows, geometry, renormalize=renormalize, query_slots=slots, compute_dtype=compute_dtype
            )  # (b, heads)
            per_layer[:, layer, : geometry.num_heads] = per_image.double().cpu()
            seen.add(layer)

        hooks = {f"blocks.{layer}.attn.probs": (lambda probs, layer=layer: reduce(layer, probs)) for layer in layers}
        visit_forward(
            model,
            device,
            pixels,
            batch_spec,
            hooks,
            precision=precision,
            query_rows=None if patch_queries is None else tuple(patch_queries),
        )
        require_every_layer(layers, seen)  # a silent zero would be averaged in as data
        return per_layer

    def on_device(chunk: torch.Tensor) -> torch.Tensor:
        return run_batch(chunk, vit.model, vit.device)

    def on_cpu(chunk: torch.Tensor) -> torch.Tensor:
        return run_batch(chunk, vit.cpu_model(), torch.device("cpu"))

    for batch in iter_batches(vit, images, batch_size, workers, skip_log):
        per_image_batch = torch.cat(
            run_with_oom_fallback(on_device, batch, on_cpu if vit.device.type != "cpu" else None)
        )
        totals += per_image_batch.sum(0)
        if per_image:
            kept.append(per_image_batch)
        done += batch.shape[0]
        if progress is not None:
            progress(done + (len(skip_log) - first_skipped if skip_log is not None else 0), total)
    newly_skipped = skip_log[first_skipped:] if skip_log is not None else []
    if done == 0:
        if newly_skipped:
            reasons = "; ".join(f"{s.name}: {s.reason}" for s in newly_skipped[:3])
            raise AnalysisError(f"None of the {len(newly_skipped)} images could be used ({reasons}).")
        raise AnalysisError("No images were given: pass at least one image or path.")
    if newly_skipped and skipped is None:
        warnings.warn(
            f"{len(newly_skipped)} of {done + len(newly_skipped)} images were skipped (pass skipped=[] to see why).",
            RuntimeWarning,
            stacklevel=2,
        )
    if per_image:
        return torch.cat(kept)
    return totals / done
