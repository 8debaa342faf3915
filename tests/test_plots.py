"""``analysis.plots``: the figures of docs/guides/figures.md run and say what the app's say; the app draws with
these very builders (its figures unchanged, the mosaic PNG cache included)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import pytest

from analysis import plots

REPO = Path(__file__).resolve().parent.parent
FIGURES = (
    "attention",
    "rollout",
    "why",
    "compare",
    "tokens",
    "robustness",
    "position",
    "filters",
    "variance",
    "distance",
)  # one per page of the app (filters: two)


def readme_figures_block() -> str:
    """The figures guide's one python block (it moved there from the README)."""
    guide = (REPO / "docs" / "guides" / "figures.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```python\n(.*?)```", guide, re.S)
    return block


@pytest.fixture(scope="module")
def readme_figures(tmp_path_factory) -> dict:
    """The figures guide's block executed as written, in a folder that has the repository's
    ``assets`` (its relative paths) and takes the HTML it writes."""
    import os

    folder = tmp_path_factory.mktemp("readme_figures")
    (folder / "assets").symlink_to(REPO / "assets")
    before = Path.cwd()
    os.chdir(folder)
    try:
        namespace: dict = {"__name__": "readme_figures"}
        exec(compile(readme_figures_block(), "docs/guides/figures.md", "exec"), namespace)
    finally:
        os.chdir(before)
    namespace["folder"] = folder
    return namespace


def trace(figure: go.Figure, kind: str):
    return next(t for t in figure.data if t.type == kind)


def test_the_readme_block_makes_one_figure_per_page(readme_figures):
    for name in FIGURES:
        assert isinstance(readme_figures[name], go.Figure), name
    assert (readme_figures["folder"] / "attention.html").stat().st_size > 0


def test_the_readme_attention_figure_is_the_app_figure_of_the_same_map(readme_figures):
    """The array background is the app's data URI; the map, the colour stops, the range and the
    colour bar's statement are the app's."""
    ns = readme_figures
    figure = ns["attention"]
    heatmap = trace(figure, "heatmap")
    expected = ns["attention_map"](ns["record"], ns["last"], head=None, query="cls")[0].numpy()
    np.testing.assert_array_equal(np.asarray(heatmap.z), expected)
    # the app's default range (vizapp/views/attention/attention.py): 0 to the 99th percentile without the
    # outlier tokens (the demo has none), at least 4x uniform, never above the maximum
    assert ns["outliers"] == []
    lo, hi, range_text = plots.colour_range("robust", expected, uniform=1 / ns["vit"].spec.num_tokens)
    top = max(min(float(np.quantile(expected, 0.99)), float(expected.max())), 4 / ns["vit"].spec.num_tokens)
    assert (heatmap.zmin, heatmap.zmax) == (0.0, pytest.approx(top))
    assert [list(stop) for stop in heatmap.colorscale] == plots.colour_stops("Viridis")
    from analysis.plots.layout import plain_label  # a long colour-bar title is wrapped to the bar

    assert (
        plain_label(heatmap.colorbar.title.text) == f"attention probability ({range_text})" and "uniform" in range_text
    )
    assert figure.layout.xaxis.title.text == "x (input px)" and list(figure.layout.yaxis.range) == [ns["size"][0], 0]
    app = plots.attention_overlay(
        plots.image_data_uri(ns["picture"]),
        ns["size"],
        expected,
        ns["patch"],
        zmin=lo,
        zmax=hi,
        colorbar_title=f"attention probability ({range_text})",
    )
    assert figure.to_json() == app.to_json()


