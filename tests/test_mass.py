"""DINO-style top-mass masks against an explicit loop, and analytic cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from analysis import AnalysisError, capture_attention, top_mass_mask
from conftest import random_pixels


def loop_reference(grid_map: np.ndarray, mass: float) -> np.ndarray:
    """Greedy: take patches from the largest down (row-major among equals) until their sum
    reaches ``mass`` of the total."""
    flat = [float(v) for v in grid_map.ravel()]
    order = sorted(range(len(flat)), key=lambda i: (-flat[i], i))
    total = sum(flat)
    keep = [False] * len(flat)
    held = 0.0
    for rank, i in enumerate(order):
        if rank > 0 and held >= mass * total * (1 - 1e-12):
            break
        keep[i] = True
        held += flat[i]
    return np.array(keep).reshape(grid_map.shape)


@pytest.mark.parametrize("mass", [0.1, 0.35, 0.6, 0.9, 1.0])
def test_matches_the_loop_reference_on_random_maps(mass):
    rng = np.random.default_rng(0)
    maps = rng.dirichlet(np.full(35, 0.3), size=(3, 4)).reshape(3, 4, 5, 7)  # non-square grid
    masks = top_mass_mask(maps, mass).numpy()
    assert masks.shape == maps.shape and masks.dtype == bool
    for index in np.ndindex(3, 4):
        np.testing.assert_array_equal(masks[index], loop_reference(maps[index], mass))
        kept = maps[index][masks[index]].sum()
        assert kept >= mass * maps[index].sum() - 1e-12
        # minimal: dropping the smallest kept patch falls short of the target
        assert kept - maps[index][masks[index]].min() < mass * maps[index].sum()


def test_uniform_map_keeps_the_ceiling_of_mass_times_n():
    gh, gw = 6, 4
    uniform = np.full((gh, gw), 1.0 / (gh * gw))
    for mass in (0.1, 0.5, 0.6, 0.99, 1.0):
        assert int(top_mass_mask(uniform, mass).sum()) == math.ceil(round(mass * gh * gw, 9))
    # ties broken row-major: the first patches
    assert top_mass_mask(uniform, 0.25).numpy().ravel()[:6].all()


def test_one_hot_map_keeps_one_patch_and_zero_patches_never_join():
    one_hot = np.zeros((3, 5))
    one_hot[2, 1] = 1.0
    for mass in (0.01, 0.6, 1.0):
        mask = top_mass_mask(one_hot, mass).numpy()
        assert mask.sum() == 1 and mask[2, 1]
    half = np.zeros((2, 2))
    half[0, 0] = half[1, 1] = 0.5
    np.testing.assert_array_equal(top_mass_mask(half, 1.0).numpy(), [[True, False], [False, True]])


def test_on_captured_attention(vits):
    vit = vits["registers"]
    record = capture_attention(vit, random_pixels(vit, batch=1))
    attn = record.attentions[-1, 0, :, 0, vit.spec.num_prefix_tokens :]  # (heads, N_patches) class-token rows
    gh, gw = vit.spec.grid_size
    maps = attn.reshape(-1, gh, gw)
    masks = top_mass_mask(maps, 0.6)
    for h in range(maps.shape[0]):
        np.testing.assert_array_equal(masks[h].numpy(), loop_reference(maps[h].double().numpy(), 0.6))


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5, True, "0.6", float("nan")])
def test_bad_mass_is_a_typed_error(bad):
    with pytest.raises(AnalysisError, match="mass"):
        top_mass_mask(np.ones((2, 2)), bad)


def test_bad_maps_are_typed_errors():
    with pytest.raises(AnalysisError, match="non-negative"):
        top_mass_mask(np.array([[0.5, -0.1]]), 0.6)
    with pytest.raises(AnalysisError, match="shape"):
        top_mass_mask(np.ones(4), 0.6)
    with pytest.raises(AnalysisError, match="numeric"):
        top_mass_mask(torch.ones(2, 2, dtype=torch.bool), 0.6)
