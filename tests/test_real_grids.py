"""The real-weights tier, part: big-grid pictures on the real 37 × 37 DINOv2-S-derived backbone.

Its position table's similarity against distance, binned one patch wide, is a smooth curve
(mean similarity falling bin after bin), equal to a reference that groups every pair of the
1369 patches by its own distance; the Position page draws it and labels the 37 × 37 grid every
4th patch, with a box zoom.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import analysis  # noqa: E402
from analysis import plots  # noqa: E402


@pytest.fixture(scope="module")
def real_similarity(real_vit) -> np.ndarray:
    return analysis.position_embedding_similarity(real_vit).numpy()


def pairwise_bins(similarity: np.ndarray, width: float = 1.0):
    """Every ordered pair of patches with its own distance, grouped into [k·w, (k + 1)·w) (the
    self-pairs alone): (lower edges, mean distance, mean, std, count) per non-empty bin."""
    gh, gw = similarity.shape[:2]
    rows, cols = np.divmod(np.arange(gh * gw), gw)
    distance = np.hypot(rows[:, None] - rows[None, :], cols[:, None] - cols[None, :]).ravel()
    values = similarity.reshape(gh * gw, gh * gw).astype(np.float64).ravel()
    key = np.where(distance == 0, -1, np.floor(distance / width)).astype(np.int64)
    out = []
    for k in np.unique(key):
        chosen = key == k
        out.append(
            (max(k, 0) * width, distance[chosen].mean(), values[chosen].mean(), values[chosen].std(), chosen.sum())
        )
    return [np.array(column) for column in zip(*out)]


def test_the_binned_similarity_of_the_real_table_is_smooth_and_the_reference(real_similarity):
    bins = analysis.similarity_distance_bins(real_similarity)
    lower, distance, mean, std, count = pairwise_bins(real_similarity)
    np.testing.assert_allclose(bins.lower, lower)
    np.testing.assert_allclose(bins.distance, distance, rtol=1e-9)
    np.testing.assert_allclose(bins.mean, mean, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(bins.std, std, rtol=1e-5, atol=1e-8)
    np.testing.assert_array_equal(bins.count, count)
    assert bins.count.sum() == 1369**2
    # a learned table: similarity falls with distance, bin after bin, over the first dozen patches
    assert bins.mean[0] == pytest.approx(1.0)
    assert np.all(np.diff(bins.mean[:13]) < 0), bins.mean[:13]
    assert bins.mean[1] > 0.8 and bins.mean[12] < 0.3
    assert np.all(bins.std[1:13] < 0.2)  # a curve with a narrow band, not a cloud


def test_the_real_37_by_37_position_mosaic_labels_every_4th_patch_and_zooms(real_similarity):
    figure = plots.position_similarity_mosaic(real_similarity)
    labels = [str(i) for i in range(0, 37, 4)]
    assert list(figure.layout.xaxis.ticktext) == labels == list(figure.layout.yaxis.ticktext)
    np.testing.assert_allclose(figure.layout.yaxis.tickvals, (np.arange(0, 37, 4) + 0.5) * 37)
    assert figure.layout.dragmode == "zoom" and figure.layout.yaxis.scaleanchor == "x"
    tile = plots.similarity_tile(real_similarity[18, 18], (18, 18))
    assert tile.layout.xaxis.dtick == 4 and tile.layout.yaxis.dtick == 4


def test_the_position_page_on_the_real_model(real_dinov2_folder, real_similarity):
    from streamlit.testing.v1 import AppTest

    from analysis.plots.charts import SIMILARITY_AXIS_TITLE
    from tests.test_app import APP, array, chart, traces

    at = AppTest.from_file(APP, default_timeout=600)
    at.run()
    at.switch_page("views/position/position.py").run()  # the position page first: no attention at 518 px is computed
    at.radio(key="model_source").set_value("local").run()
    at.text_input(key="model_path").input(str(real_dinov2_folder)).run()
    assert not at.exception, [e.value for e in at.exception]
    mosaic = chart(at, "pos_mosaic")
    assert mosaic["layout"]["xaxis"]["ticktext"] == [str(i) for i in range(0, 37, 4)]
    assert mosaic["layout"]["dragmode"] == "zoom"
    assert any("Drag a box to zoom" in c.value for c in at.caption)
    curve = chart(at, "pos_curve")
    assert curve["layout"]["yaxis"]["title"]["text"] == SIMILARITY_AXIS_TITLE
    (means,) = [t for t in traces(curve, "scatter") if t.get("mode") == "lines+markers"]
    np.testing.assert_allclose(array(means["y"]), analysis.similarity_distance_bins(real_similarity).mean, rtol=1e-5)
