"""Rollout and explanations of windowed models (issue 23, item 3): timm Swin and SAM, random
weights, small sizes.

The references write everything out by hand: the window arithmetic (which cell sits in which
slot of which window) as loops over windows and slots, the dense matrices and the 2×2 merge
cell by cell, Grad-CAM and the pooled gradients with loops over cells and channels. Nothing
calls :class:`~analysis.model.geometry.LayerGeometry` or the project's rollout to build them.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import analysis
from analysis import AnalysisError, capture_attention, explain, load_vit
from analysis.attention.rollout import merge_matrix, rollout_maps
from analysis.explanations import explanation_grid, methods_for
from analysis.faithfulness import perturbation_curve
from analysis.model.windowed_support import WINDOWED_SUPPORT
from windowed_models import small_pixels, small_sam, small_swin

# (grid, stride, window, shift) per layer of SWIN_SMALL: 16x16 cells of 4 px, then 8x8 of 8 px
SWIN_LAYERS = [
    ((16, 16), (4, 4), (4, 4), (0, 0)),
    ((16, 16), (4, 4), (4, 4), (2, 2)),
    ((8, 8), (8, 8), (4, 4), (0, 0)),
    ((8, 8), (8, 8), (4, 4), (2, 2)),
]
SAM_LAYERS = [((8, 8), (8, 8), (3, 3), (0, 0)), ((8, 8), (8, 8), (8, 8), (0, 0))] * 2


@pytest.fixture(scope="module")
def swin():
    return small_swin(bias_seed=1, num_classes=5)  # position biases of size 1: maps that differ


@pytest.fixture(scope="module")
def sam():
    return small_sam(num_classes=5)


@pytest.fixture(scope="module")
def pixels():
    return small_pixels()


@pytest.fixture(scope="module")
def swin_record(swin, pixels):
    return capture_attention(swin, pixels)


@pytest.fixture(scope="module")
def sam_record(sam, pixels):
    return capture_attention(sam, pixels)


# --------------------------------------------------------------------------- the hand reference


def _slots(grid, window, shift):
    """``[(window, slot, cell or None)]`` by hand: slot (i, j) of window (a, b) sits at
    (a·wh + i, b·ww + j) of the shifted grid padded to whole windows; past the grid it is
    padding, else it holds cell ((y + sh) mod gh, (x + sw) mod gw), row-major."""
    (gh, gw), (wh, ww), (sh, sw) = grid, window, shift
    rows, cols = -(-gh // wh), -(-gw // ww)
    out = []
    for a in range(rows):
        for b in range(cols):
            for i in range(wh):
                for j in range(ww):
                    y, x = a * wh + i, b * ww + j
                    cell = ((y + sh) % gh) * gw + (x + sw) % gw if y < gh and x < gw else None
                    out.append((a * cols + b, i * ww + j, cell))
    return out


def _fuse(windows: torch.Tensor, fusion: str) -> torch.Tensor:
    """``(B, windows, heads, Wt, Wt)`` -> ``(B, windows, Wt, Wt)``."""
    w = windows.double()
    return {"mean": w.mean(2), "max": w.amax(2), "min": w.amin(2)}[fusion]


def _hand_dense(windows, grid, window, shift, fusion="mean") -> torch.Tensor:
    """``(B, N, N)``: A[q, k] = fused[w, s, t] for every real query slot s and real key slot t of
    each window w; 0 elsewhere (padding keys dropped)."""
    fused = _fuse(windows, fusion)
    n = grid[0] * grid[1]
    dense = torch.zeros(fused.shape[0], n, n, dtype=torch.float64)
    by_window = {}
    for w, slot, cell in _slots(grid, window, shift):
        by_window.setdefault(w, []).append((slot, cell))
    for w, slots in by_window.items():
        for s, q in slots:
            for t, k in slots:
                if q is not None and k is not None:
                    dense[:, q, k] = fused[:, w, s, t]
    return dense


def _hand_step(dense: torch.Tensor) -> torch.Tensor:
    """½·A + ½·I, each row divided by its sum, entry by entry for the identity."""
    mixed = 0.5 * dense.clone()
    for i in range(dense.shape[-1]):
        mixed[:, i, i] += 0.5
    return mixed / mixed.sum(-1, keepdim=True)


def _hand_merge(grid) -> torch.Tensor:
    """``(N′, N)``: each merged cell (r′, c′) the mean of its parents (2r′+i, 2c′+j) inside the grid."""
    gh, gw = grid
    mh, mw = -(-gh // 2), -(-gw // 2)
    matrix = torch.zeros(mh * mw, gh * gw, dtype=torch.float64)
    for r in range(mh):
        for c in range(mw):
            parents = [(2 * r + i, 2 * c + j) for i in (0, 1) for j in (0, 1) if 2 * r + i < gh and 2 * c + j < gw]
            for pr, pc in parents:
                matrix[r * mw + c, pr * gw + pc] = 1 / len(parents)
    return matrix


def _hand_rollout(record, layers, start, end, fusion="mean") -> torch.Tensor:
    """``R = Â_end ⋯ (M) ⋯ Â_start`` with the merge matrix wherever the grid changes."""
    rollout = None
    for layer in range(start, end + 1):
        grid, _, window, shift = layers[layer]
        step = _hand_step(_hand_dense(record.windows[layer], grid, window, shift, fusion))
        if rollout is None:
            rollout = step
            continue
        if layers[layer - 1][0] != grid:
            rollout = _hand_merge(layers[layer - 1][0]) @ rollout
        rollout = step @ rollout
    return rollout


# --------------------------------------------------------------------------- rollout


@pytest.mark.parametrize("fusion", ["mean", "max", "min"])
def test_swin_rollout_within_each_stage_equals_the_loops(swin_record, fusion):
    for stage, (start, end) in enumerate([(0, 1), (2, 3)]):
        reference = _hand_rollout(swin_record, SWIN_LAYERS, start, end, fusion)  # (B, N, N)
        grid, stride = SWIN_LAYERS[start][0], SWIN_LAYERS[start][1]
        result = rollout_maps(swin_record, stage=stage, head_fusion=fusion)
        assert (result.grid_size, result.stride, result.query_grid, result.approximate) == (grid, stride, grid, False)
        assert (result.start_layer, result.end_layer) == (start, end)
        torch.testing.assert_close(result.maps.double(), reference.mean(1).view(2, *grid), atol=1e-6, rtol=0)
        same = analysis.attention_rollout(swin_record, start_layer=start, end_layer=end, head_fusion=fusion, query=5)
        torch.testing.assert_close(same.double(), reference[:, 5].view(2, *grid), atol=1e-6, rtol=0)
        torch.testing.assert_close(
            analysis.attention.rollout.rollout_matrices(swin_record, stage=stage, head_fusion=fusion),
            reference,
            atol=1e-9,
            rtol=0,
        )
    # a pixel query is the cell that holds it on the end layer's grid: (63, 63) is cell (7, 7) of stage 1
    reference = _hand_rollout(swin_record, SWIN_LAYERS, 2, 3)
    got = analysis.attention_rollout(swin_record, stage=-1, query=(63, 63))
    torch.testing.assert_close(got.double(), reference[:, 63].view(2, 8, 8), atol=1e-6, rtol=0)


def test_the_shifted_layers_mask_and_window_outside_is_zero(swin_record):
    # one layer: a query's map is zero outside its window (the shifted window of cell (15, 0))
    got = analysis.attention_rollout(swin_record, start_layer=1, end_layer=1, query=15 * 16).double()
    inside = torch.zeros(16, 16, dtype=torch.bool)
    inside[14:16, 0:2] = True  # its roll region: rows 14-15, columns 0-1
    assert (got[:, ~inside] == 0).all() and (got[:, inside] > 0).all()


def test_sam_rollout_over_window_and_global_blocks_is_exact(sam_record):
    reference = _hand_rollout(sam_record, SAM_LAYERS, 0, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # exact: no approximation warning
        result = rollout_maps(sam_record)
    assert (result.grid_size, result.stride, result.approximate) == ((8, 8), (8, 8), False)
    torch.testing.assert_close(result.maps.double(), reference.mean(1).view(2, 8, 8), atol=1e-6, rtol=0)
    torch.testing.assert_close(
        analysis.attention_rollout(sam_record).double(), reference.mean(1).view(2, 8, 8), atol=1e-6, rtol=0
    )
    # padding keys (the 3x3 windows pad the 8x8 grid to 9x9) take probability that is dropped
    windowed = _hand_dense(sam_record.windows[0], (8, 8), (3, 3), (0, 0))
    assert float(windowed.sum(-1).min()) < 1 - 1e-3
    torch.testing.assert_close(reference.sum(-1), torch.ones(2, 64, dtype=torch.float64), atol=1e-9, rtol=0)


def test_crossing_patch_merging_is_refused_with_the_reason(swin_record):
    for call in (
        lambda: analysis.attention_rollout(swin_record),
        lambda: analysis.attention_rollout_by_layer(swin_record),
        lambda: analysis.attention_rollout(swin_record, start_layer=1, end_layer=2),
    ):
        with pytest.raises(AnalysisError, match=r"patch merging.*16x16 cells of 4 px -> 8x8 of 8 px.*merge='mean_2x2'"):
            call()
    with pytest.raises(AnalysisError, match="merge must be None"):
        analysis.attention_rollout(swin_record, merge="max")


def test_the_merge_rule_equals_the_loops_and_is_labelled_an_approximation(swin_record):
    reference = _hand_rollout(swin_record, SWIN_LAYERS, 0, 3)  # (B, 64, 256): stage-1 queries, stem keys
    assert reference.shape == (2, 64, 256)
    with pytest.warns(RuntimeWarning, match="approximation"):
        result = rollout_maps(swin_record, merge="mean_2x2", query=9)
    assert result.approximate and result.merged_before == (2,)
    assert (result.grid_size, result.stride, result.query_grid, result.query_stride) == (
        (16, 16),
        (4, 4),
        (8, 8),
        (8, 8),
    )
    torch.testing.assert_close(result.maps.double(), reference[:, 9].view(2, 16, 16), atol=1e-6, rtol=0)
    torch.testing.assert_close(result.maps.sum((1, 2)).double(), torch.ones(2, dtype=torch.float64), atol=1e-5, rtol=0)


def test_merge_matrix_of_even_and_odd_grids_equals_the_loops(swin):
    spec = swin.spec
    torch.testing.assert_close(merge_matrix(spec.geometry(1), spec.geometry(2)), _hand_merge((16, 16)), atol=0, rtol=0)
    from analysis.model.geometry import LayerGeometry

    odd, merged = LayerGeometry(0, (5, 7), (4, 4), (4, 4)), LayerGeometry(1, (3, 4), (8, 8), (4, 4))
    torch.testing.assert_close(merge_matrix(odd, merged), _hand_merge((5, 7)), atol=0, rtol=0)
    with pytest.raises(AnalysisError, match="2x2 patch merging"):
        merge_matrix(odd, LayerGeometry(1, (3, 4), (4, 4), (4, 4)))


def test_rollout_by_layer_is_each_end_layer_in_one_pass(swin_record, sam_record):
    with pytest.warns(RuntimeWarning, match="approximation"):
        strip = rollout_maps(swin_record, merge="mean_2x2", query=(20, 44), by_layer=True)
    assert strip.maps.shape == (4, 2, 16, 16) and strip.grid_size == (16, 16)
    for end in range(4):
        reference = _hand_rollout(swin_record, SWIN_LAYERS, 0, end)
        grid, stride = SWIN_LAYERS[end][0], SWIN_LAYERS[end][1]
        cell = (20 // stride[0]) * grid[1] + 44 // stride[1]  # the pixel's cell on the end layer's grid
        torch.testing.assert_close(strip.maps[end].double(), reference[:, cell].view(2, 16, 16), atol=1e-6, rtol=0)
    with pytest.raises(AnalysisError, match="different place on each stage's grid"):
        rollout_maps(swin_record, merge="mean_2x2", query=3, by_layer=True)
    stage = analysis.attention_rollout_by_layer(swin_record, stage=1, query=3)  # one grid: a cell is fine
    assert stage.shape == (2, 2, 8, 8)
    torch.testing.assert_close(
        stage[1].double(), _hand_rollout(swin_record, SWIN_LAYERS, 2, 3)[:, 3].view(2, 8, 8), atol=1e-6, rtol=0
    )
    sam_strip = analysis.attention_rollout_by_layer(sam_record, start_layer=1)
    for i, end in enumerate(range(1, 4)):
        want = _hand_rollout(sam_record, SAM_LAYERS, 1, end).mean(1).view(2, 8, 8)
        torch.testing.assert_close(sam_strip[i].double(), want, atol=1e-6, rtol=0)


def test_discard_counts_only_the_pairs_the_windows_define(swin_record):
    # layer 1 (shifted): candidates are the real, unmasked, off-diagonal pairs of each window
    grid, _, window, shift = SWIN_LAYERS[1]
    dense = _hand_dense(swin_record.windows[1], grid, window, shift)
    candidates = torch.zeros(256, 256, dtype=torch.bool)
    by_window = {}
    for w, slot, cell in _slots(grid, window, shift):
        by_window.setdefault(w, []).append((slot, cell))
    masked = swin_record.windows[1][0, :, 0] == 0  # (windows, Wt, Wt): the shift mask's pairs are exactly 0
    for w, slots in by_window.items():
        for s, q in slots:
            for t, k in slots:
                if q != k and not masked[w, s, t]:
                    candidates[q, k] = True
    ratio = 0.3
    count = int(ratio * int(candidates.sum()))
    kept = dense.clone()
    for b in range(2):
        values = dense[b][candidates]
        threshold = values.sort().values[count - 1]
        kept[b][candidates & (dense[b] <= threshold)] = 0.0
    want = _hand_step(kept)
    got = analysis.attention.rollout.rollout_matrices(swin_record, start_layer=1, end_layer=1, discard_ratio=ratio)
    torch.testing.assert_close(got, want, atol=1e-9, rtol=0)
    assert int(candidates.sum()) < 256 * 255 // 10  # far fewer than every off-diagonal pair


def test_a_vit_rollout_is_unchanged_by_the_new_arguments():
    vit = load_vit("vit_tiny_patch16_224", pretrained=False, device="cpu", img_size=48, depth=3)
    record = capture_attention(vit, torch.randn(1, 3, 48, 48, generator=torch.Generator().manual_seed(0)))
    plain = analysis.attention_rollout(record, discard_ratio=0.2)
    assert torch.equal(analysis.attention_rollout(record, discard_ratio=0.2, stage=0, merge="mean_2x2"), plain)
    assert torch.equal(
        analysis.attention_rollout_by_layer(record, stage=-1), analysis.attention_rollout_by_layer(record)
    )
    with pytest.raises(AnalysisError, match="stage=1 does not exist"):
        analysis.attention_rollout(record, stage=1)
    assert explanation_grid(vit, "gradcam") == ((3, 3), (16, 16))


# --------------------------------------------------------------------------- explanations


def _norm_output_and_gradient(model, pixels, targets):
    """The last block's norm1 output (B, gh, gw, C) and ∂(Σ_b logit[b, t_b])/∂ it, by a plain hook."""
    block = model.layers[-1].blocks[-1] if hasattr(model, "layers") else model.blocks[-1]
    kept = []
    handle = block.norm1.register_forward_hook(lambda mod, args, out: kept.append(out))
    try:
        logits = model(pixels)
        score = sum(logits[b, int(t)] for b, t in enumerate(targets))
        (gradient,) = torch.autograd.grad(score, [kept[0]])
    finally:
        handle.remove()
    return kept[0].detach(), gradient.detach(), logits.detach()


