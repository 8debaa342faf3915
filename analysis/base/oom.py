"""Out-of-memory recovery: halve the batch, then fall back to the CPU with a warning."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TypeVar

import torch

__all__ = ["is_out_of_memory", "run_with_oom_fallback", "OOM_FALLBACK_WARNING"]

Result = TypeVar("Result")
OOM_FALLBACK_WARNING = "Out of accelerator memory even for one image: falling back to the CPU (slower)."


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` says the device (or the host) ran out of memory.

    Parameters
    ----------
    exc : BaseException
        The caught exception.

    Returns
    -------
    bool
        True for a ``torch.cuda.OutOfMemoryError`` or a message containing "out of memory" or
        "can't allocate memory" (any case: MPS and CPU allocators say so in words).
    """
    text = str(exc).lower()
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in text or "can't allocate memory" in text


def run_with_oom_fallback(
    run: Callable[[torch.Tensor], Result],
    batch: torch.Tensor,
    cpu_fallback: Callable[[torch.Tensor], Result] | None,
) -> list[Result]:
    """``run(batch)``; on out-of-memory, halve the batch and retry each half; a single image
    that still does not fit goes to ``cpu_fallback`` with a ``RuntimeWarning``.

    Parameters
    ----------
    run : Callable
        ``run(piece) -> Result``, called on ``batch`` and, after an out-of-memory error, on its halves.
    batch : torch.Tensor
        ``(B, ...)``, split along its first dimension.
    cpu_fallback : Callable or None
        ``cpu_fallback(piece) -> Result`` for a one-image piece that still runs out of memory; ``None``
        re-raises that error.

    Returns
    -------
    list
        The results of the pieces, in batch order (one element when nothing failed).

    Raises
    ------
    RuntimeError
        An error of ``run`` that is not out-of-memory, or out-of-memory for one image with no
        ``cpu_fallback``.

    Warns
    -----
    RuntimeWarning
        A one-image piece goes to ``cpu_fallback`` (:data:`OOM_FALLBACK_WARNING`).
    """
    results: list[Result] = []
    pieces = [batch]
    while pieces:
        piece = pieces.pop(0)
        try:
            results.append(run(piece))
            continue
        except RuntimeError as exc:
            if not is_out_of_memory(exc):
                raise
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            if piece.shape[0] > 1:
                half = piece.shape[0] // 2
                pieces[:0] = [piece[:half], piece[half:]]
                continue
            if cpu_fallback is None:
                raise
        warnings.warn(OOM_FALLBACK_WARNING, RuntimeWarning, stacklevel=3)
        results.append(cpu_fallback(piece))
    return results