def test_the_readme_figures_state_their_ranges_and_units(readme_figures):
    ns = readme_figures
    spec = ns["vit"].spec
    tokens = trace(ns["tokens"], "heatmap")
    assert (tokens.zmin, tokens.zmax) == (-1.0, 1.0) and tokens.colorbar.title.text == "cosine similarity (−1 to 1)"
    why = ns["why"].layout.coloraxis
    assert (why.cmin, why.cmax) == (0.0, 1.0) and why.colorbar.title.text == "map / its max |value| (negative → 0)"
    panels = [np.asarray(t.z) for t in ns["why"].data if t.type == "heatmap"]
    assert len(panels) == 2 and all(p.min() >= 0 and p.max() == pytest.approx(1.0) for p in panels)
    compare = ns["compare"].layout.coloraxis
    everything = np.stack(ns["layers"])
    assert compare.cmin == 0.0 and compare.cmax == pytest.approx(float(everything.max()))  # one scale for all
    position = ns["position"]
    drawn = [t for t in position.data if t.type == "heatmap"]
    assert drawn and (drawn[0].zmin, drawn[0].zmax) == (-1.0, 1.0)
    gh, gw = spec.grid_size
    assert np.asarray(drawn[0].z).shape == (gh * gh, gw * gw)
    assert ns["distance"].layout.yaxis.title.text == "mean attention distance (input pixels)"
    uniform = float(ns["uniform_attention_distance"](spec))
    assert [shape.y0 for shape in ns["distance"].layout.shapes] == [pytest.approx(uniform)]
    assert ns["robustness"].layout.shapes[0].y0 == pytest.approx(1 / spec.num_outputs)
    assert list(ns["robustness"].layout.yaxis.range) == [0, 1.02]
    bars = trace(ns["variance"], "bar")
    np.testing.assert_allclose(np.asarray(bars.y), ns["explained"].numpy() * 100)
    names = trace(ns["filters"], "scatter").text
    assert len(names) == 8 and names[0] == f"PC 1: {float(ns['explained'][0]) * 100:.2f}% of variance"


def test_the_app_figures_module_holds_only_its_own():
    """The pages draw with analysis.plots' builders, imported from there: vizapp.figures re-exports
    none of them, only its two mosaics with the PNG cache."""
    from vizapp import figures

    assert figures.__all__ == ["mosaic", "position_similarity_mosaic"]
    assert not [name for name in plots.__all__ if name not in figures.__all__ and hasattr(figures, name)]


@pytest.mark.parametrize("shape", [(5, 3, 4), (80, 50, 50)])  # heatmap cells, and a PNG above MAX_HEATMAP_CELLS
def test_the_app_mosaic_is_the_library_mosaic_with_a_cache(shape):
    from vizapp import figures

    tiles = np.random.default_rng(1).random(shape)
    names = [str(i) for i in range(shape[0])]
    app = figures.mosaic(tiles, 9, tile_names=names, title="t").to_json()
    assert app == plots.mosaic(tiles, 9, tile_names=names, title="t").to_json()
    assert figures.mosaic(tiles, 9, tile_names=names, title="t").to_json() == app  # from the cache
    similarity = np.random.default_rng(2).random((6, 5, 6, 5)) * 2 - 1
    assert (
        figures.position_similarity_mosaic(similarity, highlight=3).to_json()
        == plots.position_similarity_mosaic(similarity, highlight=3).to_json()
    )


def test_a_background_array_is_its_data_uri():
    rng = np.random.default_rng(3)
    picture = rng.integers(0, 256, (32, 48, 3), dtype=np.uint8)
    maps = [rng.random((2, 3)), rng.random((2, 3))]
    uri = plots.image_data_uri(picture)
    assert (
        plots.attention_overlay(picture, (32, 48), maps[0], (16, 16)).to_json()
        == plots.attention_overlay(uri, (32, 48), maps[0], (16, 16)).to_json()
    )
    assert (
        plots.map_panels(picture, (32, 48), maps, (16, 16), ["a", "b"]).to_json()
        == plots.map_panels(uri, (32, 48), maps, (16, 16), ["a", "b"]).to_json()
    )
    assert (
        plots.map_panels([picture, uri], (32, 48), maps, (16, 16), ["a", "b"]).to_json()
        == plots.map_panels([uri, uri], (32, 48), maps, (16, 16), ["a", "b"]).to_json()
    )


