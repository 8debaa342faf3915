"""Host memory for attention records, reused once a record is dropped: OFF by default (opt-in).

A record of ViT-B/16 at batch 8 holds 12 x 8 x 12 x 197 x 197 float32 maps, 179 MB. glibc
hands an allocation this large straight from ``mmap``, so every capture writes pages the
kernel must fault in and zero first (on the 2-core VM of the benchmark: 65 ms, 3.5 % of the
batch's forward pass), and ``free`` gives them back. Smaller blocks (under glibc's 32 MiB
``mmap`` ceiling) are recycled by ``malloc`` itself. With reuse turned on, large records get
the same: when every tensor and array viewing a record's memory is gone, the memory waits,
already faulted in, for the next record of the same size, as torch's caching allocators do
for CUDA and pinned memory. ``python -m analysis.bench`` measures both side by side
(``capture`` with reuse off, ``capture with record memory reuse``).

Turn it on with :func:`reuse_record_memory` (``reuse_record_memory(1024)``: keep at most
1024 MiB idle; ``0`` turns it off again and gives the idle memory back) or the environment
variable ``ANALYSIS_IDLE_RECORD_MB`` (a positive number of MiB, read at import; unset or
``0``: off, the default).

    reuse_record_memory(1024)
    record = capture_attention(vit, batch)    # new memory: faulted in once
    del record                                # every view gone: memory kept idle
    record = capture_attention(vit, batch)    # same size: the idle memory, no page faults

**The hazard, and why it is off by default.** A buffer is only reused after the last view
of it that Python can see is gone (a ``weakref.finalize`` on the ``memoryview`` each tensor's
storage holds), so a slice or ``.numpy()`` of an old record keeps its memory. But
``share_memory_()`` (also done by ``torch.multiprocessing`` queues) moves a tensor to new
memory and frees the old, and a DLPack capsule or a ``.numpy()`` array taken before it (or
any raw pointer handed to native code) does not keep the old memory: it then reads freed
memory. With plain allocations that memory is unmapped (a crash, at worst); with reuse it is
the *next record*, so such an array silently shows another image's attention. Take arrays
after sharing, or leave reuse off: the gain is the ~3.5 % of a CPU capture above.

The mappings are private (copy-on-write across ``fork``, like ``malloc``'s), and a forked
child starts with no idle memory of its own. Unlike ``torch.empty``'s, a record's storage
cannot grow (``resize_``). :func:`release_record_memory` gives idle memory back at once.
"""

from __future__ import annotations

import math
import mmap
import operator
import os
import threading
import weakref
from collections.abc import Sequence

import torch

__all__ = ["record_buffer", "reuse_record_memory", "release_record_memory", "idle_record_bytes", "REUSED_FROM_BYTES"]

REUSED_FROM_BYTES = 32 << 20  # smaller blocks: glibc's malloc recycles them itself


def _idle_limit_from_env() -> int:
    """``ANALYSIS_IDLE_RECORD_MB`` in bytes: unset, ``0`` or not a number: 0 (reuse off)."""
    raw = os.environ.get("ANALYSIS_IDLE_RECORD_MB", "0")
    try:
        return max(0, int(raw)) << 20
    except ValueError:
        return 0


class _IdleBuffers:
    """Anonymous mappings no record uses, newest last, at most ``limit`` bytes in all.

    Reports arrive from ``weakref.finalize`` callbacks, in whichever thread drops a record's
    last view (also inside garbage collection), hence the re-entrant lock."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.RLock()
        self._idle: list[mmap.mmap] = []  # oldest first
        self._bytes = 0

    def take(self, nbytes: int) -> mmap.mmap | None:
        with self._lock:
            for i in range(len(self._idle) - 1, -1, -1):  # the newest of that size
                if len(self._idle[i]) == nbytes:
                    self._bytes -= nbytes
                    return self._idle.pop(i)
        return None

    def give_back(self, mapping: mmap.mmap) -> None:
        with self._lock:
            if len(mapping) > self.limit:
                mapping.close()
                return
            self._idle.append(mapping)
            self._bytes += len(mapping)
            while self._bytes > self.limit:
                oldest = self._idle.pop(0)
                self._bytes -= len(oldest)
                oldest.close()

    def release(self) -> int:
        with self._lock:
            released = self._bytes
            for mapping in self._idle:
                mapping.close()
            self._idle.clear()
            self._bytes = 0
            return released

    @property
    def bytes(self) -> int:
        return self._bytes


_IDLE = _IdleBuffers(_idle_limit_from_env())


def _forget_in_child() -> None:
    """A forked child gets its own (empty) idle set and lock: the parent's lock may have been
    held by another thread at the fork, and its idle mappings are the parent's to reuse."""
    global _IDLE
    _IDLE = _IdleBuffers(_IDLE.limit)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)

_PRIVATE = {"flags": mmap.MAP_PRIVATE} if hasattr(mmap, "MAP_PRIVATE") else {}  # Windows maps are private anyway


def record_buffer(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor of ``shape`` and ``dtype`` for a record's maps.

    From ``REUSED_FROM_BYTES`` up, its memory is an anonymous mapping that returns to the
    idle set when the last view of the tensor is gone, and an idle mapping of the same size
    is used when there is one; smaller tensors come from ``torch.empty``."""
    shape = tuple(operator.index(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"A record's shape cannot have negative sizes, got {shape}.")
    nbytes = math.prod(shape) * dtype.itemsize
    idle = _IDLE
    if nbytes < REUSED_FROM_BYTES or nbytes > idle.limit:
        return torch.empty(shape, dtype=dtype)
    mapping = idle.take(nbytes) or mmap.mmap(-1, nbytes, **_PRIVATE)
    lease = memoryview(mapping)  # held by the tensor's storage until its last view dies
    finalizer = weakref.finalize(lease, _return, mapping)
    finalizer.atexit = False
    return torch.frombuffer(lease, dtype=dtype).view(shape)


def _return(mapping: mmap.mmap) -> None:
    _IDLE.give_back(mapping)


def reuse_record_memory(megabytes: int = 1024) -> int:
    """Turn record memory reuse on, keeping at most ``megabytes`` MiB idle, or off with ``0``
    (the default state; the idle memory is then given back). Returns the previous bound in MiB.
    Read the module docstring's hazard first: an array taken before ``share_memory_()`` or
    through DLPack can then silently read a later record."""
    if isinstance(megabytes, bool) or not isinstance(megabytes, int) or megabytes < 0:
        raise ValueError(f"megabytes must be a whole number >= 0 (0 turns reuse off), got {megabytes!r}.")
    idle = _IDLE
    with idle._lock:
        previous = idle.limit >> 20
        idle.limit = megabytes << 20
    if megabytes == 0:
        idle.release()
    return previous


def release_record_memory() -> int:
    """Give the idle record memory back to the operating system now; returns the bytes freed."""
    return _IDLE.release()


def idle_record_bytes() -> int:
    """Bytes of record memory kept idle for the next record of the same size."""
    return _IDLE.bytes