@pytest.mark.parametrize("family", ["swin", "sam"])
def test_gradcam_on_the_last_stage_equals_hooks_and_loops(family, request, pixels):
    vit = request.getfixturevalue(family)
    targets = torch.tensor([3, 1])
    activations, gradient, logits = _norm_output_and_gradient(vit.model, pixels.clone().requires_grad_(True), targets)
    batch, gh, gw, channels = activations.shape
    want = torch.zeros(batch, gh, gw, dtype=torch.float64)
    for b in range(batch):
        weights = [float(gradient[b, :, :, c].sum()) / (gh * gw) for c in range(channels)]  # mean over the grid
        for r in range(gh):
            for x in range(gw):
                value = sum(weights[c] * float(activations[b, r, x, c]) for c in range(channels))
                want[b, r, x] = max(value, 0.0)  # ReLU
    got = explain(vit, pixels, target=targets, method="gradcam")
    geometry = vit.spec.geometry(vit.spec.num_layers - 1)
    assert got.shape == (2, *geometry.grid_size) and explanation_grid(vit, "gradcam") == (
        geometry.grid_size,
        geometry.stride,
    )
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-4)
    assert float(want.max()) > 0
    if family == "swin":
        assert got.shape == (2, 8, 8)  # the last stage, 8 px cells, not the stem's 16x16


