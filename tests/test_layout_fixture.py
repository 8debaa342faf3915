"""The layout fixture's comparison (``tests/layout_fixture.py``) reports every change it is for:
a value beyond the tolerance, a changed refusal, a key only one side has; and nothing else."""

from __future__ import annotations

import numpy as np

from layout_fixture import compare


def test_compare_reports_values_refusals_and_keys_beyond_the_tolerance(tmp_path):
    before = {
        "vit/map": np.array([[0.25, 0.75]], np.float32),
        "vit/close": np.array([1.0, 2.0]),
        "swin/position_similarity/refused": np.asarray("not defined for a windowed model"),
        "sam/gone": np.zeros(3),
    }
    after = {
        "vit/map": np.array([[0.25, 0.75 + 3e-6]], np.float32),
        "vit/close": np.array([1.0, 2.0 + 2e-6]),  # within 1e-6 + 1e-6 · 2
        "swin/position_similarity/refused": np.asarray("another reason"),
        "sam/new": np.zeros(3),
    }
    np.savez(tmp_path / "before.npz", **before)
    np.savez(tmp_path / "after.npz", **after)
    lines = compare(tmp_path / "before.npz", tmp_path / "after.npz")
    assert lines == [
        "only in before.npz: sam/gone",
        "only in after.npz: sam/new",
        "swin/position_similarity/refused: not defined for a windowed model -> another reason",
        "vit/map: differs by up to 2.98e-06 (largest |before| 0.75)",  # float32 steps,
    ]
    assert compare(tmp_path / "before.npz", tmp_path / "before.npz") == []
