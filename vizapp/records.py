"""One captured forward pass per (model, image, resolution), kept once per process and shared
read-only by every session and every rerun: never pickled, never copied.

``st.cache_data`` would unpickle the whole attention record on every call (1.1 s per rerun for
a 0.5 GB ViT-L/16 record at 384 px). :class:`RecordStore` returns the very same object instead,
evicts the least recently used records beyond a count and a byte budget, and computes each key
once even when several sessions ask for it at the same moment.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
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
    (``size(value)``). The newest value is always kept, even alone over the byte budget."""

    def __init__(self, max_entries: int, max_bytes: int, size: Callable[[T], int]):
        self.max_entries, self.max_bytes, self._size = int(max_entries), int(max_bytes), size
        self._values: OrderedDict[Hashable, T] = OrderedDict()
        self._lock = threading.Lock()
        self._computing: dict[Hashable, _Gate] = {}
        self.computed = 0  # how many values were computed (a test and the benchmark read it)

    def __len__(self) -> int:
        return len(self._values)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(self._size(v) for v in self._values.values())

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
        with self._lock:
            self._values.clear()

    def _evict(self) -> None:
        total = sum(self._size(v) for v in self._values.values())
        while len(self._values) > 1 and (len(self._values) > self.max_entries or total > self.max_bytes):
            _, oldest = self._values.popitem(last=False)
            total -= self._size(oldest)
