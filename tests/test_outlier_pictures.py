"""Outlier-aware pictures: the robust colour range, the clipped cells it outlines, the outlier
tokens it leaves out (the Tokens page's rule), and the app's pages on a random ViT with planted
artifact tokens (``tests/planted.py``). The same on real weights: ``tests/test_real_pictures.py``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from streamlit.testing.v1 import AppTest

import analysis
from analysis import (
    attention_map,
    attention_rollout,
    capture_attention,
    capture_tokens,
    high_norm_tokens,
    masked_image,
    outlier_patches,
    token_norms,
)
from analysis.plots import (
    ROBUST_QUANTILE,
    UNIFORM_FLOOR,
    attention_overlay,
    clipped_cells,
    colour_range,
    layer_scaled,
    map_panels,
    robust_top,
)
from analysis.tokens import dominated_by_outliers, outlier_share
from conftest import make_vit
from planted import PLANTED, plant_artifacts

REPO = Path(__file__).resolve().parent.parent


def reference_quantile(values, q):
    """The linear-interpolation quantile, written out: sorted ``v``, ``p = q·(n−1)``."""
    ordered = sorted(float(v) for v in values)
    position = q * (len(ordered) - 1)
    below = int(position // 1)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (position - below) * (ordered[above] - ordered[below])


@pytest.mark.parametrize("shape", [(7, 9), (3, 4, 5), (1, 1), (37, 37)])
def test_robust_top_is_the_quantile_of_the_cells_that_are_not_left_out(shape):
    rng = np.random.default_rng(sum(shape))
    maps = rng.exponential(size=shape).astype(np.float32)
    cells = shape[-2] * shape[-1]
    left_out = sorted(rng.choice(cells, size=min(3, cells - 1), replace=False).tolist()) if cells > 1 else []
    kept = []
    for index in np.ndindex(*shape):
        flat = index[-2] * shape[-1] + index[-1]
        if flat not in left_out:
            kept.append(maps[index])
    assert robust_top(maps, left_out=left_out) == pytest.approx(reference_quantile(kept, ROBUST_QUANTILE), rel=1e-6)
    assert robust_top(maps) == pytest.approx(reference_quantile(maps.ravel(), ROBUST_QUANTILE), rel=1e-6)


def test_nan_cells_and_an_all_left_out_map():
    values = np.array([[np.nan, 1.0], [2.0, 3.0]])
    assert robust_top(values) == pytest.approx(reference_quantile([1.0, 2.0, 3.0], ROBUST_QUANTILE))
    assert robust_top(values, left_out=[0, 1, 2, 3]) == pytest.approx(reference_quantile([1, 2, 3], ROBUST_QUANTILE))


def test_the_robust_range_clips_a_few_outliers_and_says_so():
    uniform = 1 / 1001  # the floor, 4× uniform, lies below the object's level
    shown = np.full((10, 10), 0.004, np.float32)
    shown[2:5, 3:7] = 0.02  # the object: 12 cells
    shown[0, 0], shown[9, 9] = 0.5, 0.3  # two outlier cells
    lo, hi, label = colour_range("robust", shown, uniform=uniform, left_out=[0, 99])
    assert lo == 0 and hi == pytest.approx(max(0.02, UNIFORM_FLOOR * uniform))
    assert "top without 2 outlier tokens" in label and "2 cells above (max 0.5)" in label
    assert (shown > 0.1 * hi).mean() >= 0.12  # the object fills the scale, not the outliers
    _, hi_zero, label_zero = colour_range("zero", shown, uniform=uniform)
    assert hi_zero == pytest.approx(0.5) and "above" not in label_zero
    _, hi_minmax, label_minmax = colour_range("minmax", shown)
    assert hi_minmax == pytest.approx(0.5) and "above" not in label_minmax
    # without the detected outliers, the quantile of all 100 cells still sits among the object's
    _, hi_all, label_all = colour_range("robust", shown, uniform=uniform)
    assert hi_all == pytest.approx(reference_quantile(shown.ravel(), ROBUST_QUANTILE))
    assert "outlier" not in label_all and "1 cell above" in label_all
    # a near-uniform map: the floor, never a stretched flat map; a sharp map: never above its maximum
    flat = np.full((4, 4), 1 / 17, np.float32)
    assert colour_range("robust", flat, uniform=1 / 17)[1] == pytest.approx(UNIFORM_FLOOR / 17)
    sharp = np.zeros((4, 4), np.float32)
    sharp[1, 1] = 0.9
    assert colour_range("robust", sharp)[1] <= 0.9


def test_clipped_cells_are_outlined_one_closed_square_each():
    shown = np.zeros((3, 4), np.float32)
    shown[0, 1], shown[2, 3] = 5.0, 7.0
    assert clipped_cells(shown, 1.0).tolist() == [1, 11]
    figure = attention_overlay(np.zeros((30, 40, 3), np.uint8), (30, 40), shown, (10, 10), zmin=0, zmax=1.0)
    (outline,) = [t for t in figure.data if t.name == "2 above the colour range"]
    xs, ys = list(outline.x), list(outline.y)
    assert xs.count(None) == 2
    squares = [(xs[i : i + 5], ys[i : i + 5]) for i in (0, 6)]
    for (sx, sy), (row, col) in zip(squares, [(0, 1), (2, 3)]):
        assert sorted(set(sx)) == [col * 10, col * 10 + 10] and sorted(set(sy)) == [row * 10, row * 10 + 10]
        assert (sx[0], sy[0]) == (sx[-1], sy[-1])  # closed
    unclipped = attention_overlay(np.zeros((30, 40, 3), np.uint8), (30, 40), shown, (10, 10), zmin=0, zmax=7.0)
    assert not [t for t in unclipped.data if "above the colour range" in (t.name or "")]


def _cell_edges(layer: dict, row: int, col: int) -> tuple[list[float], list[float]]:
    """Cell (row, col)'s edges from a plotly trace's own placement: a heatmap's cell c is centred at
    x0 + c·dx, so spans x0 + (c − ½)·dx .. x0 + (c + ½)·dx; an image layer's pixel p likewise. Returns
    ([left, right], [top, bottom])."""
    x0, dx, y0, dy = (float(layer[key]) for key in ("x0", "dx", "y0", "dy"))
    return [x0 + (col - 0.5) * dx, x0 + (col + 0.5) * dx], [y0 + (row - 0.5) * dy, y0 + (row + 0.5) * dy]


def _outline_corners(trace) -> tuple[list, list]:
    """The one closed square of an outline trace: its five path points, without the None separator."""
    xs, ys = list(trace["x"]), list(trace["y"])
    assert xs[5:] == [None] and ys[5:] == [None] and (xs[0], ys[0]) == (xs[4], ys[4])
    return xs[:5], ys[:5]


def test_the_outline_of_a_clipped_cell_is_that_cells_edges_in_the_figure():
    """One clipped cell (row 2, col 1) of a 3 × 4 map of 8 × 12-pixel cells: its outline's corners
    are the cell's edges as the heatmap places it (x0, dx, y0, dy), the same for the bilinear PNG
    layer (one 1-pixel cell per input pixel: the cell spans its 8 × 12 pixels) and in map_panels."""
    row, col, (ph, pw) = 2, 1, (8, 12)
    shown = np.zeros((3, 4), np.float32)
    shown[row, col] = 5.0
    background = np.zeros((3 * ph, 4 * pw, 3), np.uint8)

    def check(figure, layer: dict, cell: tuple[int, int, int, int]):
        """cell = (first pixel row, last pixel row, first pixel col, last pixel col) in layer's units."""
        (outline,) = [t for t in figure.to_dict()["data"] if t.get("name") == "1 above the colour range"]
        xs, ys = _outline_corners(outline)
        (left, _), (top, _) = _cell_edges(layer, cell[0], cell[2])
        (_, right), (_, bottom) = _cell_edges(layer, cell[1], cell[3])
        assert xs == [left, right, right, left, left]
        assert ys == [top, top, bottom, bottom, top]

    figure = attention_overlay(background, (3 * ph, 4 * pw), shown, (ph, pw), zmin=0, zmax=1.0)
    (heatmap,) = [t for t in figure.to_dict()["data"] if t["type"] == "heatmap"]
    assert (heatmap["x0"], heatmap["dx"], heatmap["y0"], heatmap["dy"]) == (pw / 2, pw, ph / 2, ph)
    check(figure, heatmap, (row, row, col, col))
    assert _cell_edges(heatmap, row, col) == ([12.0, 24.0], [16.0, 24.0])  # (c·pw, (c+1)·pw), (r·ph, (r+1)·ph)

    smooth = np.kron(shown, np.ones((ph, pw), np.float32))  # (24, 48): the same map at input pixels
    figure = attention_overlay(background, (3 * ph, 4 * pw), shown, (ph, pw), zmin=0, zmax=1.0, upsampled=smooth)
    (png,) = [t for t in figure.to_dict()["data"] if t.get("name") == "attention (bilinear)"]
    check(figure, png, (row * ph, (row + 1) * ph - 1, col * pw, (col + 1) * pw - 1))

    panels = map_panels(background, (3 * ph, 4 * pw), [shown], (ph, pw), ["one"], zmin=0, zmax=1.0)
    (heatmap,) = [t for t in panels.to_dict()["data"] if t["type"] == "heatmap"]
    check(panels, heatmap, (row, row, col, col))


