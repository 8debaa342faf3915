"""One progress protocol for every long analysis.

Every function that loops over images, layers, heads or training steps takes
``progress: Progress | None`` and calls ``progress(done, total)`` after each step: ``done`` steps
of ``total`` (``total`` is ``None`` while it is unknown, for example over a generator of images).
A page draws ``done / total`` on a progress bar, a command line on a tqdm bar, a test records the
calls. An analysis that runs another long analysis inside it gives the inner one a
:func:`within` span of its own steps, so the outer caller sees one count that only grows.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["Progress", "tell", "within"]

Progress = Callable[[int, int | None], None]
"""``progress(done, total)``: ``done`` steps of ``total`` (``None`` while unknown) are finished."""


def tell(progress: Progress | None, done: int, total: int | None) -> None:
    """Call ``progress(done, total)`` when there is a ``progress`` to call.

    Parameters
    ----------
    progress : Progress or None
        The callback; ``None`` does nothing.
    done : int
        Steps finished.
    total : int or None
        Steps in all; ``None`` while unknown.
    """
    if progress is not None:
        progress(int(done), None if total is None else int(total))


def within(progress: Progress | None, start: int, size: int, total: int) -> Progress | None:
    """The progress of an inner loop that fills steps ``start`` to ``start + size`` of the outer
    ``total``: the inner ``(done, inner_total)`` is told to ``progress`` as
    ``(start + ⌊size · done / inner_total⌋, total)`` (just ``start`` while ``inner_total`` is
    unknown or 0). ``None`` stays ``None``.

    Parameters
    ----------
    progress : Progress or None
        The outer callback.
    start : int
        The outer step the inner loop starts at.
    size : int
        How many outer steps the inner loop fills; the reported step never leaves
        ``start..start + size``.
    total : int
        The outer loop's total steps.

    Returns
    -------
    Progress or None
        The inner loop's callback; ``None`` when ``progress`` is ``None``.
    """
    if progress is None:
        return None

    def inner(done: int, inner_total: int | None) -> None:
        moved = size * done // inner_total if inner_total else 0
        progress(start + min(size, max(0, moved)), total)

    return inner
