"""What the app says about its inputs and models (issue 29, items 5, 7 and 8): the demo
model's scope on a non-demo image, the offline note for the curated models, the warning for
a tiny upload, and the Robustness page's CNN label under token drop."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from streamlit.testing.v1 import AppTest  # noqa: E402

import analysis  # noqa: E402
from tests.test_app import DEMO_PRESENT, app, assert_clean, png_bytes, uploader  # noqa: E402, F401 - app: the fixture

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not DEMO_PRESENT, reason="needs the bundled demo model (assets/demo_vit)")


def captions(at: AppTest) -> list[str]:
    return [c.value for c in at.caption]


def image_captions(at: AppTest) -> list[str]:
    return [image.caption for element in at.get("image") for image in element.proto.imgs]


def test_demo_model_states_its_scope_on_a_photo_only(app):
    assert app.session_state["current"].image.name.startswith("scene_")
    assert not any("synthetic-shapes classifier" in c for c in captions(app))
    app.selectbox(key="image_sample").set_value("astronaut.jpg").run()
    assert_clean(app)
    (note,) = [c for c in captions(app) if "synthetic-shapes classifier" in c]
    names = analysis.load_vit("demo").class_names
    assert f"{len(names)}-class" in note and all(name in note for name in names)
    app.switch_page("views/robustness/robustness.py").run()
    assert any("synthetic-shapes classifier" in c for c in captions(app))


def test_robustness_labels_the_cnn_panel_with_what_the_cnn_gets(app):
    app.switch_page("views/robustness/robustness.py").run()
    assert app.radio(key="rob_perturbation").value == "token_drop"
    labels = image_captions(app)
    assert "ViT · drop tokens 50%" in labels
    assert "CNN · drop patches (pixels) 50%" in labels
    assert not any(label.startswith("CNN · drop tokens") for label in labels)


@pytest.mark.upload
def test_a_tiny_upload_is_warned_about_and_still_shown(app):
    vit = analysis.load_vit("demo")
    minimum = vit.minimum_input_side()
    assert minimum == max(*vit.spec.patch_size, *vit.spec.grid_size)
    uploader(app, key="image_upload").set_value(("dot.png", png_bytes(size=(1, 1)), "image/png")).run()
    assert_clean(app)
    assert app.session_state["current"].image.name == "dot.png"
    (warning,) = [w.value for w in app.warning if "1×1 px" in w.value]
    assert f"at least {minimum}×{minimum} px" in warning
    uploader(app, key="image_upload").set_value(("ok.png", png_bytes(size=(minimum, minimum)), "image/png")).run()
    assert not [w.value for w in app.warning if "upsampled to the model" in w.value]


def test_small_input_note_threshold():
    vit = analysis.load_vit("demo")
    side = vit.minimum_input_side()
    assert vit.small_input_note(side, side) is None
    assert vit.small_input_note(side * 10, side) is None
    assert "upsampled" in vit.small_input_note(side - 1, side * 10)
    assert "upsampled" in vit.small_input_note(side * 10, side - 1)


@pytest.fixture
def offline(monkeypatch):
    import analysis.model.loading.hub as hub
    from vizapp import state

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub, "in_hf_cache", lambda *args, **kwargs: False)
    state.curated_offline_note.clear()
    yield hub
    state.curated_offline_note.clear()


def test_offline_curated_models_are_explained_once(offline, app):
    app.radio(key="model_source").set_value("curated").run()
    assert_clean(app)
    (note,) = [w.value for w in app.sidebar.warning if "Offline" in w.value]
    assert "None of them is cached here" in note


def test_offline_note_names_the_cached_models(offline, monkeypatch):
    from vizapp import state

    cached = "vit_small_patch16_224.dino"
    monkeypatch.setattr(offline, "pretrained_weights_cached", lambda name: name == cached)
    monkeypatch.setattr(state, "pretrained_weights_cached", lambda name: name == cached)
    note = state.curated_offline_note()
    label = next(label for label, ref in state.CURATED_MODELS.items() if ref.source == cached)
    assert "Cached here" in note and label.replace("/", "/") in note
    assert sum(model in note for model in state.CURATED_MODELS) == 1


def test_a_random_models_maps_are_not_saturated_at_the_default(app):
    """Random weights attend almost uniformly (within 1.15× uniform): at the default colour range
    the main map tops out near 1/UNIFORM_FLOOR of its scale, and so do the layers × heads
    thumbnails (one top per layer), instead of a solid top colour; the colour bar gives the top in
    units of the uniform level and marks that level with a tick."""
    import json

    from analysis.plots import UNIFORM_FLOOR

    app.radio(key="model_source").set_value("timm").run()
    app.text_input(key="model_timm").input("random:vit_tiny_patch16_224").run()
    assert_clean(app)
    vit = app.session_state["current"].vit
    uniform = 1 / vit.spec.num_tokens
    assert app.radio(key="map_range").value == "robust" and app.radio(key="thumb_scale").value == "layer"
    specs = {c.proto.id.rsplit("-", 1)[-1]: json.loads(c.proto.spec) for c in app.get("plotly_chart")}
    (overlay,) = [t for t in specs["attn_overlay"]["data"] if t.get("type") == "heatmap"]
    from tests.test_app import array

    shown = array(overlay["z"])
    assert overlay["zmin"] == 0 and overlay["zmax"] == pytest.approx(UNIFORM_FLOOR * uniform, rel=1e-6)
    assert shown.max() / overlay["zmax"] < 0.8  # 1.15 / UNIFORM_FLOOR at most
    assert f"uniform {uniform:.2g} (top {UNIFORM_FLOOR:g}×)" in overlay["colorbar"]["title"]["text"]
    marks = dict(zip(overlay["colorbar"]["ticktext"], overlay["colorbar"]["tickvals"]))
    assert marks[f"uniform {uniform:.2g}"] == pytest.approx(uniform)
    (thumbs,) = [t for t in specs["attn_grid"]["data"] if t.get("type") == "heatmap"]
    tiles = array(thumbs["z"]).astype(np.float64)
    assert (thumbs["zmin"], thumbs["zmax"]) == (0.0, 1.0)
    assert (
        np.nanmax(tiles) < 0.9 and np.nanmean(tiles) < 0.75
    )  # a head's map reaches 1.25× uniform; the old default (each map to its own maximum) drew every tile at 1.0


def test_top_mass_panels_dim_the_image_outside_each_heads_mask(app):
    """Each head's panel has its own background: the image at full brightness inside the
    head's top-mass patches and at OUTSIDE_MASK_BRIGHTNESS outside (issue 29, item 6)."""
    import base64
    import io
    import json

    from tests.test_app import array

    app.toggle(key="dino_show").set_value(True).run()
    assert_clean(app)
    (panels,) = [json.loads(c.proto.spec) for c in app.get("plotly_chart") if c.proto.id.endswith("-mass_panels")]
    forward = app.session_state["current"]
    vit = forward.vit
    from vizapp import resources

    image = resources.forward(*forward.args).input_image.astype(np.float64)
    ph, pw = vit.spec.patch_size
    pictures = [t for t in panels["data"] if t.get("type") == "image"]
    heatmaps = [t for t in panels["data"] if t.get("type") == "heatmap"]
    assert len(pictures) == len(heatmaps) == vit.spec.num_heads
    for picture, trace in zip(pictures, heatmaps):
        mask = ~np.isnan(array(trace["z"]).reshape(vit.spec.grid_size))
        drawn = np.asarray(Image.open(io.BytesIO(base64.b64decode(picture["source"].split(",", 1)[1]))).convert("RGB"))
        weights = np.kron(np.where(mask, 1.0, 0.3), np.ones((ph, pw)))[..., None]
        expected = np.clip(np.rint(image * weights), 0, 255)
        assert np.abs(drawn.astype(np.float64) - expected).mean() < 2.0  # lossy encoding of the background


