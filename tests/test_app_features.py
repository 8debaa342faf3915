"""The Features page, driven headless with AppTest: the features listed for a patch, the chosen
feature's map, its top demo scenes, its class effect and the intervention are the library's
numbers (analysis.sae) for the same model, SAE and image; another model gets a friendly "an SAE
is needed" and typed errors for an SAE that does not fit, and the app keeps working."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import analysis
from analysis.sae import (
    SAEConfig,
    SparseAutoencoder,
    build_feature_index,
    feature_class_effect,
    intervene,
    load_demo_sae,
    patch_feature_grid,
    save_sae,
)
from tests.test_app import (  # noqa: F401 - npz_downloads: a fixture
    APP,
    DEMO_PRESENT,
    REPO,
    TIMEOUT,
    assert_clean,
    assert_same_arrays,
    first_sample,
    npz_downloads,
    reproduce,
)

pytestmark = pytest.mark.skipif(
    not (DEMO_PRESENT and (REPO / "assets" / "demo_sae" / "cfg.json").is_file()),
    reason="needs the bundled demo ViT and demo SAE",
)


@pytest.fixture(scope="module")
def demo():
    """The app's demo ViT, the demo SAE, and the features of the image the app opens on."""
    from vizapp.refs import ModelRef
    from vizapp.resources import get_model

    vit = get_model(ModelRef("demo", pretrained=True))
    sae = load_demo_sae()
    pixels = vit.preprocess(analysis.load_image(first_sample()))
    return vit, sae, pixels, patch_feature_grid(vit, sae, pixels)[0]


@pytest.fixture
def page():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    at.switch_page("views/features/features.py").run()
    assert_clean(at)
    return at


def listed(at) -> list[int]:
    """The features of the patch list, in its order (each option reads "feature i · activation")."""
    return [int(option.split()[1]) for option in at.radio(key="feat_pick").options]


def top_features(grid: torch.Tensor, patch: int, k: int = 8) -> list[int]:
    """The features firing on ``patch``, most active first (a sort of its row, ties by index)."""
    row = grid.reshape(-1, grid.shape[-1])[patch]
    return [i for i in sorted(range(len(row)), key=lambda i: (-float(row[i]), i))[:k] if row[i] > 0]


def test_a_patch_lists_its_features_and_the_chosen_ones_map_is_the_librarys(page, demo, npz_downloads):
    vit, sae, pixels, grid = demo
    for patch in (27, 5):
        page.number_input(key="feat_patch").set_value(patch).run()
        assert_clean(page)
        expected = top_features(grid, patch)
        assert expected and listed(page) == expected
    chosen = top_features(grid, 5)[1]
    page.radio(key="feat_pick").set_value(chosen).run()
    assert_clean(page)
    assert int(page.session_state["feat_feature"]) == chosen
    data = npz_downloads["feat_image_data"]
    np.testing.assert_allclose(data["feature_map"], grid[..., chosen].numpy(), atol=1e-5)
    np.testing.assert_allclose(data["activation_per_patch"], grid.sum(-1).numpy(), rtol=1e-5, atol=1e-4)


def test_top_scenes_histogram_class_effect_and_intervention_are_the_librarys(page, demo, npz_downloads):
    from vizapp.sae_resources import INDEX_SCENES, index_scene

    vit, sae, pixels, grid = demo
    feature = top_features(grid, 27)[0]
    page.number_input(key="feat_feature").set_value(feature).run()
    page.slider(key="feat_scale").set_value(3.0).run()
    assert_clean(page)
    scenes = [index_scene(i, vit.spec.img_size[0]) for i in range(INDEX_SCENES)]
    index = build_feature_index(vit, sae, scenes)
    order, peaks = index.top_images(feature, 8)
    data = npz_downloads["feat_set_data"]
    np.testing.assert_array_equal(data["top_scenes"], order.numpy())
    np.testing.assert_allclose(data["top_peaks"], peaks.numpy(), atol=1e-5)
    assert sorted(data["activations"].tolist()) == pytest.approx(sorted(index.activations(feature).tolist()), abs=1e-5)
    np.testing.assert_allclose(data["class_effect"], feature_class_effect(vit, sae, feature).numpy(), atol=1e-5)
    changed = intervene(vit, sae, pixels, {feature: 3.0})
    moved = npz_downloads["feat_intervention_data"]
    np.testing.assert_allclose(moved["steered_probabilities"], changed.steered_logits.double().softmax(-1), atol=1e-6)
    np.testing.assert_array_equal(moved["steered_class_map"], changed.steered_class_map.numpy())
    script = reproduce(page)
    assert_same_arrays(script, npz_downloads["feat_image_data"], ["feature_map"])
    assert_same_arrays(script, data, ["top_scenes", "top_peaks", "class_effect"])


def test_a_clamped_feature_on_the_page_is_the_librarys(page, demo, npz_downloads):
    """ "Set it to a value": the page's intervention is ``intervene(clamp={feature: value})``, and its
    script reproduces it."""
    vit, sae, pixels, grid = demo
    feature = top_features(grid, 27)[0]
    page.number_input(key="feat_feature").set_value(feature).run()
    page.radio(key="feat_mode").set_value("clamp").run()
    page.number_input(key="feat_clamp").set_value(2.5).run()
    assert_clean(page)
    changed = intervene(vit, sae, pixels, clamp={feature: 2.5})
    moved = npz_downloads["feat_intervention_data"]
    assert str(moved["mode"]) == "clamp" and float(moved["factor"]) == 2.5
    np.testing.assert_allclose(moved["steered_probabilities"], changed.steered_logits.double().softmax(-1), atol=1e-6)
    np.testing.assert_array_equal(moved["steered_class_map"], changed.steered_class_map.numpy())
    script = reproduce(page)
    np.testing.assert_allclose(script["changed"].steered_logits.numpy(), changed.steered_logits.numpy(), atol=1e-6)


def test_another_model_is_told_an_sae_is_needed_and_a_misfit_sae_is_refused(page, tmp_path):
    page.radio(key="model_source").set_value("timm").run()
    page.text_input(key="model_timm").input("random:vit_tiny_patch16_224").run()
    assert_clean(page)
    assert any("An SAE is needed" in i.value for i in page.info)
    page.radio(key="feat_source").set_value("demo").run()
    assert_clean(page)
    assert any("An SAE is needed" in i.value and "demo ViT" in i.value for i in page.info)
    narrow = save_sae(
        SparseAutoencoder(SAEConfig(d_in=16, d_sae=32, k=4, hook_name="blocks.2.resid_post")), tmp_path / "narrow"
    )
    page.radio(key="feat_source").set_value("folder").run()
    page.text_input(key="feat_folder").input(str(narrow)).run()
    assert_clean(page)
    assert any("16-wide" in i.value for i in page.info)
    elsewhere = save_sae(
        SparseAutoencoder(SAEConfig(d_in=192, d_sae=32, k=4, hook_name="blocks.40.resid_post")), tmp_path / "far"
    )
    page.text_input(key="feat_folder").input(str(elsewhere)).run()
    assert_clean(page)
    assert any("blocks.40" in i.value and "0..11" in i.value for i in page.info)  # the point, the blocks it has
    page.text_input(key="feat_folder").input(str(tmp_path / "nothing")).run()
    assert any("cfg.json" in i.value for i in page.info)
    page.switch_page("views/attention/attention.py").run()  # the app keeps working
    assert_clean(page)
