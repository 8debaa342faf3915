"""``python -m analysis.bench``'s capture section runs on a small model, and its floor is what it
says: the fused forward's logits untouched, then a record of the capture's shape in new memory."""

from __future__ import annotations

import math

from analysis.bench.__main__ import bench_capture


def test_the_capture_section_runs_and_its_ratios_are_the_paired_medians():
    result = bench_capture("vit_tiny_patch16_224", batch=1, repeats=2, device="cpu")
    assert result["record_mib"] == 12 * 1 * 3 * 197 * 197 * 4 / 2**20  # (L, B, heads, T, T) float32
    for key in ("ratio", "vs_peers", "floor_ratio", "vs_floor"):
        assert math.isfinite(result[key]) and result[key] > 0, key
