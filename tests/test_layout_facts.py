"""Layout facts the pages ask instead of branching on the kind of model, on a ViT (``demo``: 6 px
patches, an 8×8 grid, a class token, 4 layers × 4 heads) and a windowed model (``demo_swin``:
4 px patches, stage grids 12×12 → 6×6 → 3×3, 2/4/8 heads, 6 layers). Each is checked against the
value the pages computed by hand before the fact existed, written out here."""

from __future__ import annotations

import math

import pytest
import torch
from PIL import Image

import analysis
from analysis.attention.rollout import patch_grid_rollout
from analysis.demo.data import render_sample
from analysis.records.queries import default_query, query_for_layers, resolve_query
from analysis.robustness import load_cnn, measures_patch_attention
from analysis.tokens import capture_limits


@pytest.fixture(scope="module")
def vit():
    return analysis.load_vit("demo")


@pytest.fixture(scope="module")
def swin():
    return analysis.load_vit("demo_swin")


@pytest.fixture(scope="module")
def pixels(vit, swin):
    image = Image.fromarray(render_sample(7, 3, 96)[0])
    return vit.preprocess(image), swin.preprocess(image)


def old_resolution_step(spec) -> int:
    """The sidebar's rule before ``resolution_step``: lcm of the patch sides, doubled per stage after the first."""
    step = math.lcm(*spec.patch_size)
    if spec.layer_geometry:
        step *= 2 ** (len({g.stage for g in spec.layer_geometry}) - 1)
    return step


def test_resolution_step(vit, swin):
    assert vit.spec.resolution_step == 6 == old_resolution_step(vit.spec)
    assert swin.spec.resolution_step == 16 == old_resolution_step(swin.spec)  # 4 px · 2 mergings
    for spec in (vit.spec, swin.spec):  # whole cells on every layer's grid
        assert all(spec.resolution_step % side == 0 for g in spec.geometries() for side in g.stride)


def test_layout_summary(vit, swin):
    from vizapp.state import layout_summary

    assert layout_summary(vit.spec) == ("patch 6×6 px · grid 8×8", "4 layers × 4 heads · 1 prefix token")
    assert layout_summary(swin.spec) == (
        "patch 4×4 px · stage grids 12×12 → 6×6 → 3×3",
        "6 layers · heads per stage 2/4/8 · windowed attention (SwinTransformer)",
    )
    pooled = analysis.ViTSpec(
        patch_size=(16, 8),
        grid_size=(3, 5),
        num_prefix_tokens=4,
        num_layers=2,
        num_heads=6,
        embed_dim=12,
        img_size=(48, 40),
        has_class_token=False,
    )  # width × height, plural tokens, no class token
    assert layout_summary(pooled) == (
        "patch 8×16 px · grid 5×3",
        "2 layers × 6 heads · 4 prefix tokens, no class token",
    )


def test_headless_output_and_outlier_grid(vit, swin):
    from vizapp.ui import headless_output

    assert headless_output(vit.spec) == "pooled features"
    assert headless_output(swin.spec) == "features"
    assert vit.spec.outlier_grid == (8, 8)
    assert swin.spec.outlier_grid is None


def test_patch_centre_and_layer_cell(vit, swin):
    assert vit.spec.patch_centre(10) == (1 * 6 + 3, 2 * 6 + 3)  # row 1, column 2 of 8
    assert swin.spec.patch_centre(5) == (2, 22)
    assert swin.spec.patch_centre(13) == (1 * 4 + 2, 1 * 4 + 2)
    for spec in (vit.spec, swin.spec):
        (ph, pw), (gh, gw) = spec.patch_size, spec.grid_size
        for layer in range(spec.num_layers):
            g = spec.geometry(layer)
            for patch in range(gh * gw):
                y, x = (patch // gw) * ph + ph // 2, (patch % gw) * pw + pw // 2
                expected = min(y // g.stride[0], g.grid_size[0] - 1) * g.grid_size[1] + min(
                    x // g.stride[1], g.grid_size[1] - 1
                )
                assert spec.layer_cell(layer, patch) == expected
    assert [vit.spec.layer_cell(layer, 37) for layer in range(4)] == [37] * 4  # a ViT: the patch itself
    # Swin: patch 13 (row 1, column 1 of 12) lies in cell 0 of the 6×6 and of the 3×3 stage
    assert [swin.spec.layer_cell(layer, 13) for layer in range(6)] == [13, 13, 0, 0, 0, 0]


def test_a_vit_layer_geometry_reads_its_tokens_as_the_spec_does(vit, pixels):
    spec = vit.spec
    geometry = spec.geometry(2)
    assert geometry.class_token and geometry.prefix_tokens == 1 and geometry.stride == spec.patch_size
    assert default_query(geometry) == "cls"
    tokens = analysis.capture_tokens(vit, pixels[0]).layer_tokens(2)  # (1, T, D)
    rgb, fitted = analysis.feature_pca(tokens, geometry, foreground=True)
    rgb_spec, fitted_spec = analysis.feature_pca(tokens, spec, foreground=True)
    assert torch.equal(rgb, rgb_spec) and torch.equal(fitted, fitted_spec)
    flat = tokens[0].double()  # (T, D)
    for query, row in [("cls", flat[0]), ("prefix:0", flat[0]), (9, flat[1 + 9]), ((13, 40), flat[1 + 2 * 8 + 6])]:
        assert resolve_query(geometry, query) == resolve_query(spec, query)
        got = analysis.patch_similarity(tokens, geometry, query)
        expected = torch.tensor(
            [float(row @ flat[1 + p] / (row.norm() * flat[1 + p].norm())) for p in range(64)], dtype=torch.float64
        ).reshape(8, 8)  # cos(u, v) = u·v / (‖u‖‖v‖), patch by patch
        torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-6)
    mean = flat[1:].mean(0)
    torch.testing.assert_close(
        analysis.patch_similarity(tokens, geometry, "mean").double(),
        torch.nn.functional.cosine_similarity(flat[1:], mean[None], dim=-1).reshape(8, 8),
        rtol=1e-5,
        atol=1e-6,
    )


