"""Record memory reuse: a dropped record's memory serves the next one, never a live one's."""

from __future__ import annotations

import gc
import os
import threading

import numpy as np
import pytest
import torch

from analysis import capture_attention, load_vit
from analysis.base import record_memory
from analysis.base.record_memory import idle_record_bytes, record_buffer, release_record_memory, reuse_record_memory
from conftest import random_pixels
from reference import reference_attention

BIG = (9, 1 << 20)  # 36 MiB of float32: above REUSED_FROM_BYTES


@pytest.fixture(autouse=True)
def _empty_pool():
    """Reuse is opt-in: these tests turn it on (1024 MiB) and off again afterwards."""
    release_record_memory()
    previous = reuse_record_memory(1024)
    yield
    reuse_record_memory(previous)
    release_record_memory()


def test_reuse_is_off_by_default_and_turned_on_only_on_request(monkeypatch):
    monkeypatch.delenv("ANALYSIS_IDLE_RECORD_MB", raising=False)
    assert record_memory._idle_limit_from_env() == 0  # the default: every record gets new memory
    monkeypatch.setenv("ANALYSIS_IDLE_RECORD_MB", "64")
    assert record_memory._idle_limit_from_env() == 64 << 20
    monkeypatch.setenv("ANALYSIS_IDLE_RECORD_MB", "lots")
    assert record_memory._idle_limit_from_env() == 0
    assert reuse_record_memory(0) == 1024  # off: a dropped buffer is freed, not kept
    first = record_buffer(BIG, torch.float32)
    del first
    assert idle_record_bytes() == 0
    assert reuse_record_memory(1024) == 0
    kept = record_buffer(BIG, torch.float32)
    del kept
    assert idle_record_bytes() == 9 << 22
    assert reuse_record_memory(0) == 1024 and idle_record_bytes() == 0  # turning it off gives idle memory back
    with pytest.raises(ValueError, match="whole number"):
        reuse_record_memory(-1)


