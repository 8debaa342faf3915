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


class _PausingLock:
    """The store's lock, with a hook: the first time ``thread`` releases it after ``armed`` is
    set, ``on_release()`` runs before ``thread`` goes on. Used to hold the computing thread at
    the moment it leaves a critical section after ``compute()`` returned."""

    def __init__(self):
        self._lock = threading.Lock()
        self.thread, self.armed, self.on_release = None, False, None

    def __enter__(self):
        self._lock.acquire()
        return self

    def __exit__(self, *exc):
        self._lock.release()
        if self.armed and threading.current_thread() is self.thread:
            self.armed = False
            self.on_release()


def test_callers_arriving_while_the_first_finishes_do_not_compute_again():
    """N threads ask for one key at the moment the computing thread has returned from
    ``compute()`` and left its first critical section: each must find the gate or the value.

    Deterministic: the computing thread is held at that exact point until the N threads have
    finished (a regression that retires the gate before storing the value computes twice here)."""
    store = RecordStore(max_entries=4, max_bytes=10**9, size=len)
    lock = store._lock = _PausingLock()
    calls, results = [], []

    def compute():
        calls.append(threading.current_thread().name)
        if len(calls) == 1:  # the first computation: hold its thread when it next leaves the lock
            lock.thread, lock.armed = threading.current_thread(), True
        return b"value"

    def late_callers():
        threads = [threading.Thread(target=lambda: results.append(store.get("k", compute))) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=10)
        assert not any(t.is_alive() for t in threads), "a late caller is stuck behind the computing thread"

    lock.on_release = late_callers
    first = store.get("k", compute)
    assert len(calls) == 1, f"computed {len(calls)} times for one key"
    assert store.computed == 1 and len(results) == 8 and all(r is first for r in results)
    assert store._computing == {}, "a gate outlived its computation"


def test_callers_waiting_on_a_failed_computation_retry_one_at_a_time():
    """The first computation fails; the callers that waited on it retry, and the first retry's
    value is shared by the rest (one success, no second success computed)."""
    store = RecordStore(max_entries=4, max_bytes=10**9, size=len)
    started, release = threading.Event(), threading.Event()
    calls = []

    def compute():
        calls.append(1)
        if len(calls) == 1:
            started.set()
            release.wait(timeout=10)
            raise ValueError("first attempt fails")
        return b"value"

    errors, results = [], []

    def ask():
        try:
            results.append(store.get("k", compute))
        except ValueError as exc:
            errors.append(exc)

    first = threading.Thread(target=ask)
    first.start()
    assert started.wait(timeout=10)
    waiters = [threading.Thread(target=ask) for _ in range(5)]
    for thread in waiters:
        thread.start()
    deadline = time.monotonic() + 10
    while store._computing["k"].users < 6:  # all five are queued on the first caller's gate
        assert time.monotonic() < deadline, "the waiting callers never queued on the gate"
        time.sleep(0.01)
    release.set()
    for thread in [first, *waiters]:
        thread.join(timeout=10)
    assert len(errors) == 1 and len(results) == 5 and all(r is results[0] for r in results)
    assert len(calls) == 2 and store.computed == 1 and store._computing == {}


def test_peek_reads_without_computing_and_counts_as_a_use():
    store = RecordStore(max_entries=2, max_bytes=10**9, size=lambda value: 0)
    assert store.peek("a") is None and store.computed == 0
    store.get("a", lambda: 1)
    store.get("b", lambda: 2)
    assert store.peek("a") == 1  # "a" is now the most recently used ...
    store.get("c", lambda: 3)  # ... so "b" goes
    assert store.peek("b") is None and store.peek("a") == 1 and store.peek("c") == 3
    assert store.computed == 3


def test_head_descriptions_are_kept_in_the_locked_store():
    """Concurrent sessions share the head descriptions: one locked store, each key computed once."""
    from vizapp.views.text_prompts import compute

    assert isinstance(compute._head_text_results(), RecordStore)
    calls = []
    store = compute._head_text_results()
    store.clear()
    original = compute._head_texts
    try:
        compute._head_texts = lambda *args: calls.append(args) or ("texts", ())
        barrier = threading.Barrier(4)

        def ask():
            barrier.wait()
            compute.compute_head_texts("demo-clip", ("d1", "d2"), (b"1", b"2"), 3)

        threads = [threading.Thread(target=ask) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        compute._head_texts = original
    assert len(calls) == 1
    assert compute.stored_head_texts("demo-clip", ("d1", "d2"), 3) == ("texts", ())
    store.clear()


def test_kinds_have_their_own_counts_and_share_one_byte_budget():
    """Models and passes in one store (the app's memory budget): each kind's count pushes out the
    oldest of that kind only; the shared bytes push out the oldest of any kind; the newest stays."""
    store = RecordStore(max_entries={"model": 2, "forward": 3}, max_bytes=100, size=len, kind=lambda key: key[0])
    for name in ("m1", "m2"):
        store.get(("model", name), lambda: b"x" * 10)
    for name in ("f1", "f2", "f3"):
        store.get(("forward", name), lambda: b"x" * 5)
    store.get(("model", "m3"), lambda: b"x" * 10)  # a third model: m1 goes, no pass does
    assert store.keys() == [("model", "m2"), ("forward", "f1"), ("forward", "f2"), ("forward", "f3"), ("model", "m3")]
    assert store.usage() == {"model": (2, 20), "forward": (3, 15)} and store.evicted_for_bytes == 0
    store.get(("forward", "f2"), lambda: pytest.fail("recomputed"))  # touched: f1 is the oldest pass now
    store.get(("forward", "big"), lambda: b"x" * 70)  # 35 + 70 = 105 > 100: the oldest of any kind go
    # m2 (10) goes for the bytes (95 ≤ 100); the pass count is 4 > 3: f1, the oldest pass, goes too
    assert store.keys() == [("forward", "f3"), ("model", "m3"), ("forward", "f2"), ("forward", "big")]
    assert store.nbytes == 90 and store.evicted_for_bytes == 1
    store.get(("model", "huge"), lambda: b"x" * 500)  # alone over the budget: everything else goes, it stays
    assert store.keys() == [("model", "huge")] and store.evicted_for_bytes == 5