def test_query_for_layers(vit, swin, pixels):
    for query in ("cls", "mean", "prefix:0", 17, (5, 30)):
        assert query_for_layers(vit.spec, query) == query  # one grid: the query itself
    assert query_for_layers(swin.spec, "mean") == "mean"
    assert query_for_layers(swin.spec, (5, 30)) == (5, 30)
    assert query_for_layers(swin.spec, 5) == (2, 22)  # row 0, column 5 of 4 px cells: the centre pixel
    assert query_for_layers(swin.spec, 143) == (11 * 4 + 2, 11 * 4 + 2)
    # the Compare page's maps of a windowed model: each layer's map of the pixel is that of the cell under it
    record = analysis.capture_attention(swin, pixels[1])
    for layer in range(swin.spec.num_layers):
        cell = swin.spec.layer_cell(layer, 5)
        by_pixel = analysis.attention_map(record, layer, query=query_for_layers(swin.spec, 5))
        by_cell = analysis.attention_map(record, layer, query=cell)
        torch.testing.assert_close(by_pixel, by_cell)


def test_patch_grid_rollout(vit, swin, pixels):
    vit_record = analysis.capture_attention(vit, pixels[0])
    got = patch_grid_rollout(vit_record)
    assert got.shape == (1, 8, 8)
    torch.testing.assert_close(got, analysis.attention_rollout(vit_record))  # the probe's map before
    # the class token's row of Π_l (½·mean_h A_l + ½·I), row-normalised, written out layer by layer
    rollout = torch.eye(vit.spec.num_tokens, dtype=torch.float64)
    for layer in range(vit.spec.num_layers):
        a = vit_record.attentions[layer, 0].double().mean(0)  # (T, T)
        a = 0.5 * a + 0.5 * torch.eye(a.shape[0], dtype=torch.float64)
        a = a / a.sum(-1, keepdim=True)
        rollout = a @ rollout
    torch.testing.assert_close(got[0].double(), rollout[0, 1:].reshape(8, 8), rtol=1e-4, atol=1e-6)
    swin_record = analysis.capture_attention(swin, pixels[1])
    got = patch_grid_rollout(swin_record)
    assert got.shape == (1, 12, 12)  # the stem's patch grid, the grid token drops use
    torch.testing.assert_close(got, analysis.attention_rollout(swin_record, stage=0, query="mean"))


def test_measures_patch_attention(vit, swin):
    assert measures_patch_attention(vit)
    assert not measures_patch_attention(swin)  # attention per window
    assert not measures_patch_attention(load_cnn("demo", pretrained=False))  # no attention at all
    assert not measures_patch_attention(object())


def test_capture_limits(vit, swin):
    assert capture_limits(vit.spec) == ""
    assert capture_limits(swin.spec) == (
        "This SwinTransformer computes queries, keys and values window by window: only block outputs are "
        "defined, each layer on its own stage grid."
    )
    with pytest.raises(analysis.AnalysisError):  # what the sentence says
        analysis.capture_tokens(swin, torch.zeros(1, 3, *swin.spec.img_size), kind="query")
    analysis.capture_tokens(vit, torch.zeros(1, 3, *vit.spec.img_size), kind="query")  # every kind on a ViT
