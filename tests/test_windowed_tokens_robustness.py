"""Windowed models (issue 23) on the tokens page, the streamed distance and the robustness
probes: timm Swin v1/v2 and SAM with random weights at small sizes.

References run the model's own pieces by hand (patch embedding, each stage's patch merging,
each block), or write the rule out in loops; none of them calls the code under test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

import analysis
from analysis import AnalysisError, capture_attention, load_vit, mean_attention_distance
from analysis.robustness import (
    SALIENCY_NAMES,
    check_token_drop,
    patch_drop_indices,
    perturb,
    probe,
    robustness_curve,
    token_drop,
    token_drop_attention,
)
from analysis.tokens import (
    TokenRecord,
    attention_mass,
    capture_tokens,
    feature_pca,
    high_norm_tokens,
    logit_lens,
    logit_lens_layers,
    patch_similarity,
    token_norms,
)
from windowed_models import no_hooks_left, small_pixels, small_sam, small_swin


@pytest.fixture(scope="module")
def swin():
    return small_swin(num_classes=5)


@pytest.fixture(scope="module")
def swin_v2():
    return small_swin("swinv2_tiny_window8_256", num_classes=5)


@pytest.fixture(scope="module")
def sam():
    return small_sam(num_classes=5)


@pytest.fixture(scope="module")
def pixels():
    return small_pixels()


# --------------------------------------------------------------------------- references: the model run by hand


@torch.no_grad()
def swin_stage_outputs(model, pixels) -> list[torch.Tensor]:
    """Each block's ``(B, H, W, C)`` output, running forward_features's pieces one by one:
    the patch embedding, then per stage its patch merging and its blocks."""
    x = model.patch_embed(pixels)
    outputs = []
    for stage in model.layers:
        x = stage.downsample(x)
        for block in stage.blocks:
            x = block(x)
            outputs.append(x)
    return outputs


@torch.no_grad()
def sam_block_outputs(model, pixels) -> list[torch.Tensor]:
    """Each block's ``(B, H, W, C)`` output: patch embedding, the absolute table (same size, so
    no resampling), then the blocks one by one."""
    x = model.patch_embed(pixels)
    assert tuple(model.pos_embed.shape[1:3]) == tuple(x.shape[1:3])
    x = model.norm_pre(model.patch_drop(model.pos_drop(x + model.pos_embed)))
    outputs = []
    for block in model.blocks:
        x = block(x)
        outputs.append(x)
    return outputs


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(x.shape[0], -1, x.shape[-1])


# --------------------------------------------------------------------------- tokens


@pytest.mark.parametrize("name", ["swin", "swin_v2", "sam"])
def test_block_outputs_equal_the_model_run_stage_by_stage(name, request, pixels):
    vit = request.getfixturevalue(name)
    reference = (sam_block_outputs if name == "sam" else swin_stage_outputs)(vit.model, pixels)
    captured = capture_tokens(vit, pixels)
    assert isinstance(captured, TokenRecord) and captured.layers == tuple(range(vit.spec.num_layers))
    for layer, expected in enumerate(reference):
        grid = vit.spec.geometry(layer).grid_size
        assert tuple(expected.shape[1:3]) == grid
        torch.testing.assert_close(captured.layer_tokens(layer), _flat(expected), rtol=0, atol=1e-6)
        torch.testing.assert_close(captured.grid_tokens(layer), expected, rtol=0, atol=1e-6)
    if name != "sam":  # Swin: stage 1 is half the grid, twice the width
        assert captured.layer_tokens(0).shape == (2, 16 * 16, 32) and captured.layer_tokens(3).shape == (2, 8 * 8, 64)
    some = capture_tokens(vit, pixels, layers=[3, 1], dtype=torch.float16)
    assert some.layers == (3, 1) and some.tokens[1].dtype == torch.float16  # the order asked (issue 26)
    torch.testing.assert_close(some.layer_tokens(3).float(), _flat(reference[3]), rtol=1e-2, atol=1e-2)
    no_hooks_left(vit.model)


def test_windowed_qkv_is_refused_with_the_reason(swin, pixels):
    for kind in ("query", "key", "value"):
        with pytest.raises(AnalysisError, match=r"window by window.*kind='token'"):
            capture_tokens(swin, pixels, kind=kind)
    no_hooks_left(swin.model)


@pytest.mark.parametrize("name", ["swin", "swin_v2"])
def test_swin_logit_lens_is_norm_and_head_on_the_last_stage(name, request, pixels):
    vit = request.getfixturevalue(name)
    model = vit.model
    reference = swin_stage_outputs(model, pixels)
    assert logit_lens_layers(vit) == (2, 3)  # stage 1, after the patch merging
    lens = logit_lens(vit, pixels)
    assert lens.shape == (2, 2, 5)
    with torch.no_grad():
        for position, layer in enumerate((2, 3)):
            expected = model.head(model.norm(reference[layer]))  # mean over the grid, then fc
            torch.testing.assert_close(lens[position], expected, rtol=0, atol=1e-6)
        torch.testing.assert_close(lens[-1], model(pixels), rtol=0, atol=1e-6)  # the last layer is the output
    torch.testing.assert_close(logit_lens(vit, pixels, layers=[-1]), lens[1:], rtol=0, atol=0)
    torch.testing.assert_close(logit_lens(vit, pixels, layers=[3, 2]), lens.flip(0), rtol=0, atol=0)  # order asked
    for layer in (0, 1, -4):
        with pytest.raises(
            AnalysisError, match=r"layer \d is in stage 0 \(16x16 grid\).*defined only for layers \[2, 3\]"
        ):
            logit_lens(vit, pixels, layers=[layer, 3])


def test_sam_logit_lens_is_neck_and_head_on_every_block(sam, pixels):
    model = sam.model
    reference = sam_block_outputs(model, pixels)  # (B, gh, gw, C) each
    assert logit_lens_layers(sam) == (0, 1, 2, 3)  # one stage: every block has the width the neck takes
    tokens = capture_tokens(sam, pixels)  # every layer on one 8x8 grid at one width: stacked, as a ViT's
    assert tokens.every_layer().shape == (4, 2, 64, sam.model.blocks[0].norm1.normalized_shape[0])
    for layer, hidden in enumerate(reference):
        torch.testing.assert_close(tokens.grid_tokens(layer), hidden, rtol=0, atol=0)
    lens = logit_lens(sam, pixels)
    with torch.no_grad():
        for layer, hidden in enumerate(reference):
            torch.testing.assert_close(
                lens[layer], model.head(model.neck(hidden.permute(0, 3, 1, 2))), rtol=0, atol=1e-6
            )
        torch.testing.assert_close(lens[-1], model(pixels), rtol=0, atol=1e-6)


def test_pca_and_similarity_on_a_stage_grid(swin, pixels):
    captured = capture_tokens(swin, pixels)
    tokens, geometry = captured.layer_tokens(2), captured.geometry(2)  # (2, 64, 64) on an 8x8 grid
    rgb, fitted = feature_pca(tokens, geometry)
    assert rgb.shape == (2, 8, 8, 3) and fitted.all()
    rows = tokens.double().numpy().reshape(-1, tokens.shape[-1])  # numpy PCA with the module's sign rule
    centred = rows - rows.mean(0)
    _, vectors = np.linalg.eigh(centred.T @ centred)
    axes = vectors[:, ::-1][:, :3].T
    axes *= np.sign(axes[np.arange(3), np.abs(axes).argmax(1)])[:, None]
    projected = centred @ axes.T
    expected = (projected - projected.min(0)) / (projected.max(0) - projected.min(0))
    np.testing.assert_allclose(rgb.numpy().reshape(-1, 3), expected, rtol=1e-5, atol=1e-5)
    similarity = patch_similarity(tokens, geometry, 9, image=1)  # cell 9 = row 1, column 1
    assert similarity.shape == (8, 8)
    for cell in range(64):
        u, v = tokens[1, cell].double().numpy(), tokens[1, 9].double().numpy()
        assert float(similarity.flatten()[cell]) == pytest.approx(
            u @ v / (np.linalg.norm(u) * np.linalg.norm(v)), abs=1e-6
        )
    with pytest.raises(AnalysisError, match="no class token"):
        patch_similarity(tokens, geometry, "cls")
    with pytest.raises(AnalysisError, match="pass one layer's tokens with its geometry"):
        feature_pca(tokens, swin.spec)
    with pytest.raises(AnalysisError, match="T=64"):
        feature_pca(captured.layer_tokens(0), geometry)  # stage 0's 256 cells with stage 1's geometry


def test_high_norm_tokens_per_stage_find_a_planted_outlier(swin, pixels):
    captured = capture_tokens(swin, pixels)
    planted = [t.clone() for t in captured.tokens]
    planted[2][1, 5] *= 50.0  # image 1, cell 5 of layer 2 (an 8x8 grid)
    tokens = TokenRecord(tokens=tuple(planted), spec=captured.spec, layers=captured.layers)
    found = high_norm_tokens(tokens)  # each layer on its own stage grid
    assert found.first_layer == 2 and found.positions(2, image=1) == [5] and found.positions(2, image=0) == []
    assert [tuple(m.shape) for m in found.mask] == [(2, 256), (2, 256), (2, 64), (2, 64)]
    for position, layer_tokens in enumerate(planted):  # the ViT rule, one layer at a time
        alone = high_norm_tokens(token_norms(layer_tokens)[None], 0)
        assert torch.equal(found.mask[position], alone.mask[0])
        assert float(found.thresholds[position]) == float(alone.thresholds[0])
    assert float(found.fraction[2]) == pytest.approx(1 / 128)
    # the stages differ in grid: a whole-record read says so and names the per-layer one
    for whole in (lambda: tokens.patches(), lambda: token_norms(tokens)):
        with pytest.raises(AnalysisError, match="one layer at a time"):
            whole()
    assert tokens.prefix(2).shape == (2, 0, 64) and tokens.grid_tokens(2).shape == (2, 8, 8, 64)
    with pytest.raises(AnalysisError, match="attention mass is not defined for this Swin.*inside their windows"):
        attention_mass(capture_attention(swin, pixels), [0])


# --------------------------------------------------------------------------- streamed distance


def _images(count: int, seed: int) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)) for _ in range(count)]


@pytest.mark.parametrize("name", ["swin", "sam"])
@pytest.mark.parametrize("renormalize", [True, False])
def test_streamed_distance_equals_the_one_batch_function(name, renormalize, request):
    vit = request.getfixturevalue(name)
    images = _images(5, 11)
    streamed = analysis.dataset_attention_distance(vit, images, batch_size=2, renormalize=renormalize, workers=1)
    per_image = analysis.dataset_attention_distance(
        vit, images, batch_size=3, renormalize=renormalize, workers=1, per_image=True
    )
    pixels = torch.cat([vit.preprocess(image) for image in images])
    one_batch = mean_attention_distance(capture_attention(vit, pixels), renormalize=renormalize, per_image=True)
    heads = [g.num_heads for g in vit.spec.layer_geometry]
    assert streamed.shape == (vit.spec.num_layers, max(heads)) and per_image.shape == (5, *streamed.shape)
    for layer, count in enumerate(heads):  # NaN exactly beyond each layer's own heads
        assert not streamed[layer, :count].isnan().any() and streamed[layer, count:].isnan().all()
    torch.testing.assert_close(per_image, one_batch, rtol=0, atol=1e-9, equal_nan=True)
    torch.testing.assert_close(streamed, one_batch.mean(0), rtol=0, atol=1e-9, equal_nan=True)


def test_distance_cli_writes_the_per_layer_uniform_reference(swin, tmp_path):
    from analysis.cli.distance import shard_distance_sums, write_distance

    images = _images(3, 12)
    sums, count, skipped = shard_distance_sums(swin, images, batch_size=2, workers=1)
    expected = analysis.dataset_attention_distance(swin, images, workers=1)
    assert count == 3 and skipped == []
    torch.testing.assert_close(sums / count, expected, rtol=0, atol=1e-9, equal_nan=True)
    empty, none, _ = shard_distance_sums(swin, [], batch_size=2, workers=1)  # an empty shard sums in the right shape
    assert none == 0 and empty.shape == expected.shape
    out = tmp_path / "swin.npz"
    write_distance(
        out,
        (sums / count).numpy(),
        swin,
        model="random swin",
        images="3 noise images",
        count=count,
        skipped=[],
        world=1,
    )
    saved = np.load(out)
    np.testing.assert_array_equal(saved["distance"], expected.numpy())
    np.testing.assert_array_equal(
        saved["uniform_distance_by_layer"], analysis.uniform_attention_distance_by_layer(swin.spec).numpy()
    )
    assert "uniform_distance" not in saved.files  # no single reference for a windowed model
    np.testing.assert_array_equal(saved["layer_num_heads"], [2, 2, 4, 4])
    np.testing.assert_array_equal(saved["layer_stride"], [[4, 4], [4, 4], [8, 8], [8, 8]])
    np.testing.assert_array_equal(saved["layer_grid_size"], [[16, 16], [16, 16], [8, 8], [8, 8]])
    assert Image.open(out.with_suffix(".png")).size == (900, 600)
    page = out.with_suffix(".html").read_text()
    assert "uniform attention in each layer" in page


# --------------------------------------------------------------------------- robustness


def _drop_by_hand(pixels: torch.Tensor, indices, patch: tuple[int, int], columns: int) -> torch.Tensor:
    out = pixels.clone()
    for index in indices:
        r, c = divmod(int(index), columns)
        for y in range(r * patch[0], (r + 1) * patch[0]):
            for x in range(c * patch[1], (c + 1) * patch[1]):
                out[..., y, x] = 0.0
    return out


def _shuffle_by_hand(pixels: torch.Tensor, grid: int, seed: int) -> torch.Tensor:
    order = torch.randperm(grid * grid, generator=torch.Generator().manual_seed(seed))
    height, width = pixels.shape[-2] // grid, pixels.shape[-1] // grid
    out = torch.empty_like(pixels)
    for target in range(grid * grid):  # block `target` of the output is block order[target] of the input
        (ty, tx), (sy, sx) = divmod(target, grid), divmod(int(order[target]), grid)
        out[..., ty * height : (ty + 1) * height, tx * width : (tx + 1) * width] = pixels[
            ..., sy * height : (sy + 1) * height, sx * width : (sx + 1) * width
        ]
    return out


def test_perturbations_are_the_vit_pixels(swin, sam, pixels):
    """One rule for every model: the pixels depend on the stem's patch grid only, so a ViT with
    the same grid gets the same pixels, and each equals its rule written out."""
    vits = {
        (4, 4): load_vit("vit_tiny_patch16_224", pretrained=False, device="cpu", img_size=64, patch_size=4, depth=1),
        (8, 8): load_vit("vit_tiny_patch16_224", pretrained=False, device="cpu", img_size=64, patch_size=8, depth=1),
    }
    for windowed in (swin, sam):
        spec = windowed.spec
        vit = vits[spec.patch_size]
        assert vit.spec.grid_size == spec.grid_size
        for perturbation, level in [("pixel_drop", 0.3), ("shuffle", 4), ("noise", 0.5), ("blur", 2.0)]:
            got, dropped = perturb(windowed, pixels, perturbation, level, seed=7)
            assert dropped is None
            assert torch.equal(got, perturb(vit, pixels, perturbation, level, seed=7)[0]), perturbation
        indices = patch_drop_indices(spec, 0.3, seed=7)
        assert len(indices) == round(0.3 * spec.num_patches)
        expected = _drop_by_hand(pixels, indices, spec.patch_size, spec.grid_size[1])
        assert torch.equal(perturb(windowed, pixels, "pixel_drop", 0.3, seed=7)[0], expected)
        assert torch.equal(perturb(windowed, pixels, "shuffle", 4, seed=7)[0], _shuffle_by_hand(pixels, 4, 7))


@pytest.mark.parametrize("name", ["swin", "sam"])
@pytest.mark.parametrize(
    "perturbation, levels", [("noise", (0.0, 1.0)), ("pixel_drop", (0.0, 0.5)), ("shuffle", (1, 2))]
)
def test_robustness_curve_equals_a_loop_over_images_and_levels(name, perturbation, levels, request):
    vit = request.getfixturevalue(name)
    images = _images(2, 13)
    labels = [1, 3]
    curve = robustness_curve(vit, images, perturbation, levels, labels=labels, seed=4)
    score, probability, distance = np.zeros(len(levels)), np.zeros(len(levels)), np.zeros(len(levels))
    for index, image in enumerate(images):
        pixels = vit.preprocess(image)
        for step, level in enumerate(levels):
            perturbed, _ = perturb(vit, pixels, perturbation, level, seed=4 + index)
            with torch.no_grad():
                logits = vit.model(perturbed)
            score[step] += float(int(logits.argmax(-1)[0]) == labels[index]) / 2
            probability[step] += float(logits.softmax(-1)[0, labels[index]]) / 2
            per_layer = mean_attention_distance(capture_attention(vit, perturbed))  # (L, heads), NaN padding
            heads = [g.num_heads for g in vit.spec.layer_geometry]
            real = [float(per_layer[layer, head]) for layer in range(len(heads)) for head in range(heads[layer])]
            distance[step] += sum(real) / len(real) / 2
    assert curve.metric == "accuracy" and curve.levels == tuple(float(level) for level in levels)
    np.testing.assert_array_equal(curve.score, score)
    np.testing.assert_allclose(curve.probability, probability, rtol=0, atol=1e-5)
    np.testing.assert_allclose(curve.attention_distance, distance, rtol=0, atol=1e-6)
    assert np.isnan(curve.rollout_entropy).all()  # no class-token rollout across windows and stages
    quick = robustness_curve(vit, images, perturbation, levels, seed=4, attention=False)
    assert quick.metric == "agreement" and quick.score[0] == 1.0 and np.isnan(quick.attention_distance).all()


@pytest.mark.parametrize("name", ["swin", "sam"])
def test_token_drop_is_refused_with_the_reason(name, request, pixels):
    vit = request.getfixturevalue(name)
    reason = r"Token drop is not defined for a windowed model.*no token sequence.*pixel_drop"
    calls = [
        lambda: check_token_drop(vit),
        lambda: robustness_curve(vit, [pixels[0]], "token_drop", [0.0, 0.5]),
        lambda: token_drop_attention(vit, pixels, [0, 1]),
        lambda: probe(vit, pixels[:1], "token_drop", 0.5),
    ]
    for call in calls:
        with pytest.raises(AnalysisError, match=reason):
            call()
    with pytest.raises(AnalysisError, match=reason), token_drop(vit, [0]):
        pass
    no_hooks_left(vit.model)


@pytest.mark.parametrize("name", ["swin", "sam"])
def test_probe_of_a_windowed_model_shows_its_last_layers_attention(name, request, pixels):
    vit = request.getfixturevalue(name)
    result = probe(vit, pixels[:1], "pixel_drop", 0.25, seed=2)
    perturbed, _ = perturb(vit, pixels[:1], "pixel_drop", 0.25, seed=2)
    assert torch.equal(result.pixels, perturbed) and result.dropped is not None
    record = capture_attention(vit, perturbed)
    last = vit.spec.num_layers - 1
    expected = analysis.attention_map(record, last, query="mean")[0]
    assert result.saliency.shape == vit.spec.geometry(last).grid_size
    torch.testing.assert_close(result.saliency, expected, rtol=0, atol=1e-6)
    assert result.saliency_name == SALIENCY_NAMES["windowed"]
    with torch.no_grad():
        torch.testing.assert_close(result.logits, vit.model(perturbed), rtol=1e-5, atol=1e-5)
    assert math.isclose(float(expected.sum()), 1.0, abs_tol=1e-5)  # no padding cells: every row sums to one


def test_the_logit_lens_reads_swinv2_cr_through_its_own_head():
    """timm's swinv2_cr hands its head the last stage's (B, C, gh, gw) map with no final norm:
    the lens's last row is the model's own logits, and its stage outputs are captured per layer."""
    torch.manual_seed(0)
    vit = load_vit(
        "swinv2_cr_tiny_ns_224",
        pretrained=False,
        img_size=64,
        depths=(1, 1, 1, 1),
        embed_dim=16,
        num_heads=(1, 2, 2, 4),
        num_classes=5,
    )
    pixels = torch.randn(2, 3, 64, 64)
    lens = logit_lens(vit, pixels)
    with torch.no_grad():
        logits = vit.model(pixels)
    torch.testing.assert_close(lens[-1], logits.float(), rtol=1e-5, atol=1e-5)
    tokens = capture_tokens(vit, pixels)
    assert [tuple(t.shape[1:]) for t in tokens.tokens] == [(256, 16), (64, 32), (16, 64), (4, 128)]
