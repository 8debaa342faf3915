"""The bundled demo Swin as the app's comparison model (issue 23, item 5): on Compare and
Attention distance beside the demo ViT, and on Robustness as the third curve (tested with the
other robustness checks in tests/test_app.py)."""

from __future__ import annotations

import numpy as np
import pytest

import analysis
from tests.test_app import (  # noqa: F401 - app, npz_downloads: fixtures
    DEMO_PRESENT,
    app,
    array,
    assert_clean,
    charts,
    first_sample,
    npz_downloads,
    reproduce,
    traces,
)

pytestmark = pytest.mark.skipif(not DEMO_PRESENT, reason="needs the bundled demo models (assets/)")


def test_the_demo_swin_overlays_its_distances_beside_the_demo_vit(app):
    app.switch_page("views/distance/distance.py").run()
    choices = app.selectbox(key="dist_model2").options
    assert any("demo Swin" in option for option in choices), choices
    app.selectbox(key="dist_model2").set_value("demo_swin").run()
    assert_clean(app)
    swin = analysis.load_vit("demo_swin")
    record = analysis.capture_attention(swin, swin.preprocess(analysis.load_image(first_sample())))
    expected = analysis.mean_attention_distance(record).numpy()  # (L, heads) px, NaN beyond a layer's heads
    series = traces(charts(app)[0], "scatter")
    drawn = [array(trace["y"]).astype(np.float64) for trace in series if "swin" in trace["name"].lower()]
    assert drawn, [trace["name"] for trace in series]
    finite = expected[np.isfinite(expected)]
    np.testing.assert_allclose(np.sort(drawn[0][np.isfinite(drawn[0])]), np.sort(finite), rtol=1e-4)


def test_compare_puts_the_demo_swin_beside_the_demo_vit(app, npz_downloads):
    app.switch_page("views/compare/compare.py").run()
    app.multiselect(key="cmp_layers").set_value([0, 2]).run()
    app.selectbox(key="cmp_model2").set_value("demo_swin").run()
    assert_clean(app)
    assert any(
        "demo_swin" in (chart.get("layout", {}).get("title", {}) or {}).get("text", "")
        or any("demo_swin" in str(a.get("text", "")) for a in chart.get("layout", {}).get("annotations", []))
        for chart in charts(app)
    ), "the Swin's panels are labelled"
    # "Reproduce in Python": the Swin's layers each on its stage grid; only the ViT's rollout is
    # defined from layer 0 (the Swin's crosses patch merging), on the page and in the script
    data, script = npz_downloads["cmp_data"], reproduce(app)
    layers2 = [int(layer) for layer in data["second_model_layers"]]
    assert sorted(script["second_model_attention"]) == layers2
    for layer in layers2:
        np.testing.assert_allclose(
            script["second_model_attention"][layer], data[f"second_model_attention_layer{layer}"], rtol=1e-5, atol=1e-6
        )
    rollouts = npz_downloads["cmp_rollout_data"]
    assert list(rollouts["models"]) == ["demo"] and len(script["rollouts"]) == 1
    np.testing.assert_allclose(script["rollouts"][0], rollouts["rollout_0"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("query_mode", ["patch", "mean"])
def test_compare_gives_each_window_size_of_the_demo_swin_its_own_colour_scale(query_mode):
    """The stages' windows differ in size (36 tokens, then 9), so their probabilities differ in
    scale: one shared scale with the coarse stage's floor (4/9) left the early layers flat dark.
    Each window size gets its own scale (its floor 4× its own uniform level), from a new row."""
    from streamlit.testing.v1 import AppTest

    from analysis.plots import colour_range
    from tests.test_app import APP, TIMEOUT, chart

    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(model="demo_swin")
    at.run()
    at.switch_page("views/compare/compare.py").run()
    at.checkbox(key="cmp_all").check().run()
    at.radio(key="query_mode").set_value(query_mode).run()
    assert_clean(at)
    spec = analysis.load_vit("demo_swin").spec
    figure = chart(at, "cmp_panels")
    heatmaps = [t for t in figure["data"] if t["type"] == "heatmap"]
    assert len(heatmaps) == spec.num_layers
    levels = [
        spec.geometry(layer).uniform_attention(mean_query=query_mode == "mean") for layer in range(spec.num_layers)
    ]
    distinct = list(dict.fromkeys(levels))
    assert len(distinct) > 1
    for group, level in enumerate(distinct):
        members = [h for h, lv in zip(heatmaps, levels) if lv == level]
        axis = "coloraxis" if group == 0 else f"coloraxis{group + 1}"
        assert {h["coloraxis"] for h in members} == {axis}
        values = np.concatenate([array(h["z"]).astype(np.float64).ravel() for h in members])
        lo, hi, _ = colour_range("robust", values, uniform=level)
        assert figure["layout"][axis]["cmin"] == pytest.approx(lo) and figure["layout"][axis]["cmax"] == pytest.approx(
            hi
        )
        assert hi < 4 * max(distinct) or level == max(distinct)  # not the coarse stage's floor
        assert float(np.mean(values > lo + 0.1 * (hi - lo))) > 0.05  # readable: not flat dark


def test_the_swins_mean_over_patches_map_is_floored_at_its_own_uniform_level():
    """Stage 0 of the demo Swin (a 12×12 grid, windows of 36 cells), the mean over every query:
    uniform attention gives each cell 1/144, so the colour scale's floor is 4/144, not 4/36
    (one window's level: a 16× too high top that left the map dark)."""
    from streamlit.testing.v1 import AppTest

    from analysis.plots import colour_range
    from tests.test_app import APP, TIMEOUT, chart

    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(model="demo_swin")
    at.run()
    at.radio(key="attn_stage").set_value(0).run()
    at.radio(key="query_mode").set_value("mean").run()
    assert_clean(at)
    figure = chart(at, "attn_overlay")
    (heatmap,) = [t for t in figure["data"] if t["type"] == "heatmap"]
    values = array(heatmap["z"]).astype(np.float64)
    assert values.shape == (12, 12)
    lo, hi, _ = colour_range("robust", values, uniform=1 / 144)
    axis = heatmap.get("coloraxis")
    drawn = figure["layout"][axis] if axis else heatmap
    assert (drawn["cmin"] if axis else drawn["zmin"]) == pytest.approx(lo)
    assert (drawn["cmax"] if axis else drawn["zmax"]) == pytest.approx(hi) and hi < 4 / 36
    assert any("each of the 144 cells" in c.value for c in at.caption)
