"""The Circuits page (issue 26): its heatmaps are the library's numbers, a click selects a
head, and models the analyses do not cover get the library's reason, not a traceback."""

from __future__ import annotations

import numpy as np
import pytest

import analysis
from analysis.circuits import activation_patching, direct_logit_attribution, head_ablation
from tests.test_app import (  # noqa: F401 - app, npz_downloads: fixtures
    DEMO_PRESENT,
    app,
    array,
    assert_clean,
    assert_same_arrays,
    chart,
    first_sample,
    npz_downloads,
    reproduce,
)

pytestmark = pytest.mark.skipif(not DEMO_PRESENT, reason="needs the bundled demo model (assets/demo_vit)")


def heatmap_values(spec: dict) -> np.ndarray:
    (trace,) = [t for t in spec["data"] if t["type"] == "heatmap"]
    return array(trace["z"]).astype(np.float64)


@pytest.fixture(scope="module")
def demo_inputs():
    vit = analysis.load_vit("demo")
    return vit, vit.preprocess(analysis.load_image(first_sample()))


def test_the_page_draws_the_librarys_attribution_ablation_and_patching(app, demo_inputs):
    vit, pixels = demo_inputs
    app.switch_page("views/circuits/circuits.py").run()
    assert_clean(app)
    target = app.selectbox(key="circ_target").value
    assert target == int(vit.model(pixels).argmax())  # the prediction by default
    dla = direct_logit_attribution(vit, pixels, target=target)
    np.testing.assert_allclose(heatmap_values(chart(app, "circ_dla")), dla.per_head()[0].numpy(), atol=1e-5)
    ablation = head_ablation(vit, pixels, target=target)  # 16 passes: drawn without a click
    np.testing.assert_allclose(heatmap_values(chart(app, "circ_ablation")), ablation.delta_logit[0].numpy(), atol=1e-5)
    corrupted = analysis.base.image_ops.gaussian_noise(pixels, 1.0, seed=0)
    patching = activation_patching(vit, pixels, corrupted, target=target)
    np.testing.assert_allclose(heatmap_values(chart(app, "circ_patch_tokens")), patching.effect.numpy(), atol=1e-4)
    assert any(b.label == "Data (.npz)" for b in app.get("download_button"))
    # another class, then another image: the new image's prediction is measured (issue 50, item 2)
    app.selectbox(key="circ_target").select_index(2).run()
    app.selectbox(key="image_sample").set_value("scene_4_ring.png").run()
    assert_clean(app)
    ring = vit.preprocess(analysis.load_image(analysis.asset_path("samples", "scene_4_ring.png")))
    assert app.selectbox(key="circ_target").value == int(vit.model(ring).argmax())


def test_a_click_on_a_head_selects_it_and_other_settings_rerun(app):
    app.switch_page("views/circuits/circuits.py").run()
    app.session_state["circ_layer"], app.session_state["circ_head"] = 1, 2  # what a click's on_select sets
    app.run()
    assert_clean(app)
    assert any(h.value == "Layer 1, head 2" for h in app.subheader)
    # the demo reads only its class token: the head's whole term is there, said in words, not an empty map
    assert not any(c.proto.id.endswith("-circ_head_dla") for c in app.get("plotly_chart"))
    assert any("written at the class token" in c.value for c in app.caption)
    outline = [s for s in chart(app, "circ_dla")["layout"].get("shapes", []) if s.get("type") == "rect"]
    assert outline and outline[0]["x0"] == 1.5 and outline[0]["y0"] == 0.5  # head 2, row of layer 1
    app.radio(key="circ_method").set_value("resample").run()
    # resampled from another image than the analysed one (the image itself would change nothing)
    image = app.session_state["image_sample"]
    assert app.selectbox(key="circ_reference").value != image
    assert image not in app.selectbox(key="circ_reference").options
    assert np.abs(heatmap_values(chart(app, "circ_ablation"))).max() > 1e-3
    app.radio(key="circ_point").set_value("attn.z").run()
    app.radio(key="circ_corruption").set_value("sample").run()
    assert_clean(app)
    assert heatmap_values(chart(app, "circ_patch_heads")).shape == (4, 4)


@pytest.mark.parametrize(
    "model, side, reason",
    [
        ("vit_small_patch14_dinov2", 56, "this model has no head (no classes)"),  # DINOv2 without a classifier
        ("swin_tiny_patch4_window7_224", 112, "windowed attention"),
    ],
)
def test_models_the_analyses_do_not_cover_get_the_reason(model, side, reason):
    from streamlit.testing.v1 import AppTest

    from tests.test_app import APP, TIMEOUT

    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(model=f"random:{model}", res=str(side))
    at.run()
    at.switch_page("views/circuits/circuits.py").run()
    assert_clean(at)
    assert any(reason in i.value for i in at.info), [i.value for i in at.info]
    assert not at.get("plotly_chart")


@pytest.mark.parametrize("method, corruption", [("mean", "blur"), ("resample", "sample")])
def test_the_circuits_page_reproduces_in_python(app, npz_downloads, method, corruption):
    app.switch_page("views/circuits/circuits.py").run()
    app.radio(key="circ_method").set_value(method).run()
    app.radio(key="circ_corruption").set_value(corruption).run()
    app.radio(key="circ_point").set_value("attn.z").run()
    assert_clean(app)
    script = reproduce(app)
    assert_same_arrays(script, npz_downloads["circ_dla_data"], ["heads"])
    assert_same_arrays(script, npz_downloads["circ_ablation_data"], ["delta_logit"])
    assert_same_arrays(script, npz_downloads["circ_patch_data"], ["effect"])


def test_a_head_picked_on_a_bigger_model_and_the_auto_sections_follow_the_model(app):
    """A selected head beyond the current model is clamped (it raised an IndexError), and the
    sections that run without a click are decided again for each model: 16 passes on the demo
    run at once, 72 on a 6-head, 12-layer ViT wait for the toggle."""
    app.switch_page("views/circuits/circuits.py").run()
    assert app.toggle(key="circ_ablate").value is True
    app.session_state["circ_layer"], app.session_state["circ_head"] = 10, 7
    app.run()
    assert_clean(app)
    assert any(h.value == "Layer 3, head 0" for h in app.subheader)  # clamped to the last layer, head 0
    app.radio(key="model_source").set_value("timm").run()
    app.text_input(key="model_timm").input("random:vit_small_patch16_224").run()
    assert_clean(app)
    assert app.toggle(key="circ_ablate").value is False
    assert not any(c.proto.id.endswith("-circ_ablation") for c in app.get("plotly_chart"))
