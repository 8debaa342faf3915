"""The Masked-autoencoder page (issue 24, item 3), driven headless with AppTest: its pictures,
error map, attention and downloads are the library's numbers (``analysis.mae``) for the same
model, image and mask; a ratio change and a patch click change the mask and the reconstruction;
an encoder without a decoder gets the library's message and the app keeps working."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import torch
from PIL import Image

import analysis
from analysis import plots
from analysis.mae import draw_mask, figure_2_images, hidden_patch_loss, load_mae, mae_reconstruct
from tests.test_app import (  # noqa: F401 - npz_downloads: a fixture
    APP,
    REPO,
    TIMEOUT,
    array,
    assert_clean,
    assert_same_arrays,
    first_sample,
    npz_downloads,
    reproduce,
    reproduce_expander,
)
from tests.test_mae import folders  # noqa: F401 - fixture: tiny random ViTMAEForPreTraining folders

pytestmark = pytest.mark.skipif(
    not (REPO / "assets" / "demo_mae" / "config.json").is_file(), reason="needs the bundled demo MAE (assets/demo_mae)"
)


@pytest.fixture(scope="module")
def demo():
    """The demo MAE and the image the app opens on (the sidebar's first sample)."""
    mae = load_mae("demo_mae")  # the device the app picks
    return mae, mae.preprocess(analysis.load_image(first_sample()))


@pytest.fixture
def page():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    at.switch_page("views/mae/mae.py").run()
    assert_clean(at)
    return at


def chart_by_prefix(at, prefix: str) -> dict:
    import json

    (found,) = [json.loads(c.proto.spec) for c in at.get("plotly_chart") if f"-{prefix}" in c.proto.id]
    return found


def panel_pictures(at) -> list[np.ndarray]:
    """The four Figure 2 pictures as the browser receives them, ``(H, W, 3)`` uint8 each."""
    spec = chart_by_prefix(at, "mae_panels_")
    sources = [t["source"] for t in spec["data"] if t["type"] == "image"]
    return [np.asarray(Image.open(io.BytesIO(base64.b64decode(s.split(",", 1)[1]))).convert("RGB")) for s in sources]


def hidden_text(at) -> str:
    (line,) = [m.value for m in at.markdown if "patches hidden" in m.value]
    return line


def expected(mae, pixels, mask: torch.Tensor):
    result = mae_reconstruct(mae, pixels, mask=mask.unsqueeze(0))
    return result, figure_2_images(result, mae.preprocessing)


def test_the_page_draws_the_librarys_reconstruction_error_and_attention(page, demo, npz_downloads):
    mae, pixels = demo
    page.run()  # once more, with the download recorder in place
    n = mae.spec.num_patches
    mask = draw_mask(1, n, 0.75, 0)[0]
    result, pictures = expected(mae, pixels, mask)
    assert hidden_text(page).startswith(f"**{int(mask.sum())} of {n}**")
    assert f"**{float(result.loss):.4g}**" in hidden_text(page)
    drawn = panel_pictures(page)
    for shown, name in zip(drawn, ("original", "masked", "reconstruction", "composite")):
        np.testing.assert_array_equal(shown, plots.unit_to_uint8(pictures[name]), err_msg=name)
    grey = np.array(plots.HIDDEN_GREY)
    hidden_pixels = result.hidden_pixels()[0, 0].bool().numpy()
    assert (drawn[1][hidden_pixels] == grey).all() and hidden_pixels.any()
    error = array(next(t for t in chart_by_prefix(page, "mae_error")["data"] if t["type"] == "heatmap")["z"])
    expected_error = hidden_patch_loss(result)
    np.testing.assert_allclose(error, expected_error, rtol=1e-5)  # NaN where NaN: the visible patches
    assert np.isnan(error).sum() == n - int(mask.sum())
    for row, col in zip(*np.nonzero(np.isfinite(expected_error))):  # a slow check of the hidden patches
        patch = row * mae.spec.grid_size[1] + col
        target = analysis.mae.patches.patchify(pixels, mae.spec.patch_size)[0, patch]
        assert error[row, col] == pytest.approx(float(((result.predictions[0, patch] - target) ** 2).mean()), rel=1e-5)
    attention = array(next(t for t in chart_by_prefix(page, "mae_attention")["data"] if t["type"] == "heatmap")["z"])
    last = mae.spec.num_layers - 1
    np.testing.assert_allclose(attention, result.attention.key_grid(last, None).numpy(), rtol=1e-5)
    data = npz_downloads["mae_data"]
    np.testing.assert_array_equal(data["mask"], mask.numpy().reshape(mae.spec.grid_size))
    np.testing.assert_allclose(data["reconstruction"], pictures["reconstruction"], rtol=1e-6)
    np.testing.assert_allclose(data["patch_loss_hidden"], expected_error, rtol=1e-5)
    assert float(data["loss"]) == pytest.approx(float(result.loss), rel=1e-6)
    curve = npz_downloads["mae_curve_data"]
    assert curve["losses"].shape == (len(curve["images"]), len(curve["ratios"])) and len(curve["images"]) > 0


def test_a_ratio_change_and_a_patch_click_change_the_mask_and_the_reconstruction(page, demo, npz_downloads):
    mae, pixels = demo
    n = mae.spec.num_patches
    page.slider(key="mae_ratio").set_value(0.5).run()
    assert_clean(page)
    half = draw_mask(1, n, 0.5, 0)[0]
    assert hidden_text(page).startswith(f"**{int(half.sum())} of {n}**")
    np.testing.assert_array_equal(npz_downloads["mae_data"]["mask"].ravel(), half.numpy())
    before = panel_pictures(page)
    patch = int(np.flatnonzero(~half.numpy())[0])  # a visible patch: the click hides it
    page.session_state["mae_flipped"] = [patch]  # what a click's on_select (toggle_patch) sets
    page.run()
    assert_clean(page)
    clicked = half.clone()
    clicked[patch] = True
    mask = npz_downloads["mae_data"]["mask"].ravel()
    assert mask[patch] and mask.sum() == half.sum() + 1
    np.testing.assert_array_equal(mask, clicked.numpy())
    after = panel_pictures(page)
    assert not np.array_equal(after[2], before[2])  # the reconstruction changed
    np.testing.assert_array_equal(after[0], before[0])  # the original did not
    _, pictures = expected(mae, pixels, clicked)
    np.testing.assert_array_equal(after[2], plots.unit_to_uint8(pictures["reconstruction"]))
    # the clicked patch is outlined on every panel, and the reset brings the drawn mask back
    shapes = chart_by_prefix(page, "mae_panels_")["layout"]["shapes"]
    assert len(shapes) == 4
    page.button(key="mae_reset").click().run()
    assert hidden_text(page).startswith(f"**{int(half.sum())} of {n}**")


def test_every_patch_hidden_is_refused_with_what_to_do(page):
    n = 64
    mask = draw_mask(1, n, 0.75, 0)[0]
    page.session_state["mae_flipped"] = np.flatnonzero(~mask.numpy()).tolist()  # hide the rest too
    page.run()
    assert_clean(page)
    assert any("hides every patch" in e.value and "Reveal a patch" in e.value for e in page.error)
    page.button(key="mae_reset").click().run()
    assert_clean(page)
    assert hidden_text(page).startswith(f"**{int(mask.sum())} of {n}**")


def test_a_visible_query_shows_its_attention_and_a_hidden_one_falls_back(page, demo):
    mae, pixels = demo
    n = mae.spec.num_patches
    mask = draw_mask(1, n, 0.75, 0)[0]
    result, _ = expected(mae, pixels, mask)
    visible = int(np.flatnonzero(~mask.numpy())[1])
    page.session_state["mae_query"] = visible
    page.slider(key="mae_layer").set_value(1).run()
    page.selectbox(key="mae_head").set_value(2).run()
    assert_clean(page)
    spec = chart_by_prefix(page, "mae_attention")
    attention = array(next(t for t in spec["data"] if t["type"] == "heatmap")["z"])
    np.testing.assert_allclose(attention, result.attention.key_grid(1, visible, head=2).numpy(), rtol=1e-5)
    assert [s for s in spec["layout"]["shapes"] if s["type"] == "rect"]  # the query is outlined
    hidden_patch = int(np.flatnonzero(mask.numpy())[0])
    page.session_state["mae_query"] = hidden_patch
    page.run()
    assert any(f"patch {hidden_patch} is hidden now" in c.value for c in page.caption)
    attention = array(next(t for t in chart_by_prefix(page, "mae_attention")["data"] if t["type"] == "heatmap")["z"])
    np.testing.assert_allclose(attention, result.attention.key_grid(1, None, head=2).numpy(), rtol=1e-5)


def test_a_timm_mae_encoder_gets_the_decoder_message_and_the_app_keeps_working(page):
    page.radio(key="mae_source").set_value("hf").run()
    assert any("ViTMAEForPreTraining" in i.value for i in page.info)  # asks for a name first
    page.text_input(key="mae_other").input("vit_base_patch16_224.mae").run()
    assert_clean(page)
    (message,) = [i.value for i in page.info]
    assert "without its decoder" in message and "hf:facebook/vit-mae-base" in message
    assert not page.get("plotly_chart")
    page.switch_page("views/attention/attention.py").run()
    assert_clean(page)
    assert page.get("plotly_chart")


def test_the_downloads(page, demo, monkeypatch):
    import vizapp.ui as ui

    pngs: dict[str, np.ndarray] = {}
    original = ui.download_png

    def recording(key, filename, image, label="Image (.png)"):
        pngs[key] = np.asarray(Image.open(io.BytesIO(ui.png_bytes(image))))
        original(key, filename, image, label)

    monkeypatch.setattr(ui, "download_png", recording)
    page.run()
    mae, pixels = demo
    _, pictures = expected(mae, pixels, draw_mask(1, mae.spec.num_patches, 0.75, 0)[0])
    assert set(pngs) == {f"mae_png_{name}" for name in pictures}
    for name, picture in pictures.items():
        np.testing.assert_array_equal(pngs[f"mae_png_{name}"], plots.unit_to_uint8(picture))
    labels = [b.label for b in page.get("download_button")]
    assert labels.count("Data (.npz)") == 2


def test_a_timm_mae_encoder_in_the_sidebar_is_offered_and_gets_the_decoder_message(page):
    """The sidebar's model, a timm ``.mae`` encoder (random weights, at 32 px to stay fast), is the
    page's first choice; the page says the library's reason, and the demo MAE still works."""
    page.number_input(key="resolution").set_value(32)
    page.radio(key="model_source").set_value("timm").run()
    page.text_input(key="model_timm").input("random:vit_base_patch16_224.mae").run()
    assert_clean(page)
    assert page.session_state["current"].model.source == "vit_base_patch16_224.mae"
    assert page.radio(key="mae_source").value == "sidebar"
    (message,) = [i.value for i in page.info]
    assert "without its decoder" in message and "hf:facebook/vit-mae-base" in message
    assert any("headless ViT" in c.value for c in page.caption)
    page.radio(key="mae_source").set_value("demo").run()
    assert_clean(page)
    assert hidden_text(page).startswith("**48 of 64**")


def test_a_hugging_face_mae_folder_opens_with_its_own_grid_and_norm_pix_loss(page, folders):
    """A ``save_pretrained`` ViTMAEForPreTraining (tiny, random, ``norm_pix_loss`` on) typed into the
    page: its own grid, the library's reconstruction (un-normalised per patch) and the loss's units."""
    folder = folders[True]
    page.radio(key="mae_source").set_value("hf").run()
    page.text_input(key="mae_other").input(folder).run()
    assert_clean(page)
    mae = load_mae(folder)  # the device the app picks
    n = mae.spec.num_patches
    assert n != 64  # not the demo's grid
    mask = draw_mask(1, n, 0.75, 0)[0]
    pixels = mae.preprocess(analysis.load_image(first_sample()))
    result, pictures = expected(mae, pixels, mask)
    assert hidden_text(page).startswith(f"**{int(mask.sum())} of {n}**")
    assert "norm_pix_loss" in hidden_text(page) and f"**{float(result.loss):.4g}**" in hidden_text(page)
    np.testing.assert_array_equal(panel_pictures(page)[2], plots.unit_to_uint8(pictures["reconstruction"]))


def test_at_ratio_zero_nothing_is_hidden_until_a_click_hides_a_patch(page, demo):
    mae, pixels = demo
    page.slider(key="mae_ratio").set_value(0.0).run()
    assert_clean(page)
    assert hidden_text(page).startswith("**0 of 64**") and "no loss" in hidden_text(page)
    page.session_state["mae_flipped"] = [27]  # hide one patch by hand
    page.run()
    mask = torch.zeros(64, dtype=torch.bool)
    mask[27] = True
    result, _ = expected(mae, pixels, mask)
    assert hidden_text(page).startswith("**1 of 64**") and f"**{float(result.loss):.4g}**" in hidden_text(page)


def test_the_page_reproduces_in_python_with_a_clicked_mask(page, demo, npz_downloads):
    """The "Reproduce in Python" script recomputes what the page shows for a mask the user edited
    (one drawn-visible patch hidden, one drawn-hidden patch revealed) at another ratio, seed,
    layer, head and query: the four pictures as drawn, the loss as printed, the error map, the
    attention and the loss curve, equal to the page's own numbers."""
    mae, _ = demo
    n = mae.spec.num_patches
    page.slider(key="mae_ratio").set_value(0.6).run()
    page.number_input(key="mae_seed").set_value(3).run()
    drawn = draw_mask(1, n, 0.6, 3)[0].numpy()
    hide, reveal = int(np.flatnonzero(~drawn)[0]), int(np.flatnonzero(drawn)[0])
    page.session_state["mae_flipped"] = sorted([hide, reveal])  # what two clicks' on_select (toggle_patch) sets
    query = int(np.flatnonzero(~drawn)[1])  # visible, and not the patch the click hid
    page.session_state["mae_query"] = query
    page.slider(key="mae_layer").set_value(1).run()
    page.selectbox(key="mae_head").set_value(2).run()
    assert_clean(page)
    code = reproduce_expander(page).code[0].value
    assert f"FLIPPED = {sorted([hide, reveal])!r}" in code and "RATIO, SEED = 0.6, 3" in code
    script = reproduce(page)
    npz = npz_downloads["mae_data"]
    expected_mask = drawn.copy()
    expected_mask[[hide, reveal]] = ~expected_mask[[hide, reveal]]
    np.testing.assert_array_equal(npz["mask"].ravel(), expected_mask)  # the page used the edited mask
    assert (int(npz["attention_query"]), str(npz["attention_head"]), int(npz["attention_layer"])) == (query, "2", 1)
    assert_same_arrays(
        script,
        npz,
        ["original", "masked", "reconstruction", "composite", "mask", "drawn_mask", "patch_loss_hidden", "attention"],
    )
    assert script["loss"] == pytest.approx(float(npz["loss"]), rel=1e-6)
    assert f"reconstruction loss **{script['loss']:.4g}**" in hidden_text(page)  # the number the page prints
    for shown, name in zip(panel_pictures(page), ("original", "masked", "reconstruction", "composite")):
        np.testing.assert_array_equal(shown, plots.unit_to_uint8(script[name]), err_msg=name)  # the pixels drawn
    attention = array(next(t for t in chart_by_prefix(page, "mae_attention")["data"] if t["type"] == "heatmap")["z"])
    np.testing.assert_allclose(attention, script["attention"], rtol=1e-5)
    curve = npz_downloads["mae_curve_data"]
    assert tuple(script["SET_RATIOS"]) == tuple(curve["ratios"])
    assert_same_arrays(script, curve, ["losses"])
