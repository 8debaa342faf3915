"""DINO-style attention masks: the patches that hold the top fraction of a map's attention
mass (Caron et al., "Emerging Properties in Self-Supervised Vision Transformers", 2021)."""

from __future__ import annotations

import numbers

import numpy as np
import torch

from ..base.errors import AnalysisError

__all__ = ["top_mass_mask"]


def top_mass_mask(maps, mass: float = 0.6) -> torch.Tensor:
    """``(..., gh, gw)`` non-negative maps -> bool masks of the same shape.

    For each map ``a`` (flattened to ``n`` values), sort descending ``a_(1) ≥ … ≥ a_(n)`` and
    keep the smallest ``k`` with ``Σ_{i≤k} a_(i) ≥ mass · Σ_i a_i``: the fewest patches that
    together hold ``mass`` of the attention. ``mass = 1`` keeps every patch with non-zero
    weight (and at least one). Ties at the cut are broken by patch order (row-major first).

    Parameters
    ----------
    maps : torch.Tensor or array_like
        ``(..., gh, gw)`` finite, non-negative maps (attention probabilities, e.g.
        :func:`attention_map`'s ``(B, gh, gw)``), floating point or int32 / int64; a NumPy array
        or nested list is converted. Each map is measured in float64.
    mass : float, default 0.6
        The fraction of each map's total attention to keep, in ``(0, 1]``.

    Returns
    -------
    torch.Tensor
        ``(..., gh, gw)`` bool, the shape of ``maps``: True on the kept patches.

    Raises
    ------
    AnalysisError
        ``mass`` not a number in ``(0, 1]``; ``maps`` with fewer than 2 dimensions, an empty grid,
        a dtype other than floating point, int32 or int64, or negative or non-finite values.
    """
    if isinstance(mass, bool) or not isinstance(mass, numbers.Real) or not 0.0 < float(mass) <= 1.0:
        raise AnalysisError(f"mass must be a fraction in (0, 1], got {mass!r}.")
    values = torch.as_tensor(np.asarray(maps) if not isinstance(maps, torch.Tensor) else maps)
    if values.ndim < 2 or min(values.shape[-2:]) < 1:
        raise AnalysisError(f"top_mass_mask expects (..., gh, gw) maps, got shape {tuple(values.shape)}.")
    if not (values.is_floating_point() or values.dtype in (torch.int32, torch.int64)):
        raise AnalysisError(f"top_mass_mask expects numeric maps, got dtype {values.dtype}.")
    values = values.detach().to(torch.float64)
    if (values < 0).any() or not torch.isfinite(values).all():
        raise AnalysisError("top_mass_mask expects finite, non-negative maps (attention probabilities).")
    flat = values.flatten(-2)  # (..., n)
    ordered, order = torch.sort(flat, dim=-1, descending=True, stable=True)
    total = flat.sum(-1, keepdim=True)  # (..., 1)
    before = torch.cumsum(ordered, -1) - ordered  # mass of the patches ranked above each one
    # keep a patch while the mass above it is still short of the target (the first always)
    keep_sorted = before < float(mass) * total * (1 - 1e-12)
    keep_sorted[..., 0] = True
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return keep.reshape(values.shape)
