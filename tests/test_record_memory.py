"""Record memory reuse: a dropped record's memory serves the next one, never a live one's."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
import torch

from analysis import capture_attention, load_vit
from analysis import record_memory
from analysis.record_memory import idle_record_bytes, record_buffer, release_record_memory
from conftest import random_pixels
from reference import reference_attention

BIG = (9, 1 << 20)  # 36 MiB of float32: above REUSED_FROM_BYTES


@pytest.fixture(autouse=True)
def _empty_pool():
    release_record_memory()
    yield
    release_record_memory()


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
            if float(buffer[:, :1024].min()) != mark or float(buffer[:, :1024].max()) != mark or float(buffer[-1, -1]) != mark:
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
    torch.testing.assert_close(again.attentions.double(), reference_attention(vit.model, second_pixels),
                               atol=2e-6, rtol=1e-4)
    assert torch.equal(kept.attentions, kept_values)
