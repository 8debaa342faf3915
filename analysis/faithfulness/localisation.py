"""Localisation of an explanation against a known object mask (the demo scenes' exact masks).

One rule for each metric, used by the faithfulness benchmark and the demo model's evaluation
(``python -m analysis.demo.evaluate``) alike.
"""

from __future__ import annotations

import numpy as np
import torch

from ..base.errors import AnalysisError

__all__ = ["patch_mask", "pointing_score", "mask_iou"]


def patch_mask(pixel_mask, patch_size: tuple[int, int], grid_size: tuple[int, int]) -> np.ndarray:
    """``(..., H, W)`` bool pixel mask -> ``(..., gh, gw)`` bool: the patch holds at least one
    object pixel (pixels past the grid's ``gh·ph x gw·pw`` are ignored).

    Parameters
    ----------
    pixel_mask : array_like
        ``(..., H, W)`` object mask, read as bool.
    patch_size : tuple of int
        ``(ph, pw)``, a cell's side in pixels.
    grid_size : tuple of int
        ``(gh, gw)``, the grid.

    Returns
    -------
    numpy.ndarray
        ``(..., gh, gw)`` bool.

    Raises
    ------
    AnalysisError
        A mask with fewer than 2 dimensions or smaller than ``gh·ph x gw·pw``.
    """
    mask = np.asarray(pixel_mask, dtype=bool)
    (ph, pw), (gh, gw) = patch_size, grid_size
    if mask.ndim < 2 or mask.shape[-2] < gh * ph or mask.shape[-1] < gw * pw:
        raise AnalysisError(f"The mask is {mask.shape}; the model's input is {gh * ph}x{gw * pw} pixels.")
    lead = mask.shape[:-2]
    cropped = mask[..., : gh * ph, : gw * pw].reshape(*lead, gh, ph, gw, pw)
    return np.asarray(cropped.any(axis=(-3, -1)))  # an array even for one mask (numpy types it bool | array)


def pointing_score(saliency, object_patches) -> np.ndarray:
    """Pointing game (Zhang et al. 2016) on patches, ties split evenly. For each map::

        score = |argmax(saliency) ∩ object| / |argmax(saliency)|

    where ``argmax`` is the *set* of patches holding the map's maximum. With one maximum this
    is the classic game (1 if the peak patch is on the object, else 0). Ties are split as a
    fraction, which is the expected score when a tie is broken uniformly at random. We chose
    this over the other rules because each of them rewards or punishes ties for no reason:

    * "first arg-max" (raster order) decides a tie by where the patches sit: a flat map hits
      exactly when the top-left patch is on the object;
    * "any maximum on the object" gives a flat map a perfect score;
    * "every maximum on the object" gives a flat map zero.

    Under the split rule a flat map scores the object's share of the patches, i.e. the chance
    level of a uniformly random patch, and the score does not depend on the patch order.

    NaN cells (e.g. dropped tokens) are not candidates for the maximum; a map that is NaN
    everywhere has no maximum and scores NaN.

    Parameters
    ----------
    saliency : torch.Tensor or array_like
        ``(..., gh, gw)`` maps.
    object_patches : array_like
        ``(..., gh, gw)`` bool, the object's patches (:func:`patch_mask`), the shape of ``saliency``.

    Returns
    -------
    numpy.ndarray
        ``(...)`` float64 in ``[0, 1]`` (0-d for one map), NaN for an all-NaN map.

    Raises
    ------
    AnalysisError
        A map with fewer than 2 dimensions, or shapes that differ.
    """
    values = torch.as_tensor(saliency).detach().double().cpu()
    truth = torch.tensor(np.asarray(object_patches, dtype=bool))  # a copy: the mask may be read-only
    if values.ndim < 2 or tuple(values.shape) != tuple(truth.shape):
        raise AnalysisError(
            f"The map is {tuple(values.shape)} and the object patches {tuple(truth.shape)}; "
            "pass both as (..., gh, gw) on the same grid."
        )
    flat = values.reshape(*values.shape[:-2], -1)  # (..., gh·gw)
    candidates = torch.where(torch.isnan(flat), -torch.inf, flat)  # NaN cells never hold the maximum
    peak = (candidates == candidates.amax(dim=-1, keepdim=True)) & ~torch.isnan(flat)  # (..., gh·gw)
    on_object = (peak & truth.reshape(flat.shape)).sum(-1)
    return (on_object.double() / peak.sum(-1).double()).numpy()


def mask_iou(saliency, object_patches: np.ndarray) -> float:
    """IoU of the object's patches with the map's top-``k`` patches, ``k`` = the object's
    patch count (so a perfect ranking scores 1 whatever the object's size). Ties keep patch order.

    Parameters
    ----------
    saliency : torch.Tensor or array_like
        ``(gh, gw)`` map.
    object_patches : numpy.ndarray
        ``(gh, gw)`` bool, the object's patches (:func:`patch_mask`).

    Returns
    -------
    float
        In ``[0, 1]``.

    Raises
    ------
    AnalysisError
        The object covers no patch.
    """
    values = torch.as_tensor(saliency).detach().double().reshape(-1)
    truth = np.asarray(object_patches, dtype=bool).reshape(-1)
    k = int(truth.sum())
    if k == 0:
        raise AnalysisError("The object covers no patch: mask IoU is undefined.")
    chosen = np.zeros_like(truth)
    chosen[torch.sort(-values, stable=True).indices[:k].numpy()] = True
    return float((chosen & truth).sum() / (chosen | truth).sum())
