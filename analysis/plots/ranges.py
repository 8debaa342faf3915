"""Which values a map's colour scale spans (the app's sidebar "Map colour range").

Attention maps are probabilities. Under uniform attention every key gets ``1/T`` (``T`` keys),
so a map without structure is flat at ``1/T``: stretched from 0 to its own maximum it would
fill the whole colour scale and look as "hot" as the sharpest head. The default range
therefore reaches at least :data:`UNIFORM_FLOOR` times the uniform level: a flat map sits in
the lowest quarter of the scale, and a map that really concentrates its attention still
spans the whole scale. The colour bar's title states the range and the uniform level.
"""

from __future__ import annotations

import numpy as np

__all__ = ["MAP_RANGES", "UNIFORM_FLOOR", "colour_range", "layer_scaled"]

#: How a map's values are spread over the colour scale: mode -> what it means.
MAP_RANGES = {
    "zero": "0 to the map's maximum (at least 4× uniform attention)",
    "minmax": "the map's minimum to maximum",
    "shared": "0 to the maximum over all layers and heads",
}

#: The default range's top is at least this many times the uniform level ``1/T``.
UNIFORM_FLOOR = 4.0


def _uniform_text(uniform: float | None) -> str:
    return f"; uniform {uniform:.2g}" if uniform else ""


def colour_range(mode: str, shown: np.ndarray, everything: np.ndarray | None = None, *,
                 uniform: float | None = None) -> tuple[float, float, str]:
    """``(lo, hi, label)`` of the colour scale for the map ``shown``.

    ``"zero"`` (default): ``[0, max(max(shown), UNIFORM_FLOOR·uniform)]``: a near-uniform map
    stays pale instead of filling the scale (``uniform``: the value of uniform attention,
    ``1/T``; ``None`` for maps that are not probabilities, then plain ``[0, max]``).
    ``"minmax"``: ``[min, max]`` of ``shown``, the most contrast. ``"shared"``:
    ``[0, max(everything)]`` (e.g. every layer and head for this query), so maps compare by
    colour. The label says which, with the numbers and the uniform level.
    """
    values = shown if mode != "shared" or everything is None else everything
    finite_shown = np.asarray(shown, dtype=np.float64)[np.isfinite(shown)]
    finite_values = np.asarray(values, dtype=np.float64)[np.isfinite(values)]
    lo = float(finite_shown.min()) if mode == "minmax" and finite_shown.size else 0.0
    hi = float(finite_values.max()) if finite_values.size else lo  # an all-NaN map: an empty scale from lo
    name = {"zero": "0–max", "minmax": "min–max", "shared": "0–max of all layers, heads"}.get(mode, mode)
    if mode == "zero" and uniform and hi < UNIFORM_FLOOR * uniform:
        hi = UNIFORM_FLOOR * uniform
        name = f"0–{UNIFORM_FLOOR:g}× uniform"
    if hi <= lo:
        hi = lo + 1e-12
    return lo, hi, f"{name}: {lo:.3g}–{hi:.3g}{_uniform_text(uniform)}"


def layer_scaled(maps: np.ndarray, *, uniform: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(L, n, gh, gw)`` maps (n maps per layer) -> each layer's maps divided by one shared
    top, ``max(max over the layer's maps, UNIFORM_FLOOR·uniform)``, and the ``(L,)`` tops.

    Within a layer, heads compare by colour; a layer whose maps are all near-uniform stays
    pale (at most about ``1/UNIFORM_FLOOR``) instead of saturating.
    """
    values = np.asarray(maps, dtype=np.float32)
    tops = np.nanmax(values.reshape(values.shape[0], -1), axis=1)
    if uniform:
        tops = np.maximum(tops, np.float32(UNIFORM_FLOOR * uniform))
    tops = np.where(tops > 0, tops, 1.0).astype(np.float32)
    return values / tops[:, None, None, None], tops
