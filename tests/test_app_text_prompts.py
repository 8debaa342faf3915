"""The Text prompts page (issue 25, item 3), driven headless with AppTest: its zero-shot bars,
maps, decomposition, curves and downloads are ``analysis.text``'s numbers for the same model
(the very instance the app caches), image and prompts; typing prompts, changing methods and
choosing a head change them; an empty prompt, a bad template, an over-long prompt and an
image-only model get the library's typed message and the app keeps working.

No number of the demo CLIP's current weights is assumed: every expectation is recomputed with
the API on the same model."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import analysis
from analysis.faithfulness import area_under_curve, perturbation_curve
from analysis.text import explain_text, head_texts, score_value, text_decomposition, zero_shot
from tests.test_app import (  # noqa: F401 - npz_downloads is a fixture
    APP,
    REPO,
    TIMEOUT,
    array,
    assert_clean,
    first_sample,
    npz_downloads,
    reproduce,
    traces,
)

pytestmark = pytest.mark.skipif(
    not (REPO / "assets" / "demo_clip" / "config.json").is_file(),
    reason="needs the bundled demo CLIP (assets/demo_clip)",
)
DEMO_PROMPTS = ["a circle", "a ring", "a bar", "a triangle", "a cross", "a star"]  # the page's demo default


@pytest.fixture(scope="module")
def demo():
    """The demo CLIP the app uses (its process-wide cached instance) and the image the app opens on."""
    from vizapp.views.text_prompts.compute import get_clip

    clip = get_clip("demo_clip")
    return clip, clip.preprocess(analysis.load_image(first_sample()))


@pytest.fixture
def page(npz_downloads):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    at.switch_page("views/text_prompts/text_prompts.py").run()
    assert_clean(at)
    return at


def chart_by_prefix(at, prefix: str) -> dict:
    (found,) = [json.loads(c.proto.spec) for c in at.get("plotly_chart") if f"-{prefix}" in c.proto.id]
    return found


def bars(at) -> tuple[list[str], np.ndarray]:
    """The zero-shot bar chart: ``(prompts top to bottom, probabilities)``."""
    (bar,) = traces(chart_by_prefix(at, "tp_zero_shot"), "bar")
    return list(bar["customdata"])[::-1], array(bar["x"])[::-1] / 100


def panel_maps(at, key: str = "tp_maps") -> list[np.ndarray]:
    return [array(t["z"]) for t in traces(chart_by_prefix(at, key), "heatmap")]


def scaled(map_: torch.Tensor) -> np.ndarray:
    return analysis.scale_by_peak(map_.numpy(), negative="zero")


def assert_maps(at, clip, pixels, prompts, methods):
    drawn = panel_maps(at)
    assert len(drawn) == len(prompts) * len(methods)
    for index, (prompt, method) in enumerate((p, m) for p in prompts for m in methods):
        expected = explain_text(clip, pixels, prompt, method=method).maps[0]
        np.testing.assert_allclose(drawn[index], scaled(expected), rtol=1e-4, atol=1e-5, err_msg=f"{prompt}/{method}")
        assert 0 <= drawn[index].min() and drawn[index].max() <= 1  # one 0-1 scale


def test_the_default_page_draws_the_librarys_numbers(page, demo, npz_downloads):
    clip, pixels = demo
    expected = zero_shot(clip, pixels, DEMO_PROMPTS)
    shown, probabilities = bars(page)
    assert shown == DEMO_PROMPTS
    np.testing.assert_allclose(probabilities, expected.probabilities[0].numpy(), rtol=1e-5, atol=1e-6)
    assert probabilities.sum() == pytest.approx(1.0, abs=1e-5)  # CLIP: a softmax over the prompts
    assert "softmax over the prompts" in chart_by_prefix(page, "tp_zero_shot")["layout"]["xaxis"]["title"]["text"]
    scores = npz_downloads["tp_scores_data"]
    np.testing.assert_allclose(scores["logits"], expected.logits[0].numpy(), rtol=1e-5)
    # the maps: the two best-scoring prompts, by chefer, legrad and patch_text
    ranked = [DEMO_PROMPTS[i] for i in np.argsort(-expected.logits[0].numpy(), kind="stable")][:2]
    assert page.multiselect(key="tp_mapped").value == ranked
    assert_maps(page, clip, pixels, ranked, ["chefer", "legrad", "patch_text"])
    maps = npz_downloads["tp_maps_data"]
    np.testing.assert_allclose(
        maps["maps"][1, 2], explain_text(clip, pixels, ranked[1], method="patch_text").maps[0], rtol=1e-4, atol=1e-6
    )
    # the decomposition of the best prompt: heads x layers, the chosen head's map, the sum
    decomposition = text_decomposition(clip, pixels, ranked[0])
    heads = decomposition.heads()[0].numpy()
    heatmap = traces(chart_by_prefix(page, "tp_heads_"), "heatmap")[0]
    np.testing.assert_allclose(array(heatmap["z"]), heads, rtol=1e-4, atol=1e-6)
    layer, head = np.unravel_index(np.argmax(np.abs(heads)), heads.shape)  # the strongest head at first
    assert page.selectbox(key="tp_head").value == f"{layer}:{head}"
    np.testing.assert_allclose(
        panel_maps(page, "tp_head_map")[0], decomposition.head_maps()[0, layer, head], rtol=1e-4, atol=1e-6
    )
    (total,) = [m.value for m in page.markdown if m.value.startswith("s('")]
    assert f"**{float(decomposition.score[0]):.4g}**" in total and "logit bias" in total
    data = npz_downloads["tp_decomposition_data"]
    assert float(data["total"]) == pytest.approx(float(data["score"]), abs=1e-4)
    assert float(data["score"]) == pytest.approx(float(expected.logits[0, DEMO_PROMPTS.index(ranked[0])]), abs=1e-4)
    # deletion and insertion of the score for chefer's map, with the score as the value
    curves = npz_downloads["tp_curves_data"]
    saliency = explain_text(clip, pixels, ranked[0], method="chefer").maps[0]
    value = score_value(clip, clip.encode_text(ranked[0]).embeddings)
    for mode in ("deletion", "insertion"):
        fractions, values = perturbation_curve(clip.image, pixels, saliency, 0, mode=mode, steps=16, value=value)
        np.testing.assert_allclose(curves[mode], values, rtol=1e-4, atol=1e-4)
        assert float(curves[f"{mode}_auc"]) == pytest.approx(area_under_curve(fractions, values), abs=1e-4)
    assert curves["deletion"][0] == pytest.approx(float(decomposition.score[0]), abs=1e-3)  # nothing removed yet
    layout = chart_by_prefix(page, "tp_curves")["layout"]
    assert layout["yaxis"]["title"]["text"] == "image–text score s"
    low, high = layout["yaxis"]["range"]  # a score is not a probability: the axis holds every point
    drawn = np.concatenate([curves[k] for k in ("deletion", "insertion", "random_deletion", "random_insertion")])
    assert low <= min(0.0, drawn.min()) and high >= drawn.max()
    names = [t["name"] for t in traces(chart_by_prefix(page, "tp_curves"), "scatter") if t.get("showlegend")]
    assert names[0].startswith("random (AUC") and names[1].startswith("Chefer")


def test_typing_prompts_and_changing_methods_redraw_the_maps(page, demo):
    clip, pixels = demo
    page.text_area(key="tp_prompts").input("a red star\n\na blue ring on the left").run()
    assert_clean(page)
    prompts = ["a red star", "a blue ring on the left"]
    shown, probabilities = bars(page)
    assert shown == prompts
    np.testing.assert_allclose(probabilities, zero_shot(clip, pixels, prompts).probabilities[0].numpy(), rtol=1e-5)
    assert any("1 blank line skipped" in c.value for c in page.caption)
    assert sorted(page.multiselect(key="tp_mapped").value) == sorted(prompts)
    mapped = page.multiselect(key="tp_mapped").value
    assert_maps(page, clip, pixels, mapped, ["chefer", "legrad", "patch_text"])
    page.multiselect(key="tp_methods").set_value(["gradcam", "decomposition", "attnlrp"]).run()
    assert_clean(page)
    assert_maps(page, clip, pixels, mapped, ["gradcam", "decomposition", "attnlrp"])
    page.multiselect(key="tp_mapped").set_value(["a red star"]).run()
    assert_maps(page, clip, pixels, ["a red star"], ["gradcam", "decomposition", "attnlrp"])


def test_a_class_list_with_a_template_gives_its_prompts(page, demo):
    clip, pixels = demo
    page.radio(key="tp_mode").set_value("classes").run()
    page.text_input(key="tp_template").input("a green {}").run()
    page.text_input(key="tp_classes").input("star, ring,bar").run()
    assert_clean(page)
    prompts = ["a green star", "a green ring", "a green bar"]
    shown, probabilities = bars(page)
    assert shown == prompts
    np.testing.assert_allclose(probabilities, zero_shot(clip, pixels, prompts).probabilities[0].numpy(), rtol=1e-5)
    page.text_input(key="tp_template").input("a green thing").run()
    assert_clean(page)
    assert any("exactly one {}" in e.value.replace("\\", "") for e in page.error)  # markdown-escaped


def test_choosing_a_head_shows_its_own_patch_map(page, demo, npz_downloads):
    clip, pixels = demo
    focus = page.selectbox(key="tp_focus").value
    maps = text_decomposition(clip, pixels, focus).head_maps()[0]
    page.selectbox(key="tp_head").set_value("1:2").run()
    assert_clean(page)
    np.testing.assert_allclose(panel_maps(page, "tp_head_map")[0], maps[1, 2], rtol=1e-4, atol=1e-6)
    assert (
        int(npz_downloads["tp_decomposition_data"]["layer"]),
        int(npz_downloads["tp_decomposition_data"]["head"]),
    ) == (1, 2)
    page.session_state["tp_head"] = "3:0"  # what a click on the heatmap's cell sets (choose_head)
    page.run()
    np.testing.assert_allclose(panel_maps(page, "tp_head_map")[0], maps[3, 0], rtol=1e-4, atol=1e-6)
    shapes = chart_by_prefix(page, "tp_heads_")["layout"]["shapes"]
    assert len(shapes) == 1 and shapes[0]["x0"] == pytest.approx(-0.5) and shapes[0]["y0"] == pytest.approx(2.5)
    other = next(p for p in page.selectbox(key="tp_focus").options if p != focus)
    page.selectbox(key="tp_focus").set_value(other).run()
    heads = text_decomposition(clip, pixels, other).heads()[0].numpy()
    np.testing.assert_allclose(
        array(traces(chart_by_prefix(page, "tp_heads_"), "heatmap")[0]["z"]), heads, rtol=1e-4, atol=1e-6
    )


def test_an_empty_prompt_and_an_over_long_prompt_are_said_never_silent(page, demo):
    clip, _ = demo
    page.text_area(key="tp_prompts").input("  \n ").run()
    assert_clean(page)
    assert any("No prompt was given" in e.value for e in page.error)
    assert not page.get("plotly_chart")
    long = "a red star on the top left " * 3  # past the demo text tower's context
    assert len(long.split()) + 2 > clip.context_length
    page.text_area(key="tp_prompts").input(f"a ring\n{long}").run()
    assert_clean(page)
    assert any("truncated" in w.value and str(clip.context_length) in w.value for w in page.warning)
    assert len(bars(page)[0]) == 2
    page.text_area(key="tp_prompts").input("a ring").run()
    assert not any("truncated" in w.value for w in page.warning)


def test_an_image_only_model_gets_the_typed_message_and_the_app_keeps_working(page):
    page.radio(key="tp_source").set_value("other").run()
    page.text_input(key="tp_other").input("demo").run()  # the bundled demo ViT: no text tower
    assert_clean(page)
    assert any("image-only" in e.value and "load_clip" in e.value.replace("\\", "") for e in page.error)
    assert not page.get("plotly_chart")
    page.radio(key="tp_source").set_value("demo").run()
    assert_clean(page)
    assert bars(page)[0] == DEMO_PROMPTS
    page.switch_page("views/attention/attention.py").run()
    assert_clean(page)
    assert page.get("plotly_chart")


def test_the_page_reproduces_in_python(page, npz_downloads):
    page.selectbox(key="tp_head").set_value("2:1").run()
    page.selectbox(key="tp_curve_method").set_value("legrad").run()
    assert_clean(page)
    script = reproduce(page)
    for name in ("logits", "probabilities"):
        np.testing.assert_allclose(script[name], npz_downloads["tp_scores_data"][name], rtol=1e-5, atol=1e-6)
    for name in ("maps", "scaled"):
        np.testing.assert_allclose(script[name], npz_downloads["tp_maps_data"][name], rtol=1e-4, atol=1e-6)
    decomposition = npz_downloads["tp_decomposition_data"]
    np.testing.assert_allclose(script["heads"], decomposition["heads"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(script["head_map"], decomposition["head_map"], rtol=1e-4, atol=1e-6)
    assert script["score"] == pytest.approx(float(decomposition["score"]), abs=1e-5)
    curves = npz_downloads["tp_curves_data"]
    assert str(curves["method"]) == "legrad"
    for name in ("fractions", "deletion", "insertion"):
        np.testing.assert_allclose(script[name], curves[name], rtol=1e-4, atol=1e-4)


def test_head_descriptions_are_computed_on_demand_and_kept(page, demo):
    from vizapp import inputs

    clip, _ = demo
    assert not page.get("arrow_data_frame")
    page.button(key="tp_describe").click().run()
    assert_clean(page)
    (table,) = page.dataframe
    frame = table.value
    images = [analysis.load_image(inputs.read_sample(p.name)) for p in inputs.sample_paths()]
    expected = head_texts(clip, images, texts_per_head=3, batch_size=8)
    assert len(frame) == clip.spec.num_layers * clip.spec.num_heads == len(expected.heads)
    for (_, row), description in zip(frame.iterrows(), expected.heads):
        assert (row["layer"], row["head"]) == (description.layer, description.head)
        assert row["texts (share of the head's variance)"] == " · ".join(
            f"{t} ({s:.0%})" for t, s in zip(description.texts, description.shares)
        )
        assert row["explained"] == pytest.approx(round(description.explained, 3))
    page.run()  # kept: shown again without a click, and no button
    assert len(page.dataframe) == 1 and not [b for b in page.button if b.key == "tp_describe"]


def test_a_clicked_points_customdata_reads_as_streamlit_returns_it():
    """Streamlit returns a 2-D numpy customdata's row as a dict {"0": .., "1": ..} (it once made the
    heatmap's head clicks do nothing); a list stays a list."""
    from vizapp.ui import point_customdata

    assert point_customdata({"customdata": {"0": 2, "1": 3, "2": 0.5}}) == [2, 3, 0.5]
    assert point_customdata({"customdata": [1, 0]}) == [1, 0]
    assert point_customdata({"point_index": 4}) is None


