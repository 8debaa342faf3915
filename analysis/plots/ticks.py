"""Axis ticks of patch grids: every row and column of a small grid, every k-th of a big one."""

from __future__ import annotations

__all__ = ["DENSE_GRID", "MAX_GRID_TICKS", "grid_tick_step", "grid_ticks"]

DENSE_GRID = 24  # up to this many rows (columns) every one is labelled
MAX_GRID_TICKS = 12  # a bigger grid labels at most about this many
_NICE_STEPS = (1, 2, 4, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000)


def grid_tick_step(n: int) -> int:
    """Label every k-th of ``n`` rows (columns): ``k = 1`` up to :data:`DENSE_GRID`, else the
    smallest ``k`` of 2, 4, 5, 10, 20, 25, 50, … that leaves at most :data:`MAX_GRID_TICKS`
    labels (``⌈n / k⌉ ≤ MAX_GRID_TICKS``).

    Parameters
    ----------
    n : int
        The number of rows (columns).

    Returns
    -------
    int
        The step ``k``; beyond the largest nice step (1000), ``⌈n / MAX_GRID_TICKS⌉``.
    """
    if n <= DENSE_GRID:
        return 1
    return next((k for k in _NICE_STEPS if -(-n // k) <= MAX_GRID_TICKS), -(-n // MAX_GRID_TICKS))


def grid_ticks(n: int) -> list[int]:
    """The labelled indices of ``n`` rows (columns): ``0, k, 2k, …`` below ``n`` (:func:`grid_tick_step`).

    Parameters
    ----------
    n : int
        The number of rows (columns).

    Returns
    -------
    list of int
        The labelled indices, in order.
    """
    return list(range(0, n, grid_tick_step(n)))
