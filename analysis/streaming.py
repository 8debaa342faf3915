"""Dataset-level attention statistics that stream: memory does not grow with the image count.

``dataset_attention_distance`` reduces each layer's attention to per-image distances inside the
capture hook, as soon as the layer is computed, so no image's attention maps outlive its layer.
Decoding and preprocessing of the next batch run in worker threads while the current batch is
in the forward pass (PIL decoding releases the GIL).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import islice

import torch
from PIL import Image

from .capture import attention_taps, input_spec
from .devices import autocast_context
from .distance import attention_distance_per_image, patch_distance_matrix
from .errors import AnalysisError
from .images import load_image
from .oom import run_with_oom_fallback

__all__ = ["dataset_attention_distance", "iter_batches"]

Progress = Callable[[int, int | None], None]


def _to_pixels(vit, item) -> torch.Tensor:
    image = item if isinstance(item, Image.Image) else load_image(item)
    return vit.preprocess(image)[0]  # (3, H, W)


def iter_batches(vit, images: Iterable, batch_size: int, workers: int) -> Iterator[torch.Tensor]:
    """Yield ``(b, 3, H, W)`` batches; the next batch is decoded while the caller works."""
    iterator = iter(images)
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="vit-decode") as pool:

        def submit() -> list[Future]:
            return [pool.submit(_to_pixels, vit, item) for item in islice(iterator, batch_size)]

        pending = submit()
        while pending:
            upcoming = submit()  # starts decoding batch n+1 before batch n is returned
            yield torch.stack([future.result() for future in pending])
            pending = upcoming


def dataset_attention_distance(
    vit,
    images: Iterable,
    *,
    batch_size: int = 32,
    progress: Progress | None = None,
    renormalize: bool = True,
    precision: str = "auto",
    workers: int | None = None,
) -> torch.Tensor:
    """Mean attention distance over a set of images, streamed batch by batch.

    Equals the mean over images of ``mean_attention_distance(capture_attention(vit, x),
    per_image=True)``, but only one layer of one batch's attention exists at any time.

    Args:
        images: any iterable of PIL images or image paths / bytes (decoded in worker threads).
        batch_size: images per forward pass. On CUDA out-of-memory the batch is halved, and
            at batch 1 the work falls back to the CPU with a warning.
        progress: called as ``progress(done, total)`` after each batch (``total`` is ``None``
            when ``images`` has no length).
        workers: decode threads (default: ``min(4, cpu count)``).

    Returns:
        ``(L, heads)`` float64, in input pixels.
    """
    if batch_size < 1:
        raise AnalysisError(f"batch_size must be at least 1, got {batch_size}.")
    total = len(images) if hasattr(images, "__len__") else None
    workers = workers or min(4, os.cpu_count() or 1)
    spec = vit.spec
    layers = tuple(range(spec.num_layers))
    prefix = spec.num_prefix_tokens
    patch_queries = list(range(prefix, prefix + spec.num_patches))
    distances_on: dict[torch.device, torch.Tensor] = {}
    compute_dtype = torch.float64 if vit.device.type == "cpu" else torch.float32
    totals = torch.zeros(spec.num_layers, spec.num_heads, dtype=torch.float64)
    done = 0

    def run_batch(pixels: torch.Tensor, model, device: torch.device) -> torch.Tensor:
        batch_spec = input_spec(vit, pixels)
        per_layer = torch.zeros(spec.num_layers, spec.num_heads, dtype=torch.float64)

        def reduce(layer: int, probs: torch.Tensor) -> None:  # probs (b, heads, N, T)
            if probs.device not in distances_on:
                distances_on[probs.device] = patch_distance_matrix(batch_spec).to(probs.device)
            per_image = attention_distance_per_image(
                probs, batch_spec, distances_on[probs.device], renormalize=renormalize, compute_dtype=compute_dtype
            )  # (b, heads)
            per_layer[layer] = per_image.sum(0).double().cpu()

        with torch.no_grad(), attention_taps(model, layers, reduce, query_tokens=patch_queries):
            with autocast_context(device, precision):
                model(pixels.to(device, non_blocking=True))
        return per_layer

    def on_device(chunk: torch.Tensor) -> torch.Tensor:
        return run_batch(chunk, vit.model, vit.device)

    def on_cpu(chunk: torch.Tensor) -> torch.Tensor:
        return run_batch(chunk, vit.cpu_model(), torch.device("cpu"))

    for batch in iter_batches(vit, images, batch_size, workers):
        totals += sum(run_with_oom_fallback(on_device, batch, on_cpu if vit.device.type != "cpu" else None))
        done += batch.shape[0]
        if progress is not None:
            progress(done, total)
    if done == 0:
        raise AnalysisError("No images were given: pass at least one image or path.")
    return totals / done