def _hand_pool(pixel_map: torch.Tensor, grid, cell) -> torch.Tensor:
    """``(B, H, W)`` -> ``(B, gh, gw)``: the sum over each cell's pixels, cell by cell."""
    out = torch.zeros(pixel_map.shape[0], *grid, dtype=torch.float64)
    for r in range(grid[0]):
        for c in range(grid[1]):
            out[:, r, c] = (
                pixel_map[:, r * cell[0] : (r + 1) * cell[0], c * cell[1] : (c + 1) * cell[1]].double().sum((1, 2))
            )
    return out


def _hand_pixel_gradient(model, inputs, target: int) -> torch.Tensor:
    inputs = inputs.clone().requires_grad_(True)
    (gradient,) = torch.autograd.grad(model(inputs)[:, target].sum(), [inputs])
    return gradient


def test_input_x_gradient_pools_on_the_stem_patch_grid(swin, pixels):
    targets = torch.tensor([2, 4])
    got = explain(swin, pixels, target=targets, method="input_x_gradient")
    assert (
        explanation_grid(swin, "input_x_gradient") == ((16, 16), (4, 4)) == (swin.spec.grid_size, swin.spec.patch_size)
    )
    want = torch.cat(
        [
            _hand_pool(
                (pixels[b : b + 1] * _hand_pixel_gradient(swin.model, pixels[b : b + 1], int(t))).sum(1),
                (16, 16),
                (4, 4),
            )
            for b, t in enumerate(targets)
        ]
    )
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-4)


