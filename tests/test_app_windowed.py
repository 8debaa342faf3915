"""The app on windowed models (issue 23): a random Swin v1, Swin v2 and SAM at small inputs.

Every page opens each of them without an exception. The Attention page draws each layer's
map on its own stage grid, with the query's window outlined: the outline is checked against
the window arithmetic written out here as loops (the cyclic shift as modular index
arithmetic, padding as cells past the grid), never against :meth:`LayerGeometry.window_cells`.
Maps, thumbnails, distances and position biases are compared numerically with direct calls
to ``analysis`` on the very model instance the app uses (Streamlit's resource cache is
process-wide and AppTest runs the app in this process).
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from streamlit.testing.v1 import AppTest  # noqa: E402

import analysis  # noqa: E402
from analysis.model.geometry import LayerGeometry  # noqa: E402
from analysis.plots.layout import plain_label  # noqa: E402
from model_folders import NARROW_SWIN, model_folder  # noqa: E402
from tests.test_app import (  # noqa: E402
    APP,
    array,
    assert_clean,
    chart,
    first_sample,
    mosaic_tiles,
    npz_downloads,  # noqa: F401 - a fixture
    overlay_map,
    reproduce,
    tiles_of,
    traces,
)
from vizapp import layer_grids  # noqa: E402

TIMEOUT = 180
# family -> (timm name, input side in px, model_args). Each family's own stages, windows, shifts and
# global blocks at a small input, with narrow, shallow blocks: the same layouts at a fraction of the
# cost on two cores (written once per process as a folder with random weights, opened by its path).
SWIN = ("swin_tiny_patch4_window7_224", 112, NARROW_SWIN)
# ^ 28x28 -> 14 -> 7 -> 4 cells, 7x7 windows, shift 3 on stages 0-1
SWIN_V2 = ("swinv2_tiny_window8_256", 128, NARROW_SWIN)
# ^ 32x32 -> 16 -> 8 -> 4 cells, 8x8 windows
SAM = ("samvit_base_patch16", 128, dict(embed_dim=64, depth=6, num_heads=2, global_attn_indexes=(2, 5)))
# ^ one 8x8 grid: 14x14 windows padded, and global blocks
FAMILIES = {"swin": SWIN, "swinv2": SWIN_V2, "sam": SAM}
# The demo ViT beside them, for the tests written once for every layout (one token sequence, windows)
LAYOUTS = {"vit": ("demo", 48, None), **FAMILIES}
# Also opened on every page: timm's swinv2_cr (its own window module). torchvision's Swin-T (converted at
# the boundary into timm's Swin, at its own 224 px, random weights by name) opens on the Attention page
OTHER_FAMILIES = {
    "swinv2_cr": ("swinv2_cr_tiny_ns_224", 128, NARROW_SWIN),
    "torchvision_swin": ("torchvision:swin_t", 224, None),
}
PAGES = ("attention", "rollout", "explain", "compare", "tokens", "robustness", "position", "filters", "distance")


def model_source(family: str) -> str:
    """What the app opens for ``family``: a folder named after its timm architecture (its small
    ``model_args``, random weights), or the name itself for a model built by name."""
    name, side, model_args = {**LAYOUTS, **OTHER_FAMILIES}[family]
    return name if model_args is None else model_folder(name, img_size=side, **model_args)


def model_ref(family: str):
    from vizapp.refs import ModelRef

    source, side = model_source(family), {**LAYOUTS, **OTHER_FAMILIES}[family][1]
    return ModelRef(source, pretrained=source != "torchvision:swin_t", img_size=side)


def loaded(family: str) -> analysis.LoadedViT:
    """The model instance the app holds for ``family``."""
    from vizapp.resources import get_model

    return get_model(model_ref(family))


def open_app(family: str, **params) -> AppTest:
    ref = model_ref(family)
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(model=("" if ref.pretrained else "random:") + ref.source, res=str(ref.img_size), **params)
    at.run()
    assert_clean(at)
    assert at.session_state["current"].spec.is_windowed == (family in FAMILIES or family in OTHER_FAMILIES)
    return at


def record_of(vit) -> analysis.records.windowed.WindowedAttentionRecord:
    return analysis.capture_attention(vit, vit.preprocess(analysis.load_image(first_sample())))


def chart_keys(at: AppTest) -> list[str]:
    return [c.proto.id for c in at.get("plotly_chart")]


# --------------------------------------------------------------------------- window outline


def hand_window_cells(grid, window, shift, a: int, b: int) -> set[tuple[int, int]]:
    """The (row, col) cells of window (a, b), written out: slot (i, j) of the rolled, padded
    grid holds cell ((a·wh + i + sh) mod gh, (b·ww + j + sw) mod gw), or padding past the grid."""
    (gh, gw), (wh, ww), (sh, sw) = grid, window, shift
    cells = set()
    for i in range(wh):
        for j in range(ww):
            y, x = a * wh + i, b * ww + j
            if y < gh and x < gw:
                cells.add(((y + sh) % gh, (x + sw) % gw))
    return cells


def covered(rectangles, stride) -> list[tuple[int, int]]:
    """Every cell a list of pixel rectangles covers, with repeats (overlaps would repeat)."""
    sy, sx = stride
    return [
        (r, c) for x0, y0, x1, y1 in rectangles for r in range(y0 // sy, y1 // sy) for c in range(x0 // sx, x1 // sx)
    ]


@pytest.mark.parametrize(
    "grid, window, shift",
    [
        ((8, 8), (4, 4), (2, 2)),  # the last window row and column wrap around: 4 pieces
        ((8, 8), (4, 4), (0, 0)),  # no shift: one rectangle per window
        ((7, 10), (4, 4), (2, 2)),  # padding: windows at the bottom and right hold fewer cells
        ((6, 9), (3, 3), (1, 0)),  # a shift along rows only
    ],
)
def test_the_window_outline_is_the_window_arithmetic(grid, window, shift):
    stride = (8, 4)
    geometry = LayerGeometry(stage=0, grid_size=grid, stride=stride, window_size=window, shift=shift, num_heads=1)
    rows, cols = -(-grid[0] // window[0]), -(-grid[1] // window[1])
    for a in range(rows):
        for b in range(cols):
            expected = hand_window_cells(grid, window, shift, a, b)
            for r, c in expected:
                rectangles = layer_grids.window_rectangles(geometry, r * grid[1] + c)
                cells = covered(rectangles, stride)
                assert sorted(cells) == sorted(expected), (a, b, rectangles)  # the window, each cell once
    if shift == (2, 2) and grid == (8, 8):  # the corner window: rows 6,7,0,1 x cols 6,7,0,1
        assert sorted(layer_grids.window_rectangles(geometry, 0)) == sorted(
            [
                (0, 0, 2 * 4, 2 * 8),
                (6 * 4, 0, 8 * 4, 2 * 8),
                (0, 6 * 8, 2 * 4, 8 * 8),
                (6 * 4, 6 * 8, 8 * 4, 8 * 8),
            ]
        )


def test_a_click_on_any_layer_grid_queries_that_cell_on_that_layer():
    spec = loaded("swin").spec
    for layer in range(spec.num_layers):
        geometry = spec.geometry(layer)
        for cell in range(geometry.grid_size[0] * geometry.grid_size[1]):
            patch = layer_grids.layer_cell_to_query_patch(spec, geometry, cell)
            assert geometry.cell_of_pixel(*spec.patch_centre(patch)) == cell


# --------------------------------------------------------------------------- every page, every family


@pytest.mark.parametrize("family", sorted(FAMILIES) + ["swinv2_cr"])
def test_every_page_opens_a_windowed_model(family):
    at = open_app(family)
    vit = loaded(family)
    spec = vit.spec
    stages = layer_grids.stage_layers(spec)
    sidebar = " ".join(m.value for m in at.sidebar.markdown)
    assert "windowed attention" in sidebar and spec.family in sidebar
    for page in PAGES:
        at.switch_page(f"views/{page}/{page}.py").run()
        assert_clean(at)
        assert not at.error, (page, [e.value for e in at.error])
        keys = chart_keys(at)
        if page == "attention":
            assert any(k.endswith("-attn_overlay") for k in keys)
            mosaics = sum("-attn_grid_s" in k or k.endswith("-attn_grid") for k in keys)
            assert mosaics == len(stages)  # one thumbnail mosaic per stage
        elif page == "rollout":
            assert any(k.endswith("-rollout_overlay") for k in keys) and any(k.endswith("-rollout_strip") for k in keys)
        elif page == "explain":
            assert any(k.endswith("-explain_panels") for k in keys)
        elif page == "tokens":
            assert all(any(k.endswith(f"-{key}") for k in keys) for key in ("tok_pca", "tok_similarity", "tok_norms"))
        elif page == "robustness":  # SAM's image encoder has no class head: nothing to perturb, said so
            assert any(k.endswith("-rob_maps") for k in keys) if spec.has_classifier else at.info
        elif page == "position":
            zero = any("all zero" in i.value for i in at.info)  # a random SAM's tables: said, not drawn
            assert any(k.endswith(("-pos_bias", "-pos_table_rows")) for k in keys) or zero, keys
        elif page == "filters":
            assert any(k.endswith("-filt_grid") for k in keys), keys
        elif page == "distance":
            scatter = chart(at, "dist_scatter")
            (reference,) = [t for t in scatter["data"] if "uniform in each layer" in t.get("name", "")]
            steps = array(reference["y"])
            np.testing.assert_allclose(
                steps[np.isfinite(steps)][::2], analysis.uniform_attention_distance_by_layer(spec).numpy(), rtol=1e-6
            )
        elif page == "compare":
            assert any(k.endswith("-cmp_panels") for k in keys)


# --------------------------------------------------------------------------- the Attention page


def test_the_attention_page_outlines_the_query_window_and_draws_its_map():
    """Swin v1, layer 1 (shifted by 3 cells), the query at the image's top-left cell: its
    window wraps around both borders, so the outline is 4 rectangles and the map is zero
    outside them."""
    at = open_app("swin")
    vit = loaded("swin")
    spec = vit.spec
    record = record_of(vit)
    at.radio(key="attn_stage").set_value(0).run()
    at.slider(key="layer").set_value(1).run()
    at.radio(key="query_mode").set_value("patch").run()
    at.number_input(key="query_patch").set_value(0).run()
    assert_clean(at)
    geometry = spec.geometry(1)
    assert geometry.shift == (3, 3) and geometry.grid_size == (28, 28)
    overlay = chart(at, "attn_overlay")
    shown = overlay_map(overlay)
    (heatmap,) = traces(overlay, "heatmap")
    assert (heatmap["dx"], heatmap["dy"]) == (4, 4)  # cells of this layer's stride
    np.testing.assert_allclose(
        shown, analysis.attention_map(record, 1, head=None, query=(2, 2))[0].numpy(), rtol=1e-5, atol=1e-7
    )
    outline = [s for s in overlay["layout"]["shapes"] if s.get("name") == layer_grids.WINDOW_SHAPE_NAME]
    # cell (0, 0) sits in the last rolled window: rows and columns 24..27 and 0..2
    expected_cells = hand_window_cells((28, 28), (7, 7), (3, 3), 3, 3)
    assert (0, 0) in expected_cells
    rectangles = [(int(s["x0"]), int(s["y0"]), int(s["x1"]), int(s["y1"])) for s in outline]
    assert len(rectangles) == 4
    assert sorted(covered(rectangles, (4, 4))) == sorted(expected_cells)
    inside = np.zeros((28, 28), bool)
    for r, c in expected_cells:
        inside[r, c] = True
    assert np.all(shown[~inside] == 0) and shown[inside].sum() > 0.99

    # another stage: the layer slider moves within it, the map is on its grid
    at.radio(key="attn_stage").set_value(1).run()
    assert_clean(at)
    layer = at.slider(key="layer").value
    assert layer in layer_grids.stage_layers(spec)[1]
    overlay = chart(at, "attn_overlay")
    assert overlay_map(overlay).shape == spec.geometry(layer).grid_size == (14, 14)
    assert traces(overlay, "heatmap")[0]["dx"] == 8


def test_the_thumbnails_hold_every_layer_and_head_of_each_stage():
    at = open_app("swin")
    vit = loaded("swin")
    spec = vit.spec
    record = record_of(vit)
    at.radio(key="query_mode").set_value("patch").run()
    at.number_input(key="query_patch").set_value(5 * 28 + 9).run()
    at.radio(key="thumb_scale").set_value("shared").run()
    assert_clean(at)
    query = spec.patch_centre(5 * 28 + 9)
    for stage, layers in layer_grids.stage_layers(spec).items():
        geometry = spec.geometry(layers[0])
        heads = geometry.num_heads
        tiles = mosaic_tiles(chart(at, f"attn_grid_s{stage}"), geometry.grid_size)  # rows of many heads wrap
        assert len(tiles) == len(layers) * (heads + 1)
        for row, layer in enumerate(layers):
            for head in (0, heads - 1, None):
                column = heads if head is None else head
                expected = analysis.attention_map(record, layer, head=head, query=query)[0].numpy()
                np.testing.assert_allclose(tiles[row * (heads + 1) + column], expected, rtol=1e-5, atol=1e-7)


def test_the_thumbnails_layer_scale_reads_each_layers_top_inside_the_query_window():
    """The default thumbnail scale ("one scale per layer", robust range): each layer's maps divided by
    the 99th percentile of its heads' cells inside the query's window (at least 1.5× uniform, 1/Wt);
    the cells outside the window are 0 and do not count (over the whole 28×28 grid the percentile
    would be about 0 and every tile saturated)."""
    at = open_app("swin")
    vit = loaded("swin")
    spec = vit.spec
    record = record_of(vit)
    at.radio(key="query_mode").set_value("patch").run()
    at.number_input(key="query_patch").set_value(0).run()
    assert_clean(at)
    assert at.radio(key="thumb_scale").value == "layer" and at.session_state["current"].map_range == "robust"
    geometry = spec.geometry(0)
    heads = geometry.num_heads
    tiles = mosaic_tiles(chart(at, "attn_grid_s0"), geometry.grid_size)
    windows = {
        0: hand_window_cells((28, 28), (7, 7), (0, 0), 0, 0),
        1: hand_window_cells((28, 28), (7, 7), (3, 3), 3, 3),
    }
    for layer, cells in windows.items():
        assert (0, 0) in cells
        maps = np.stack(
            [analysis.attention_map(record, layer, head=h, query=(2, 2))[0].numpy() for h in [*range(heads), None]]
        )  # (heads + 1, 28, 28)
        in_window = np.array([maps[:, r, c] for r, c in sorted(cells)]).ravel()
        top = max(np.quantile(in_window.astype(np.float64), 0.99), 1.5 / 49)
        for column in range(heads + 1):
            np.testing.assert_allclose(tiles[layer * (heads + 1) + column], maps[column] / top, rtol=1e-4, atol=1e-6)


def test_the_attention_page_reproduces_in_python_for_a_swin(npz_downloads, monkeypatch):  # noqa: F811
    at = open_app("swin")
    vit = loaded("swin")
    at.radio(key="attn_stage").set_value(1).run()
    at.slider(key="layer").set_value(3).run()
    at.selectbox(key="head").set_value(4).run()
    at.radio(key="query_mode").set_value("patch").run()
    at.number_input(key="query_patch").set_value(27).run()
    assert_clean(at)
    calls = []

    def same_model(source, **kwargs):  # random weights: the script gets the app's own instance
        calls.append((source, kwargs))
        return vit

    monkeypatch.setattr(analysis, "load_vit", same_model)
    script = reproduce(at)
    assert calls == [(model_source("swin"), {"img_size": SWIN[1]})]
    npz = npz_downloads["attn_overlay_data"]
    assert script["attention"].shape == (14, 14)
    np.testing.assert_allclose(script["attention"], npz["attention"], rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- the other pages


def test_compare_puts_a_swin_beside_a_vit_at_the_same_image_position():
    at = open_app("swin")
    at.switch_page("views/compare/compare.py").run()
    at.multiselect(key="cmp_layers").set_value([1, 7]).run()  # stages 0 and 3
    at.radio(key="query_mode").set_value("patch").run()
    at.number_input(key="query_patch").set_value(0).run()
    at.selectbox(key="cmp_model2").set_value("other").run()
    at.text_input(key="cmp_model2_other").set_value("random:vit_tiny_patch16_224").run()
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    spec = loaded("swin").spec
    panels = chart(at, "cmp_panels")
    heatmaps = traces(panels, "heatmap")
    assert [array(h["z"]).shape for h in heatmaps] == [(28, 28), (4, 4), (14, 14), (14, 14)]
    assert [h["dx"] for h in heatmaps] == [4, 28, 16, 16]
    query = spec.patch_centre(0)
    record = record_of(loaded("swin"))
    np.testing.assert_allclose(
        array(heatmaps[0]["z"]), analysis.attention_map(record, 1, query=query)[0].numpy(), rtol=1e-5, atol=1e-7
    )
    # the ViT's query: the patch at the same image position (its top-left patch)
    rects = [s for s in panels["layout"]["shapes"] if s["type"] == "rect"]
    assert any(s["x0"] == 0 and s["y0"] == 0 and s["x1"] == 16 and s["y1"] == 16 for s in rects)


def test_distance_puts_a_swin_beside_a_vit_in_pixels():
    at = open_app("swin")
    vit = loaded("swin")
    at.switch_page("views/distance/distance.py").run()
    assert list(at.radio(key="dist_unit").options) == ["input pixels", "fraction of image side"]  # no one patch side
    at.selectbox(key="dist_model2").set_value("other").run()
    at.text_input(key="dist_model2_other").set_value("random:vit_tiny_patch16_224").run()
    assert_clean(at)
    scatter = chart(at, "dist_scatter")
    names = [t["name"] for t in scatter["data"]]
    swin_series = scatter["data"][0]
    expected = analysis.mean_attention_distance(record_of(vit)).numpy()  # (L, max heads), NaN past a layer's heads
    values = array(swin_series["y"])
    np.testing.assert_allclose(values[np.isfinite(values)], expected[np.isfinite(expected)], rtol=1e-4)
    assert any("vit_tiny_patch16_224" in n for n in names), names
    second = analysis.load_vit("vit_tiny_patch16_224", pretrained=False)
    lines = [shape["y0"] for shape in scatter["layout"]["shapes"]]
    assert lines == pytest.approx([analysis.uniform_attention_distance(second.spec)], rel=1e-6)  # the ViT's line
    assert any("uniform in each layer's window" in n for n in names)  # the Swin's steps


@pytest.mark.parametrize("family", ["swin", "swinv2", "sam"])
def test_the_position_page_draws_the_relative_position_bias(family, npz_downloads):  # noqa: F811
    at = open_app(family)
    vit = loaded(family)
    at.switch_page("views/position/position.py").run()
    at.selectbox(key="pos_bias_layer").set_value(2).run()
    assert_clean(at)
    text = " ".join(c.value for c in at.caption)
    if family == "sam":  # timm starts every position table of SAM at zero: the page says so, draws nothing
        info = " ".join(i.value for i in at.info)
        assert "Layer 2's two relative-position tables (rows and columns) are all zero" in info
        assert re.search(r"The position table of \S*samvit\S* is all zero", info), info
        assert not any(k.endswith(("-pos_table_rows", "-pos_table_columns", "-pos_mosaic")) for k in chart_keys(at))
        assert "issue" not in info and "position_embedding_similarity" not in info
        return
    bias = analysis.relative_position_bias(vit, 2).numpy()  # (heads, 2M − 1, 2M − 1)
    heads = bias.shape[0]
    (heatmap,) = traces(chart(at, "pos_bias"), "heatmap")
    tiles = tiles_of(array(heatmap["z"]), bias.shape[1:], min(heads, 6), heads)
    np.testing.assert_allclose(tiles, bias, rtol=1e-6)
    assert "Figure 7 (centre)" in text
    np.testing.assert_array_equal(npz_downloads["pos_bias_data"]["bias"], bias)


@pytest.fixture
def trained_looking_sam():
    """The app's random SAM with its position tables drawn (std 0.5; timm starts them at zero),
    restored afterwards; the page's caches of them are cleared both times."""
    from vizapp.views.position import compute

    vit = loaded("sam")
    saved = {
        n: p.detach().clone()
        for n, p in vit.model.named_parameters()
        if n.endswith(("rel_pos_h", "rel_pos_w", "pos_embed"))
    }
    generator = torch.Generator().manual_seed(5)

    def clear():
        compute.decomposed_position.clear()
        compute.position_similarity.clear()

    with torch.no_grad():
        for name, parameter in vit.model.named_parameters():
            if name in saved:
                parameter.copy_(0.5 * torch.randn(parameter.shape, generator=generator))
    clear()
    yield vit
    with torch.no_grad():
        for name, parameter in vit.model.named_parameters():
            if name in saved:
                parameter.copy_(saved[name])
    clear()


