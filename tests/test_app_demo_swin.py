"""The bundled demo Swin as the app's comparison model (issue 23, item 5): on Compare and
Attention distance beside the demo ViT, and on Robustness as the third curve (tested with the
other robustness checks in tests/test_app.py)."""

from __future__ import annotations

import numpy as np
import pytest

import analysis
from tests.test_app import DEMO_PRESENT, app, array, assert_clean, charts, first_sample, traces  # noqa: F401 - app: fixture

pytestmark = pytest.mark.skipif(not DEMO_PRESENT, reason="needs the bundled demo models (assets/)")


def test_the_demo_swin_overlays_its_distances_beside_the_demo_vit(app):
    app.switch_page("views/distance.py").run()
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


def test_compare_puts_the_demo_swin_beside_the_demo_vit(app):
    app.switch_page("views/compare.py").run()
    app.selectbox(key="cmp_model2").set_value("demo_swin").run()
    assert_clean(app)
    assert any(
        "demo_swin" in (chart.get("layout", {}).get("title", {}) or {}).get("text", "")
        or any("demo_swin" in str(a.get("text", "")) for a in chart.get("layout", {}).get("annotations", []))
        for chart in charts(app)
    ), "the Swin's panels are labelled"