def test_integrated_gradients_pool_on_the_stem_patch_grid(sam, pixels):
    steps = 3
    got = explain(sam, pixels[:1], target=1, method="integrated_gradients", steps=steps, baseline="black")
    baseline = analysis.base.image_ops.baseline_pixels(sam, pixels[:1], "black")
    total = torch.zeros_like(pixels[:1])
    for k in range(steps):  # midpoint rule, one point at a time
        alpha = (k + 0.5) / steps
        total += _hand_pixel_gradient(sam.model, baseline + alpha * (pixels[:1] - baseline), 1)
    want = _hand_pool(((pixels[:1] - baseline) * total / steps).sum(1), (8, 8), (8, 8))
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-4)


def test_rollout_explanation_is_the_windowed_rollout(swin, sam, pixels, swin_record, sam_record):
    torch.testing.assert_close(
        explain(swin, pixels, method="rollout", stage=-1),
        rollout_maps(swin_record, stage=-1).maps,
        atol=1e-6,
        rtol=0,
    )
    assert explanation_grid(swin, "rollout", stage=-1) == ((8, 8), (8, 8))
    assert explanation_grid(swin, "rollout", merge="mean_2x2") == ((16, 16), (4, 4))
    torch.testing.assert_close(explain(sam, pixels, method="rollout"), rollout_maps(sam_record).maps, atol=1e-6, rtol=0)
    with pytest.raises(AnalysisError, match="patch merging"):
        explain(swin, pixels, method="rollout")


