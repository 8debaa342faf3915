"""The app's record store: one shared object per key, LRU by count and bytes, computed once."""

from __future__ import annotations

import threading
import time

import pytest

from vizapp.records import RecordStore


def test_the_same_object_comes_back_and_is_computed_once():
    store = RecordStore(max_entries=4, max_bytes=10**9, size=len)
    first = store.get("a", lambda: bytearray(10))
    assert store.get("a", lambda: pytest.fail("recomputed")) is first
    assert store.computed == 1


def test_least_recently_used_records_go_first_by_count_and_by_bytes():
    store = RecordStore(max_entries=2, max_bytes=25, size=len)
    store.get("a", lambda: b"x" * 10)
    store.get("b", lambda: b"x" * 10)
    store.get("a", lambda: b"")  # touch a: b is now the oldest
    store.get("c", lambda: b"x" * 10)  # three entries > 2: b goes
    assert store.get("a", lambda: b"new") == b"x" * 10
    assert store.get("b", lambda: b"new") == b"new"  # recomputed
    store.clear()
    store.get("big", lambda: b"x" * 20)
    store.get("big2", lambda: b"x" * 20)  # 40 bytes > 25: the older goes, the newest stays
    assert len(store) == 1 and store.nbytes == 20
    store.get("huge", lambda: b"x" * 100)  # alone over the budget: kept (the page needs it)
    assert len(store) == 1 and store.nbytes == 100


def test_concurrent_requests_for_one_key_compute_it_once():
    store = RecordStore(max_entries=4, max_bytes=10**9, size=len)
    calls = []

    def slow():
        calls.append(1)
        time.sleep(0.2)
        return b"value"

    results = []
    threads = [threading.Thread(target=lambda: results.append(store.get("k", slow))) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and len(results) == 6 and all(r is results[0] for r in results)


def test_a_failed_computation_stores_nothing():
    store = RecordStore(max_entries=4, max_bytes=10**9, size=len)
    with pytest.raises(ValueError):
        store.get("k", lambda: (_ for _ in ()).throw(ValueError("bad image")))
    assert len(store) == 0 and store.get("k", lambda: b"ok") == b"ok"
