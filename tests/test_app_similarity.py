"""The Attention distance page's linear CKA: the model against itself over the bundled samples,
then against a second model, each equal to :func:`analysis.representation_similarity` over the
same images in the page's minibatches (the cached pieces of :data:`vizapp.resources.SET_CHUNK`)."""

from __future__ import annotations

import os

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import analysis  # noqa: E402
from tests.test_app import app, array, assert_clean, chart, npz_downloads, traces  # noqa: E402, F401 - fixtures
from vizapp import inputs, resources  # noqa: E402


def test_the_distance_page_draws_the_linear_cka_of_the_library(app, npz_downloads):  # noqa: F811
    app.switch_page("views/distance/distance.py").run()
    assert_clean(app)
    assert not [c for c in app.get("plotly_chart") if c.proto.id.endswith("-dist_cka_chart")]  # on request only
    app.toggle(key="dist_cka").set_value(True).run()
    assert_clean(app)
    vit = analysis.load_vit("demo")
    paths = inputs.bundled_set(scenes=True)  # the demo model: every bundled sample
    expected = analysis.representation_similarity(vit, paths, batch_size=resources.SET_CHUNK)
    (heatmap,) = traces(chart(app, "dist_cka_chart"), "heatmap")
    np.testing.assert_allclose(array(heatmap["z"]), expected.matrix, atol=1e-6)
    assert tuple(heatmap["y"]) == expected.layers_a == tuple(heatmap["x"])
    np.testing.assert_allclose(npz_downloads["dist_cka_data"]["matrix"], expected.matrix, atol=1e-6)
    assert int(npz_downloads["dist_cka_data"]["images"]) == len(paths)

    app.selectbox(key="dist_model2").set_value("demo_swin").run()  # a windowed second model
    app.radio(key="dist_cka_with").set_value("second").run()
    assert_clean(app)
    swin = analysis.load_vit("demo_swin")
    against = analysis.representation_similarity(vit, paths, swin, batch_size=resources.SET_CHUNK)
    (heatmap,) = traces(chart(app, "dist_cka_chart"), "heatmap")
    np.testing.assert_allclose(array(heatmap["z"]), against.matrix, atol=1e-6)
    assert tuple(heatmap["x"]) == against.layers_b and "stage" in heatmap["x"][-1]

    # against a CNN (Raghu et al.'s ViT against ResNet): the demo CNN's stage outputs, as the library
    app.radio(key="dist_cka_with").set_value("cnn").run()
    assert_clean(app)
    from analysis.robustness import load_cnn

    against_cnn = analysis.representation_similarity(vit, paths, load_cnn("demo"), batch_size=resources.SET_CHUNK)
    (heatmap,) = traces(chart(app, "dist_cka_chart"), "heatmap")
    np.testing.assert_allclose(array(heatmap["z"]), against_cnn.matrix, atol=1e-6)
    assert tuple(heatmap["x"]) == against_cnn.layers_b != against.layers_b
    np.testing.assert_allclose(npz_downloads["dist_cka_data"]["matrix"], against_cnn.matrix, atol=1e-6)
    app.text_input(key="dist_cka_cnn").set_value("no_such_cnn_anywhere").run()
    assert_clean(app)
    assert any("Could not load the CNN" in e.value for e in app.error)
