"""Reconstruction loss against mask ratio over an image set (MAE, He et al. 2022, the loss side of
its masking-ratio study): one :func:`~analysis.mae.mae_reconstruct` per batch and ratio, over
the project's one image-set loop (:func:`analysis.attention.streaming.iter_batches`).

Image ``i`` of the set (its position in the full set, also when a command is sharded) is
masked with MAE's own draw from ``seed + i`` (:func:`~analysis.mae.masking.draw_mask`), so a
result does not depend on batching or sharding, and with one seed a higher ratio hides a
superset of the patches of a lower one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence

import torch

from ..attention.streaming import SkippedImage, iter_batches
from ..base.errors import AnalysisError
from .masking import draw_mask, visible_count
from .reconstruct import mae_reconstruct

__all__ = ["dataset_mae_loss", "check_ratios"]


def check_ratios(ratios: Sequence[float], num_patches: int) -> tuple[float, ...]:
    """The ratios as floats, each leaving at least one of ``num_patches`` visible.

    Parameters
    ----------
    ratios : sequence of float
        Mask ratios, each in ``[0, 1)``.
    num_patches : int
        ``N``, the patches per image.

    Returns
    -------
    tuple of float
        ``ratios``, in order.

    Raises
    ------
    AnalysisError
        No ratio, a ratio outside ``[0, 1)``, or one that hides all ``N`` patches
        (:func:`~analysis.mae.masking.visible_count`).
    """
    ratios = tuple(ratios)
    if not ratios:
        raise AnalysisError("ratios is empty: pass some mask ratios in [0, 1), e.g. 0.25, 0.5, 0.75, 0.9.")
    for ratio in ratios:
        visible_count(num_patches, ratio)
    return tuple(float(r) for r in ratios)


def dataset_mae_loss(
    mae,
    images: Iterable,
    ratios: Sequence[float],
    *,
    seed: int = 0,
    batch_size: int = 16,
    workers: int | None = None,
    index_of: Callable[[int], int] | None = None,
    skipped: list[SkippedImage] | None = None,
    progress: Callable[[int, int | None], None] | None = None,
) -> torch.Tensor:
    """Each readable image's reconstruction loss (the mean over its hidden patches,
    :attr:`~analysis.mae.MAEReconstruction.image_loss`) at each ratio, in image order.

    Parameters
    ----------
    mae : LoadedMAE
        The model (:func:`~analysis.mae.load_mae`).
    images : iterable
        Paths, bytes or PIL images.
    ratios : sequence of float
        The ``R`` mask ratios, each in ``[0, 1)`` (:func:`check_ratios`).
    seed : int, default 0
        Image ``i`` is masked with :func:`~analysis.mae.masking.draw_mask` from ``seed + index_of(i)``.
    batch_size : int, default 16
        Images per forward pass (at least 1).
    workers : int or None, default None
        Decode threads; ``None``, ``min(8, os.cpu_count())``.
    index_of : callable or None, default None
        ``index_of(j)``: the position in the full set of item ``j`` of ``images`` (a shard:
        ``rank + j·world``; default ``j``), which seeds its mask.
    skipped : list of SkippedImage or None, default None
        A list that receives the images that could not be read (then they are left out; without
        it the first unreadable image raises).
    progress : callable or None, default None
        Called ``progress(done, len(images))`` after each batch, ``done`` the items read so far.

    Returns
    -------
    torch.Tensor
        ``(n, R)`` float64, ``n`` the images read.

    Raises
    ------
    AnalysisError
        ``batch_size < 1``, a bad ratio (:func:`check_ratios`), or with ``skipped=None`` an image
        that cannot be preprocessed.
    ImageLoadError
        With ``skipped=None``, an image that cannot be decoded.
    """
    images = list(images)
    if batch_size < 1:
        raise AnalysisError(f"batch_size must be at least 1, got {batch_size}.")
    num_patches = mae.spec.num_patches
    ratios = check_ratios(ratios, num_patches)
    index_of = index_of or (lambda j: j)
    collect_skips = skipped is not None
    skipped = skipped if skipped is not None else []
    workers = workers if workers is not None else min(8, os.cpu_count() or 1)
    rows: list[torch.Tensor] = []
    cursor = 0  # every item before it is either used or skipped
    for pixels in iter_batches(mae, images, batch_size, workers, skipped if collect_skips else None):
        left_out = {item.index for item in skipped}
        members: list[int] = []  # the items of this batch: the next ones not skipped
        while len(members) < pixels.shape[0]:
            if cursor not in left_out:
                members.append(cursor)
            cursor += 1
        losses = torch.empty(len(members), len(ratios), dtype=torch.float64)
        for column, ratio in enumerate(ratios):
            mask = torch.cat([draw_mask(1, num_patches, ratio, seed + index_of(j)) for j in members])  # (b, N)
            losses[:, column] = mae_reconstruct(mae, pixels, mask=mask).image_loss.double()
        rows.append(losses)
        if progress is not None:
            progress(cursor, len(images))
    if not rows:
        return torch.zeros(0, len(ratios), dtype=torch.float64)
    return torch.cat(rows)