def test_sams_position_page_draws_its_tables_and_its_absolute_table(trained_looking_sam, npz_downloads):  # noqa: F811
    vit = trained_looking_sam
    at = open_app("sam")
    at.switch_page("views/position/position.py").run()
    at.selectbox(key="pos_bias_layer").set_value(2).run()
    assert_clean(at)
    rows, cols = analysis.decomposed_relative_position(vit, 2)
    (heatmap,) = traces(chart(at, "pos_table_rows"), "heatmap")
    np.testing.assert_allclose(array(heatmap["z"]), rows.numpy().T, rtol=1e-6)
    assert "decomposes" in " ".join(c.value for c in at.caption)
    # the absolute table, as a ViT's: one tile per patch, its cosine similarity to every patch
    similarity = analysis.position_embedding_similarity(vit).numpy()
    gh, gw = similarity.shape[:2]
    (mosaic,) = traces(chart(at, "pos_mosaic"), "heatmap")
    tiles = tiles_of(array(mosaic["z"]), (gh, gw), gw, gh * gw)
    np.testing.assert_allclose(tiles.reshape(similarity.shape), similarity, rtol=1e-5, atol=1e-6)
    assert not at.info and "Absolute position table" in [h.value for h in at.subheader]


@pytest.mark.parametrize(
    "page, module, resource",
    [
        ("rollout", "vizapp.resources", "rollout_by_layer"),
        ("explain", "vizapp.views.explain.compute", "explanation"),
        ("tokens", "vizapp.resources", "layer_tokens"),
        ("robustness", "vizapp.views.robustness.compute", "vit_probe"),
    ],
)
def test_a_refused_analysis_is_shown_as_its_reason(page, module, resource, monkeypatch):
    """Where the library refuses a windowed model (typed AnalysisError), the page says why as
    information and the run ends cleanly: no traceback, the URL still published. ``module``: where
    the page looks the cached computation up (the shared resources or the page's own compute.py)."""

    def refused(*args, **kwargs):
        raise analysis.AnalysisError("not yet defined for windowed attention (test)")

    at = open_app("swin")
    monkeypatch.setattr(f"{module}.{resource}", refused)
    at.switch_page(f"views/{page}/{page}.py").run()
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    assert any("not yet defined for windowed attention" in i.body for i in at.info), [i.body for i in at.info]
    params = {k: at.query_params[k] for k in at.query_params}
    assert "swin_tiny_patch4_window7_224" in str(params.get("model"))