def test_deletion_and_insertion_axes_follow_the_data_and_mark_the_start():
    """A class the model gives 2% is not a flat line on a 0–1 axis (issue 29, item 9)."""
    from analysis import plots

    fractions = np.linspace(0, 1, 5)
    deletion = np.array([0.020, 0.012, 0.006, 0.004, 0.003])
    insertion = np.array([0.003, 0.010, 0.016, 0.019, 0.020])
    random_deletion = np.array([0.020, 0.018, 0.011, 0.007, 0.003])
    figure = plots.perturbation_curves(
        [
            ("random", fractions, random_deletion, insertion[::-1], 0.01, 0.01),
            ("rollout", fractions, deletion, insertion, 0.007, 0.014),
        ]
    )
    layout = figure.layout
    assert tuple(layout.yaxis.range) == tuple(layout.yaxis2.range) == (0, pytest.approx(0.021))
    starts = [shape for shape in layout.shapes if shape.type == "line"]
    assert [s.y0 for s in starts] == [0.02, 0.02] and {s.yref for s in starts} == {"y", "y2"}
    assert any("unperturbed p = 0.02" in (a.text or "") for a in layout.annotations)
    high = plots.perturbation_curves([("rollout", fractions, deletion * 49, insertion * 49, 0.3, 0.6)])
    assert tuple(high.layout.yaxis.range) == (0, 1.02)  # never above a probability's range


