"""Patch-grid maps at image resolution: exact patch cells or smooth (bilinear) upsampling,
and the ViT paper's Figure 6 view (the image multiplied by the upsampled rollout mask)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..base.arguments import check_int
from ..base.errors import AnalysisError

__all__ = ["UPSAMPLING_MODES", "upsample_map", "masked_image"]

#: ``"nearest"``: every pixel takes its patch's value (exact cells); ``"bilinear"``: values
#: sit at patch centres and are interpolated linearly in between (half-pixel centres,
#: ``align_corners=False``), edges clamped.
UPSAMPLING_MODES = ("nearest", "bilinear")


def upsample_map(grid_map, size: tuple[int, int], mode: str = "bilinear") -> np.ndarray:
    """``(gh, gw)`` map -> ``(H, W)`` float64 map.

    Bilinear: pixel centre ``y = (i + ½)·gh/H − ½`` (likewise x) in patch coordinates,
    value = Σ over the 4 neighbouring patch centres of (1 − |Δy|)(1 − |Δx|)·m, with
    coordinates clamped to the grid. Nearest: ``m[⌊i·gh/H⌋, ⌊j·gw/W⌋]``.

    Parameters
    ----------
    grid_map : array_like
        ``(gh, gw)`` map on the patch grid, both sides at least 1 (a numpy array or a CPU tensor),
        read as float64.
    size : tuple of int
        ``(H, W)`` output size in pixels, each at least 1.
    mode : str, default "bilinear"
        One of :data:`UPSAMPLING_MODES`: ``"bilinear"`` (smooth) or ``"nearest"`` (exact patch cells).

    Returns
    -------
    numpy.ndarray
        ``(H, W)`` float64.

    Raises
    ------
    AnalysisError
        For an unknown ``mode``, a ``grid_map`` that is not a non-empty ``(gh, gw)`` map, or a
        ``size`` side that is not a positive int.
    """
    if mode not in UPSAMPLING_MODES:
        raise AnalysisError(f"Unknown upsampling mode {mode!r}; use one of {', '.join(UPSAMPLING_MODES)}.")
    values = torch.as_tensor(np.asarray(grid_map), dtype=torch.float64)
    if values.ndim != 2 or min(values.shape) < 1:
        raise AnalysisError(f"upsample_map expects a (gh, gw) map, got shape {tuple(values.shape)}.")
    height = check_int("size[0]", size[0], minimum=1)
    width = check_int("size[1]", size[1], minimum=1)
    batch = values[None, None]  # (1, 1, gh, gw)
    if mode == "nearest":
        out = F.interpolate(batch, size=(height, width), mode="nearest")
    else:
        out = F.interpolate(batch, size=(height, width), mode="bilinear", align_corners=False)
    return out[0, 0].numpy()


def masked_image(image, mask, mode: str = "bilinear", *, top: float | None = None) -> np.ndarray:
    """Figure 6: ``image · min(m / top, 1)``, ``m`` the ``(gh, gw)`` mask upsampled to the image.

    A mask whose top is not positive gives a black image.

    Parameters
    ----------
    image : array_like
        ``(H, W, 3)`` uint8 (the pixels the model saw), e.g. an RGB PIL image or a numpy array.
    mask : array_like
        ``(gh, gw)`` mask on the patch grid (e.g. a rollout map), upsampled to ``(H, W)`` by
        :func:`upsample_map`.
    mode : str, default "bilinear"
        The upsampling, one of :data:`UPSAMPLING_MODES`.
    top : float or None, default None
        The mask value shown at full brightness (``None``: ``max(m)``, the paper's rule; a robust
        top such as :func:`analysis.plots.robust_top` keeps one outlier patch from darkening the
        rest: pixels above it stay at full brightness).

    Returns
    -------
    numpy.ndarray
        ``(H, W, 3)`` uint8: the image times the clipped, upsampled mask, rounded.

    Raises
    ------
    AnalysisError
        For an ``image`` that is not ``(H, W, 3)``, or an unknown ``mode``.
    """
    pixels = np.asarray(image)
    if pixels.ndim != 3 or pixels.shape[2] != 3:
        raise AnalysisError(f"masked_image expects an (H, W, 3) image, got shape {pixels.shape}.")
    weights = upsample_map(mask, pixels.shape[:2], mode)  # (H, W)
    peak = weights.max() if top is None else float(top)
    weights = np.minimum(weights / peak, 1.0) if peak > 0 else np.zeros_like(weights)
    return np.clip(np.rint(pixels.astype(np.float64) * weights[..., None]), 0, 255).astype(np.uint8)
