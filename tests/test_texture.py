"""Texture removal and shape bias (analysis.robustness.texture, analysis.demo.cue_conflict), each
against a slow, obviously correct reference: explicit per-pixel loops, hand-counted decisions, a
per-image loop of each model's own forward."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from analysis import load_vit
from analysis.base.errors import AnalysisError
from analysis.demo.cue_conflict import (
    CLASS_TEXTURES,
    class_texture,
    cue_conflict_scene,
    cue_conflict_scenes,
    textured_scene,
    textured_scenes,
)
from analysis.demo.data import CLASS_NAMES, generate_samples
from analysis.robustness import (
    TEXTURE_PROBES,
    ShapeBias,
    TextureError,
    edge_map,
    kuwahara,
    load_cnn,
    remove_texture,
    shape_bias,
    shape_bias_of,
    sobel_magnitude,
    texture_curve,
)

LUMA = (0.299, 0.587, 0.114)


@pytest.fixture(scope="module")
def demo_models():
    return {"vit": load_vit("demo"), "cnn": load_cnn("demo")}


def random_image(height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(height, width, 3)).astype(np.uint8)


def grey_of(rgb: np.ndarray) -> np.ndarray:
    return rgb[..., 0] * LUMA[0] + rgb[..., 1] * LUMA[1] + rgb[..., 2] * LUMA[2]


# --- Kuwahara -------------------------------------------------------------------------------------


def kuwahara_loop(rgb: np.ndarray, r: int) -> np.ndarray:
    """Per pixel, per quadrant: the window's pixels gathered one by one (indices clamped to the image:
    the border replicated), the grey variance by np.var, the first least-varying quadrant's mean colour."""
    height, width = rgb.shape[:2]
    out = np.zeros_like(rgb)
    for y in range(height):
        for x in range(width):
            best_variance, best_colour = math.inf, None
            for rows, cols in [
                (range(y - r, y + 1), range(x - r, x + 1)),  # top-left
                (range(y - r, y + 1), range(x, x + r + 1)),  # top-right
                (range(y, y + r + 1), range(x - r, x + 1)),  # bottom-left
                (range(y, y + r + 1), range(x, x + r + 1)),  # bottom-right
            ]:
                pixels = np.array(
                    [rgb[min(max(i, 0), height - 1), min(max(j, 0), width - 1)] for i in rows for j in cols],
                    dtype=np.float64,
                )
                assert len(pixels) == (r + 1) ** 2
                variance = np.var(grey_of(pixels))
                if variance < best_variance:  # strict: a tie keeps the earlier quadrant
                    best_variance, best_colour = variance, pixels.mean(axis=0)
            out[y, x] = np.rint(best_colour)
    return out


@pytest.mark.parametrize("radius", [1, 2, 3])
def test_kuwahara_matches_a_per_pixel_loop(radius):
    rgb = random_image(7, 9, seed=radius)
    # A flat block as well, where quadrants tie at variance 0.
    rgb[:4, :4] = (40, 200, 90)
    assert np.array_equal(np.asarray(kuwahara(rgb, radius=radius)), kuwahara_loop(rgb, radius))


def test_kuwahara_breaks_a_tie_by_quadrant_order():
    """A = (8, 11, 15) and B = (23, 2, 22) have exactly the same grey level (BT.601, in float). Around the
    centre (radius 1) the top-right window {A, B, A, B} and the bottom-left {A, A, A, A} both have grey
    variance 0; top-left and bottom-right hold black. The top-right comes first: the centre takes its
    mean colour (A + B) / 2 = (15.5, 6.5, 18.5), rounded half to even."""
    a, b, k = (8, 11, 15), (23, 2, 22), (0, 0, 0)
    rgb = np.array([[k, a, b], [a, a, b], [a, a, k]], dtype=np.uint8)
    assert grey_of(np.array([a], dtype=np.float64))[0] == grey_of(np.array([b], dtype=np.float64))[0]
    out = np.asarray(kuwahara(rgb, radius=1))
    assert tuple(out[1, 1]) == (16, 6, 18)
    assert np.array_equal(out, kuwahara_loop(rgb, 1))


