"""Putting maps on one colour scale: each map divided by its own peak, or stretched min to max.

Explanations differ in units (a probability, a relevance, a gradient times a pixel), and some
are signed (input × gradient, integrated gradients). To draw several side by side on one
0–1 scale, each is divided by its largest absolute value (:func:`scale_by_peak`); negative
evidence is then either kept (a −1…1 scale) or drawn as 0 (the sign stays in the raw map).
:func:`scale_min_max` stretches each map from its minimum to its maximum (LeGrad's last step).
"""

from __future__ import annotations

import numpy as np
import torch

from ..base.errors import AnalysisError

__all__ = ["NEGATIVE_HANDLING", "scale_by_peak", "scale_min_max"]

#: ``"keep"``: values in [−1, 1]; ``"zero"``: negative values become 0, values in [0, 1].
NEGATIVE_HANDLING = ("keep", "zero")


def scale_by_peak(maps, *, negative: str = "keep") -> np.ndarray:
    """``(..., h, w)`` maps -> float32 maps ``m / max|m|``, each ``(h, w)`` map by its own peak.

    NaN cells (e.g. dropped tokens) are ignored for the peak and stay NaN; an all-zero (or
    all-NaN) map stays as it is.

    Parameters
    ----------
    maps : array_like
        ``(..., h, w)`` maps, at least two dimensions (e.g. ``(B, gh, gw)``): a numpy array, a CPU
        tensor or nested lists, read as float32.
    negative : str, default "keep"
        One of :data:`NEGATIVE_HANDLING`: ``"keep"`` leaves negative values, giving values in
        [−1, 1]; ``"zero"`` then sets negative values to 0, giving values in [0, 1].

    Returns
    -------
    numpy.ndarray
        ``(..., h, w)`` float32, the shape of ``maps``: each ``(h, w)`` map divided by its largest
        absolute value (NaN cells ignored).

    Raises
    ------
    AnalysisError
        For an infinite value, which has no finite scale (the map overflowed upstream); also
        for an unknown ``negative`` or ``maps`` with fewer than two dimensions.
    """
    if negative not in NEGATIVE_HANDLING:
        raise AnalysisError(f"negative must be one of {', '.join(NEGATIVE_HANDLING)}, not {negative!r}.")
    values = np.asarray(maps, dtype=np.float32)
    if values.ndim < 2:
        raise AnalysisError(f"scale_by_peak expects (..., h, w) maps, got shape {values.shape}.")
    infinite = int(np.isinf(values).sum())
    if infinite:
        raise AnalysisError(
            f"{infinite} map value(s) are infinite, so no map can be scaled by its peak: the map overflowed "
            "where it was computed (e.g. float16); compute it in float32, or replace the infinities first."
        )
    flat = np.abs(values.reshape(*values.shape[:-2], -1))
    finite = np.where(np.isnan(flat), -np.inf, flat)
    peak = finite.max(axis=-1, initial=0.0)[..., None, None] if flat.size else np.zeros((*values.shape[:-2], 1, 1))
    scaled = values / np.where(peak > 0, peak, 1.0).astype(np.float32)
    if negative == "zero":
        scaled = np.where(scaled < 0, np.float32(0.0), scaled)
    return scaled.astype(np.float32)


def scale_min_max(maps: torch.Tensor) -> torch.Tensor:
    """``(B, h, w)`` maps -> each map ``(m − min m) / (max m − min m)`` in [0, 1]; a constant map
    becomes all zeros. The dtype and device stay (LeGrad, Bousselham et al. 2024, scales its maps
    this way).

    Parameters
    ----------
    maps : torch.Tensor
        ``(B, h, w)`` floating-point maps; a single ``(h, w)`` map is scaled as one, and with more
        than three dimensions everything after the first is one map.

    Returns
    -------
    torch.Tensor
        The shape, dtype and device of ``maps``, each map in [0, 1].

    Raises
    ------
    AnalysisError
        If ``maps`` has fewer than two dimensions.
    """
    if maps.ndim < 2:
        raise AnalysisError(f"scale_min_max expects (B, h, w) maps, got shape {tuple(maps.shape)}.")
    flat = maps.reshape(maps.shape[0], -1) if maps.ndim > 2 else maps.reshape(1, -1)
    low, high = flat.min(-1, keepdim=True).values, flat.max(-1, keepdim=True).values
    span = high - low
    scaled = torch.where(span > 0, (flat - low) / span.clamp_min(torch.finfo(flat.dtype).tiny), torch.zeros_like(flat))
    return scaled.reshape(maps.shape)
