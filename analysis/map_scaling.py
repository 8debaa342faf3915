"""Putting maps on one colour scale: each map divided by its own peak.

Explanations differ in units (a probability, a relevance, a gradient times a pixel), and some
are signed (input × gradient, integrated gradients). To draw several side by side on one
0–1 scale, each is divided by its largest absolute value; negative evidence is then either
kept (a −1…1 scale) or drawn as 0 (the sign stays in the raw map).
"""

from __future__ import annotations

import numpy as np

from .errors import AnalysisError

__all__ = ["NEGATIVE_HANDLING", "scale_by_peak"]

#: ``"keep"``: values in [−1, 1]; ``"zero"``: negative values become 0, values in [0, 1].
NEGATIVE_HANDLING = ("keep", "zero")


def scale_by_peak(maps, *, negative: str = "keep") -> np.ndarray:
    """``(..., h, w)`` maps -> float32 maps ``m / max|m|``, each ``(h, w)`` map by its own peak.

    NaN cells (e.g. dropped tokens) are ignored for the peak and stay NaN; an all-zero (or
    all-NaN) map stays as it is. ``negative="zero"`` then sets negative values to 0. An infinite
    value has no finite scale: it is refused with an AnalysisError (the map overflowed upstream).
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
