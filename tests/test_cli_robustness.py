"""``python -m analysis robustness attack|corruptions|texture``: the same numbers as the library, on one process
and on two torchrun ranks, and their failures."""

from __future__ import annotations

import csv
import importlib.util

import numpy as np
import pytest
from PIL import Image

import cli_runner
from analysis import load_vit
from analysis.demo.cue_conflict import cue_conflict_scenes
from analysis.demo.data import render_sample
from analysis.robustness import (
    attack_curve,
    corruption_curve,
    corruption_errors,
    linear_probe_curve,
    load_cnn,
    patch_size_curve,
    shape_bias_of,
    texture_curve,
)
from test_cli import run

SEED = 4242
# The commands compared on one process and on two torchrun ranks (their --out added), keyed by subcommand
CORRUPTIONS = [
    "robustness",
    "corruptions",
    "--model",
    "demo",
    "--cnn",
    "demo",
    "--demo-scenes",
    "3",
    "--seed",
    str(SEED),
]
CORRUPTIONS += ["--corruptions", "gaussian_noise,pixelate", "--severities", "0,2,5"]
TEXTURE = ["robustness", "texture", "--model", "demo", "--cnn", "demo", "--demo-scenes", "5"]
TEXTURE += ["--seed", str(SEED), "--cue-conflict", "7"]
PATCH = ["robustness", "patch", "--model", "demo", "--cnn", "demo", "--demo-scenes", "6", "--seed", str(SEED)]
PATCH += ["--train-scenes", "4", "--epochs", "1", "--batch-size", "4", "--shares", "0.05,0.1"]
PROBE = ["robustness", "probe", "--model", "demo", "--also", "demo_swin", "--demo-scenes", "24"]
PROBE += ["--seed", str(SEED), "--concat", "2"]


@pytest.fixture(scope="module")
def on_two_ranks(tmp_path_factory) -> dict[str, tuple]:
    """``subcommand -> (the run, its --out file)`` of each command above on two torchrun ranks, all
    in one launch (tests/cli_runner.py)."""
    folder = tmp_path_factory.mktemp("two_ranks")
    commands = {
        argv[1]: [*argv, "--out", str(folder / f"{argv[1]}.npz")] for argv in (CORRUPTIONS, TEXTURE, PATCH, PROBE)
    }
    runs = cli_runner.torchrun_batch(commands, folder)
    return {name: (runs[name], folder / f"{name}.npz") for name in commands}


def demo_scenes(n: int):
    found = [render_sample(SEED, i) for i in range(n)]
    return [Image.fromarray(image) for image, _, _ in found], [label for _, label, _ in found]


