"""Faithfulness metrics against loops and analytic cases; the benchmark on held-out demo scenes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import analysis
from analysis import AnalysisError
from analysis.faithfulness import (
    RANDOM,
    area_under_curve,
    benchmark,
    format_table,
    mask_iou,
    patch_mask,
    patch_ranking,
    perturbation_curve,
    perturbed_inputs,
    pointing_score,
    randomized_copy,
    rank_correlation,
)
from analysis.faithfulness.__main__ import BENCHMARK_SEED, main

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def demo():
    return analysis.load_vit("demo", device="cpu")


def test_area_under_curve_is_the_trapezoid_rule():
    assert area_under_curve([0, 1], [1, 1]) == 1.0
    assert area_under_curve([0, 0.5, 1], [1, 0, 1]) == 0.5
    assert area_under_curve(np.linspace(0, 1, 101), np.linspace(0, 1, 101)) == pytest.approx(0.5)


def test_ranking_is_descending_with_row_major_ties():
    saliency = torch.tensor([[0.2, 0.9], [0.2, 0.5]])
    assert patch_ranking(saliency).tolist() == [1, 3, 0, 2]
    assert patch_ranking(saliency, most_first=False).tolist() == [0, 2, 3, 1]
    with pytest.raises(AnalysisError, match="NaN"):
        patch_ranking(torch.tensor([[float("nan"), 1.0]]))


def test_perturbed_inputs_replace_exactly_the_chosen_patches():
    grid, patch = (2, 3), (4, 5)
    pixels = torch.arange(3 * 8 * 15, dtype=torch.float32).reshape(3, 8, 15)
    replacement = -torch.ones_like(pixels)
    out = perturbed_inputs(
        pixels, replacement, [torch.tensor([]), torch.tensor([4]), torch.tensor([0, 5])], patch, grid
    )
    assert torch.equal(out[0], pixels)
    for k, chosen in ((1, {4}), (2, {0, 5})):
        for index in range(6):
            r, c = divmod(index, 3)
            block = out[k, :, r * 4 : (r + 1) * 4, c * 5 : (c + 1) * 5]
            expected = replacement if index in chosen else pixels
            assert torch.equal(block, expected[:, r * 4 : (r + 1) * 4, c * 5 : (c + 1) * 5])


def test_deletion_curve_equals_a_loop_of_forward_passes(demo):
    image = analysis.load_image(REPO / "assets" / "samples" / "scene_0_bar.png")
    pixels = demo.preprocess(image)
    saliency = torch.rand(demo.spec.grid_size, generator=torch.Generator().manual_seed(0))
    fractions, values = perturbation_curve(demo, pixels, saliency, 2, mode="deletion", steps=4)
    assert fractions.tolist() == [0, 0.25, 0.5, 0.75, 1.0]
    n = demo.spec.num_patches
    order = sorted(range(n), key=lambda i: -float(saliency.reshape(-1)[i]))
    (ph, pw), gw = demo.spec.patch_size, demo.spec.grid_size[1]
    for f, value in zip(fractions, values):
        x = pixels.clone()
        for index in order[: int(round(f * n))]:
            r, c = divmod(index, gw)
            x[..., r * ph : (r + 1) * ph, c * pw : (c + 1) * pw] = 0.0  # "mean": the normalised zero
        with torch.no_grad():
            expected = demo.model(x).softmax(-1)[0, 2]
        assert value == pytest.approx(float(expected), abs=1e-6)
    # insertion at 100% is the image itself; at 0% the baseline
    _, inserted = perturbation_curve(demo, pixels, saliency, 2, mode="insertion", steps=1)
    with torch.no_grad():
        assert inserted[-1] == pytest.approx(float(demo.model(pixels).softmax(-1)[0, 2]), abs=1e-6)
        assert inserted[0] == pytest.approx(float(demo.model(torch.zeros_like(pixels)).softmax(-1)[0, 2]), abs=1e-6)


def test_localisation_metrics():
    mask = np.zeros((8, 12), dtype=bool)
    mask[0, 0] = mask[5, 11] = True
    patches = patch_mask(mask, (4, 4), (2, 3))
    assert patches.tolist() == [[True, False, False], [False, False, True]]
    perfect = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    assert pointing_score(perfect, patches) == 1.0 and mask_iou(perfect, patches) == 1.0
    wrong = torch.tensor([[1.0, 3.0, 0.0], [0.0, 0.0, 0.5]])
    assert pointing_score(wrong, patches) == 0.0
    assert mask_iou(wrong, patches) == pytest.approx(1 / 3)  # top-2 = {1, 0}: 1 shared of {0, 1, 5}
    # a flat map scores the chance level (2 of 6 patches on the object), whatever the patch order
    assert pointing_score(torch.ones(2, 3), patches) == pytest.approx(2 / 6)
    assert pointing_score(torch.tensor([[3.0, 3.0, 0.0], [0.0, 0.0, 3.0]]), patches) == pytest.approx(2 / 3)
    with pytest.raises(AnalysisError, match="no patch"):
        mask_iou(perfect, np.zeros((2, 3), dtype=bool))
    # NaN cells (dropped tokens) are not candidates; a map NaN everywhere has no maximum
    holes = torch.tensor(
        [
            [[np.nan, 0.0, 0.0], [0.0, 0.0, 1.0]],
            [[np.nan, 1.0, np.nan], [1.0, 0.0, np.nan]],
            [[np.nan] * 3, [np.nan] * 3],
        ]
    )
    scores = pointing_score(holes, np.broadcast_to(patches, (3, 2, 3)))
    assert scores[0] == 1.0 and scores[1] == 0.0 and np.isnan(scores[2])


def test_pointing_score_matches_a_loop_over_random_tied_maps():
    """The batched rule against an explicit loop: share of the maximal patches on the object."""
    generator = torch.Generator().manual_seed(0)
    maps = torch.randint(0, 3, (40, 3, 5), generator=generator).float()  # small integers: many ties
    objects = torch.rand(40, 3, 5, generator=generator) < 0.3
    scores = pointing_score(maps, objects.numpy())
    assert scores.shape == (40,)
    for saliency, on_object, score in zip(maps, objects, scores):
        top = float(saliency.max())
        peaks = [(i, j) for i in range(3) for j in range(5) if float(saliency[i, j]) == top]
        expected = sum(bool(on_object[i, j]) for i, j in peaks) / len(peaks)
        assert score == pytest.approx(expected)
        assert pointing_score(saliency, on_object.numpy()) == pytest.approx(expected)  # one map at a time
    with pytest.raises(AnalysisError, match="same grid"):
        pointing_score(maps[0], objects[0, :2].numpy())


def test_rank_correlation_matches_a_direct_spearman():
    assert rank_correlation([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert rank_correlation([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert rank_correlation([1, 1, 1], [1, 2, 3]) == 0.0
    rng = np.random.default_rng(0)
    a, b = rng.random(50), rng.random(50)
    ra, rb = a.argsort().argsort(), b.argsort().argsort()  # no ties
    expected = 1 - 6 * ((ra - rb) ** 2).sum() / (50 * (50**2 - 1))
    assert rank_correlation(a, b) == pytest.approx(expected)


def test_randomized_copy_leaves_the_loaded_model_alone(demo):
    before = {k: v.clone() for k, v in demo.model.state_dict().items()}
    state = torch.random.get_rng_state()
    copy = randomized_copy(demo, demo.spec.num_layers, seed=1)
    assert torch.equal(state, torch.random.get_rng_state())
    for key, value in demo.model.state_dict().items():
        assert torch.equal(value, before[key]), key
    changed = [k for k, v in copy.model.state_dict().items() if not torch.equal(v, before[k])]
    assert any(k.startswith("head") for k in changed) and any(
        k.startswith(f"blocks.{demo.spec.num_layers - 1}") for k in changed
    )
    assert not any(k.startswith("patch_embed") for k in changed)  # below the blocks: kept
    only_head = randomized_copy(demo, 0, seed=1)
    assert all(k.startswith("head") for k, v in only_head.model.state_dict().items() if not torch.equal(v, before[k]))


def test_every_method_beats_random_on_held_out_demo_scenes(demo):
    """The acceptance bar on a small fixed set: deletion AUC below the random map's for every
    method, and Chefer's relevance points at the object at least 90% of the time."""
    from analysis.demo.data import generate_samples

    images, _labels, masks = generate_samples(24, BENCHMARK_SEED)
    results = benchmark(
        demo, images, masks, steps=8, sanity_images=4, method_options={"integrated_gradients": {"steps": 16}}
    )
    by_name = {r.method: r for r in results}
    assert list(by_name) == [RANDOM, *analysis.EXPLANATION_METHODS]
    random_deletion = by_name[RANDOM].mean("deletion_auc")
    for name, scores in by_name.items():
        assert len(scores.values["deletion_auc"]) == 24 and len(scores.values["sanity_rho"]) == 4
        if name != RANDOM:
            assert scores.mean("deletion_auc") < random_deletion, (name, scores.mean("deletion_auc"), random_deletion)
    assert by_name["chefer"].mean("pointing") >= 0.9
    assert by_name[RANDOM].mean("pointing") < 0.6  # the bar means something
    table = format_table(results)
    assert table.count("\n") == len(results) + 1 and "| random |" in table


def test_the_benchmark_command_prints_the_table(capsys):
    assert main(["--n", "3", "--methods", "chefer,rollout", "--sanity-images", "1", "--steps", "4"]) == 0
    out = capsys.readouterr().out
    assert "| method |" in out and "| chefer |" in out and "| random |" in out and f"seed {BENCHMARK_SEED}" in out


def test_bad_benchmark_requests_are_typed_errors(demo):
    pixels = torch.zeros(1, 3, *demo.spec.img_size)
    with pytest.raises(AnalysisError, match="Unknown methods"):
        benchmark(demo, [], methods=["lrp"])
    with pytest.raises(AnalysisError, match="grid"):
        perturbation_curve(demo, pixels, torch.zeros(3, 3), 0)
    with pytest.raises(AnalysisError, match="mode"):
        perturbation_curve(demo, pixels, torch.zeros(demo.spec.grid_size), 0, mode="both")
    with pytest.raises(AnalysisError, match="one image"):
        perturbation_curve(demo, pixels.repeat(2, 1, 1, 1), torch.zeros(demo.spec.grid_size), 0)