def test_a_37x37_position_grid_keeps_its_tiles_readable():
    """DINOv2 at 518 px: 37×37 tiles of 37×37 cells. Each tile is drawn with at least
    MIN_TILE_PIXELS per side, each pixel the area-weighted mean of the cells it covers
    (issue 29, item 3; the old box average divided 37 only by 37: one pixel per tile)."""
    import base64
    import io

    from PIL import Image

    from analysis.plots.mosaics import MIN_TILE_PIXELS, _area_weights

    n = 37
    rng = np.random.default_rng(0)
    similarity = rng.uniform(-1, 1, size=(n, n, n, n)).astype(np.float32)
    figure = plots.position_similarity_mosaic(similarity)
    (picture,) = [t for t in figure.data if t.type == "image"]
    drawn = np.asarray(Image.open(io.BytesIO(base64.b64decode(picture.source.split(",", 1)[1]))).convert("RGB"))
    side = drawn.shape[0] // n
    assert drawn.shape[:2] == (n * side, n * side) and side >= MIN_TILE_PIXELS
    assert picture.dx == pytest.approx(n / side) and picture.dy == pytest.approx(n / side)
    assert f"drawn at {side}×{side} px" in figure.layout.title.text
    # tile (row 3, col 5), pixel (p, q): an explicit area average over the cells it covers
    weights = _area_weights(n, side)
    np.testing.assert_allclose(weights.sum(1), 1.0)
    tile = similarity[3, 5].astype(np.float64)
    for p, q in [(0, 0), (side // 2, side - 1), (side - 1, 3)]:
        covered = [(i, j) for i in range(n) for j in range(n) if weights[p, i] > 0 and weights[q, j] > 0]
        expected = sum(weights[p, i] * weights[q, j] * tile[i, j] for i, j in covered)
        rgb = plots.colorize(np.array([[expected]], np.float32), "Viridis", -1.0, 1.0)[0, 0]
        assert np.abs(drawn[3 * side + p, 5 * side + q].astype(int) - rgb.astype(int)).max() <= 1


def test_a_64x64_resample_mosaic_is_the_4x4_box_average():
    """A 64×64 resampled grid: 16 px per 64-cell tile, each pixel exactly the mean of its 4×4
    cells (the picture before the area weights were general). Its speed is the benchmark's."""
    from analysis.plots.mosaics import _cell_average

    n = 64
    similarity = np.random.default_rng(1).uniform(-1, 1, size=(n, n, n, n)).astype(np.float32)
    figure = plots.position_similarity_mosaic(similarity)
    (picture,) = [t for t in figure.data if t.type == "image"]
    assert picture.dx == pytest.approx(4.0) and picture.dy == pytest.approx(4.0)
    big = similarity.transpose(0, 2, 1, 3).reshape(n * n, n * n)  # rows: (tile row, cell row)
    boxes = big.reshape(n * 16, 4, n * 16, 4).astype(np.float64).mean(axis=(1, 3))
    np.testing.assert_allclose(_cell_average(big, n, n, n, n, 16, 16), boxes, rtol=1e-5, atol=1e-6)


def test_non_square_mosaics_keep_8_px_per_tile_on_both_axes():
    """A 16x64 grid (e.g. a resampled position grid) has 16x64-cell tiles: each axis keeps
    MIN_TILE_PIXELS on its own (the tile is not shrunk by its longer side's factor)."""
    from analysis.plots.mosaics import MAX_IMAGE_SIDE, MIN_TILE_PIXELS, _tile_pixels

    assert _tile_pixels(16, 64, 16, 64) == (16, 16)
    assert _tile_pixels(24, 80, 24, 80) == (24, 12)
    assert _tile_pixels(300, 4, 300, 4) == (MIN_TILE_PIXELS, 4)  # a 4-cell side stays exact
    assert _tile_pixels(8, 8, 8, 8) == (8, 8)  # fits: every cell its own pixel
    for nrows, ncols in [(37, 37), (16, 64), (5, 200)]:
        ph, pw = _tile_pixels(nrows, ncols, nrows, ncols)
        assert ph >= min(nrows, MIN_TILE_PIXELS) and pw >= min(
            ncols, MIN_TILE_PIXELS
        )  # a side never below 8 px or its cells
        assert nrows * ph <= max(MAX_IMAGE_SIDE, nrows * MIN_TILE_PIXELS)
    n_h, n_w = 16, 64
    similarity = np.random.default_rng(3).uniform(-1, 1, size=(n_h, n_w, n_h, n_w)).astype(np.float32)
    figure = plots.position_similarity_mosaic(similarity)
    (picture,) = [t for t in figure.data if t.type == "image"]
    assert (picture.dy, picture.dx) == (pytest.approx(1.0), pytest.approx(4.0))
    assert "drawn at 16×16 px" in figure.layout.title.text


def test_signed_circuit_figures_are_centred_on_zero_with_their_range_stated():
    """Signed effects (analysis.plots.circuits): white is exactly 0, the range is ±max|v| and
    the colour bar says so, and the click targets carry (layer, head)."""
    from analysis import plots

    values = np.array([[0.5, -2.0, 0.0], [1.0, np.nan, 0.25]])
    figure = plots.head_heatmap(values, title="t", colorbar_title="Δ logit", selected=(5, 2), layers=[3, 5])
    heatmap, targets = figure.data
    assert heatmap.zmin == -2.0 and heatmap.zmax == 2.0 and heatmap.zmid == 0
    assert "±2" in heatmap.colorbar.title.text
    middle = plots.colorize(np.zeros((1, 1)), plots.DIVERGING, -2.0, 2.0)[0, 0]
    assert middle.min() >= 240  # 0 is (near) white on RdBu_r
    assert targets.customdata[:, :2].tolist()[:3] == [[3, 0], [3, 1], [3, 2]]
    (outline,) = figure.layout.shapes
    assert (outline.x0, outline.y0) == (1.5, 0.5)  # head 2 of layer 5 (row 1)
    assert plots.symmetric_limit(np.zeros(3)) > 0 and plots.symmetric_limit(np.array([np.nan, -3.0])) == 3.0
    patching = plots.patching_heatmap(np.array([[0.2, -0.8]]), ["class", "patch 0"], title=None)
    assert patching.data[0].zmin == -0.8 and patching.data[0].zmax == 0.8


def tile_screen_pixels(figure: go.Figure, nrows: int, ncols: int) -> tuple[float, float]:
    """A thumbnail mosaic's tile size on screen, read off its layout: the plot area (the figure
    less its margins) divided among the rows and columns."""
    layout = figure.layout
    area_w = layout.width - layout.margin.l - layout.margin.r
    area_h = layout.height - layout.margin.t - layout.margin.b
    return area_h / nrows, area_w / ncols


@pytest.mark.parametrize(
    "layers, heads, grid, title",
    [
        (12, 6, (14, 14), None),
        (12, 12, (37, 37), "t"),
        (24, 16, (16, 16), None),
        (2, 3, (7, 5), None),
        (12, 4, (14, 14), None),
    ],
)
def test_thumbnail_tiles_are_at_least_120_pixels_and_square_celled(layers, heads, grid, title):
    """The Attention page's layers × heads mosaic (heads + mean per row): the figure is sized to
    its tiles, every tile at least 120 px on its shorter side (a row too wide for the page's column
    wraps onto sub-rows), no wider than the column, cells square, the plot area not grown by
    automatic margins."""
    gh, gw = grid
    n = layers * (heads + 1)
    figure = plots.mosaic(
        np.random.default_rng(0).random((n, gh, gw)),
        heads + 1,
        tile_names=[str(i) for i in range(n)],
        col_labels=[str(h) for h in range(heads + 1)],
        row_labels=[str(r) for r in range(layers)],
        x_title="head",
        y_title="layer",
        title=title,
    )
    margins = figure.layout.margin.l + figure.layout.margin.r
    per_row = int((plots.mosaics.THUMBNAIL_MAX_WIDTH - margins) // (plots.mosaics.THUMBNAIL_PIXELS * gw / min(gh, gw)))
    sub_rows = -(-(heads + 1) // per_row)
    tile_h, tile_w = tile_screen_pixels(figure, layers * sub_rows, -(-(heads + 1) // sub_rows))
    assert min(tile_h, tile_w) >= plots.mosaics.THUMBNAIL_PIXELS - 0.5
    assert figure.layout.width <= plots.mosaics.THUMBNAIL_MAX_WIDTH  # the page does not shrink it (nor its colour bar)
    assert tile_h / gh == pytest.approx(tile_w / gw, rel=0.02)  # square cells: the plot area has the tiles' shape
    assert figure.layout.xaxis.automargin is False and figure.layout.yaxis.automargin is False


def test_a_ViT_S_layers_by_heads_mosaic_fits_one_row_per_layer_at_120_pixels():
    """6 heads and the mean: seven 120 px tiles fit the page's 980 px column with the margins."""
    figure = plots.mosaic(
        np.zeros((12 * 7, 14, 14)),
        7,
        tile_names=[str(i) for i in range(84)],
        col_labels=[*map(str, range(6)), "mean"],
        row_labels=[str(r) for r in range(12)],
        x_title="head",
        y_title="layer",
    )
    assert list(figure.layout.xaxis.ticktext) == ["0", "1", "2", "3", "4", "5", "mean"]
    assert tile_screen_pixels(figure, 12, 7) == pytest.approx((120.5, 120.5), abs=0.1)  # 0.5 px of slack for plotly


def test_a_row_too_wide_for_the_column_wraps_and_every_tile_lands_where_its_label_says():
    """12 heads + mean at 120 px do not fit 980 px: each layer's row wraps onto two sub-rows of 7 and
    6 tiles. Every tile's values are drawn at the place its click marker, its column label and its
    row label name, read back from the figure."""
    layers, heads, (gh, gw) = 3, 12, (5, 4)
    n = layers * (heads + 1)
    tiles = np.random.default_rng(1).random((n, gh, gw)).astype(np.float32)
    labels = [*map(str, range(heads)), "mean"]
    figure = plots.mosaic(
        tiles,
        heads + 1,
        tile_names=[f"L{i // 13} {labels[i % 13]}" for i in range(n)],
        col_labels=labels,
        row_labels=["a", "b", "c"],
        x_title="head",
        y_title="layer",
        highlight=20,
    )
    z = np.asarray(figure.data[0].z, dtype=np.float32)
    assert z.shape == (layers * 2 * gh, 7 * gw)
    marker = figure.data[-1]
    xticks = dict(zip(figure.layout.xaxis.tickvals, figure.layout.xaxis.ticktext))
    yticks = dict(zip(figure.layout.yaxis.tickvals, figure.layout.yaxis.ticktext))
    for i in range(n):
        x, y, index = marker.x[i], marker.y[i], int(marker.customdata[i][0])
        assert index == i
        col, row = int(x // gw), int(y // gh)
        np.testing.assert_array_equal(z[row * gh : (row + 1) * gh, col * gw : (col + 1) * gw], tiles[i])
        layer, head = divmod(i, heads + 1)
        assert row // 2 == layer and labels[head] in xticks[(col + 0.5) * gw].split(" / ")
        assert xticks[(col + 0.5) * gw].split(" / ")[row % 2] == labels[head]  # upper label: upper sub-row
        assert yticks[(layer * 2 + 0.5) * gh] == "abc"[layer]  # the layer's label on its first sub-row
    assert "upper / lower" in figure.layout.xaxis.title.text
    highlight = figure.layout.shapes[-1]  # tile 20: layer 1, head 7: second sub-row, column 0
    assert (highlight.x0, highlight.y0) == (0, 3 * gh)
    assert len(z[np.isnan(z)]) == layers * gh * gw  # one empty slot per layer (13 tiles in 14 places)


def test_the_position_mosaic_of_a_big_grid_labels_every_kth_patch_and_zooms():
    similarity = np.random.default_rng(4).random((37, 37, 37, 37)) * 2 - 1
    figure = plots.position_similarity_mosaic(similarity)
    x, y = figure.layout.xaxis, figure.layout.yaxis
    assert list(x.ticktext) == [str(c) for c in range(0, 37, 4)] == list(y.ticktext)
    np.testing.assert_allclose(x.tickvals, (np.arange(0, 37, 4) + 0.5) * 37)  # the centre of column c's tiles
    assert x.showticklabels and y.showticklabels
    assert figure.layout.dragmode == "zoom" and y.scaleanchor == "x"  # a box zoom keeps cells square
    small = plots.position_similarity_mosaic(similarity[:14, :14, :14, :14])
    assert list(small.layout.xaxis.ticktext) == [str(c) for c in range(14)]  # a small grid: every patch
    tile = plots.similarity_tile(similarity[3, 5], (3, 5))
    assert (tile.layout.xaxis.dtick, tile.layout.yaxis.dtick, tile.layout.xaxis.tickmode) == (4, 4, "linear")
    assert tile.layout.dragmode == "zoom" and tile.layout.yaxis.scaleanchor == "x"


@pytest.mark.parametrize("n, step", [(1, 1), (14, 1), (24, 1), (25, 4), (37, 4), (64, 10), (300, 25)])
def test_grid_ticks_label_every_kth_of_a_big_grid(n, step):
    from analysis.plots.ticks import MAX_GRID_TICKS, grid_tick_step, grid_ticks

    assert grid_tick_step(n) == step and grid_ticks(n) == list(range(0, n, step))
    assert len(grid_ticks(n)) <= max(MAX_GRID_TICKS, 24)


def test_grouped_bars_draw_each_value_on_its_bar_and_nan_as_no_bar():
    from analysis.plots import grouped_bars

    figure = grouped_bars(["edges", "kuwahara"], [("ViT", [0.25, float("nan")]), ("CNN", [1.0, 0.5])], y_title="y")
    bars = [trace for trace in figure.data if trace.type == "bar"]
    assert [b.name for b in bars] == ["ViT", "CNN"] and figure.layout.barmode == "group"
    assert list(bars[0].x) == ["edges", "kuwahara"]
    assert list(bars[0].y) == [0.25, None] and list(bars[0].text) == ["0.25", "n/a"]
    assert list(bars[1].y) == [1.0, 0.5] and list(bars[1].text) == ["1.00", "0.50"]


def test_robustness_curves_draw_a_control_line_dashed_in_its_owners_colour():
    from analysis.plots import robustness_curves

    levels = [1, 2]
    figure = robustness_curves(
        [("ViT", levels, [0.9, 0.8]), ("CNN", levels, [0.7, 0.6]), ("CNN, noise patch", levels, [0.75, 0.7])],
        x_title="x",
        y_title="y",
        x_dtick=1,
        dashed=["CNN, noise patch"],
    )
    vit, cnn, noise = figure.data
    assert noise.line.color == cnn.line.color != vit.line.color
    assert noise.line.dash == "dash" and cnn.line.dash is None and figure.layout.xaxis.dtick == 1


def test_robust_scaled_divides_the_positive_part_by_its_99th_percentile_without_the_outliers():
    from analysis.plots import robust_scaled

    rng = np.random.default_rng(0)
    grid_map = rng.normal(size=(10, 10))
    grid_map[3, 4] = 50.0  # an artifact cell
    outliers = (34,)
    kept = [max(float(v), 0.0) for i, v in enumerate(grid_map.ravel()) if i not in outliers]
    kept.sort()
    position = 0.99 * (len(kept) - 1)  # numpy's linear quantile, written out
    low = int(position)
    top = kept[low] + (position - low) * (kept[low + 1] - kept[low])
    scaled, found = robust_scaled(grid_map, left_out=outliers)
    assert found == pytest.approx(top, rel=1e-12)
    np.testing.assert_allclose(scaled, np.clip(grid_map, 0, None) / top, rtol=1e-6)
    assert scaled[3, 4] > 1  # the artifact cell is above the scale: drawn clipped and outlined
    sparse = np.zeros((20, 20))
    sparse[0, 0] = 2.0  # 0 in all but 1 of 400 cells: the 99th percentile is 0, the peak is the top
    np.testing.assert_array_equal(robust_scaled(sparse)[0], sparse / 2.0)
    assert robust_scaled(np.zeros((2, 2)))[1] == 0.0
    with_nan = np.array([[np.nan, 1.0], [2.0, -1.0]])
    scaled, _ = robust_scaled(with_nan)
    assert np.isnan(scaled[0, 0]) and scaled[1, 1] == 0.0


@pytest.mark.parametrize("name", plots.COLORSCALES)
def test_every_colour_scale_reaches_the_figure_stop_for_stop_and_never_as_hex(name):
    """Each scale the app offers is drawn as plotly's own stops, each written ``rgb(...)``: Streamlit's
    front end swaps a few hex colours of its theme wherever they appear (Magma's and Inferno's first
    stop, ``#000004``, came out pink). The browser test draws Viridis, Magma and Cividis this way."""
    import plotly.colors

    figure = plots.attention_overlay(np.zeros((8, 8, 3), np.uint8), (8, 8), np.eye(4), (2, 2), colorscale=name)
    stops = trace(figure, "heatmap").colorscale
    expected = plotly.colors.get_colorscale(name)
    assert [position for position, _ in stops] == pytest.approx([position for position, _ in expected])
    for (_, drawn), (_, true) in zip(stops, expected):
        assert drawn.startswith("rgb("), drawn
        want = plotly.colors.hex_to_rgb(true) if true.startswith("#") else plotly.colors.unlabel_rgb(true)
        assert plotly.colors.unlabel_rgb(drawn) == pytest.approx(tuple(float(v) for v in want)), (name, drawn, true)