def test_attack_curve_equals_the_library(tmp_path):
    out = tmp_path / "attack.npz"
    result = run(
        "-m",
        "analysis",
        "robustness",
        "attack",
        "--model",
        "demo",
        "--cnn",
        "demo",
        "--demo-scenes",
        "3",
        "--seed",
        str(SEED),
        "--epsilons",
        "0,8",
        "--steps",
        "2",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    saved = np.load(out)
    images, labels = demo_scenes(3)
    expected = attack_curve(
        {"ViT": load_vit("demo"), "CNN": load_cnn("demo")}, images, labels, epsilons=(0, 8), steps=2, seed=SEED
    )
    assert list(saved["models"]) == ["ViT", "CNN"] and int(saved["count"]) == 3
    np.testing.assert_allclose(saved["accuracy"], np.stack([expected.accuracy["ViT"], expected.accuracy["CNN"]]))
    with out.with_suffix(".csv").open() as file:
        rows = list(csv.DictReader(file))
    assert [(r["model"], float(r["epsilon"]), float(r["accuracy"])) for r in rows] == [
        (m, e, float(a)) for m in ("ViT", "CNN") for e, a in zip((0.0, 8.0), expected.accuracy[m])
    ]


@pytest.mark.skipif(importlib.util.find_spec("imagecorruptions") is None, reason="needs the corruptions extra")
def test_corruption_curve_on_two_ranks_equals_one_process_and_the_library(tmp_path, on_two_ranks):
    common = CORRUPTIONS
    one, (ranks, two) = tmp_path / "one.npz", on_two_ranks[common[1]]
    single = run("-m", "analysis", *common, "--out", str(one))
    assert single.returncode == 0, single.stderr
    assert ranks.returncode == 0, ranks.stderr
    a, b = np.load(one), np.load(two)
    assert int(a["world_size"]) == 1 and int(b["world_size"]) == 2 and int(b["count"]) == 3
    images, labels = demo_scenes(3)
    curve = corruption_curve(
        {"ViT": load_vit("demo"), "CNN": load_cnn("demo")},
        images,
        labels,
        corruptions=("gaussian_noise", "pixelate"),
        severities=(0, 2, 5),
        seed=SEED,
    )  # image i: seed + i, on one process or on the rank that has it
    expected = np.stack([curve.accuracy["ViT"], curve.accuracy["CNN"]])
    np.testing.assert_allclose(a["accuracy"], expected)
    np.testing.assert_allclose(b["accuracy"], expected)
    errors = corruption_errors(curve, "CNN")
    np.testing.assert_allclose(a["mean_corruption_error"], [errors["ViT"][1], errors["CNN"][1]], equal_nan=True)


def test_texture_curve_and_shape_bias_on_two_ranks_equal_one_process_and_the_library(tmp_path, on_two_ranks):
    """Five demo scenes (silhouettes from their masks) and seven cue-conflict scenes: the ranks take
    every other image and scene, and their summed counts give the single process's numbers. The texture
    probes score the models given; the shape bias, by default, their textured variants."""
    common = TEXTURE
    one, (ranks, two) = tmp_path / "one.npz", on_two_ranks[common[1]]
    single = run("-m", "analysis", *common, "--out", str(one))
    assert single.returncode == 0, single.stderr
    assert ranks.returncode == 0, ranks.stderr
    models = {"ViT": load_vit("demo"), "CNN": load_cnn("demo")}
    found = [render_sample(SEED, i) for i in range(5)]
    curve = texture_curve(
        models,
        [Image.fromarray(image) for image, _, _ in found],
        [label for _, label, _ in found],
        masks=[mask for _, _, mask in found],
    )
    textured = {"ViT": load_vit("demo_textured"), "CNN": load_cnn("demo_textured")}
    biases = shape_bias_of(textured, cue_conflict_scenes(7, SEED))
    for saved in (np.load(one), np.load(two)):
        assert list(saved["shape_bias_models"]) == ["demo_textured", "cnn:demo_textured"]
        assert list(saved["probes"]) == ["silhouette", "edges", "kuwahara"] == list(curve.probes)
        np.testing.assert_allclose(saved["clean_accuracy"], [curve.clean["ViT"], curve.clean["CNN"]])
        np.testing.assert_allclose(saved["accuracy"], np.stack([curve.accuracy["ViT"], curve.accuracy["CNN"]]))
        counts = [[biases[m].shape, biases[m].texture, biases[m].neither] for m in ("ViT", "CNN")]
        assert saved["shape_texture_neither"].tolist() == counts and int(saved["count"]) == 5
        np.testing.assert_allclose(saved["shape_bias"], [biases["ViT"].fraction, biases["CNN"].fraction])
    assert int(np.load(two)["world_size"]) == 2


def test_the_shape_bias_of_the_models_given_on_request(tmp_path):
    """``--shape-bias-of given``: the plain demo ViT and Swin themselves, as the library counts them."""
    out = tmp_path / "given.npz"
    common = ["robustness", "texture", "--model", "demo", "--also", "demo_swin", "--demo-scenes", "1"]
    result = run(
        "-m", "analysis", *common, "--probes", "edges", "--seed", str(SEED), "--cue-conflict", "6",
        "--shape-bias-of", "given", "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    saved = np.load(out)
    assert list(saved["shape_bias_models"]) == ["demo", "demo_swin"]
    biases = shape_bias_of({"ViT": load_vit("demo"), "Swin": load_vit("demo_swin")}, cue_conflict_scenes(6, SEED))
    counts = [[b.shape, b.texture, b.neither] for b in biases.values()]
    assert saved["shape_texture_neither"].tolist() == counts


def test_texture_refuses_cue_conflict_scenes_for_other_classes_and_a_silhouette_without_masks(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    Image.new("RGB", (32, 32), (90, 140, 30)).save(images / "a.png")
    other_classes = run(
        "-m", "analysis", "robustness", "texture", "--model", "random:vit_tiny_patch16_224", "--images",
        str(images), "--cue-conflict", "3", "--out", str(tmp_path / "x.npz"),
    )  # fmt: skip
    assert other_classes.returncode == 2 and "demo classes" in other_classes.stderr
    no_masks = run(
        "-m", "analysis", "robustness", "texture", "--model", "demo", "--images", str(images),
        "--probes", "silhouette", "--out", str(tmp_path / "y.npz"),
    )  # fmt: skip
    assert no_masks.returncode == 2 and "mask" in no_masks.stderr


def test_patch_curve_on_two_ranks_equals_one_process_and_the_library(tmp_path, on_two_ranks):
    """Every rank trains the same patches; each scores its rows of the whole set's positions, so the
    summed rates equal one process's and patch_size_curve's on the same scenes."""
    from analysis.robustness.adversarial_patch import PATCH_TRAIN_SEED

    common = PATCH
    one, (ranks, two) = tmp_path / "one.npz", on_two_ranks[common[1]]
    single = run("-m", "analysis", *common, "--out", str(one))
    assert single.returncode == 0, single.stderr
    assert ranks.returncode == 0, ranks.stderr
    train = [render_sample(PATCH_TRAIN_SEED, i) for i in range(4)]
    held, held_labels = demo_scenes(6)
    curve = patch_size_curve(
        {"ViT": load_vit("demo"), "CNN": load_cnn("demo")},
        [Image.fromarray(image) for image, _, _ in train],
        [label for _, label, _ in train],
        shares=(0.05, 0.1),
        eval_images=held,
        eval_labels=held_labels,
        epochs=1,
        batch_size=4,
        seed=SEED,
    )
    for saved in (np.load(one), np.load(two)):
        for field, expected in (
            ("accuracy", curve.accuracy),
            ("fooling_rate", curve.fooling_rate),
            ("noise_accuracy", curve.noise_accuracy),
            ("noise_fooling_rate", curve.noise_fooling_rate),
        ):
            np.testing.assert_allclose(saved[field], np.stack([expected["ViT"], expected["CNN"]]), atol=1e-12)
        np.testing.assert_allclose(saved["clean_accuracy"], [curve.clean_accuracy["ViT"], curve.clean_accuracy["CNN"]])
    assert int(np.load(two)["world_size"]) == 2


def test_a_targeted_patch_prints_its_target_hit_rate_and_the_training_stream_is_refused(tmp_path):
    """--target ring: the .npz's target-hit rates (the patch's and the noise patch's) and each step's training
    loss are patch_size_curve's on the same scenes, and the printed line states them; --seed 5151 (the
    training stream) is refused before any training, since its scenes would not be held out."""
    from analysis.robustness import demo_patch_scenes

    out = tmp_path / "targeted.npz"
    common = ["-m", "analysis", "robustness", "patch", "--model", "demo", "--cnn", "demo", "--demo-scenes", "6"]
    common += ["--train-scenes", "8", "--steps", "3", "--batch-size", "4", "--shares", "0.1"]
    result = run(*common, "--seed", str(SEED), "--target", "ring", "--out", str(out))
    assert result.returncode == 0, result.stderr
    scenes = demo_patch_scenes(6, SEED, train_scenes=8)
    curve = patch_size_curve(
        {"ViT": load_vit("demo"), "CNN": load_cnn("demo")}, scenes.train_images, scenes.train_labels,
        shares=(0.1,), eval_images=scenes.held_out_images, eval_labels=scenes.held_out_labels, target=1, steps=3,
        batch_size=4, seed=SEED,
    )  # fmt: skip
    assert curve.target_rate is not None and curve.noise_target_rate is not None
    saved = np.load(out)
    np.testing.assert_allclose(saved["target_rate"], np.stack([curve.target_rate["ViT"], curve.target_rate["CNN"]]))
    np.testing.assert_allclose(
        saved["noise_target_rate"], np.stack([curve.noise_target_rate["ViT"], curve.noise_target_rate["CNN"]])
    )
    np.testing.assert_allclose(saved["losses"], [[curve.patches[n][0].losses] for n in ("ViT", "CNN")], rtol=1e-6)
    assert int(saved["target"]) == 1 and int(saved["steps"]) == 3 and int(saved["batch_size"]) == 4
    hits = f"{curve.target_rate['CNN'][0]:.3f} / {curve.noise_target_rate['CNN'][0]:.3f}"
    assert f"target-hit rate, own patch / noise patch: 0.1: {hits}" in result.stdout
    refused = run(*common, "--seed", "5151", "--out", str(tmp_path / "refused.npz"))
    assert refused.returncode == 2 and "--seed 5151 is the stream the patches train on" in refused.stderr
    assert "adversarial patches on" not in refused.stderr  # refused before the models are loaded


def test_linear_probe_on_two_ranks_equals_one_process_and_the_library(tmp_path, on_two_ranks):
    """Each rank reads the features of every other scene; their sum is the whole set in order, so the
    probe, its split and its accuracies equal one process's and linear_probe_curve's."""
    common = PROBE
    one, (ranks, two) = tmp_path / "one.npz", on_two_ranks[common[1]]
    single = run("-m", "analysis", *common, "--out", str(one))
    assert single.returncode == 0, single.stderr
    assert ranks.returncode == 0, ranks.stderr
    images, labels = demo_scenes(24)
    for name, model in (("ViT", load_vit("demo")), ("demo_swin", load_vit("demo_swin"))):
        expected = linear_probe_curve(model, images, labels, concat_k=(2,), seed=SEED)
        for saved in (np.load(one), np.load(two)):
            assert saved[f"{name}_layers"].tolist() == list(expected.layers)
            np.testing.assert_allclose(saved[f"{name}_accuracy"], expected.accuracy, atol=1e-12)
            np.testing.assert_allclose(saved[f"{name}_concat_accuracy"], expected.concat_accuracy, atol=1e-12)
            assert float(saved[f"{name}_model_accuracy"]) == pytest.approx(expected.model_accuracy)
    assert int(np.load(two)["world_size"]) == 2


def test_linear_probe_reads_a_folder_of_class_subfolders_and_refuses_one_without(tmp_path):
    classes = tmp_path / "set"
    images, labels = demo_scenes(12)
    for i, (image, label) in enumerate(zip(images, labels)):
        (classes / f"k{label}").mkdir(parents=True, exist_ok=True)
        image.save(classes / f"k{label}" / f"{i}.png")
    done = run("-m", "analysis", "robustness", "probe", "--model", "demo", "--folder", str(classes),
               "--concat", "2", "--out", str(tmp_path / "f.npz"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    saved = np.load(tmp_path / "f.npz")
    assert int(saved["count"]) == 12 and np.isnan(saved["ViT_model_accuracy"])  # folder names are not classes
    flat = tmp_path / "flat"
    flat.mkdir()
    images[0].save(flat / "a.png")
    refused = run("-m", "analysis", "robustness", "probe", "--model", "demo", "--folder", str(flat),
                  "--out", str(tmp_path / "g.npz"))  # fmt: skip
    assert refused.returncode == 2 and "class subfolders" in refused.stderr


def test_bad_arguments_exit_with_a_message(tmp_path):
    negative = run(
        "-m",
        "analysis",
        "robustness",
        "attack",
        "--model",
        "demo",
        "--demo-scenes",
        "2",
        "--epsilons=-1,2",
        "--out",
        str(tmp_path / "x.npz"),
    )
    assert negative.returncode == 2 and "0 or more" in negative.stderr
    other_classes = run(
        "-m",
        "analysis",
        "robustness",
        "attack",
        "--model",
        "demo",
        "--cnn",
        "random:resnet18",
        "--demo-scenes",
        "2",
        "--out",
        str(tmp_path / "y.npz"),
    )
    assert other_classes.returncode in (1, 2) and "error:" in other_classes.stderr
    severity = run(
        "-m",
        "analysis",
        "robustness",
        "corruptions",
        "--model",
        "demo",
        "--demo-scenes",
        "2",
        "--severities",
        "0,7",
        "--out",
        str(tmp_path / "z.npz"),
    )
    assert severity.returncode == 2 and "severit" in severity.stderr
    assert not any(tmp_path.iterdir())