def test_layer_scaled_robust_and_masked_image_top():
    maps = np.random.default_rng(1).random((2, 3, 4, 5)).astype(np.float32)
    maps[0, :, 0, 0] = 50.0
    scaled, tops = layer_scaled(maps, robust=True, left_out=[0])
    assert tops[0] == pytest.approx(
        reference_quantile(maps[0].reshape(3, -1)[:, 1:].ravel(), ROBUST_QUANTILE), rel=1e-6
    )
    np.testing.assert_allclose(scaled[0], maps[0] / tops[0], rtol=1e-6)
    image = np.full((8, 10, 3), 200, np.uint8)
    mask = np.array([[1.0, 0.5], [0.25, 100.0]])
    shown = masked_image(image, mask, "nearest", top=1.0)
    assert shown[0, 0, 0] == 200 and shown[0, 9, 0] == 100 and shown[7, 0, 0] == 50 and shown[7, 9, 0] == 200
    assert masked_image(image, mask, "nearest")[0, 0, 0] == 2  # the paper's rule: / max


# --------------------------------------------------------------------------- a ViT with planted artifacts


@pytest.fixture(scope="module")
def planted():
    vit = make_vit("class_token", img_size=160)  # a 10 × 10 grid
    return vit, plant_artifacts(vit, pull=1.0)