def test_a_swin_typed_in_the_sidebar_opens():
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    at.radio(key="model_source").set_value("timm").run()
    at.text_input(key="model_timm").input("random:swin_tiny_patch4_window7_224").run()
    at.number_input(key="resolution").set_value(128).run()
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    current = at.session_state["current"]
    assert current.model.source == "swin_tiny_patch4_window7_224" and current.spec.is_windowed
    assert current.spec.img_size == (128, 128)
    assert at.number_input(key="resolution").step == 32  # whole cells on every stage: 4 px patches, merged 3 times


def test_the_distance_and_compare_pages_reproduce_in_python_for_a_swin(npz_downloads, monkeypatch):  # noqa: F811
    at = open_app("swin")
    vit = loaded("swin")
    monkeypatch.setattr(analysis, "load_vit", lambda source, **kwargs: vit)  # the app's random weights
    at.switch_page("views/distance/distance.py").run()
    assert_clean(at)
    script = reproduce(at)
    npz = npz_downloads["dist_data"]
    np.testing.assert_allclose(script["current_image"], npz["current_image"], rtol=1e-5, equal_nan=True)
    np.testing.assert_allclose(script["uniform_reference"], npz["uniform_reference"], rtol=1e-6)
    assert npz["uniform_reference"].shape == (vit.spec.num_layers,)

    at.switch_page("views/compare/compare.py").run()
    at.multiselect(key="cmp_layers").set_value([0, 5, 7]).run()  # stages 0, 2 and 3
    at.selectbox(key="head").set_value(5).run()  # stage 0 has 3 heads: its layers show the mean
    at.radio(key="query_mode").set_value("patch").run()
    at.number_input(key="query_patch").set_value(100).run()
    assert_clean(at)
    script = reproduce(at)
    npz = npz_downloads["cmp_data"]
    for layer in (0, 5, 7):
        np.testing.assert_allclose(script["attention"][layer], npz[f"attention_layer{layer}"], rtol=1e-5, atol=1e-7)


