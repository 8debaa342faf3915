"""Off-the-shelf tokens (analysis.robustness.linear_probe): the ridge probe against numpy's least squares, the
demo ViT's last class token against the model's own accuracy on the same held-out scenes, the features against
the engine's cache, the folder loader and its typed errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from analysis import load_vit
from analysis.demo.data import render_sample
from analysis.engine.activations import run_with_cache
from analysis.robustness.linear_probe import (
    ImageFolderSet,
    ProbeError,
    block_features,
    fit_ridge_probe,
    linear_probe_curve,
    linear_probe_curves,
    load_image_folder,
    split_indices,
)

HELD_OUT_SEED = 4242  # not a training or validation stream of the demo models


@pytest.fixture(scope="module")
def demo_vit():
    return load_vit("demo")


def scenes(seed: int, count: int, size: int):
    found = [render_sample(seed, i, size) for i in range(count)]
    return [Image.fromarray(image) for image, _, _ in found], [label for _, label, _ in found]


def test_ridge_probe_equals_numpy_least_squares():
    """The closed form (XᵀX + λI)⁻¹XᵀY against lstsq on the augmented system [X; √λ·I] W = [Y; 0]."""
    rng = np.random.default_rng(0)
    features = rng.normal(size=(40, 7)) * rng.uniform(0.5, 3, size=7) + rng.normal(size=7)
    labels = rng.integers(0, 3, size=40)
    ridge = 2.5
    probe = fit_ridge_probe(torch.from_numpy(features), labels, ridge=ridge)
    standard = (features - features.mean(0)) / features.std(0)
    onehot = np.eye(3)[labels]
    centred = onehot - onehot.mean(0)
    augmented_x = np.vstack([standard, np.sqrt(ridge) * np.eye(7)])
    augmented_y = np.vstack([centred, np.zeros((7, 3))])
    expected, *_ = np.linalg.lstsq(augmented_x, augmented_y, rcond=None)
    np.testing.assert_allclose(probe.weight.numpy(), expected, atol=1e-10)
    np.testing.assert_allclose(probe.bias.numpy(), onehot.mean(0), atol=1e-12)
    scores = standard @ expected + onehot.mean(0)
    assert torch.equal(probe.predict(torch.from_numpy(features)), torch.from_numpy(scores.argmax(1)))


def test_split_is_disjoint_and_seeded():
    train, test = split_indices(10, 0.3, seed=1)
    assert len(test) == 3 and not set(train) & set(test) and sorted([*train, *test]) == list(range(10))
    again = split_indices(10, 0.3, seed=1)
    assert np.array_equal(train, again[0]) and np.array_equal(test, again[1])


def test_features_are_the_class_token_of_each_block_output(demo_vit):
    images, _ = scenes(HELD_OUT_SEED, 3, demo_vit.spec.img_size[0])
    layers, features, logits = block_features(demo_vit, images, batch_size=2)
    pixels = torch.cat([demo_vit.preprocess(image) for image in images])
    names = [f"blocks.{layer}.resid_post" for layer in layers]
    cache = run_with_cache(demo_vit, pixels, names=names)
    assert layers == tuple(range(demo_vit.spec.num_layers))
    for layer, feature in zip(layers, features):
        torch.testing.assert_close(feature, cache[f"blocks.{layer}.resid_post"][:, 0].float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, demo_vit.model(pixels).detach().float(), atol=1e-4, rtol=1e-4)


def test_last_class_token_probe_is_near_the_models_own_accuracy(demo_vit):
    """400 held-out scenes, split 200 / 200 (seed 0). Measured: by depth 0.22, 0.495, 0.775, 0.90; the last
    block's class token 0.90 against the model's own 0.915 on the same 200 test scenes (the last 2
    concatenated: 0.90). On 800 scenes (400 / 400): 0.22, 0.525, 0.82, 0.935 against the model's 0.9425."""
    images, labels = scenes(HELD_OUT_SEED, 400, demo_vit.spec.img_size[0])
    calls = []
    curve = linear_probe_curve(
        demo_vit,
        images,
        labels,
        test_share=0.5,
        concat_k=(2,),
        seed=0,
        progress=lambda done, total: calls.append((done, total)),
    )
    print("by depth", curve.accuracy, "last 2 concatenated", curve.concat_accuracy, "model", curve.model_accuracy)
    assert not set(curve.train_indices) & set(curve.test_indices)
    assert len(curve.train_indices) + len(curve.test_indices) == 400
    assert calls == [(done, 400) for done in (64, 128, 192, 256, 320, 384, 400)]  # batches of 64 images
    assert curve.feature == "class token" and curve.layers == tuple(range(demo_vit.spec.num_layers))
    assert curve.accuracy[-1] >= curve.model_accuracy - 0.05
    assert curve.accuracy[-1] > curve.accuracy[0]  # deeper class tokens carry the class
    assert curve.concat_k == (2,) and curve.concat_accuracy.shape == (1,)


