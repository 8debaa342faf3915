"""Localisation of an explanation against a known object mask (the demo scenes' exact masks)."""

from __future__ import annotations

import numpy as np
import torch

from ..errors import AnalysisError

__all__ = ["patch_mask", "pointing_hit", "mask_iou"]


def patch_mask(pixel_mask, patch_size: tuple[int, int], grid_size: tuple[int, int]) -> np.ndarray:
    """``(H, W)`` bool pixel mask -> ``(gh, gw)`` bool: the patch holds at least one object pixel."""
    mask = np.asarray(pixel_mask, dtype=bool)
    (ph, pw), (gh, gw) = patch_size, grid_size
    if mask.ndim != 2 or mask.shape[0] < gh * ph or mask.shape[1] < gw * pw:
        raise AnalysisError(f"The mask is {mask.shape}; the model's input is {gh * ph}x{gw * pw} pixels.")
    return mask[: gh * ph, : gw * pw].reshape(gh, ph, gw, pw).any(axis=(1, 3))


def pointing_hit(saliency, object_patches: np.ndarray) -> bool:
    """Pointing game (Zhang et al. 2016) on patches: the map's maximum lies on the object
    (a tie counts as a hit only if every maximal patch is on the object)."""
    values = torch.as_tensor(saliency).detach().double().numpy()
    peak = values == values.max()
    return bool(object_patches[peak].all())


def mask_iou(saliency, object_patches: np.ndarray) -> float:
    """IoU of the object's patches with the map's top-``k`` patches, ``k`` = the object's
    patch count (so a perfect ranking scores 1 whatever the object's size)."""
    values = torch.as_tensor(saliency).detach().double().reshape(-1)
    truth = np.asarray(object_patches, dtype=bool).reshape(-1)
    k = int(truth.sum())
    if k == 0:
        raise AnalysisError("The object covers no patch: mask IoU is undefined.")
    chosen = np.zeros_like(truth)
    chosen[torch.sort(-values, stable=True).indices[:k].numpy()] = True
    return float((chosen & truth).sum() / (chosen | truth).sum())
