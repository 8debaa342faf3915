"""Head effects over an image set: the mean zero-ablation effect and the mean direct logit
attribution of every head, streamed batch by batch (:func:`analysis.attention.streaming.iter_batches`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from ..attention.streaming import SkippedImage, iter_batches
from ..base.errors import AnalysisError
from .ablation import head_ablation
from .attribution import direct_logit_attribution

__all__ = ["HeadEffectSums", "dataset_head_effects"]


@dataclass(frozen=True)
class HeadEffectSums:
    """Sums over the images used (divide by ``count`` for means; sums add across shards), what
    :func:`dataset_head_effects` returns.

    Attributes
    ----------
    delta_logit : torch.Tensor
        ``(L, heads)`` float64: Σ over images of the change of the predicted class's logit when
        the head's output is zeroed (:func:`head_ablation`).
    delta_probability : torch.Tensor
        ``(L, heads)`` float64: the same for the predicted class's probability.
    direct_logit : torch.Tensor
        ``(L, heads)`` float64: Σ over images of the head's direct logit attribution to the
        predicted class (:func:`direct_logit_attribution`); all NaN where the model's readout
        refuses it.
    count : int
        Images used.
    skipped : tuple of SkippedImage, default ()
        Images that could not be read.
    attribution_note : str, default ""
        Why ``direct_logit`` is NaN, or ``""``.
    """

    delta_logit: torch.Tensor
    delta_probability: torch.Tensor
    direct_logit: torch.Tensor
    count: int
    skipped: tuple[SkippedImage, ...] = ()
    attribution_note: str = ""


def dataset_head_effects(
    vit,
    images: Iterable,
    *,
    batch_size: int = 16,
    workers: int | None = None,
    progress: Callable[[int, int | None], None] | None = None,
) -> HeadEffectSums:
    """Zero-ablate each head and attribute the logit to each head, on every readable image of
    ``images``, for each image's own predicted class, streamed batch by batch.

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`), with a class head.
    images : Iterable
        Image paths, bytes or PIL images (read into a list first); unreadable ones are skipped and
        listed in ``skipped``.
    batch_size : int, default 16
        Images per batch.
    workers : int or None, default None
        Decode threads; ``None``: ``min(8, cpu count)``.
    progress : callable or None, default None
        Called as ``progress(done, total)`` after each batch, ``done`` counting used and skipped
        images, ``total`` the number of images.

    Returns
    -------
    HeadEffectSums
        The ``(L, heads)`` float64 sums over the images used, their count and the skipped images.

    Raises
    ------
    AnalysisError
        As :func:`head_ablation`: a windowed model, a model without a class head, or whose heads
        are not separable. A refusal of the direct logit attribution is not raised: it becomes
        ``attribution_note``.
    """
    images = list(images)
    spec = vit.spec
    shape = (spec.num_layers, spec.num_heads)
    sums = {
        key: torch.zeros(shape, dtype=torch.float64) for key in ("delta_logit", "delta_probability", "direct_logit")
    }
    skipped: list[SkippedImage] = []
    count, note = 0, ""
    workers = workers if workers is not None else min(8, os.cpu_count() or 1)
    for pixels in iter_batches(vit, images, batch_size, workers, skipped):
        ablation = head_ablation(vit, pixels)
        sums["delta_logit"] += ablation.delta_logit.double().sum(0)
        sums["delta_probability"] += ablation.delta_probability.double().sum(0)
        if not note:
            try:
                sums["direct_logit"] += (
                    direct_logit_attribution(vit, pixels, target=ablation.targets).per_head().double().sum(0)
                )
            except AnalysisError as exc:
                note = str(exc)
        count += int(pixels.shape[0])
        if progress is not None:
            progress(count + len(skipped), len(images))
    if note:
        sums["direct_logit"].fill_(float("nan"))
    return HeadEffectSums(count=count, skipped=tuple(skipped), attribution_note=note, **sums)