def test_planted_tokens_are_found_by_the_tokens_rule_and_dominate_the_maps(planted):
    clean, vit = planted
    pixels = torch.randn(2, 3, 160, 160, generator=torch.Generator().manual_seed(3))
    found = high_norm_tokens(token_norms(capture_tokens(vit, pixels)), vit.spec.num_prefix_tokens)
    assert outlier_patches(found, 0) == list(PLANTED) == outlier_patches(found, 1)
    clean_found = high_norm_tokens(token_norms(capture_tokens(clean, pixels)), clean.spec.num_prefix_tokens)
    assert outlier_patches(clean_found) == []
    record = capture_attention(vit, pixels)
    last = attention_map(record, vit.spec.num_layers - 1)[0].numpy()
    rollout = attention_rollout(record)[0].numpy()
    for shown in (last, rollout):
        assert dominated_by_outliers(shown, PLANTED) and outlier_share(shown, PLANTED) > 0.5
        uniform = 1 / vit.spec.num_tokens
        _, hi_zero, _ = colour_range("zero", shown, uniform=uniform)
        lo, hi, label = colour_range("robust", shown, uniform=uniform, left_out=list(PLANTED))
        others = np.delete(shown.ravel(), list(PLANTED))
        assert hi == pytest.approx(max(reference_quantile(others, ROBUST_QUANTILE), UNIFORM_FLOOR * uniform), rel=1e-6)
        assert hi < 0.2 * hi_zero  # the outliers no longer set the top ...
        assert f"{len(PLANTED)} cells above" in label  # ... they are clipped, counted and outlined
    clean_last = attention_map(capture_attention(clean, pixels), clean.spec.num_layers - 1)[0].numpy()
    assert not dominated_by_outliers(clean_last, [])


def test_outlier_patches_refuses_a_windowed_models_stage_grids():
    found = analysis.tokens.HighNormTokens(
        thresholds=torch.zeros(2),
        mask=(torch.zeros(1, 4, dtype=torch.bool),),
        fraction=torch.zeros(2),
        first_layer=None,
    )
    with pytest.raises(analysis.AnalysisError, match="windowed"):
        outlier_patches(found)


