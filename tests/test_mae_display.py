"""What the Masked-autoencoder page draws (analysis.mae.display, analysis.plots.mae), against
explicit loops over pixels and patches."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from analysis import plots
from analysis.base.preprocessing import Preprocessing
from analysis.mae import draw_mask, figure_2_images, flip_patches, hidden_patch_loss, mae_reconstruct, unit_pixels


@pytest.fixture(scope="module")
def demo_pass():
    from tests.test_app import REPO

    if not (REPO / "assets" / "demo_mae" / "config.json").is_file():
        pytest.skip("needs the bundled demo MAE (assets/demo_mae)")
    from analysis.mae import load_mae

    mae = load_mae("demo_mae", device="cpu")
    pixels = torch.randn(1, 3, *mae.spec.img_size, generator=torch.Generator().manual_seed(3))
    return mae, mae_reconstruct(mae, pixels, mask_ratio=0.6, seed=2)


def test_unit_pixels_undo_the_normalisation_channel_by_channel():
    preprocessing = Preprocessing.from_data_config({"mean": (0.1, 0.2, 0.3), "std": (0.5, 0.25, 2.0)}, (4, 6))
    pixels = torch.randn(3, 4, 6, generator=torch.Generator().manual_seed(0)) * 3
    out = unit_pixels(pixels, preprocessing)
    assert out.shape == (4, 6, 3)
    for y in range(4):
        for x in range(6):
            for c in range(3):
                value = float(pixels[c, y, x]) * preprocessing.std[c] + preprocessing.mean[c]
                assert out[y, x, c] == pytest.approx(value, rel=1e-6, abs=1e-6)
    assert out.min() < 0 or out.max() > 1  # not clipped


def test_figure_2_pictures_and_the_error_map_by_patch(demo_pass):
    mae, result = demo_pass
    pictures = figure_2_images(result, mae.preprocessing)
    error = hidden_patch_loss(result)
    (gh, gw), (ph, pw) = result.grid_size, result.patch_size
    original = unit_pixels(result.pixels[0], mae.preprocessing)
    assert not mae.norm_pix_loss  # the loss is then the reconstruction's squared error in input units
    for r in range(gh):
        for c in range(gw):
            block = (slice(r * ph, (r + 1) * ph), slice(c * pw, (c + 1) * pw))
            hidden = bool(result.mask[0, r * gw + c])
            masked = pictures["masked"][block]
            if hidden:
                assert np.isnan(masked).all()
                np.testing.assert_array_equal(pictures["composite"][block], pictures["reconstruction"][block])
                square = (
                    result.reconstruction[0, :, block[0], block[1]] - result.pixels[0, :, block[0], block[1]]
                ) ** 2
                assert error[r, c] == pytest.approx(float(square.mean()), rel=1e-5)
            else:
                np.testing.assert_array_equal(masked, original[block])
                np.testing.assert_allclose(pictures["composite"][block], original[block], atol=1e-6)
                assert math.isnan(error[r, c])
    np.testing.assert_array_equal(pictures["original"], original)


def test_flip_patches_switches_each_listed_patch_once():
    mask = draw_mask(1, 16, 0.5, 0)[0]
    kept = mask.clone()
    out = flip_patches(mask, [0, 3, 3, 99, -1])
    assert torch.equal(mask, kept)  # the input is not changed
    for index in range(16):
        assert bool(out[index]) == (not bool(mask[index]) if index in (0, 3) else bool(mask[index]))


def test_pixels_are_drawn_on_one_clipped_scale_and_hidden_ones_grey():
    image = np.array([[[-0.2, 0.0, 0.5], [1.0, 1.3, 0.25]], [[np.nan, np.nan, np.nan], [0.004, 0.002, 0.998]]])
    out = plots.unit_to_uint8(image)
    assert out.dtype == np.uint8
    assert out[0, 0].tolist() == [0, 0, 128] and out[0, 1].tolist() == [255, 255, 64]
    assert out[1, 0].tolist() == list(plots.HIDDEN_GREY)
    assert out[1, 1].tolist() == [1, 1, 254]
    assert plots.clipped_fraction(image) == pytest.approx(2 / 9)


def test_panel_click_targets_name_their_patch_and_state(demo_pass):
    mae, result = demo_pass
    pictures = figure_2_images(result, mae.preprocessing)
    hidden = result.mask[0].numpy()
    figure = plots.mae_panels(
        list(pictures.values()), list(pictures), result.grid_size, result.patch_size, hidden, outline=[1, 5]
    )
    images = [t for t in figure.data if t.type == "image"]
    targets = [t for t in figure.data if t.type == "scatter"]
    assert len(images) == len(targets) == 4
    gh, gw = result.grid_size
    (ph, pw) = result.patch_size
    for panel, target in enumerate(targets):
        custom = np.asarray(target.customdata)
        for patch in range(gh * gw):
            r, c = divmod(patch, gw)
            assert custom[patch].tolist() == [patch, panel, float(hidden[patch]), r, c]
            assert (target.x[patch], target.y[patch]) == ((c + 0.5) * pw, (r + 0.5) * ph)
    assert len(figure.layout.shapes) == 2 * 4


def test_patch_map_and_loss_chart_keep_their_values_and_ranges():
    values = np.array([[0.1, np.nan], [0.4, 0.2]])
    background = np.zeros((8, 8, 3))
    figure = plots.mae_patch_map(
        background,
        values,
        (4, 4),
        np.isnan(values),
        zmin=0.0,
        zmax=0.4,
        colorbar_title="error (0 to max 0.4)",
        outline=3,
    )
    (heatmap,) = [t for t in figure.data if t.type == "heatmap"]
    np.testing.assert_array_equal(np.asarray(heatmap.z, dtype=float), values)
    assert (heatmap.zmin, heatmap.zmax) == (0.0, 0.4) and heatmap.colorbar.title.text == "error (0 to max 0.4)"
    (target,) = [t for t in figure.data if t.type == "scatter"]
    np.testing.assert_array_equal(np.asarray(target.customdata)[:, 5], values.ravel())
    assert figure.layout.shapes[0].x0 == 4 and figure.layout.shapes[0].y0 == 4  # patch 3: row 1, col 1
    losses = np.array([[0.1, 0.3], [0.3, np.nan]])
    chart = plots.mae_loss_by_ratio([0.25, 0.75], losses, ["a", "b"], y_title="loss", current_ratio=0.5)
    mean = chart.data[-1]
    np.testing.assert_allclose(mean.y, [0.2, 0.3])
    assert chart.layout.yaxis.range[0] == 0 and chart.layout.shapes[0].x0 == 0.5
