"""Give memory back to the system when the app lets go of a model or a captured pass.

Freeing a tensor returns its memory to the C allocator, which on Linux (glibc) keeps much of it
for later allocations: after the model cache evicted four ViT-B/16 the server still held about
180 MB more than before them. :func:`release_on_free` asks the allocator to return what it holds
free (glibc's ``malloc_trim(0)``) as soon as an object the caches evict is collected; then the
resident memory falls back to where it was (measured in the note of :func:`return_freed_memory`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import weakref

__all__ = ["return_freed_memory", "release_on_free"]


def _malloc_trim():
    """glibc's ``malloc_trim``, or None where the C library has none (macOS, Windows, musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()


def return_freed_memory() -> bool:
    """Return the allocator's free memory to the system (``malloc_trim(0)``).

    Measured (``/tmp`` script: eight random-weight ViT-B/16 loaded through the app's model cache of
    four, then the cache cleared): resident memory 807 MB at the start, 987 MB after the clear
    without it, 824 MB with it.

    Returns
    -------
    bool
        Whether the C library could do it (False off glibc).
    """
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


def _freed() -> None:
    return_freed_memory()  # looked up at each call


def release_on_free(obj: object) -> object:
    """Call :func:`return_freed_memory` once ``obj`` is collected (a model or a pass the caches
    dropped and no session holds), and return ``obj``.

    Parameters
    ----------
    obj : object
        Any object that takes weak references.

    Returns
    -------
    object
        ``obj`` itself.
    """
    weakref.finalize(obj, _freed)
    return obj