def test_a_windowed_forward_pass_counts_every_windows_bytes():
    """The record store's LRU by bytes and the float16 choice read ``record.windows`` (a
    windowed record has no ``record.attentions``)."""
    import torch

    from vizapp import resources

    at = open_app("swin")
    cur = at.session_state["current"]
    forward = resources.forward(*cur.args)
    windows = forward.record.windows
    assert forward.nbytes == (
        sum(w.numel() * w.element_size() for w in windows)
        + forward.record.logits.numel() * forward.record.logits.element_size()
        + forward.input_image.nbytes
        + forward.probabilities.nbytes
    )
    entries = sum(g.num_windows * g.num_heads * g.window_tokens**2 for g in cur.spec.layer_geometry)
    assert entries == sum(w[0].numel() for w in windows)
    assert resources.record_dtype(cur.spec) == torch.float32  # far below the float16 limit at 112 px


def test_the_url_layer_picks_its_stage_and_both_survive_a_page_switch():
    at = open_app("swin", layer="3", query="patch", patch="40")
    assert at.radio(key="attn_stage").value == 1 and at.slider(key="layer").value == 3
    at.switch_page("views/distance/distance.py").run()
    at.switch_page("views/attention/attention.py").run()
    assert_clean(at)
    assert at.radio(key="attn_stage").value == 1 and at.slider(key="layer").value == 3
    assert at.number_input(key="query_patch").value == 40
    params = {k: at.query_params[k] for k in at.query_params}
    flat = {k: (v[0] if isinstance(v, list) else v) for k, v in params.items()}
    assert flat["layer"] == "3" and flat["res"] == "112" and flat["patch"] == "40"


