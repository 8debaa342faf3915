"""Maps as one byte per value, for views that hold many maps in the browser.

The rule (one range per map): each map (the last axis of ``values``) is stored as

    code = round((v − lo) / (hi − lo) · 255),    lo = min(map), hi = max(map)
    v'   = lo + code / 255 · (hi − lo)            (decoded)

so the map's minimum is code 0 (an exact zero when the map's minimum is zero), its maximum is
code 255 (decoded exactly), and every value comes back within half a step,
``|v' − v| ≤ (hi − lo) / 510``. A colour scale that spans at least the map's own values
(every range of :func:`analysis.plots.colour_range`: 0–max, min–max, a shared maximum) has
steps of at least ``(hi − lo) / 255``, so the decoded map's colours are within one colour step
of the exact map's. A flat map (``hi == lo``) is all code 0 and decodes to its value.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

import numpy as np

from analysis.base.errors import AnalysisError

__all__ = ["QuantisedMaps", "quantise_maps"]

LEVELS = 255  # codes 0..255


@dataclass(frozen=True)
class QuantisedMaps:
    """Maps stored as uint8 codes with one ``(lo, hi)`` per map.

    Attributes
    ----------
    codes : numpy.ndarray
        ``(..., n)`` uint8, one map per entry of the leading axes.
    ranges : numpy.ndarray
        ``(..., 2)`` float32, each map's ``(lo, hi)``; ``v = lo + code / 255 · (hi − lo)``.
    """

    codes: np.ndarray
    ranges: np.ndarray

    def decoded(self) -> np.ndarray:
        """``(..., n)`` float32: the values the codes stand for (the rule above)."""
        lo, hi = self.ranges[..., :1], self.ranges[..., 1:]
        return (lo + self.codes.astype(np.float32) / np.float32(LEVELS) * (hi - lo)).astype(np.float32)

    def as_base64(self) -> tuple[str, str]:
        """``(codes, ranges)`` as base64 text of their C-order bytes (uint8; little-endian float32),
        for a browser that decodes them with ``atob`` into a ``Uint8Array`` / ``Float32Array``."""
        ranges = np.ascontiguousarray(self.ranges, dtype="<f4")
        return (
            base64.b64encode(np.ascontiguousarray(self.codes).tobytes()).decode("ascii"),
            base64.b64encode(ranges.tobytes()).decode("ascii"),
        )


def quantise_maps(values) -> QuantisedMaps:
    """``(..., n)`` finite values -> :class:`QuantisedMaps` (one ``[min, max]`` per map, the
    module's rule).

    Parameters
    ----------
    values : array_like
        ``(..., n)`` finite values, one map along the last axis per entry of the leading axes;
        read as float32.

    Returns
    -------
    QuantisedMaps
        ``codes`` ``(..., n)`` uint8 and ``ranges`` ``(..., 2)`` float32.

    Raises
    ------
    AnalysisError
        For NaN or infinite values (no code stands for them), a 0-d input or an empty last axis.
    """
    values = np.asarray(values, dtype=np.float32)
    if values.ndim == 0 or values.shape[-1] == 0:
        raise AnalysisError(f"quantise_maps needs maps along the last axis, got shape {values.shape}.")
    if not np.isfinite(values).all():
        raise AnalysisError("quantise_maps: the maps hold NaN or infinite values; quantise finite maps only.")
    lo = values.min(axis=-1, keepdims=True)
    hi = values.max(axis=-1, keepdims=True)
    span = np.where(hi > lo, hi - lo, np.float32(1))
    codes = np.rint((values - lo) / span * LEVELS).clip(0, LEVELS).astype(np.uint8)
    return QuantisedMaps(codes=codes, ranges=np.concatenate([lo, hi], axis=-1).astype(np.float32))
