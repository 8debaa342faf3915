"""analysis.sae.features (the Features page's analyses) against loops over the formulas: the
patch features, the index over an image set, the decoder direction through the head, and the
interventions (against run_with_hooks with the same splice, and a per-patch readout by hand)."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from analysis import load_vit
from analysis.demo.data import render_sample
from analysis.engine.activations import run_with_cache, run_with_hooks
from analysis.sae import SAEConfig, SparseAutoencoder, splice
from analysis.sae.errors import SAEFeatureError, SAEWidthError, UnknownPointError
from analysis.sae.features import build_feature_index, feature_class_effect, intervene, patch_feature_grid

POINT = "blocks.2.resid_post"


@pytest.fixture(scope="module")
def vit():
    return load_vit("demo")


@pytest.fixture(scope="module")
def sae(vit):
    """A random TopK SAE on the demo ViT's width, with its b_dec at the tokens' mean scale."""
    config = SAEConfig(d_in=vit.spec.embed_dim, d_sae=64, k=4, hook_name=POINT, tokens="patches")
    model = SparseAutoencoder(config, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        model.b_enc.copy_(torch.randn(64, generator=torch.Generator().manual_seed(4)) * 0.5)
    return model


@pytest.fixture(scope="module")
def images(vit):
    return [Image.fromarray(render_sample(99, i, vit.spec.img_size[0])[0]) for i in range(5)]


def test_patch_grid_is_the_encoding_of_each_patch_token(vit, sae, images):
    pixels = vit.preprocess(images[0])
    grid = patch_feature_grid(vit, sae, pixels)  # (1, gh, gw, d_sae)
    tokens = run_with_cache(vit, pixels, names=[POINT])[POINT][0]  # (T, D)
    gh, gw = vit.spec.grid_size
    prefix = vit.spec.num_prefix_tokens
    for r in range(gh):
        for c in range(gw):
            expected = sae.encode(tokens[prefix + r * gw + c]).detach()
            torch.testing.assert_close(grid[0, r, c], expected, atol=1e-5, rtol=0)


def test_index_peaks_histogram_and_top_images_against_loops(vit, sae, images):
    index = build_feature_index(vit, sae, images, batch_size=2)
    grids = [patch_feature_grid(vit, sae, vit.preprocess(image))[0] for image in images]  # (gh, gw, d_sae) each
    assert index.tokens == len(images) * vit.spec.num_patches and index.images == len(images)
    for feature in range(sae.config.d_sae):
        peaks = torch.stack([g[..., feature].max() for g in grids])
        torch.testing.assert_close(index.peaks[:, feature], peaks)
        values = [float(v) for g in grids for v in g[..., feature].flatten() if v != 0]
        assert sorted(index.activations(feature).tolist()) == pytest.approx(sorted(values), abs=1e-6)
        order, top = index.top_images(feature, k=3)
        expected = sorted((i for i in range(len(images)) if peaks[i] > 0), key=lambda i: (-float(peaks[i]), i))[:3]
        assert order.tolist() == expected
        assert float(index.fire_rate()[feature]) == pytest.approx(len(values) / index.tokens)
    assert int((index.peaks > 0).sum()) > 0  # the SAE fires somewhere: the loops compare something


def test_class_effect_is_the_head_on_the_norms_linear_part(vit, sae):
    norm, head = vit.model.norm, vit.model.head
    for feature in (0, 17):
        d = sae.W_dec[feature].detach().double()
        D = d.shape[0]
        mean = sum(float(d[j]) for j in range(D)) / D
        shaped = [(float(d[j]) - mean) * float(norm.weight[j]) for j in range(D)]
        expected = [sum(float(head.weight[c, j]) * shaped[j] for j in range(D)) for c in range(head.weight.shape[0])]
        assert feature_class_effect(vit, sae, feature).tolist() == pytest.approx(expected, abs=1e-4)
    with pytest.raises(SAEFeatureError):
        feature_class_effect(vit, sae, sae.config.d_sae)


def test_intervention_matches_the_splice_and_a_per_patch_readout(vit, sae, images):
    pixels = vit.preprocess(images[1])
    grid = patch_feature_grid(vit, sae, pixels)[0]
    feature = int(grid.reshape(-1, grid.shape[-1]).sum(0).argmax())  # the feature that fires most here
    nothing = intervene(vit, sae, pixels, {})
    assert torch.equal(nothing.clean_logits, nothing.steered_logits)  # the error term kept: exact
    assert float(nothing.change_map.abs().max()) == 0.0
    result = intervene(vit, sae, pixels, {feature: 10.0})
    hooks = splice(vit, sae, scale={feature: 10.0}, keep_error=True)
    torch.testing.assert_close(result.steered_logits, run_with_hooks(vit, pixels, hooks)[0])
    torch.testing.assert_close(result.clean_logits, run_with_hooks(vit, pixels, {})[0])
    last = f"blocks.{vit.spec.num_layers - 1}.resid_post"
    hidden = run_with_cache(vit, pixels, names=[last], hooks=hooks)[last][0]  # (T, D)
    gh, gw = vit.spec.grid_size
    prefix = vit.spec.num_prefix_tokens
    with torch.no_grad():
        for r in range(gh):
            for c in range(gw):
                token = hidden[prefix + r * gw + c]
                normed = (token - token.mean()) / torch.sqrt(token.var(unbiased=False) + vit.model.norm.eps)
                logits = (
                    vit.model.head.weight @ (normed * vit.model.norm.weight + vit.model.norm.bias) + vit.model.head.bias
                )
                assert int(result.steered_class_map[r, c]) == int(logits.argmax())
    assert float(result.change_map.max()) > 0


def test_a_clamped_feature_switches_on_where_scaling_cannot(vit, sae, images):
    """``intervene(clamp={i: v})`` is the splice that sets feature ``i`` to ``v`` at every token: for a
    feature silent on the image, scaling changes nothing and clamping moves the logits exactly as
    that splice does."""
    pixels = vit.preprocess(images[1])
    grid = patch_feature_grid(vit, sae, pixels)[0]  # (gh, gw, d_sae)
    silent = int((grid.reshape(-1, grid.shape[-1]).abs().sum(0) == 0).nonzero()[0])
    scaled = intervene(vit, sae, pixels, {silent: 5.0})
    assert torch.equal(scaled.steered_logits, scaled.clean_logits)  # 5 × 0 = 0
    clamped = intervene(vit, sae, pixels, clamp={silent: 3.0})
    hooks = splice(vit, sae, clamp={silent: 3.0}, keep_error=True)
    torch.testing.assert_close(clamped.steered_logits, run_with_hooks(vit, pixels, hooks)[0])
    assert float((clamped.steered_logits - clamped.clean_logits).abs().max()) > 1e-3
    assert float(clamped.change_map.min()) > 0  # every patch token was set, so every one moved
    with pytest.raises(SAEFeatureError):
        intervene(vit, sae, pixels, clamp={sae.config.d_sae: 1.0})


def test_typed_errors_for_a_wrong_point_and_width(vit, images):
    pixels = vit.preprocess(images[0])
    narrow = SparseAutoencoder(SAEConfig(d_in=16, d_sae=32, k=4, hook_name=POINT))
    with pytest.raises(SAEWidthError, match="16-wide"):
        patch_feature_grid(vit, narrow, pixels)
    elsewhere = SparseAutoencoder(SAEConfig(d_in=vit.spec.embed_dim, d_sae=32, k=4, hook_name="blocks.7.resid_post"))
    with pytest.raises(UnknownPointError):
        patch_feature_grid(vit, elsewhere, pixels)
