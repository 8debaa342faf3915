"""The small derivations that the app's pages show, as library functions (issue 27, item 5):
the attention-pooling head's map, record slicing, per-map peak scaling, the same query and
layer in another model (similarity against distance: tests/test_app.py). Each against explicit loops."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import analysis
from analysis import (
    capture_attention,
    corresponding_layer,
    corresponding_query,
    pooling_attention_map,
    scale_by_peak,
)
from tests.conftest import random_pixels


@pytest.fixture(scope="module")
def siglip():
    torch.manual_seed(0)
    return analysis.load_vit(
        "vit_base_patch16_siglip_224", pretrained=False, device="cpu", img_size=48, depth=2, embed_dim=96, num_heads=4
    )


def test_pooling_attention_map_is_the_probe_row_over_the_patches(siglip):
    record = capture_attention(siglip, random_pixels(siglip, batch=2))
    pool = record.pool_attention  # (B, heads, probes, T)
    assert pool is not None
    spec = record.spec
    gh, gw = spec.grid_size
    prefix = spec.num_prefix_tokens
    heads = pool.shape[1]
    for head in [None, *range(heads)]:
        got = pooling_attention_map(record, head=head)
        expected = torch.zeros(2, gh, gw)
        for b in range(2):
            for i in range(gh):
                for j in range(gw):
                    chosen = range(heads) if head is None else [head]
                    expected[b, i, j] = sum(float(pool[b, h, 0, prefix + i * gw + j]) for h in chosen) / len(chosen)
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)
    with pytest.raises(analysis.AnalysisError, match="head"):
        pooling_attention_map(record, head=heads)


def test_pooling_attention_map_is_none_without_a_pooling_head(vits):
    vit = vits["class_token"]
    assert pooling_attention_map(capture_attention(vit, random_pixels(vit, batch=1))) is None


def test_select_layers_keeps_the_order_asked_and_views_consecutive_layers(vits):
    vit = vits["class_token"]  # 3 layers
    pixels = random_pixels(vit, batch=1)
    record = capture_attention(vit, pixels)
    for layers in ([2, 0], [1], [0, 1], [1, 2]):
        chosen = record.select_layers(layers)
        assert chosen.layers == tuple(layers)
        for position, layer in enumerate(layers):
            assert torch.equal(chosen.attentions[position], record.attentions[layer])
            assert torch.equal(analysis.attention_map(chosen, layer), analysis.attention_map(record, layer))
    consecutive = record.select_layers([1, 2])
    assert consecutive.attentions.untyped_storage().data_ptr() == record.attentions.untyped_storage().data_ptr()
    with pytest.raises(analysis.AnalysisError, match="not captured"):
        record.select_layers([0]).select_layers([1])
    with pytest.raises(analysis.AnalysisError, match="at least one"):
        record.select_layers([])


def test_scale_by_peak_divides_each_map_by_its_largest_magnitude():
    maps = np.array([[[1.0, -4.0], [2.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]], [[np.nan, 3.0], [1.5, 0.0]]])
    kept = scale_by_peak(maps)
    np.testing.assert_array_equal(kept[0], [[0.25, -1.0], [0.5, 0.0]])
    np.testing.assert_array_equal(kept[1], np.zeros((2, 2)))
    np.testing.assert_array_equal(kept[2], [[np.nan, 1.0], [0.5, 0.0]])
    np.testing.assert_array_equal(scale_by_peak(maps, negative="zero")[0], [[0.25, 0.0], [0.5, 0.0]])
    with pytest.raises(analysis.AnalysisError, match="negative"):
        scale_by_peak(maps, negative="abs")
    with pytest.raises(analysis.AnalysisError, match="1 map value.*infinite"):
        scale_by_peak(np.array([[[1.0, np.inf], [0.0, 2.0]]]))


def test_corresponding_query_and_layer():
    assert corresponding_query("cls", (14, 14), (16, 16), False) == "mean"
    assert corresponding_query("prefix:0", (14, 14), (16, 16), True, from_has_class_token=True) == "cls"
    # a registers-only model's prefix 0 is a register, not the other model's class token
    assert corresponding_query("prefix:0", (14, 14), (16, 16), True, from_has_class_token=False) == "mean"
    with pytest.raises(analysis.AnalysisError, match="from_has_class_token"):
        corresponding_query("prefix:0", (14, 14), (16, 16), True)
    with pytest.raises(analysis.AnalysisError, match="patch_of_pixel"):
        corresponding_query((3, 4), (14, 14), (16, 16), True)
    assert corresponding_query("prefix:2", (14, 14), (16, 16), True) == "mean"
    assert corresponding_query(0, (14, 14), (16, 16), True) == 0
    assert corresponding_query(14 * 14 - 1, (14, 14), (16, 16), True) == 16 * 16 - 1
    # every patch: the target patch contains the source patch's centre (a loop over pixels' fractions)
    for source_grid, target_grid in [((14, 14), (6, 6)), ((3, 5), (7, 4))]:
        for index in range(source_grid[0] * source_grid[1]):
            r, c = divmod(index, source_grid[1])
            centre_y, centre_x = (r + 0.5) / source_grid[0], (c + 0.5) / source_grid[1]
            r2, c2 = divmod(corresponding_query(index, source_grid, target_grid, True), target_grid[1])
            assert r2 / target_grid[0] <= centre_y < (r2 + 1) / target_grid[0]
            assert c2 / target_grid[1] <= centre_x < (c2 + 1) / target_grid[1]
    assert corresponding_layer(11, 12, 24) == 23 and corresponding_layer(0, 12, 24) == 0
    assert corresponding_layer(6, 12, 6) == round(6 * 5 / 11)
    assert corresponding_layer(3, 1, 4) == 3 and corresponding_layer(3, 8, 1) == 0


def test_default_colour_range_keeps_a_uniform_map_pale():
    from analysis.plots import UNIFORM_FLOOR, colour_range, layer_scaled

    tokens = 197
    flat = np.full((14, 14), 1 / tokens) + np.linspace(0, 1e-6, 196).reshape(14, 14)
    lo, hi, label = colour_range("zero", flat, uniform=1 / tokens)
    assert (lo, hi) == (0.0, pytest.approx(UNIFORM_FLOOR / tokens))
    assert flat.max() / hi < 1 / UNIFORM_FLOOR + 0.01 and f"uniform {1 / tokens:.2g} (top {UNIFORM_FLOOR:g}×)" in label
    sharp = np.zeros((14, 14))
    sharp[3, 4] = 0.9
    assert colour_range("zero", sharp, uniform=1 / tokens)[:2] == (0.0, 0.9)  # a real peak spans the scale
    assert colour_range("zero", flat)[1] == flat.max()  # not a probability: plain 0–max
    assert colour_range("minmax", flat, uniform=1 / tokens)[:2] == (flat.min(), flat.max())
    # per layer: one top per layer, at least the floor
    maps = np.stack([np.stack([flat, flat * 1.1]), np.stack([sharp, flat])])  # (L=2, n=2, 14, 14)
    scaled, tops = layer_scaled(maps, uniform=1 / tokens)
    np.testing.assert_allclose(tops, [UNIFORM_FLOOR / tokens, 0.9], rtol=1e-6)
    for layer in range(2):
        for index in range(2):
            np.testing.assert_allclose(scaled[layer, index], maps[layer, index] / tops[layer], rtol=1e-6)
    assert scaled[0].max() < 1.1 / UNIFORM_FLOOR + 0.01 and scaled[1].max() == pytest.approx(1.0)


def test_colour_range_of_a_map_with_nan_cells():
    from analysis.plots import colour_range

    blank = np.full((3, 3), np.nan)
    lo, hi, label = colour_range("zero", blank, uniform=0.1)
    assert (lo, hi) == (0.0, pytest.approx(0.15)) and "nan" not in label  # UNIFORM_FLOOR × 0.1
    lo, hi, label = colour_range("minmax", blank)
    assert np.isfinite([lo, hi]).all() and hi > lo and "nan" not in label
    partly = np.array([[np.nan, 0.2], [0.1, 0.05]])
    assert colour_range("minmax", partly)[:2] == (0.05, 0.2)


def test_scale_min_max_stretches_each_map_by_a_written_out_loop():
    """analysis.maps.scaling.scale_min_max against (m − min) / (max − min) cell by cell; a constant map is 0."""
    import torch

    from analysis.maps.scaling import scale_min_max

    maps = torch.tensor([[[1.0, 3.0], [2.0, 5.0]], [[-2.0, -2.0], [-2.0, -2.0]], [[0.5, -1.5], [4.5, 0.0]]])
    got = scale_min_max(maps)
    for b in range(3):
        cells = [float(v) for v in maps[b].flatten()]
        low, high = min(cells), max(cells)
        for i in range(2):
            for j in range(2):
                want = 0.0 if high == low else (float(maps[b, i, j]) - low) / (high - low)
                assert abs(float(got[b, i, j]) - want) < 1e-7
    assert got.dtype == maps.dtype and got.shape == maps.shape


def test_a_real_rollout_keeps_its_own_top_and_the_bar_marks_uniform():
    """An ImageNet ViT-Ti/16's rollout stays under 2× uniform (99th percentile 0.0083, maximum
    0.0096, T = 197): a top of 4× uniform left every cell under half the scale (the Rollout page's
    Figure 6 uniformly dim). The default range tops out at its own 99th percentile, and the
    acceptance shares hold: the brightest 1% reach 60% of the scale, 20% of the cells lie above a
    tenth of it, at most 10% in its top 5%."""
    from analysis.plots import UNIFORM_FLOOR, colour_bar_ticks, colour_range

    tokens = 197
    uniform = 1 / tokens
    rng = np.random.default_rng(0)
    rollout = np.clip(rng.normal(0.0049, 0.0014, (14, 14)), 0.002, None)
    rollout.flat[:3] = (0.0083, 0.009, 0.0096)  # the object's few brightest cells
    lo, hi, label = colour_range("robust", rollout, uniform=uniform)
    p99 = np.quantile(rollout, 0.99)
    assert p99 > UNIFORM_FLOOR * uniform and hi == pytest.approx(p99) and lo == 0
    assert f"(top {hi / uniform:.2g}×)" in label
    assert np.quantile(rollout, 0.99) / (4 * uniform) < 0.6  # the old floor: the brightest 1% under 60%
    assert np.quantile(rollout, 0.99) / hi >= 0.6
    assert (rollout > 0.1 * hi).mean() >= 0.2 and (rollout > 0.95 * hi).mean() <= 0.1

    ticks = colour_bar_ticks(lo, hi, uniform=uniform)
    values, texts = ticks["tickvals"], ticks["ticktext"]
    assert values == sorted(values) and all(lo <= v <= hi for v in values)
    assert dict(zip(texts, values))[f"uniform {uniform:.2g}"] == uniform
    round_values = [v for v, t in zip(values, texts) if not t.startswith("uniform")]
    step = round_values[1] - round_values[0]
    assert len(round_values) >= 3 and step == pytest.approx(0.0025)
    assert all(abs(v - uniform) > step / 3 for v in round_values)
    assert all(abs(v / step - round(v / step)) < 1e-9 for v in round_values)
    assert not any(t.startswith("uniform") for t in colour_bar_ticks(0.0, 0.004, uniform=uniform)["ticktext"])
    assert colour_bar_ticks(0.5, 0.5) == {}