def test_folder_loader_and_its_typed_errors(tmp_path):
    for name, colour in (("b_red", (255, 0, 0)), ("a_blue", (0, 0, 255))):
        (tmp_path / "set" / name).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (8, 8), colour).save(tmp_path / "set" / name / f"{i}.png")
    (tmp_path / "set" / "a_blue" / "notes.txt").write_text("not an image")
    found = load_image_folder(tmp_path / "set")
    assert isinstance(found, ImageFolderSet)
    assert found.class_names == ["a_blue", "b_red"] and found.labels == [0, 0, 1, 1]
    assert [image.getpixel((0, 0)) for image in found.images] == [(0, 0, 255)] * 2 + [(255, 0, 0)] * 2
    flat = tmp_path / "flat"
    flat.mkdir()
    Image.new("RGB", (8, 8)).save(flat / "x.png")
    with pytest.raises(ProbeError, match="no class subfolders"):
        load_image_folder(flat)
    with pytest.raises(ProbeError, match="not a folder"):
        load_image_folder(tmp_path / "missing")
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    with pytest.raises(ProbeError, match="hold no images"):
        load_image_folder(tmp_path / "empty")
    with pytest.raises(ProbeError, match="test_share"):
        split_indices(10, 1.0)
    with pytest.raises(ProbeError, match="labels"):
        fit_ridge_probe(torch.zeros((3, 2)), [0, 1])
    from analysis.robustness import load_cnn

    with pytest.raises(ProbeError, match="no transformer blocks"):
        block_features(load_cnn("demo"), found.images)


def test_a_folder_of_demo_scenes_is_probed_in_the_models_own_classes(demo_vit, tmp_path):
    """The folder's subfolders are the demo classes' names: its labels become the model's class indices,
    so the model's own accuracy is reported; the probe on a Swin reads the mean token of its stage grid."""
    from analysis.demo.data import CLASS_NAMES

    images, labels = scenes(HELD_OUT_SEED, 36, demo_vit.spec.img_size[0])
    for i, (image, label) in enumerate(zip(images, labels)):
        (tmp_path / CLASS_NAMES[label]).mkdir(exist_ok=True)
        image.save(tmp_path / CLASS_NAMES[label] / f"{i:03d}.png")
    folder = load_image_folder(tmp_path)
    curve = linear_probe_curve(demo_vit, folder, None, concat_k=(), seed=1)
    truth = np.asarray([demo_vit.class_names.index(folder.class_names[label]) for label in folder.labels])
    pixels = torch.cat([demo_vit.preprocess(image) for image in folder.images])
    predicted = demo_vit.model(pixels).argmax(-1).numpy()
    assert curve.model_accuracy == pytest.approx(float((predicted == truth)[curve.test_indices].mean()))
    swin = load_vit("demo_swin")
    layers, features, _ = block_features(swin, folder.images[:2])
    tokens = run_with_cache(
        swin,
        torch.cat([swin.preprocess(image) for image in folder.images[:2]]),
        names=[f"blocks.{layers[-1]}.resid_post"],
    )[f"blocks.{layers[-1]}.resid_post"]
    torch.testing.assert_close(features[-1], tokens.float().mean(dim=(1, 2)), atol=1e-5, rtol=1e-5)


def test_curves_of_a_folder_equal_the_curves_of_its_images_as_a_list(demo_vit, tmp_path):
    """linear_probe_curves on an ImageFolderSet (no len()) against the same call on the folder's images
    as a list, labelled by hand in each model's own classes: the same split, accuracies and progress,
    whose total is models · images."""
    from analysis.demo.data import CLASS_NAMES

    images, labels = scenes(HELD_OUT_SEED, 12, demo_vit.spec.img_size[0])
    for i, (image, label) in enumerate(zip(images, labels)):
        (tmp_path / CLASS_NAMES[label]).mkdir(exist_ok=True)
        image.save(tmp_path / CLASS_NAMES[label] / f"{i:03d}.png")
    folder = load_image_folder(tmp_path)
    assert not hasattr(folder, "__len__")
    models = {"vit": demo_vit, "again": demo_vit}
    by_hand = [demo_vit.class_names.index(folder.class_names[label]) for label in folder.labels]
    seen_folder: list[tuple[int, int]] = []
    seen_list: list[tuple[int, int]] = []
    kwargs = dict(concat_k=(2,), seed=3)
    from_folder = linear_probe_curves(models, folder, None, progress=lambda *a: seen_folder.append(a), **kwargs)
    from_list = linear_probe_curves(
        models, list(folder.images), by_hand, progress=lambda *a: seen_list.append(a), **kwargs
    )
    assert list(from_folder) == list(from_list) == ["vit", "again"]
    for name in models:
        ours, theirs = from_folder[name], from_list[name]
        assert np.array_equal(ours.train_indices, theirs.train_indices)
        assert np.array_equal(ours.test_indices, theirs.test_indices)
        assert np.array_equal(ours.accuracy, theirs.accuracy)
        assert np.array_equal(ours.concat_accuracy, theirs.concat_accuracy)
        assert ours.model_accuracy is not None and ours.model_accuracy == theirs.model_accuracy
    assert seen_folder == seen_list and seen_folder[-1] == (2 * 12, 2 * 12)


def test_curves_refuse_images_that_are_not_a_sequence(demo_vit):
    images, labels = scenes(HELD_OUT_SEED, 4, demo_vit.spec.img_size[0])
    with pytest.raises(ProbeError, match="images must be a sequence of PIL images or an ImageFolderSet.*got generator"):
        linear_probe_curves({"vit": demo_vit}, (image for image in images), labels)
