"""The library facts the Rollout, Distance and Robustness pages ask instead of the kind of model:
each on the demo ViT (one global grid, a class token) and the demo Swin (windows on stage grids),
against what the pages computed by kind before, written out by hand."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

import analysis
from analysis.attention.rollout import rollout_uniform_level
from analysis.model.windowed_support import is_model_refusal, refuse_windowed
from analysis.records.queries import query_for_layers
from analysis.robustness import (
    SALIENCY_NAMES,
    check_token_drop,
    is_last_layer_attention,
    probe,
    saliency_description,
)
from analysis.views.attention_view import rollout_view_rows, view_layout
from conftest import random_pixels


@pytest.fixture(scope="module")
def demo():
    return analysis.load_vit("demo")


@pytest.fixture(scope="module")
def swin():
    return analysis.load_vit("demo_swin")


def test_the_demo_models_are_the_two_kinds(demo, swin):
    assert demo.spec.attends_globally and not swin.spec.attends_globally
    assert demo.spec.grid_size == (8, 8) and demo.spec.patch_size == (6, 6) and demo.spec.num_prefix_tokens == 1
    assert swin.spec.grid_size == (12, 12) and swin.spec.patch_size == (4, 4) and swin.spec.num_layers == 6


# --------------------------------------------------------------------------- query_for_layers


def test_a_vit_query_is_unchanged(demo):
    for query in ("mean", "cls", "prefix:0", 0, 13, 63, (10, 20)):
        assert query_for_layers(demo.spec, query) == query


def test_a_windowed_patch_query_becomes_the_pixel_at_its_centre(swin):
    spec = swin.spec
    assert query_for_layers(spec, 0) == (2, 2)
    assert query_for_layers(spec, 13) == (6, 6)  # row 1, column 1 of 4 px patches
    assert query_for_layers(spec, 23) == (6, 46)  # row 1, column 11
    assert query_for_layers(spec, 143) == (46, 46)
    assert query_for_layers(spec, "mean") == "mean" and query_for_layers(spec, (5, 7)) == (5, 7)
    for patch in range(144):  # the page's rule before: vizapp.layer_grids.query_pixel, written out
        r, c = divmod(patch, 12)
        pixel = query_for_layers(spec, patch)
        assert pixel == (r * 4 + 2, c * 4 + 2)
        for layer in range(spec.num_layers):  # every layer reads the cell under the patch's centre
            geometry = spec.geometry(layer)
            sy, sx = geometry.stride
            assert geometry.cell_of_pixel(*pixel) == (r * 4 // sy) * geometry.grid_size[1] + (c * 4 // sx)
    with pytest.raises(analysis.AnalysisError, match="outside the 12x12 grid"):
        query_for_layers(spec, 144)


# --------------------------------------------------------------------------- rollout_uniform_level


def test_a_vit_rollout_uniform_level_is_one_over_its_tokens(demo):
    for start in range(demo.spec.num_layers):
        assert rollout_uniform_level(demo.spec, start) == 1 / 65 == 1 / demo.spec.num_tokens  # 1 class + 8x8
    with pytest.raises(analysis.AnalysisError):
        rollout_uniform_level(demo.spec, 4)


@pytest.mark.filterwarnings("ignore:This rollout crosses patch merging:RuntimeWarning")
def test_a_windowed_rollout_uniform_level_is_one_over_the_cells_of_its_map(swin):
    record = analysis.capture_attention(swin, random_pixels(swin, 1))
    expected = {0: 1 / 144, 1: 1 / 144, 2: 1 / 36, 3: 1 / 36, 4: 1 / 9, 5: 1 / 9}  # 12x12, 6x6, 3x3 stage grids
    for start, level in expected.items():
        assert rollout_uniform_level(swin.spec, start) == level
        strip = analysis.attention_rollout_by_layer(
            record, start_layer=start, query="mean", merge="mean_2x2"
        )  # (steps, 1, gh, gw): the page's map, across patch merging
        assert rollout_uniform_level(swin.spec, start) == 1 / strip[-1, 0].numel()  # the page's rule before
    for stage, first in ((0, 0), (1, 2), (2, 4)):
        strip = analysis.attention_rollout_by_layer(record, stage=stage, query="mean")
        assert rollout_uniform_level(swin.spec, first) == 1 / strip[-1, 0].numel()


# --------------------------------------------------------------------------- the rollout view's layout


def test_the_rollout_view_is_defined_for_a_vit_only(demo, swin):
    vit_record = analysis.capture_attention(demo, random_pixels(demo, 1))
    assert view_layout(demo.spec) == view_layout(demo) == view_layout(vit_record) == "tokens"
    ends, rows = rollout_view_rows(vit_record)
    assert ends == [0, 1, 2, 3] and rows.shape == (4, 1, 66, 64)
    swin_record = analysis.capture_attention(swin, random_pixels(swin, 1))
    assert view_layout(swin.spec) == view_layout(swin) == view_layout(swin_record) == "windows"
    with pytest.raises(analysis.AnalysisError):
        rollout_view_rows(swin_record)


# --------------------------------------------------------------------------- uniform_distance_reference


def _mean_pair_distance(cells: list[tuple[int, int]], stride: tuple[int, int]) -> float:
    """Mean over every (query, key) pair of cells of the distance between their centres, by loops."""
    total = 0.0
    for (r1, c1), (r2, c2) in itertools.product(cells, cells):
        total += math.hypot((r1 - r2) * stride[0], (c1 - c2) * stride[1])
    return total / len(cells) ** 2


def test_a_vit_has_one_uniform_distance_for_every_layer(demo):
    reference = analysis.uniform_distance_reference(demo.spec)
    by_hand = _mean_pair_distance([(r, c) for r in range(8) for c in range(8)], (6, 6))
    assert not reference.per_layer
    assert reference.value == pytest.approx(by_hand, rel=1e-12)
    assert reference.value == analysis.uniform_attention_distance(demo.spec)  # the page's number before
    assert reference.values.dtype == torch.float64 and reference.values.tolist() == [reference.value] * 4
    from_model = analysis.uniform_distance_reference(demo)  # a LoadedViT: its spec
    assert not from_model.per_layer and torch.equal(from_model.values, reference.values)


def test_a_windowed_model_has_one_uniform_distance_per_layer(swin):
    reference = analysis.uniform_distance_reference(swin.spec)
    assert reference.per_layer and reference.values.shape == (6,)
    torch.testing.assert_close(  # the page's numbers before
        reference.values, analysis.uniform_attention_distance_by_layer(swin.spec), rtol=0, atol=0
    )
    # layer 0: 6x6 windows of 4 px cells, no shift, no padding: every query sees its own 6x6 block
    assert reference.values[0].item() == pytest.approx(
        _mean_pair_distance([(r, c) for r in range(6) for c in range(6)], (4, 4)), rel=1e-12
    )
    # layers 4, 5: one 3x3 window over the whole 3x3 grid of 16 px cells
    block = _mean_pair_distance([(r, c) for r in range(3) for c in range(3)], (16, 16))
    assert reference.values[4].item() == pytest.approx(block, rel=1e-12)
    assert reference.values[5].item() == pytest.approx(block, rel=1e-12)
    with pytest.raises(analysis.AnalysisError, match="one uniform-attention reference per layer"):
        _ = reference.value


# --------------------------------------------------------------------------- is_model_refusal


def test_a_windowed_refusal_is_told_from_a_failure(demo, swin):
    with pytest.raises(analysis.AnalysisError) as token_drop:
        check_token_drop(swin)
    assert is_model_refusal(token_drop.value)
    with pytest.raises(analysis.AnalysisError) as single_distance:
        analysis.uniform_attention_distance(swin.spec)
    assert is_model_refusal(single_distance.value)
    with pytest.raises(analysis.AnalysisError) as generic:
        refuse_windowed(swin.spec, "something")
    assert is_model_refusal(generic.value)
    with pytest.raises(analysis.AnalysisError) as patches:  # a Swin's failure that is no refusal of the kind
        analysis.distance_unit_length(swin.spec, "patches")
    assert not is_model_refusal(patches.value)  # alone: not raised as a refusal of windowed attention
    assert is_model_refusal(patches.value, swin.spec) and is_model_refusal(patches.value, swin)  # a windowed model's
    assert not is_model_refusal(ValueError("not an analysis"), swin.spec)
    with pytest.raises(analysis.AnalysisError) as vit_error:
        analysis.distance_unit_length(demo.spec, "furlongs")
    assert not is_model_refusal(vit_error.value) and not is_model_refusal(vit_error.value, demo.spec)  # a failure
    assert not is_model_refusal(analysis.AnalysisError("a failure")) and not is_model_refusal(ValueError("x"))
    refuse_windowed(demo.spec, "something")  # a ViT: nothing to refuse


# --------------------------------------------------------------------------- saliency_description


def test_a_probe_says_what_its_map_is(demo, swin):
    vit_probe = probe(demo, random_pixels(demo, 1), "noise", 0.0)
    assert vit_probe.saliency_name == "class-token attention rollout" and not is_last_layer_attention(
        vit_probe.saliency_name
    )
    assert saliency_description(vit_probe.saliency_name, tuple(vit_probe.saliency.shape), (48, 48)) == (
        "class-token attention rollout"
    )
    swin_probe = probe(swin, random_pixels(swin, 1), "noise", 0.0)
    assert tuple(swin_probe.saliency.shape) == (3, 3) and is_last_layer_attention(swin_probe.saliency_name)
    assert saliency_description(swin_probe.saliency_name, tuple(swin_probe.saliency.shape), (48, 48)) == (
        "last layer's attention, mean over every query cell and head, on the last layer's 3×3 grid "
        "(16 px cells; no rollout across windows and stages)"
    )
    assert saliency_description(SALIENCY_NAMES["windowed"], (6, 4), (48, 48)) == (  # gh = 6, gw = 4
        "last layer's attention, mean over every query cell and head, on the last layer's 4×6 grid "
        "(12 px cells; no rollout across windows and stages)"
    )
    assert saliency_description(SALIENCY_NAMES["cnn"], (7, 7), (224, 224)) == "Grad-CAM"


# --------------------------------------------------------------------------- LayerGeometry.uniform_attention
def _uniform_attention_map(geometry, query_cell: int | None) -> np.ndarray:
    """By construction: every query spreads 1 evenly over its window's ``Wt`` slots (padding
    included); the key cells' map of one query's row, or the mean over every cell's query."""
    cells = geometry.window_cells()  # (windows, Wt), -1 for padding
    gh, gw = geometry.grid_size
    received = np.zeros((gh * gw, gh * gw))  # (query cell, key cell)
    for window in cells.tolist():
        real = [c for c in window if c >= 0]
        for query in real:
            for key in real:
                received[query, key] += 1 / len(window)
    return received[query_cell] if query_cell is not None else received.mean(axis=0)


def test_uniform_attention_is_what_uniform_attention_gives_a_key_cell(demo, swin):
    for layer in range(swin.spec.num_layers):
        geometry = swin.spec.geometry(layer)
        gh, gw = geometry.grid_size
        if geometry.padded_grid != geometry.grid_size:
            continue  # padding: the rule is exact only without it (its docstring)
        row = _uniform_attention_map(geometry, query_cell=(gh // 2) * gw + gw // 2)
        assert geometry.uniform_attention() == pytest.approx(row[row > 0].max(), rel=1e-12)
        mean = _uniform_attention_map(geometry, query_cell=None)
        np.testing.assert_allclose(mean, geometry.uniform_attention(mean_query=True), rtol=1e-12)
    vit_geometry = demo.spec.geometry(0)
    assert (
        vit_geometry.uniform_attention() == vit_geometry.uniform_attention(mean_query=True) == 1 / demo.spec.num_tokens
    )
