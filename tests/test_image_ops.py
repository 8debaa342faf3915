"""``analysis.base.image_ops`` against explicit loops: blur, noise, the baseline images and the
pixels that chosen patches cover."""

from __future__ import annotations

import math

import pytest
import torch

from analysis import AnalysisError, load_vit
from analysis.base.image_ops import (
    BASELINES,
    baseline_pixels,
    gaussian_blur,
    gaussian_noise,
    patch_grid,
    patch_pixel_mask,
)


def blur_by_loops(image: torch.Tensor, sigma: float) -> torch.Tensor:
    """``(H, W)``: Σ_{|a|,|b| ≤ r} k[a]·k[b]·x[clamp(i+a), clamp(j+b)], k ∝ exp(−t²/2σ²), r = ⌈3σ⌉."""
    radius = max(1, math.ceil(3 * sigma))
    weights = [math.exp(-0.5 * (t / sigma) ** 2) for t in range(-radius, radius + 1)]
    total = sum(weights)
    weights = [w / total for w in weights]
    height, width = image.shape
    out = torch.zeros(height, width, dtype=torch.float64)
    for i in range(height):
        for j in range(width):
            value = 0.0
            for a in range(-radius, radius + 1):
                for b in range(-radius, radius + 1):
                    y, x = min(max(i + a, 0), height - 1), min(max(j + b, 0), width - 1)
                    value += weights[a + radius] * weights[b + radius] * float(image[y, x])
            out[i, j] = value
    return out


@pytest.mark.parametrize("sigma", [0.7, 1.5])
def test_blur_is_the_replicated_edge_gaussian_of_the_loops(sigma):
    pixels = torch.randn(2, 3, 9, 7, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    blurred = gaussian_blur(pixels, sigma)
    for b in range(2):
        for c in range(3):
            torch.testing.assert_close(
                blurred[b, c], blur_by_loops(pixels[b, c], sigma), rtol=1e-6, atol=1e-7
            )  # the kernel is float32
    assert torch.equal(gaussian_blur(pixels, 0), pixels)


def test_noise_adds_sigma_times_the_seeded_normal():
    pixels = torch.rand(1, 3, 4, 5)
    expected = pixels + 0.3 * torch.randn(pixels.shape, generator=torch.Generator().manual_seed(11))
    torch.testing.assert_close(gaussian_noise(pixels, 0.3, seed=11), expected)
    with pytest.raises(AnalysisError):
        gaussian_blur(pixels, -1.0)


def test_baselines_are_black_the_mean_colour_and_a_patch_wide_blur():
    vit = load_vit("demo")
    pixels = torch.randn(1, 3, *vit.spec.img_size, generator=torch.Generator().manual_seed(2))
    black = baseline_pixels(vit, pixels, "black")
    for c, (mean, std) in enumerate(zip(vit.preprocessing.mean, vit.preprocessing.std)):
        assert torch.allclose(black[0, c], torch.full(vit.spec.img_size, (0.0 - mean) / std))
    assert torch.equal(baseline_pixels(vit, pixels, "mean"), torch.zeros_like(pixels))
    torch.testing.assert_close(
        baseline_pixels(vit, pixels, "blur"), gaussian_blur(pixels, float(max(vit.spec.patch_size)))
    )
    assert BASELINES == ("mean", "black", "blur")  # the first is the default of explain and perturbation_curve
    with pytest.raises(AnalysisError, match="baseline must be one of"):
        baseline_pixels(vit, pixels, "white")


@pytest.mark.parametrize("image_size", [(9, 20), (7, 13), (10, 22)])  # exact, cropped, padded
def test_patch_pixel_mask_covers_exactly_the_pixels_of_the_chosen_patches(image_size):
    """A 3×4 grid of 3×5 patches (not square, not a square grid): pixel (y, x) is chosen iff the
    patch (y // 3, x // 5) is, and pixels beyond the grid are never chosen."""
    grid_size, patch_size = (3, 4), (3, 5)
    sets = [torch.tensor([0, 5, 11]), torch.tensor([], dtype=torch.long), [3, 4]]
    mask = patch_pixel_mask(patch_grid(sets, grid_size), patch_size, image_size)
    assert mask.shape == (3, *image_size) and mask.dtype == torch.bool
    for k, chosen in enumerate(sets):
        chosen = {int(i) for i in chosen}
        for y in range(image_size[0]):
            for x in range(image_size[1]):
                r, c = y // 3, x // 5
                inside = r < 3 and c < 4
                assert bool(mask[k, y, x]) == (inside and r * 4 + c in chosen), (k, y, x)
