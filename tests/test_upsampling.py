"""Bilinear / nearest upsampling of patch maps and Figure 6's masked image, against explicit
loops and analytic cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis import AnalysisError, masked_image, upsample_map


def loop_bilinear(grid: np.ndarray, height: int, width: int) -> np.ndarray:
    """Half-pixel-centre bilinear interpolation, written out: pixel (i, j) sits at patch
    coordinates ((i + ½)·gh/H − ½, (j + ½)·gw/W − ½), clamped to [0, g − 1]."""
    gh, gw = grid.shape
    out = np.zeros((height, width))
    for i in range(height):
        y = min(max((i + 0.5) * gh / height - 0.5, 0.0), gh - 1)
        y0 = int(math.floor(y))
        y1 = min(y0 + 1, gh - 1)
        fy = y - y0
        for j in range(width):
            x = min(max((j + 0.5) * gw / width - 0.5, 0.0), gw - 1)
            x0 = int(math.floor(x))
            x1 = min(x0 + 1, gw - 1)
            fx = x - x0
            out[i, j] = (
                (1 - fy) * (1 - fx) * grid[y0, x0]
                + (1 - fy) * fx * grid[y0, x1]
                + fy * (1 - fx) * grid[y1, x0]
                + fy * fx * grid[y1, x1]
            )
    return out


def test_bilinear_matches_an_explicit_loop_on_a_non_square_grid():
    grid = np.random.default_rng(0).random((3, 5))
    np.testing.assert_allclose(upsample_map(grid, (12, 35)), loop_bilinear(grid, 12, 35), atol=1e-12)


def test_nearest_gives_exact_patch_cells():
    grid = np.arange(6, dtype=float).reshape(2, 3)
    out = upsample_map(grid, (8, 12), "nearest")  # 4 x 4 px cells
    for r in range(2):
        for c in range(3):
            assert (out[r * 4 : (r + 1) * 4, c * 4 : (c + 1) * 4] == grid[r, c]).all()


def test_constant_maps_stay_constant_and_masks_scale_the_image():
    image = np.random.default_rng(1).integers(0, 256, (16, 24, 3), dtype=np.uint8)
    np.testing.assert_allclose(upsample_map(np.full((2, 3), 0.25), (16, 24)), 0.25)
    np.testing.assert_array_equal(masked_image(image, np.full((2, 3), 0.25)), image)  # normalised by max
    half = np.ones((2, 3))
    half[:, 1:] = 0.5
    out = masked_image(image, half, mode="nearest")
    np.testing.assert_array_equal(out[:, :8], image[:, :8])
    np.testing.assert_array_equal(out[:, 8:], np.rint(image[:, 8:] * 0.5).astype(np.uint8))
    assert (masked_image(image, np.zeros((2, 3))) == 0).all()


@pytest.mark.parametrize(
    "call",
    [
        lambda: upsample_map(np.ones((2, 2)), (4, 4), mode="bicubic"),
        lambda: upsample_map(np.ones(4), (4, 4)),
        lambda: upsample_map(np.ones((2, 2)), (0, 4)),
        lambda: upsample_map(np.ones((2, 2)), (4.5, 4)),
        lambda: masked_image(np.zeros((4, 4)), np.ones((2, 2))),
    ],
)
def test_bad_arguments_raise_typed_errors(call):
    with pytest.raises(AnalysisError):
        call()
