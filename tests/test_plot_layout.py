"""The layout rules of analysis.plots.layout, on the figures that use them: colour bars as long
as their images' y domain, images that their height limits at the planned chart width, titles
wrapped to their panel and to their colour bar (the browser check is tests/test_browser_layout.py)."""

from __future__ import annotations

import html

import numpy as np
import pytest

from analysis import plots
from analysis.plots.layout import (
    CHAR_WIDTH,
    IMAGE_LEFT_PX,
    IMAGE_RIGHT_PX,
    chars_fitting,
    column_width,
    image_figure_height,
    line_count,
    wrap_label,
)

LONG_BAR_TITLE = "attention probability (0–p99: 0–0.012; 5 cells above, outlined)"


def _grey(h: int, w: int) -> np.ndarray:
    return np.full((h, w, 3), 128, np.uint8)


def _longest_line_px(label: str, font_size: float) -> float:
    return max(len(html.unescape(line)) for line in label.split("<br>")) * CHAR_WIDTH * font_size


def test_wrap_label_breaks_at_spaces_and_keeps_long_words():
    assert wrap_label("one two three four", 9) == "one two<br>three<br>four"
    assert wrap_label("abcdefghijkl mn", 5) == "abcdefghijkl<br>mn"
    assert line_count("a<br>b<br>c") == 3 and line_count("") == 0


@pytest.mark.parametrize(
    "titles",
    [
        [
            "ViT last layer's attention, mean over every query cell and head · clean",
            "ViT last layer's attention, mean over every query cell and head · perturbed",
            "CNN Grad-CAM · clean",
            "CNN Grad-CAM · perturbed",
        ],
        [f"demo_swin · layer {i}" for i in range(8)],
    ],
)
def test_panel_titles_fit_their_panel_and_have_room_above_their_row(titles):
    n = len(titles)
    ncols = 4
    figure = plots.map_panels(
        _grey(48, 48),
        (48, 48),
        [np.random.rand(8, 8) for _ in titles],
        (6, 6),
        titles,
        ncols=ncols,
        zmin=0.0,
        zmax=1.0,
        colorbar_title=LONG_BAR_TITLE,
        panel_height=300,
    )
    layout = figure.layout
    plot_width = plots.CHART_WIDTH_PX - IMAGE_LEFT_PX - IMAGE_RIGHT_PX
    panel_px = (layout.xaxis.domain[1] - layout.xaxis.domain[0]) * plot_width
    plot_height = layout.height - layout.margin.t - layout.margin.b
    for annotation in layout.annotations:
        assert _longest_line_px(annotation.text, annotation.font.size) <= panel_px, annotation.text
        lines_px = line_count(annotation.text) * annotation.font.size * 1.3
        row_top = annotation.y
        if row_top == 1:  # first row: its titles sit in the top margin
            assert lines_px <= layout.margin.t
        else:  # a lower row: in the gap below the row above
            above = min(
                layout[f"yaxis{k}"].domain[0] if k else layout.yaxis.domain[0]
                for k in ["", *range(2, n + 1)]
                if (layout[f"yaxis{k}"].domain[0] if k else layout.yaxis.domain[0]) > row_top
            )
            assert lines_px <= (above - row_top) * plot_height


def test_a_panel_grid_is_limited_by_its_height_and_its_colour_bar_spans_the_rows():
    figure = plots.map_panels(
        _grey(48, 96),
        (48, 96),
        [np.random.rand(8, 16) for _ in range(6)],
        (6, 6),
        [f"layer {i}" for i in range(6)],
        ncols=3,
        zmin=0.0,
        zmax=1.0,
        panel_height=400,
    )
    layout = figure.layout
    plot_width = plots.CHART_WIDTH_PX - IMAGE_LEFT_PX - IMAGE_RIGHT_PX
    plot_height = layout.height - layout.margin.t - layout.margin.b
    panel_w = (layout.xaxis.domain[1] - layout.xaxis.domain[0]) * plot_width
    panel_h = (layout.yaxis.domain[1] - layout.yaxis.domain[0]) * plot_height
    assert panel_h <= panel_w * 48 / 96 + 1e-6  # a 2:1 image: at most half as tall as its panel is wide
    bar = layout.coloraxis.colorbar
    rows = sorted({tuple(layout[name].domain) for name in layout if name.startswith("yaxis") and layout[name].domain})
    lo, hi = min(r[0] for r in rows), max(r[1] for r in rows)
    assert bar.lenmode == "fraction" and bar.yanchor == "middle"
    assert bar.len == pytest.approx(hi - lo) and bar.y == pytest.approx((lo + hi) / 2)


def test_two_models_get_a_colour_bar_each_beside_their_own_rows():
    figure = plots.map_panels(
        _grey(48, 48),
        (48, 48),
        [np.random.rand(8, 8) for _ in range(4)],
        (6, 6),
        ["a", "b", "c", "d"],
        ncols=2,
        slots=[0, 1, 2, 3],
        color_groups=[0, 0, 1, 1],
        group_ranges=[(0, 1, "first"), (0, 2, "second")],
    )
    layout = figure.layout
    top_row, bottom_row = layout.yaxis.domain, layout.yaxis3.domain
    for bar, row in ((layout.coloraxis.colorbar, top_row), (layout.coloraxis2.colorbar, bottom_row)):
        assert bar.len == pytest.approx(row[1] - row[0]) and bar.y == pytest.approx(sum(row) / 2)


def test_a_long_colour_bar_title_is_wrapped_to_the_bar_and_a_short_one_is_left_alone():
    figure = plots.attention_overlay(
        _grey(224, 224),
        (224, 224),
        np.random.rand(14, 14),
        (16, 16),
        zmin=0.0,
        colorbar_title=LONG_BAR_TITLE,
        chart_width=column_width(1 / 2),
    )
    heatmap = figure.data[1]
    _, plot_height = image_figure_height(560, (224, 224), column_width(1 / 2), titled=False)
    title = heatmap.colorbar.title.text
    assert "<br>" in title and title.replace("<br>", " ") == LONG_BAR_TITLE
    assert _longest_line_px(title, 12) <= plot_height * heatmap.colorbar.len
    short = plots.attention_overlay(
        _grey(224, 224), (224, 224), np.random.rand(14, 14), (16, 16), colorbar_title="cosine similarity"
    )
    assert short.data[1].colorbar.title.text == "cosine similarity"


@pytest.mark.parametrize("image_size", [(224, 224), (518, 518), (112, 336)])
@pytest.mark.parametrize("fraction", [1.0, 3 / 5, 1 / 2, 2 / 5])
def test_an_overlay_is_no_taller_than_its_chart_width_lets_it_be(image_size, fraction):
    width = column_width(fraction)
    figure = plots.attention_overlay(
        _grey(*image_size),
        image_size,
        np.random.rand(8, 8),
        (image_size[0] // 8, image_size[1] // 8),
        title="t",
        chart_width=width,
    )
    layout = figure.layout
    plot_height = layout.height - layout.margin.t - layout.margin.b
    plot_width = width - IMAGE_LEFT_PX - IMAGE_RIGHT_PX
    assert plot_height <= plot_width * image_size[0] / image_size[1] + 1  # its height limits the image
    assert figure.data[1].colorbar.len == 1.0


def test_chars_fitting_estimates_from_the_font_size():
    assert chars_fitting(110, 10) == 20 and chars_fitting(10, 14) == 8