def test_kuwahara_keeps_a_step_edge_and_flattens_texture_inside():
    """Two flat halves: every pixel has a quadrant wholly on its own side (variance 0), so the image stays;
    a fine checkerboard in one half becomes flat in its interior."""
    rgb = np.zeros((8, 10, 3), dtype=np.uint8)
    rgb[:, :5] = (200, 30, 30)
    rgb[:, 5:] = (20, 20, 220)
    assert np.array_equal(np.asarray(kuwahara(rgb, radius=2)), rgb)
    assert np.array_equal(np.asarray(remove_texture(Image.fromarray(rgb), "kuwahara", radius=2)), rgb)


# --- edge map -------------------------------------------------------------------------------------


def sobel_loop(grey: np.ndarray) -> np.ndarray:
    height, width = grey.shape

    def at(i, j):
        return grey[min(max(i, 0), height - 1), min(max(j, 0), width - 1)]

    out = np.zeros((height, width))
    for y in range(height):
        for x in range(width):
            gx = (at(y - 1, x + 1) + 2 * at(y, x + 1) + at(y + 1, x + 1)) - (
                at(y - 1, x - 1) + 2 * at(y, x - 1) + at(y + 1, x - 1)
            )
            gy = (at(y + 1, x - 1) + 2 * at(y + 1, x) + at(y + 1, x + 1)) - (
                at(y - 1, x - 1) + 2 * at(y - 1, x) + at(y - 1, x + 1)
            )
            out[y, x] = math.sqrt(gx * gx + gy * gy)
    return out


def test_sobel_magnitude_matches_explicit_loops_and_a_known_step():
    grey = grey_of(random_image(6, 8, seed=3).astype(np.float64))
    np.testing.assert_allclose(sobel_magnitude(grey), sobel_loop(grey), rtol=1e-12, atol=1e-9)
    step = np.zeros((5, 6))
    step[:, 3:] = 100.0
    # Next to the step (columns 2 and 3) Gx = (1 + 2 + 1) * 100, Gy = 0; elsewhere flat.
    expected = np.zeros((5, 6))
    expected[:, 2:4] = 400.0
    np.testing.assert_allclose(sobel_magnitude(step), expected)


@pytest.mark.parametrize("threshold", [0.1, 0.2, 0.5])
def test_edge_map_is_the_thresholded_sobel_magnitude_dark_on_white(threshold):
    rgb = random_image(9, 7, seed=5)
    magnitude = sobel_loop(grey_of(rgb.astype(np.float64)))
    out = np.asarray(edge_map(rgb, threshold=threshold))
    for y in range(rgb.shape[0]):
        for x in range(rgb.shape[1]):
            edge = magnitude[y, x] > 0 and magnitude[y, x] >= threshold * magnitude.max()
            assert tuple(out[y, x]) == ((0, 0, 0) if edge else (255, 255, 255))
    flat = np.full((4, 4, 3), 77, dtype=np.uint8)
    assert (np.asarray(edge_map(flat)) == 255).all()  # no gradient, no edge


# --- silhouette -----------------------------------------------------------------------------------


def test_silhouette_is_the_mask_black_on_white():
    mask = np.array(
        [
            [0, 0, 0, 0, 0],
            [0, 1, 1, 0, 0],
            [0, 1, 1, 1, 0],
            [0, 0, 0, 0, 0],
        ],
        dtype=bool,
    )
    image = Image.fromarray(random_image(4, 5, seed=9))
    out = np.asarray(remove_texture(image, "silhouette", mask=mask))
    assert out.shape == (4, 5, 3)
    for y in range(4):
        for x in range(5):
            assert tuple(out[y, x]) == ((0, 0, 0) if mask[y, x] else (255, 255, 255))
    # 0/1 integers are a mask too.
    assert np.array_equal(np.asarray(remove_texture(image, "silhouette", mask=mask.astype(np.uint8))), out)