@pytest.fixture(scope="module")
def planted_folder(planted, tmp_path_factory):
    """The planted model as a timm folder the app loads (config.json + model.safetensors)."""
    from safetensors.torch import save_file

    _, vit = planted
    folder = tmp_path_factory.mktemp("planted_vit")
    save_file({k: v.contiguous() for k, v in vit.model.state_dict().items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(
        json.dumps(
            {
                "architecture": "vit_tiny_patch16_224",
                "num_classes": vit.model.num_classes,
                "model_args": {"img_size": 160, "depth": vit.spec.num_layers},
            }
        )
    )
    return folder


def test_the_attention_and_rollout_pages_leave_planted_outliers_out(planted_folder):
    from analysis.plots.layout import plain_label
    from tests.test_app import array

    app = AppTest.from_file(str(REPO / "vizapp" / "app.py"), default_timeout=120)
    app.run()
    app.radio(key="model_source").set_value("local").run()
    app.text_input(key="model_path").input(str(planted_folder)).run()
    assert not app.exception, [e.value for e in app.exception]
    cur = app.session_state["current"]
    assert cur.outliers == PLANTED
    notices = [i.value for i in app.info if "outlier tokens dominate" in i.value]
    assert notices and all(f"patch {PLANTED[0]} (row 0, col 0)" in n for n in notices)

    def overlay(key):
        (chart,) = [json.loads(c.proto.spec) for c in app.get("plotly_chart") if c.proto.id.endswith(key)]
        (heatmap,) = [t for t in chart["data"] if t.get("type") == "heatmap"]
        outlines = [t for t in chart["data"] if t.get("name", "").endswith("above the colour range")]
        title = plain_label(heatmap["colorbar"]["title"]["text"])  # a long title is wrapped to the bar
        return array(heatmap["z"]).astype(np.float64), heatmap["zmax"], title, outlines

    z, zmax, title, outlines = overlay("attn_overlay")
    assert zmax == pytest.approx(colour_range("robust", z, uniform=1 / cur.spec.num_tokens, left_out=PLANTED)[1])
    assert zmax < 0.2 * np.nanmax(z) and "top without 3 outlier tokens" in title and len(outlines) == 1
    app.checkbox(key="hide_outliers").check().run()
    z_hidden, *_ = overlay("attn_overlay")
    assert np.isnan(z_hidden.ravel()[list(PLANTED)]).all() and np.isfinite(np.delete(z_hidden.ravel(), PLANTED)).all()
    app.checkbox(key="hide_outliers").uncheck().run()

    app.switch_page("views/rollout/rollout.py").run()
    assert not app.exception, [e.value for e in app.exception]
    z, zmax, title, outlines = overlay("rollout_overlay")
    assert "top without 3 outlier tokens" in title and zmax < 0.5 * np.nanmax(z)
    assert any("outlier tokens dominate this rollout" in i.value for i in app.info)

    app.switch_page("views/explain/explain.py").run()  # the attention-based explanations sink into them too
    assert not app.exception, [e.value for e in app.exception]
    assert any(re.search(r"outlier tokens dominate the .+ map", i.value) for i in app.info)

    app.switch_page("views/compare/compare.py").run()
    assert not app.exception, [e.value for e in app.exception]
    assert any(re.search(r"outlier tokens dominate layer \d+'s map", i.value) for i in app.info)
    (chart,) = [json.loads(c.proto.spec) for c in app.get("plotly_chart") if c.proto.id.endswith("cmp_panels")]
    assert "top without 3 outlier tokens" in plain_label(chart["layout"]["coloraxis"]["colorbar"]["title"]["text"])


def test_the_largest_cell_of_a_flat_map_raises_no_alert():
    """On a flat map (a first layer's) the largest cell can be an outlier token's by chance: four
    outlier cells holding 2% of the mass, one of them 1% above the rest, raised "4 outlier tokens
    dominate this map … hold 4% of its mass". Now it takes a quarter of the mass, or a largest cell
    at STANDOUT_RATIO times the other cells' 99th percentile (numpy's rule, computed here)."""
    from analysis.tokens import STANDOUT_RATIO

    rng = np.random.default_rng(0)
    flat = 1 / 197 + rng.uniform(-1e-4, 1e-4, 196)
    cells = [5, 60, 100, 150]
    flat[5] = flat.max() * 1.01
    assert outlier_share(flat, cells) < 0.05 and not dominated_by_outliers(flat, cells)
    others = np.delete(flat, cells)
    standing_out = flat.copy()
    standing_out[5] = STANDOUT_RATIO * np.quantile(others, 0.99) * 1.001
    assert outlier_share(standing_out, cells) < 0.25 and dominated_by_outliers(standing_out, cells)
    standing_out[5] = STANDOUT_RATIO * np.quantile(others, 0.99) * 0.999
    assert not dominated_by_outliers(standing_out, cells)
    majority = flat.copy()
    majority[cells] = 0.1
    assert dominated_by_outliers(majority, cells)