def test_global_token_methods_are_refused_with_the_reason(swin, sam, pixels):
    for vit in (swin, sam):
        with pytest.raises(AnalysisError, match=r"method='chefer' is not defined for a windowed model.*class token"):
            explain(vit, pixels[:1], method="chefer")
        with pytest.raises(
            AnalysisError, match=r"method='attention' is not defined for a windowed model.*attention_map"
        ):
            explain(vit, pixels[:1], method="attention")
        with pytest.raises(AnalysisError, match="not defined for a windowed model"):
            explanation_grid(vit, "chefer")
        assert methods_for(vit) == ("rollout", "gradcam", "input_x_gradient", "integrated_gradients", "attnlrp")
    assert methods_for(analysis.load_vit("demo")) == tuple(analysis.EXPLANATION_METHODS)  # a ViT: every one
    with pytest.raises(AnalysisError, match="windowed attention"):
        analysis.explanations.attention_gradients(swin, pixels[:1])
    assert "gradcam" in WINDOWED_SUPPORT and "attention_rollout" in WINDOWED_SUPPORT


# --------------------------------------------------------------------------- faithfulness


def _hand_deleted(pixels, replacement, cells, grid, cell):
    out = pixels.clone()
    for index in cells:
        r, c = divmod(int(index), grid[1])
        out[:, :, r * cell[0] : (r + 1) * cell[0], c * cell[1] : (c + 1) * cell[1]] = replacement[
            :, :, r * cell[0] : (r + 1) * cell[0], c * cell[1] : (c + 1) * cell[1]
        ]
    return out