def test_texture_probes_refuse_bad_input():
    image = random_image(6, 6)
    with pytest.raises(TextureError, match="Unknown texture probe 'blur'"):
        remove_texture(image, "blur")
    with pytest.raises(TextureError, match="needs the object's mask"):
        remove_texture(image, "silhouette")
    with pytest.raises(TextureError, match=r"mask of shape \(5, 6\) for a 6x6 image"):
        remove_texture(image, "silhouette", mask=np.zeros((5, 6), dtype=bool))
    with pytest.raises(TextureError, match="values other than 0 and 1"):
        remove_texture(image, "silhouette", mask=np.full((6, 6), 2))
    with pytest.raises(TextureError, match="radius"):
        kuwahara(image, radius=0)
    with pytest.raises(TextureError, match="threshold"):
        edge_map(image, threshold=0)
    assert issubclass(TextureError, AnalysisError)
    assert set(TEXTURE_PROBES) == {"silhouette", "edges", "kuwahara"}


# --- shape bias -----------------------------------------------------------------------------------


def test_shape_bias_against_a_hand_counted_case():
    shapes = [0, 1, 2, 3, 4, 5, 0, 1, 2, 3]
    textures = [1, 2, 3, 4, 5, 0, 2, 3, 4, 5]
    predictions = [0, 2, 2, 4, 1, 5, 2, 1, 0, 3]
    # image:       0  1  2  3  4  5  6  7  8  9
    # decision:    S  T  S  T  N  S  T  S  N  S   (S: = shape, T: = texture, N: neither)
    # shape: images 0, 2, 5, 7, 9 -> 5; texture: images 1, 3, 6 -> 3; neither: images 4, 8 -> 2.
    bias = shape_bias(predictions, shapes, textures)
    assert bias == ShapeBias(shape=5, texture=3, neither=2)
    assert bias.fraction == 5 / 8
    assert bias.note == ""


def test_shape_bias_without_shape_or_texture_decisions_is_nan_with_a_note():
    bias = shape_bias([3, 3], [0, 1], [1, 2])
    assert (bias.shape, bias.texture, bias.neither) == (0, 0, 2)
    assert math.isnan(bias.fraction)
    assert "undefined" in bias.note and "2" in bias.note


def test_shape_bias_refuses_mismatched_or_agreeing_labels():
    with pytest.raises(TextureError, match="3 predictions, 2 shape labels and 3 texture labels"):
        shape_bias([0, 1, 2], [0, 1], [1, 2, 3])
    with pytest.raises(TextureError, match=r"Images \[1\] have the same shape and texture class"):
        shape_bias([0, 1, 2], [0, 1, 2], [1, 1, 3])


# --- cue-conflict scenes --------------------------------------------------------------------------


def test_cue_conflict_scenes_are_deterministic_prefixes_with_another_texture():
    first = cue_conflict_scenes(12, seed=7)
    again = cue_conflict_scenes(20, seed=7)[:12]
    for a, b in zip(first, again):
        assert np.array_equal(a.image, b.image) and np.array_equal(a.mask, b.mask)
        assert (a.shape_class, a.texture_class) == (b.shape_class, b.texture_class)
    other = cue_conflict_scenes(12, seed=8)
    assert any(not np.array_equal(a.image, b.image) for a, b in zip(first, other))
    many = cue_conflict_scenes(60, seed=1)
    assert all(s.shape_class != s.texture_class for s in many)
    assert {s.shape_class for s in many} == set(range(len(CLASS_NAMES)))
    assert {s.texture_class for s in many} == set(range(len(CLASS_NAMES)))
    image, shape, texture, mask = many[0]  # a plain tuple as well
    assert image.dtype == np.uint8 and image.shape == (48, 48, 3) and mask.shape == (48, 48)
    assert all(s.shape_class == s.texture_class for s in textured_scenes(10, seed=1))
    with pytest.raises(AnalysisError, match="number of scenes"):
        cue_conflict_scenes(-1, seed=0)


def test_the_mask_is_the_textured_object():
    """The textured twin of a cue-conflict scene has the same background, object and colours: the two
    images agree exactly outside the mask, and differ inside it where the two textures differ."""
    for index in range(6):
        conflict, own = cue_conflict_scene(3, index), textured_scene(3, index)
        assert np.array_equal(conflict.mask, own.mask) and conflict.shape_class == own.shape_class
        assert conflict.mask.sum() > 50
        outside = ~conflict.mask
        assert np.array_equal(conflict.image[outside], own.image[outside])
        differs = (conflict.image != own.image).any(axis=2)
        assert differs[conflict.mask].mean() > 0.2


