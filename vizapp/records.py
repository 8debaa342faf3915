"""One captured forward pass per (model, image, resolution), and one loaded model per source, kept
once per process and shared read-only by every session and every rerun: never pickled, never copied.

``st.cache_data`` would unpickle the whole attention record on every call (1.1 s per rerun for
a 0.5 GB ViT-L/16 record at 384 px). :class:`RecordStore` returns the very same object instead,
evicts the least recently used values beyond a count (of each kind: models, passes) and one byte
budget they share, and computes each key once even when several sessions ask for it at the same
moment.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import Generic, TypeVar

__all__ = ["RecordStore"]

T = TypeVar("T")


class _Gate:
    """The lock one key's computation is serialised on, and how many callers hold or await it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.users = 0


class RecordStore(Generic[T]):
    """A thread-safe LRU map ``key -> value`` bounded by ``max_entries`` and ``max_bytes``
    (``size(value)``). The newest value is always kept, even alone over the byte budget.

    Parameters
    ----------
    max_entries : int or Mapping[str, int]
        The most values kept; or the most of each kind (``kind(key)``), a kind not named having no
        count of its own.
    max_bytes : int
        The most bytes all values together hold, whatever their kind: the least recently used go
        first, of any kind.
    size : Callable[[T], int]
        A value's bytes.
    kind : Callable[[Hashable], str], optional
        A key's kind (e.g. ``"model"``, ``"forward"``); one kind by default.
    """

    def __init__(
        self,
        max_entries: int | Mapping[str, int],
        max_bytes: int,
        size: Callable[[T], int],
        kind: Callable[[Hashable], str] | None = None,
    ):
        self.max_entries: dict[str, int] | int = (
            int(max_entries) if isinstance(max_entries, int) else {k: int(v) for k, v in max_entries.items()}
        )
        self.max_bytes, self._size = int(max_bytes), size
        self._kind = kind or (lambda key: "")
        self._values: OrderedDict[Hashable, T] = OrderedDict()
        self._lock = threading.Lock()
        self._computing: dict[Hashable, _Gate] = {}
        self.computed = 0  # how many values were computed (a test and the benchmark read it)
        self.evicted_for_bytes = 0  # how many values the byte budget pushed out (the sidebar reads it)

    def __len__(self) -> int:
        return len(self._values)

    def __contains__(self, key: Hashable) -> bool:
        """Whether ``key`` is stored (its place in the LRU order unchanged)."""
        with self._lock:
            return key in self._values

    def keys(self) -> list[Hashable]:
        """The stored keys, least recently used first."""
        with self._lock:
            return list(self._values)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(self._size(v) for v in self._values.values())

    def usage(self) -> dict[str, tuple[int, int]]:
        """``{kind: (values, bytes)}`` of what the store holds now."""
        held: dict[str, tuple[int, int]] = {}
        with self._lock:
            for key, value in self._values.items():
                count, size = held.get(self._kind(key), (0, 0))
                held[self._kind(key)] = (count + 1, size + self._size(value))
        return held

    def peek(self, key: Hashable) -> T | None:
        """The stored value of ``key`` (now the most recently used), or ``None``: never computes."""
        with self._lock:
            if key not in self._values:
                return None
            self._values.move_to_end(key)
            return self._values[key]

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        """The stored value of ``key``, or ``compute()`` stored: once per key across threads.

        The first caller computes while later callers for the same key wait on the key's gate;
        the value is stored *before* the gate is retired, in one critical section, so a caller
        arriving at any moment finds either the gate (and waits) or the value (and returns it),
        never neither. An exception reaches the caller that computed; every caller waiting on
        the same gate then tries again in turn, and nothing is stored."""
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
                return self._values[key]
            gate = self._computing.get(key)
            if gate is None:
                gate = self._computing[key] = _Gate()
            gate.users += 1
        try:
            with gate.lock:  # a second thread asking for the same key waits here for the first
                with self._lock:
                    if key in self._values:
                        self._values.move_to_end(key)
                        return self._values[key]
                value = compute()
                with self._lock:
                    self.computed += 1
                    self._values[key] = value
                    self._evict()
                return value
        finally:
            with self._lock:  # the last caller of a gate retires it (the value, if any, is stored)
                gate.users -= 1
                if gate.users == 0 and self._computing.get(key) is gate:
                    del self._computing[key]

    def clear(self) -> None:
        """Drop every value (and the count of values the byte budget pushed out)."""
        with self._lock:
            self._values.clear()
            self.evicted_for_bytes = 0

    def _evict(self) -> None:
        """Oldest first, drop a value while the store is over its bytes or the value's kind over its
        count; never the newest."""
        sizes = {key: self._size(value) for key, value in self._values.items()}
        total = sum(sizes.values())
        counts: dict[str, int] = {}
        for key in sizes:
            counts[self._counted_as(key)] = counts.get(self._counted_as(key), 0) + 1
        newest = next(reversed(self._values))
        for key in list(self._values):
            if key == newest:
                break
            kind = self._counted_as(key)
            over_count, over_bytes = counts[kind] > self._limit(kind), total > self.max_bytes
            if over_count or over_bytes:
                del self._values[key]
                total -= sizes[key]
                counts[kind] -= 1
                self.evicted_for_bytes += int(not over_count)

    def _counted_as(self, key: Hashable) -> str:
        """The kind whose count ``key`` adds to: every key together under a single count."""
        return "" if isinstance(self.max_entries, int) else self._kind(key)

    def _limit(self, kind: str) -> int:
        if isinstance(self.max_entries, int):
            return self.max_entries
        return self.max_entries.get(kind, 2**62)