@pytest.mark.parametrize("method, grid, cell", [("gradcam", (8, 8), (8, 8)), ("input_x_gradient", (16, 16), (4, 4))])
def test_deletion_curve_removes_the_cells_of_the_maps_own_grid(swin, pixels, method, grid, cell):
    image = pixels[:1]
    saliency = explain(swin, image, target=3, method=method)[0]
    fractions, values = perturbation_curve(swin, image, saliency, 3, mode="deletion", steps=4, baseline="black")
    order = torch.sort(-saliency.reshape(-1).double(), stable=True).indices
    replacement = analysis.base.image_ops.baseline_pixels(swin, image, "black")
    for fraction, value in zip(fractions, values):
        removed = order[: int(round(fraction * grid[0] * grid[1]))]
        with torch.no_grad():
            want = swin.model(_hand_deleted(image, replacement, removed, grid, cell)).softmax(-1)[0, 3]
        assert value == pytest.approx(float(want), abs=1e-5)
    with pytest.raises(AnalysisError, match=r"its layer grids: \[\(8, 8\), \(16, 16\)\]"):
        perturbation_curve(swin, image, torch.zeros(4, 4), 3)


def test_the_benchmark_scores_each_windowed_map_on_its_own_grid():
    """The demo Swin on two demo scenes: Grad-CAM's map lies on the last stage's 3x3 grid (16 px
    cells), input × gradient's on the stem's 12x12 (4 px): each is pointed, cut and scored on its own."""
    from PIL import Image

    from analysis.demo.data import generate_samples
    from analysis.faithfulness import area_under_curve, benchmark, pointing_score

    vit = load_vit("demo_swin", device="cpu")
    images, _, masks = generate_samples(2, 5)
    results = {r.method: r for r in benchmark(vit, images, masks, methods=["gradcam", "input_x_gradient"], steps=4)}
    grids = {}
    for method in ("gradcam", "input_x_gradient"):
        grid, cell = explanation_grid(vit, method)
        grids[method] = grid
        for index, image in enumerate(images):
            pixels = vit.preprocess(image)
            with torch.no_grad():
                target = int(vit.model(pixels).argmax(-1)[0])
            saliency = explain(vit, pixels, target=target, method=method)[0]
            assert tuple(saliency.shape) == grid
            mask_image = Image.fromarray(masks[index].astype("uint8") * 255, "L").convert("RGB")
            pixel_mask = torch.from_numpy(np.asarray(vit.model_input_image(mask_image))[..., 0] > 127)
            by_hand = pixel_mask[: grid[0] * cell[0], : grid[1] * cell[1]]
            by_hand = by_hand.reshape(grid[0], cell[0], grid[1], cell[1]).any(3).any(1).numpy()
            assert results[method].values["pointing"][index] == pytest.approx(float(pointing_score(saliency, by_hand)))
            fractions, values = perturbation_curve(vit, pixels, saliency, target, mode="deletion", steps=4)
            assert results[method].values["deletion_auc"][index] == pytest.approx(area_under_curve(fractions, values))
    assert grids["gradcam"] != grids["input_x_gradient"]  # not vacuous: two grids in one table


def test_post_norm_swin_v2_rollout_warns_and_a_headless_model_names_what_works(pixels):
    v2 = small_swin("swinv2_tiny_window8_256")
    record = capture_attention(v2, pixels[:1])
    with pytest.warns(RuntimeWarning, match="post-norm"):
        got = analysis.attention_rollout(record, stage=0)
    torch.testing.assert_close(
        got.double(), _hand_rollout(record, SWIN_LAYERS, 0, 1).mean(1).view(1, 16, 16), atol=1e-6, rtol=0
    )
    headless = small_sam(num_classes=0)
    with pytest.raises(AnalysisError, match=r"no class to explain\. Use method='rollout', or load a classifier"):
        explain(headless, pixels[:1], method="gradcam")