def test_a_swin_beside_a_vit_in_patch_units_says_why_it_is_left_out():
    """Patch sides exist for the ViT, not across a Swin's patch merging: the Swin's series is
    left out with the library's reason, the ViT's stays."""
    from tests.test_app import RANDOM_MODEL

    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(model=RANDOM_MODEL, res="64")
    at.run()
    at.switch_page("views/distance/distance.py").run()
    at.radio(key="dist_unit").set_value("patches").run()
    at.selectbox(key="dist_model2").set_value("other").run()
    at.text_input(key="dist_model2_other").set_value(model_source("swin")).run()
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    assert any("no one patch side" in i.body for i in at.info), [i.body for i in at.info]
    assert chart(at, "dist_scatter")["data"]


# --------------------------------------------------------------------------- rollout, explain, tokens, robustness, set distance


def fresh_app(family: str, **params) -> AppTest:
    """:func:`open_app` with Streamlit's caches emptied first: random weights differ per load, and
    a model evicted from the model cache by an earlier test would leave results of its old
    weights in the result caches; here the page and :func:`loaded` share one instance."""
    import streamlit as st

    st.cache_data.clear()
    st.cache_resource.clear()
    return open_app(family, **params)


def pixel_query(spec, patch: int) -> tuple[int, int]:
    """The input pixel at the centre of finest-grid cell ``patch``, written out."""
    (ph, pw), gw = spec.patch_size, spec.grid_size[1]
    return ((patch // gw) * ph + ph // 2, (patch % gw) * pw + pw // 2)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_rollout_page_rolls_out_within_a_stage(family, npz_downloads, monkeypatch):  # noqa: F811
    at = fresh_app(family)
    vit = loaded(family)
    spec = vit.spec
    record = record_of(vit)
    at.switch_page("views/rollout/rollout.py").run()
    at.radio(key="query_mode").set_value("patch").run()
    at.number_input(key="query_patch").set_value(9).run()
    stages = layer_grids.stage_layers(spec)
    if len(stages) > 1:
        at.radio(key="rollout_span").set_value(1).run()
        expected = analysis.attention_rollout(record, stage=1, query=pixel_query(spec, 9))[0].numpy()
        layers = stages[1]
    else:  # SAM: one stage, every layer exact
        expected = analysis.attention_rollout(record, query=pixel_query(spec, 9))[0].numpy()
        layers = list(range(spec.num_layers))
    assert_clean(at)
    assert not at.info and not at.error
    overlay = chart(at, "rollout_overlay")
    shown = overlay_map(overlay)
    assert shown.shape == spec.geometry(layers[0]).grid_size
    assert traces(overlay, "heatmap")[0]["dx"] == spec.geometry(layers[0]).stride[1]
    np.testing.assert_allclose(shown, expected, rtol=1e-5, atol=1e-7)
    npz = npz_downloads["rollout_data"]
    assert list(npz["end_layers"]) == layers and npz["after_each_layer"].shape == (len(layers), *shown.shape)
    monkeypatch.setattr(analysis, "load_vit", lambda source, **kwargs: vit)
    np.testing.assert_allclose(reproduce(at)["rollout"], npz["rollout"], rtol=1e-5, atol=1e-7)


def test_rollout_across_swin_stages_needs_the_approximation_opt_in():
    from analysis.attention.rollout import MERGE_WARNING

    at = fresh_app("swinv2")  # 32 -> 16 -> 8 -> 4 cells: every merging 2x2 (the 112 px Swin's 7 -> 4 is refused)
    vit = loaded("swinv2")
    spec = vit.spec
    at.switch_page("views/rollout/rollout.py").run()
    at.radio(key="rollout_span").set_value("across").run()
    at.slider(key="start_layer").set_value(0).run()
    assert_clean(at)
    reasons = [i.body.replace("\\", "") for i in at.info]  # markdown escapes removed
    assert any("patch merging" in r and "mean_2x2" in r for r in reasons), reasons
    assert not chart_keys(at)
    at.checkbox(key="rollout_merge").check().run()
    assert_clean(at)
    assert any(MERGE_WARNING in w.body for w in at.warning)
    with pytest.warns(RuntimeWarning, match="mean_2x2"):
        expected = analysis.attention_rollout(record_of(vit), start_layer=0, merge="mean_2x2", query="mean")[0].numpy()
    shown = overlay_map(chart(at, "rollout_overlay"))
    assert shown.shape == spec.grid_size
    np.testing.assert_allclose(shown, expected, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_tokens_page_reads_each_layer_on_its_stage_grid(family, npz_downloads, monkeypatch):  # noqa: F811
    from analysis.tokens import logit_lens_layers

    at = fresh_app(family)
    vit = loaded(family)
    spec = vit.spec
    pixels = vit.preprocess(analysis.load_image(first_sample()))
    layer = 3  # Swin: stage 1 (14x14 / 16x16 cells); SAM: its one 8x8 grid
    at.switch_page("views/tokens/tokens.py").run()
    at.slider(key="layer").set_value(layer).run()
    at.radio(key="query_mode").set_value("patch").run()
    at.number_input(key="query_patch").set_value(9).run()
    assert_clean(at)
    assert all("logit lens" in i.body for i in at.info), [i.body for i in at.info]  # nothing else refused
    features = analysis.capture_tokens(vit, pixels)
    geometry = spec.geometry(layer)
    tokens = features.layer_tokens(layer)
    rgb, _ = analysis.feature_pca(tokens, geometry)
    (pca,) = traces(chart(at, "tok_pca"), "image")
    assert pca["dx"] == geometry.stride[1]
    np.testing.assert_array_equal(
        array(pca["z"]).reshape(*geometry.grid_size, 3).astype(np.uint8),
        np.round(rgb[0].numpy() * 255).astype(np.uint8),
    )
    cell = geometry.cell_of_pixel(*pixel_query(spec, 9))
    similarity = analysis.patch_similarity(tokens, geometry, cell).numpy()
    np.testing.assert_allclose(overlay_map(chart(at, "tok_similarity")), similarity, rtol=1e-5, atol=1e-6)
    norms = analysis.token_norms(tokens)[0].numpy()
    np.testing.assert_allclose(overlay_map(chart(at, "tok_norms")).ravel(), norms, rtol=1e-5)
    found = analysis.high_norm_tokens(features)  # each layer on its own stage grid
    # no attention-mass charts: no prefix tokens, and (with outliers) the library's reason why not
    note = (
        f"The attention mass is not defined for this {spec.family}"
        if any(bool(mask.any()) for mask in found.mask)
        else "No prefix tokens and no outliers in this model and image."
    )
    assert any(c.body.startswith(note) for c in at.caption), [c.body for c in at.caption]
    assert not [k for k in chart_keys(at) if "tok_mass" in k]
    np.testing.assert_array_equal(npz_downloads["tok_norm_data"]["thresholds"], found.thresholds.numpy())
    monkeypatch.setattr(analysis, "load_vit", lambda source, **kwargs: vit)
    script = reproduce(at)
    np.testing.assert_allclose(script["rgb"], npz_downloads["tok_pca_data"]["rgb"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        script["similarity"], npz_downloads["tok_similarity_data"]["similarity"], rtol=1e-5, atol=1e-6
    )
    saved = npz_downloads["tok_norm_data"]  # layers of one grid (SAM's) stacked, else one array per layer
    saved_norms = saved["norms"][layer] if "norms" in saved else saved[f"norms_layer{layer}"].ravel()
    assert ("norms" in saved) == (len({g.grid_size for g in spec.geometries()}) == 1)
    np.testing.assert_allclose(script["norms"][layer], saved_norms, rtol=1e-5)
    if spec.has_classifier:  # the logit lens: rows are the last stage's layers, labelled by them
        lens_layers = logit_lens_layers(vit)
        assert layer not in lens_layers  # stage 1: the lens says why it is not defined there
        assert any("logit lens: layer 3" in i.body for i in at.info)
        assert not [k for k in chart_keys(at) if k.endswith("-tok_lens_top5")]
        lens = analysis.logit_lens(vit, pixels)[:, 0].softmax(-1)
        (curve,) = traces(chart(at, "tok_lens"), "scatter")
        assert list(array(curve["x"])) == list(lens_layers)
        np.testing.assert_allclose(array(curve["y"]), lens[:, int(lens[-1].argmax())].numpy(), rtol=1e-5)
        np.testing.assert_allclose(script["probabilities"], npz_downloads["tok_lens_data"]["probabilities"], rtol=1e-5)
        at.slider(key="layer").set_value(lens_layers[0]).run()
        assert_clean(at)
        (bar,) = traces(chart(at, "tok_lens_top5"), "bar")
        top = sorted(array(bar["x"] if "x" in bar else bar["y"]))[-1]
        np.testing.assert_allclose(top, 100 * lens[0].max().item(), rtol=1e-5)  # percent
    # queries, keys and values exist per window: the library's reason, as information
    at.radio(key="tok_kind").set_value("query").run()
    assert_clean(at)
    assert any("window by window" in i.body for i in at.info), [i.body for i in at.info]


#: each method as the Explain page's method box names it
EXPLAIN_LABELS = {
    "attention": "attention (last layer)",
    "rollout": "rollout",
    "chefer": "Chefer et al. 2021",
    "gradcam": "Grad-CAM",
    "input_x_gradient": "input × gradient",
    "integrated_gradients": "integrated gradients",
    "attnlrp": "AttnLRP (Achtibat et al. 2024)",
}


@pytest.mark.parametrize("family", sorted(LAYOUTS))
def test_the_explain_page_draws_each_method_on_its_grid(family):
    """Every layout, one test: each method the model has is drawn on the grid the library names
    (``explanation_grid``) as its positive part over its 99th percentile (the outlier tokens left
    out where the model has one patch grid for them), and deletion / insertion come per map; each
    method the model does not have is left out with the library's reason."""
    from analysis.explanations import CLASS_SPECIFIC, EXPLANATION_METHODS, explanation_grid, methods_for
    from analysis.faithfulness import perturbation_curve

    assert set(EXPLAIN_LABELS) == set(EXPLANATION_METHODS)
    at = fresh_app(family)
    vit = loaded(family)
    spec = vit.spec
    pixels = vit.preprocess(analysis.load_image(first_sample()))
    at.switch_page("views/explain/explain.py").run()
    offered = methods_for(vit)
    info = " ".join(i.body for i in at.info).replace("\\", "")
    shown = at.multiselect(key="explain_methods").options  # the labels a visitor reads
    for method, label in EXPLAIN_LABELS.items():  # what the model does not have is not offered, and said why
        in_page = method in offered and (spec.has_classifier or method not in CLASS_SPECIFIC)
        assert (label in shown) == in_page, (method, shown)
        assert (f"method={method!r} is not defined for a windowed model" in info) == (method not in offered), method
    drawable = ("rollout", "chefer", "gradcam", "input_x_gradient", "attnlrp")
    methods = [m for m in drawable if m in offered][:4] if spec.has_classifier else ["rollout"]  # 4 at most
    at.multiselect(key="explain_methods").set_value(methods).run()
    stages = layer_grids.stage_layers(spec)
    rollout_options = {}
    if len(stages) > 1:
        at.selectbox(key="explain_rollout_stage").set_value(1).run()
        rollout_options = {"stage": 1}
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    target = at.selectbox(key="explain_target").value if spec.has_classifier else None
    heatmaps = traces(chart(at, "explain_panels"), "heatmap")
    assert len(heatmaps) == len(methods)
    outliers = (  # the image's outlier tokens, on the one patch grid every layer shares (none for windows)
        []
        if spec.outlier_grid is None
        else analysis.outlier_patches(analysis.high_norm_tokens(analysis.capture_tokens(vit, pixels)))
    )
    for trace, method in zip(heatmaps, methods):
        options = rollout_options if method == "rollout" else {}
        kwargs = {} if method == "rollout" else {"target": target}
        reference = analysis.explain(vit, pixels, method=method, **kwargs, **options)[0].numpy()
        grid, stride = explanation_grid(vit, method, **options)
        assert reference.shape == grid and (trace["dy"], trace["dx"]) == stride, method
        drawn = array(trace["z"]).reshape(grid)
        # by default over its robust top without the outlier cells; a random Swin v2's Grad-CAM can be
        # all 0 (ReLU): drawn as 0
        positive = np.clip(reference, 0, None)
        kept = np.delete(positive.ravel(), list(outliers))
        top = np.quantile(kept, 0.99) or kept.max()
        np.testing.assert_allclose(drawn, positive / top if top > 0 else positive, rtol=1e-4, atol=1e-6)
    if spec.has_classifier:  # deletion / insertion on each map's own grid, next to the random map
        curves = chart(at, "explain_curves")
        gradcam = analysis.explain(vit, pixels, method="gradcam", target=target)[0]
        _, deletion = perturbation_curve(vit, pixels, gradcam, target, mode="deletion", steps=16)
        names = {str(t.get("name")).split(" (AUC")[0] for t in curves["data"]}
        assert {"random", "rollout", "Grad-CAM", "input × gradient"} <= names, names
        ys = [array(t["y"]) for t in curves["data"] if str(t.get("name")).startswith("Grad-CAM")]
        assert any(np.allclose(y, np.asarray(deletion), rtol=1e-5) for y in ys)


def test_the_robustness_page_probes_a_swin_with_pixel_perturbations(npz_downloads, monkeypatch):  # noqa: F811
    from analysis.robustness import SALIENCY_NAMES, check_token_drop, probe, shuffle_grids

    at = fresh_app("swin")
    vit = loaded("swin")
    spec = vit.spec
    pixels = vit.preprocess(analysis.load_image(first_sample()))
    at.switch_page("views/robustness/robustness.py").run()
    at.selectbox(key="rob_cnn").set_value("none").run()
    # token drop is not offered: the library's reason is shown
    assert "token_drop" not in at.radio(key="rob_perturbation").options
    with pytest.raises(analysis.AnalysisError) as refused:
        check_token_drop(vit)
    assert any(str(refused.value)[:40] in c.value.replace("\\", "") for c in at.caption), [c.value for c in at.caption]
    at.radio(key="rob_perturbation").set_value("pixel_drop").run()
    at.slider(key="rob_fraction").set_value(0.25).run()
    at.radio(key="rob_selection").set_value("most_salient").run()
    assert_clean(at)
    assert not at.info and not at.error, ([i.body for i in at.info], [e.value for e in at.error])
    ranking = analysis.attention_rollout(record_of(vit), stage=0, query="mean")[0].numpy()  # on the stem's patch grid
    assert ranking.shape == spec.grid_size
    seed = at.number_input(key="rob_seed").value
    clean = probe(vit, pixels, "pixel_drop", 0.0, seed=seed, selection="most_salient", saliency=ranking)
    perturbed = probe(vit, pixels, "pixel_drop", 0.25, seed=seed, selection="most_salient", saliency=ranking)
    assert perturbed.saliency_name == SALIENCY_NAMES["windowed"]
    panels = chart(at, "rob_maps")
    heatmaps = traces(panels, "heatmap")
    last = spec.geometry(spec.num_layers - 1)
    peak = max(clean.saliency.max().item(), perturbed.saliency.max().item())
    for trace, expected in zip(heatmaps, (clean.saliency, perturbed.saliency)):
        assert array(trace["z"]).shape == last.grid_size and trace["dx"] == last.stride[1]
        np.testing.assert_allclose(array(trace["z"]), expected.numpy() / peak, rtol=1e-4, atol=1e-6)
    titles = " ".join(plain_label(a["text"]) for a in panels["layout"]["annotations"])  # titles wrap to their panel
    assert SALIENCY_NAMES["windowed"] in titles
    npz = npz_downloads["rob_image_data"]
    np.testing.assert_array_equal(npz["dropped_patches"], perturbed.dropped.numpy())
    monkeypatch.setattr(analysis, "load_vit", lambda source, **kwargs: vit)
    script = reproduce(at)
    np.testing.assert_array_equal(script["dropped_patches"], npz["dropped_patches"])
    np.testing.assert_allclose(script["vit_perturbed_probabilities"], npz["vit_perturbed_probabilities"], rtol=1e-5)
    # the image-set curve runs for the Swin
    curve = chart(at, "rob_curves_chart")
    assert any(str(t.get("name", "")).startswith("ViT") for t in curve["data"])
    # shuffles split the stem's 28x28 patch grid (4 px patches): blocks of whole patches
    at.radio(key="rob_perturbation").set_value("shuffle").run()
    assert_clean(at)
    assert (
        list(at.select_slider(key="rob_grid").options)
        == [str(g) for g in shuffle_grids(spec)]
        == ["1", "2", "4", "7", "14", "28"]
    )


def test_the_distance_page_averages_a_swin_over_the_image_set(npz_downloads, monkeypatch):  # noqa: F811
    from analysis.attention.streaming import distance_heads
    from vizapp import inputs

    at = fresh_app("swin")
    vit = loaded("swin")
    at.switch_page("views/distance/distance.py").run()
    assert_clean(at)
    assert not at.info, [i.body for i in at.info]
    paths = inputs.bundled_set(scenes=False)  # a model other than the demo models: the photos
    assert paths and not any(p.name.startswith("scene_") for p in paths)
    expected = analysis.dataset_attention_distance(vit, [str(p) for p in paths], per_image=True).numpy()  # (N, L, H)
    assert expected.shape == (len(paths), vit.spec.num_layers, distance_heads(vit.spec))
    npz = npz_downloads["dist_data"]
    np.testing.assert_allclose(npz["set_per_image"], expected, rtol=1e-4, equal_nan=True)
    (mean_series,) = [t for t in chart(at, "dist_scatter")["data"] if f"mean over {len(paths)} images" in t["name"]]
    shown = array(mean_series["y"])
    mean = expected.mean(axis=0)
    np.testing.assert_allclose(shown, mean.ravel(), rtol=1e-4, equal_nan=True)  # NaN beyond a layer's heads
    monkeypatch.setattr(analysis, "load_vit", lambda source, **kwargs: vit)
    np.testing.assert_allclose(reproduce(at)["set_mean"], npz["set_mean"], rtol=1e-4, equal_nan=True)


def test_a_torchvision_swin_opens_with_its_windows_outlined():
    """torchvision's swin_t, converted once into timm's Swin sharing its modules: layer 0's map
    for the patch at pixel (100, 60) is drawn on the 56x56 stage grid, zero outside its 7x7
    window (cells 21..27 x 14..20, written out), which is outlined."""
    at = open_app("torchvision_swin")
    vit = loaded("torchvision_swin")
    assert vit.spec.geometry(0).grid_size == (56, 56) and vit.spec.geometry(0).window_size == (7, 7)
    at.radio(key="attn_stage").set_value(0).run()
    at.slider(key="layer").set_value(0).run()
    at.radio(key="query_mode").set_value("patch").run()
    at.number_input(key="query_patch").set_value(25 * 56 + 15).run()  # cell (25, 15): pixel (100, 60)
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    overlay = chart(at, "attn_overlay")
    shown = overlay_map(overlay)
    expected = analysis.attention_map(record_of(vit), 0, head=None, query=(102, 62))[0].numpy()
    np.testing.assert_allclose(shown, expected, rtol=1e-5, atol=1e-7)
    inside = np.zeros((56, 56), bool)
    inside[21:28, 14:21] = True
    assert np.all(shown[~inside] == 0) and shown[inside].sum() > 0.99
    outline = [s for s in overlay["layout"]["shapes"] if s.get("name") == layer_grids.WINDOW_SHAPE_NAME]
    assert [(int(s["x0"]), int(s["y0"]), int(s["x1"]), int(s["y1"])) for s in outline] == [(56, 84, 84, 112)]


# --------------------------------------------------------------------------- the instant view (issue 28)


def unpack_windowed_blob(blob: bytes, geometry) -> dict:
    """``attention_view_blob``'s bytes of a windowed layer as the page reads them."""
    heads, windows, slots = geometry.num_heads + 1, geometry.num_windows, geometry.window_tokens
    cells_n = geometry.grid_size[0] * geometry.grid_size[1]
    sizes = [
        ("row_ranges", "<f4", heads * windows * slots * 2),
        ("mean_ranges", "<f4", heads * 2),
        ("cells", "<i4", windows * slots),
        ("rows", np.uint8, heads * windows * slots * slots),
        ("mean", np.uint8, heads * cells_n),
    ]
    out, offset = {}, 0
    for name, dtype, count in sizes:
        out[name] = np.frombuffer(blob, dtype, count, offset)
        offset += count * np.dtype(dtype).itemsize
    assert offset == len(blob)
    return out


@pytest.mark.parametrize("family, layer", [("swin", 1), ("swin", 3), ("sam", 0)])  # swin 3: a coarser grid's cell
def test_the_windowed_attention_page_gives_the_view_its_layers_windows(family, layer):
    """The view of a windowed layer: its own grid and stride, the query as the layer's cell, and
    data from the windowed record whose rows, scattered through the window's cells as the page
    does, are ``attention_map`` of each cell within half a step of each row's range."""
    import json

    from analysis.views.attention_view import attention_view_blob

    at = open_app(family)
    vit = loaded(family)
    spec, record = vit.spec, record_of(vit)
    if "attn_stage" in at.session_state:
        at.radio(key="attn_stage").set_value(spec.geometry(layer).stage).run()
    if at.slider(key="layer") is not None and layer != at.session_state["layer"]:
        at.slider(key="layer").set_value(layer).run()
    at.radio(key="query_mode").set_value("patch").run()
    at.number_input(key="query_patch").set_value(5).run()
    assert_clean(at)
    geometry = spec.geometry(layer)
    (view,) = [c for c in at.get("component_instance") if c.proto.component_name.endswith("attention_view")]
    args = json.loads(view.proto.json_args)
    query_cell = geometry.cell_of_pixel(*spec.patch_centre(5))
    assert args["windowed"] is True and (args["grid"], args["patch_size"]) == (
        list(geometry.grid_size),
        list(geometry.stride),
    )
    assert (args["layer"], args["query_patch"], args["heads"], args["columns"]) == (
        layer,
        query_cell,
        geometry.num_heads,
        False,
    )
    assert args["uniform"] == pytest.approx(1 / geometry.window_tokens)
    blob, meta = attention_view_blob(record, [layer])
    assert args["data_id"] == meta["data_id"]  # the page fetches exactly this file
    data = unpack_windowed_blob(blob, geometry)
    heads, windows, slots = geometry.num_heads + 1, geometry.num_windows, geometry.window_tokens
    codes, ranges = (
        data["rows"].reshape(heads, windows, slots, slots),
        data["row_ranges"].reshape(heads, windows, slots, 2),
    )
    cells = data["cells"].reshape(windows, slots)
    gh, gw = geometry.grid_size
    for cell in (0, query_cell, gh * gw - 1):
        (window,), (slot,) = np.nonzero(cells == cell)
        for head in (0, None):
            h = geometry.num_heads if head is None else head
            lo, hi = ranges[h, window, slot]
            grid = np.zeros(gh * gw)
            keys = cells[window] >= 0
            grid[cells[window][keys]] = (lo + codes[h, window, slot] / 255 * (hi - lo))[keys]
            exact = analysis.attention_map(record, layer, head=head, query=cell)[0].numpy().ravel()
            assert np.abs(grid - exact).max() <= (hi - lo) / 510 + 1e-7 and hi <= exact.max() + 1e-7, (cell, head)
    mean = data["mean"].reshape(heads, gh * gw)
    lo, hi = data["mean_ranges"].reshape(heads, 2)[1]
    exact = analysis.attention_map(record, layer, head=1, query="mean")[0].numpy().ravel()
    assert np.abs(lo + mean[1] / 255 * (hi - lo) - exact).max() <= (hi - lo) / 510 + 1e-7


def test_a_sam_global_layer_over_the_view_budget_keeps_the_chart(monkeypatch):
    import vizapp.limits
    from analysis.views.attention_view import view_layer_bytes

    vit = loaded("sam")
    spec = vit.spec
    glob = next(layer for layer in range(spec.num_layers) if spec.geometry(layer).is_global)
    monkeypatch.setattr(vizapp.limits, "MAX_VIEW_BYTES", view_layer_bytes(spec, glob) - 1)
    at = open_app("sam", layer=str(glob))
    assert at.session_state["layer"] == glob
    assert not [c for c in at.get("component_instance") if c.proto.component_name.endswith("attention_view")]
    assert any("instant hover view is off for this layer" in c.value for c in at.caption)
    assert at.get("plotly_chart")