def _address(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def test_dropped_buffer_is_reused_and_kept_idle_meanwhile():
    first = record_buffer(BIG, torch.float32)
    address = _address(first)
    del first
    assert idle_record_bytes() == 9 << 22
    second = record_buffer(BIG, torch.float32)
    assert _address(second) == address
    assert idle_record_bytes() == 0


@pytest.mark.parametrize("keep", ["slice", "numpy", "reshaped view"])
def test_a_live_view_keeps_the_memory_its_own(keep):
    first = record_buffer(BIG, torch.float32)
    first.fill_(1.0)
    if keep == "slice":
        view = first[3]
    elif keep == "numpy":
        view = first.numpy()
    else:
        view = first.view(-1)
    address = _address(first)
    del first
    gc.collect()
    assert idle_record_bytes() == 0
    second = record_buffer(BIG, torch.float32)
    assert _address(second) != address
    second.fill_(2.0)
    assert float(np.asarray(view).min()) == 1.0  # the old view's values are untouched
    del view, second
    gc.collect()
    assert idle_record_bytes() == 2 * (9 << 22)  # both came back once nothing viewed them


def test_small_buffers_and_other_sizes_are_plain_allocations():
    small = record_buffer((4, 5), torch.float16)
    assert small.shape == (4, 5) and small.dtype == torch.float16
    del small
    assert idle_record_bytes() == 0
    first = record_buffer(BIG, torch.float32)
    address = _address(first)
    del first
    other = record_buffer((10, 1 << 20), torch.float32)  # a different size never takes it
    assert _address(other) != address
    half = record_buffer((18, 1 << 20), torch.float16)  # same bytes, another dtype and shape: reused
    assert _address(half) == address and half.shape == (18, 1 << 20) and half.dtype == torch.float16


def test_idle_memory_is_bounded_and_released(monkeypatch):
    monkeypatch.setattr(record_memory._IDLE, "limit", 80 << 20)
    buffers = [record_buffer(BIG, torch.float32) for _ in range(3)]
    del buffers
    assert idle_record_bytes() == 2 * (9 << 22)  # a third would pass 80 MiB: the oldest is given back
    assert release_record_memory() == 2 * (9 << 22)
    assert idle_record_bytes() == 0
    monkeypatch.setattr(record_memory._IDLE, "limit", 0)  # ANALYSIS_IDLE_RECORD_MB=0: reuse off
    plain = record_buffer(BIG, torch.float32)
    del plain
    assert idle_record_bytes() == 0


def test_threads_never_share_a_live_buffer():
    """Many threads allocate, write their own mark, check it, and drop: a buffer handed to two
    live owners at once would show another thread's mark."""
    errors: list[str] = []

    def work(mark: int) -> None:
        for _ in range(6):
            buffer = record_buffer(BIG, torch.float32)
            buffer[:, :1024].fill_(mark)
            buffer[-1, -1] = mark
            if (
                float(buffer[:, :1024].min()) != mark
                or float(buffer[:, :1024].max()) != mark
                or float(buffer[-1, -1]) != mark
            ):
                errors.append(f"thread {mark} saw another owner's writes")
            del buffer

    threads = [threading.Thread(target=work, args=(mark,)) for mark in range(1, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert idle_record_bytes() <= record_memory._IDLE.limit


def test_captures_reuse_a_dropped_record_and_leave_a_kept_one_intact(monkeypatch):
    """With the threshold lowered to the demo's record size, consecutive captures go through
    the reused memory: each record still equals the reference, and a record that is kept is
    not overwritten by the next capture."""
    monkeypatch.setattr(record_memory, "REUSED_FROM_BYTES", 1)
    vit = load_vit("demo")
    first_pixels, second_pixels = random_pixels(vit, seed=1), random_pixels(vit, seed=2)
    kept = capture_attention(vit, first_pixels)
    kept_values = kept.attentions.clone()
    dropped = capture_attention(vit, second_pixels)
    address = _address(dropped.attentions)
    assert address != _address(kept.attentions)
    del dropped
    again = capture_attention(vit, second_pixels)
    assert _address(again.attentions) == address
    torch.testing.assert_close(
        again.attentions.double(), reference_attention(vit.model, second_pixels), atol=2e-6, rtol=1e-4
    )
    assert torch.equal(kept.attentions, kept_values)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX-only; Windows maps are private")
def test_a_forked_child_never_writes_into_the_parents_records():
    """The mappings are private: after fork, a child that writes into its copy of a live record,
    and into records of its own (its idle set starts empty), leaves the parent's untouched."""
    live = record_buffer(BIG, torch.float32)
    live.numpy()[:] = 1.0  # numpy, not torch ops: no OpenMP pool in the forked child
    idle = record_buffer(BIG, torch.float32)
    idle.numpy()[:] = 2.0
    idle_address = _address(idle)
    del idle
    assert idle_record_bytes() == 9 << 22
    pid = os.fork()
    if pid == 0:  # child: exit status 0 only if everything went as expected
        status = 1
        try:
            inherited_idle_kept = idle_record_bytes() == 0
            live.numpy()[:] = 7.0
            mine = record_buffer(BIG, torch.float32)
            mine.numpy()[:] = 7.0
            status = 0 if inherited_idle_kept else 2
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert float(live.numpy().min()) == float(live.numpy().max()) == 1.0
    reused = record_buffer(BIG, torch.float32)  # the parent's idle buffer, values as it left them
    assert _address(reused) == idle_address
    assert float(reused.numpy().min()) == float(reused.numpy().max()) == 2.0


def test_shapes_are_checked_like_torch_empty():
    with pytest.raises(TypeError):
        record_buffer((9.7, 1 << 20), torch.float32)
    with pytest.raises(ValueError, match="negative"):
        record_buffer((-9, -(1 << 20)), torch.float32)
    assert idle_record_bytes() == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX-only")
def test_a_child_forked_while_another_thread_holds_the_lock_still_allocates():
    import signal

    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with record_memory._IDLE._lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    try:
        pid = os.fork()
        if pid == 0:
            signal.alarm(10)  # a deadlocked child dies of SIGALRM instead of hanging the suite
            status = 1
            try:
                buffer = record_buffer(BIG, torch.float32)
                del buffer
                status = 0 if idle_record_bytes() == 9 << 22 else 2
            finally:
                os._exit(status)
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        holder.join()
    assert os.waitstatus_to_exitcode(status) == 0