def test_a_model_switch_keeps_the_layer_where_the_new_model_has_it(app):
    """The layer slider's range changes with the model, which makes it a new widget to Streamlit:
    unless the run sets its value, it shows its own minimum (a switch from the demo at layer 2 to a
    12-layer ViT opened layer 0, where a real model's map is flat). The layer is kept where the new
    model has it, else the new model's last layer; the Tokens page keeps it too."""
    app.slider(key="layer").set_value(2).run()
    app.radio(key="model_source").set_value("timm").run()
    app.text_input(key="model_timm").input("random:vit_tiny_patch16_224").run()
    assert_clean(app)
    assert (app.slider(key="layer").value, app.slider(key="layer").max) == (2, 11)
    app.slider(key="layer").set_value(9).run()
    app.radio(key="model_source").set_value("default").run()  # the demo: 4 layers
    assert_clean(app)
    demo_last = app.session_state["current"].vit.spec.num_layers - 1
    assert demo_last < 9 and app.slider(key="layer").value == demo_last
    app.switch_page("views/tokens/tokens.py").run()
    app.slider(key="layer").set_value(1).run()
    app.radio(key="model_source").set_value("timm").run()
    app.text_input(key="model_timm").input("random:deit_tiny_patch16_224").run()
    assert_clean(app)
    assert app.slider(key="layer").value == 1 and app.session_state["current"].vit.spec.num_layers == 12


def test_a_pages_toy_model_says_so_on_a_photo_and_real_models_get_the_photos(app):
    """The MAE and Text prompts pages default to bundled 48×48 models trained on synthetic scenes:
    on a photo they say so at the top and name the real route; on a demo scene they do not. The
    bundled image set of a model other than the demo models is the photos, not the scenes."""
    from vizapp import inputs

    for page, what in (("views/mae/mae.py", "MAE"), ("views/text_prompts/text_prompts.py", "CLIP")):
        app.switch_page(page).run()
        assert_clean(app)
        assert not [w for w in app.warning if "A toy model on this image" in w.value], page  # a demo scene
        app.selectbox(key="image_sample").set_value("astronaut.jpg").run()
        assert_clean(app)
        (note,) = [w.value for w in app.warning if "A toy model on this image" in w.value]
        assert f"bundled demo {what}" in note and "hf" in note.lower(), note
        app.selectbox(key="image_sample").set_value("scene_1_star.png").run()
    everything = [i.name for i in inputs.image_set("samples", "unused")[0]]
    photos = [i.name for i in inputs.image_set("samples", "unused", scenes=False)[0]]
    assert any(n.startswith("scene_") for n in everything)
    assert photos == [n for n in everything if not n.startswith("scene_")] and len(photos) >= 3