def test_a_siglip_folder_is_scored_by_its_own_sigmoid(page, tmp_path):
    """The page's other source: a Hugging Face SigLIP folder (tiny, random, saved here). Its
    probabilities are sigmoids (not a distribution, and the chart says so), its decomposition
    names the logit bias and the pooling head's MLP, and all of it is the library's on the same
    model instance the app cached."""
    pytest.importorskip("tokenizers")
    import text_models
    from vizapp.views.text_prompts.compute import get_clip

    text_models.save("siglip", tmp_path)
    page.radio(key="tp_source").set_value("other").run()
    page.text_input(key="tp_other").input(str(tmp_path)).run()
    page.text_area(key="tp_prompts").input("a red star\na blue dog\na green circle").run()
    assert_clean(page)
    clip = get_clip(str(tmp_path))
    pixels = clip.preprocess(analysis.load_image(first_sample()))
    prompts = ["a red star", "a blue dog", "a green circle"]
    expected = zero_shot(clip, pixels, prompts)
    assert expected.rule == "sigmoid"
    shown, probabilities = bars(page)
    assert shown == prompts
    np.testing.assert_allclose(probabilities, expected.probabilities[0].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(probabilities, torch.sigmoid(expected.logits[0]).numpy(), rtol=1e-5, atol=1e-6)
    assert "sigmoid per prompt" in chart_by_prefix(page, "tp_zero_shot")["layout"]["xaxis"]["title"]["text"]
    mapped = page.multiselect(key="tp_mapped").value
    assert_maps(page, clip, pixels, mapped, ["chefer", "legrad", "patch_text"])
    (total,) = [m.value for m in page.markdown if m.value.startswith("s('")]
    assert "logit bias" in total and "pooling head" in total
    score = float(text_decomposition(clip, pixels, mapped[0]).score[0])
    assert f"**{score:.4g}**" in total


@pytest.mark.upload
def test_head_descriptions_over_uploaded_images(page, demo):
    from PIL import Image

    from tests.test_app import uploader

    clip, _ = demo
    scenes = sorted((REPO / "assets" / "samples").glob("scene_*.png"))[:2]
    page.radio(key="tp_set").set_value("mine").run()
    uploader(page, key="tp_files").set_value([(p.name, p.read_bytes(), "image/png") for p in scenes]).run()
    page.button(key="tp_describe").click().run()
    assert_clean(page)
    (table,) = page.dataframe
    expected = head_texts(clip, [Image.open(p).convert("RGB") for p in scenes], texts_per_head=3, batch_size=8)
    assert any(f"Over {len(scenes)} images" in c.value for c in page.caption)
    for (_, row), description in zip(table.value.iterrows(), expected.heads):
        assert row["texts (share of the head's variance)"] == " · ".join(
            f"{t} ({s:.0%})" for t, s in zip(description.texts, description.shares)
        )