def test_class_textures_follow_their_rules():
    assert list(CLASS_TEXTURES) == CLASS_NAMES
    ink = {name: class_texture(c, 48)[..., 0] == 255 for c, name in enumerate(CLASS_NAMES)}  # period 6
    # Diagonal stripes: (x + y) mod 6 < 3; vertical stripes: x mod 6 < 3; checks of side 3.
    for y in range(48):
        for x in range(48):
            assert ink["bar"][y, x] == ((x + y) % 6 < 3)
            assert ink["cross"][y, x] == (x % 6 < 3)
            assert ink["ring"][y, x] == ((x // 3 + y // 3) % 2 == 1)
            assert ink["circle"][y, x] == ((x % 6 - 3) ** 2 + (y % 6 - 3) ** 2 < 1.8**2)
    names = list(ink)
    for i, a in enumerate(names):  # each texture its own
        for b in names[i + 1 :]:
            assert (ink[a] != ink[b]).mean() > 0.2, (a, b)


# --- accuracy on the probes, shape bias of models ------------------------------------------------


def predictions_loop(model, images) -> list[int]:
    out = []
    for image in images:
        with torch.no_grad():
            out.append(int(model.model(model.preprocess(image)).argmax(-1)[0]))
    return out


def test_texture_curve_equals_a_per_image_loop(demo_models):
    images, labels, masks = generate_samples(6, seed=4)
    calls = []
    curve = texture_curve(
        demo_models, images, labels, masks=masks, progress=lambda done, total: calls.append((done, total))
    )
    assert curve.probes == tuple(TEXTURE_PROBES) and curve.images == 6
    assert calls == [(1, 4), (2, 4), (3, 4), (4, 4)]
    for name, model in demo_models.items():
        clean = np.mean(np.asarray(predictions_loop(model, images)) == labels)
        assert curve.clean[name] == pytest.approx(clean)
        for p, probe in enumerate(curve.probes):
            probed = [remove_texture(image, probe, mask=mask) for image, mask in zip(images, masks)]
            accuracy = np.mean(np.asarray(predictions_loop(model, probed)) == labels)
            assert curve.accuracy[name][p] == pytest.approx(accuracy), (name, probe)
    # Without masks the default leaves the silhouette out.
    assert texture_curve({"vit": demo_models["vit"]}, images[:2], labels[:2]).probes == ("edges", "kuwahara")


def test_texture_curve_refuses_bad_input(demo_models):
    images, labels, masks = generate_samples(2, seed=0)
    model = {"vit": demo_models["vit"]}
    with pytest.raises(TextureError, match="2 images and 1 labels"):
        texture_curve(model, images, labels[:1])
    with pytest.raises(TextureError, match="1 masks for 2 images"):
        texture_curve(model, images, labels, masks=masks[:1])
    with pytest.raises(TextureError, match="Unknown texture probe"):
        texture_curve(model, images, labels, probes=["edges", "stylise"])
    with pytest.raises(TextureError, match="needs the object's mask"):
        texture_curve(model, images, labels, probes=["silhouette"])


def test_shape_bias_of_counts_each_models_own_predictions(demo_models):
    scenes = cue_conflict_scenes(8, seed=2)
    calls = []
    biases = shape_bias_of(demo_models, scenes, progress=lambda done, total: calls.append((done, total)))
    assert calls == [(1, 2), (2, 2)]
    for name, model in demo_models.items():
        predicted = predictions_loop(model, [Image.fromarray(s.image) for s in scenes])
        shape = sum(p == s.shape_class for p, s in zip(predicted, scenes))
        texture = sum(p == s.texture_class for p, s in zip(predicted, scenes))
        assert biases[name] == ShapeBias(shape, texture, len(scenes) - shape - texture)
    with pytest.raises(TextureError, match="No cue-conflict scenes"):
        shape_bias_of(demo_models, [])
