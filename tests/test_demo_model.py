"""The bundled demo ViT (assets/demo_vit) and its procedural data: offline and fast.

Tests never retrain the shipped model; they load it and re-measure the targets on a
smaller held-out sample whose seed (TEST_SEED) neither training (seeds 0 and 1) nor the
model card's evaluation (seed 2026) used.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from analysis.demo.data import CLASS_NAMES, generate_arrays, generate_samples, render_sample

DEMO_DIR = Path(__file__).resolve().parent.parent / "assets" / "demo_vit"
TEST_SEED = 777
TEST_N = 300


# --------------------------------------------------------------------------- generator


def test_generator_is_deterministic_per_seed():
    a_imgs, a_labels, a_masks = generate_samples(12, seed=5)
    b_imgs, b_labels, b_masks = generate_samples(12, seed=5)
    assert a_labels == b_labels
    assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a_imgs, b_imgs))
    assert np.array_equal(a_masks, b_masks)

    c_imgs, _, c_masks = generate_samples(12, seed=6)
    assert not any(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a_imgs, c_imgs))
    assert not np.array_equal(a_masks, c_masks)


def test_generator_output_types_and_shapes():
    imgs, labels, masks = generate_samples(8, seed=1, size=32)
    assert len(imgs) == len(labels) == 8
    assert all(im.mode == "RGB" and im.size == (32, 32) for im in imgs)
    assert all(isinstance(lab, int) and 0 <= lab < len(CLASS_NAMES) for lab in labels)
    assert masks.dtype == bool and masks.shape == (8, 32, 32)
    assert len(CLASS_NAMES) >= 6 and len(set(CLASS_NAMES)) == len(CLASS_NAMES)
    # A prefix of a longer stream is the shorter stream.
    _, labels_long, masks_long = generate_samples(20, seed=1, size=32)
    assert labels_long[:8] == labels and np.array_equal(masks_long[:8], masks)


def test_all_classes_occur_and_objects_are_reasonably_sized():
    _, labels, masks = generate_arrays(300, seed=3)
    assert set(labels.tolist()) == set(range(len(CLASS_NAMES)))
    share = masks.reshape(len(masks), -1).mean(axis=1)
    assert share.min() > 0.03 and share.max() < 0.6


def test_masks_are_exactly_the_drawn_object_pixels():
    """Same scenes without clutter: the object (same geometry) on flat grey 128. Every
    pixel outside the mask must be untouched grey and every mask pixel must not be."""
    imgs, labels, masks = generate_arrays(100, seed=11)
    plain, plain_labels, plain_masks = generate_arrays(100, seed=11, clutter=False)
    assert np.array_equal(labels, plain_labels) and np.array_equal(masks, plain_masks)
    for img, mask in zip(plain, plain_masks):
        assert mask.any()
        assert (img[~mask] == 128).all()
        assert (np.abs(img[mask].astype(int) - 128).max(axis=-1) >= 20).all()
    # In the cluttered scene the object is drawn last (never occluded): its pixels are
    # one shaded colour plus noise, so they are far more uniform than the whole image.
    for img, mask in zip(imgs[:20].astype(float), masks[:20]):
        inside = img[mask].std(axis=0).mean()
        overall = img.reshape(-1, 3).std(axis=0).mean()
        assert inside < 20 and inside < overall


def test_ring_has_a_hole_and_disc_does_not():
    """Shape-specific check of the masks: a ring's centre pixel is not in its mask."""
    found = {"ring": False, "circle": False}
    for i in range(200):
        _, label, mask = render_sample(21, i, clutter=False)
        name = CLASS_NAMES[label]
        if name not in found or found[name]:
            continue
        ys, xs = np.nonzero(mask)
        cy, cx = int(round(ys.mean())), int(round(xs.mean()))
        assert mask[cy, cx] == (name == "circle"), name
        found[name] = True
    assert all(found.values())


# --------------------------------------------------------------------------- shipped model


@pytest.fixture(scope="module")
def demo_vit():
    from analysis import load_vit

    return load_vit("demo", device="cpu")


@pytest.fixture(scope="module")
def demo_metrics(demo_vit):
    from analysis.demo.evaluate import evaluate

    return evaluate(demo_vit, n=TEST_N, seed=TEST_SEED)


def test_shipped_files_are_small_safetensors_with_complete_config():
    files = sorted(p.name for p in DEMO_DIR.iterdir())
    assert "model.safetensors" in files and "config.json" in files and "MODEL_CARD.md" in files
    assert not any(f.endswith((".bin", ".pth", ".pt", ".pkl", ".ckpt")) for f in files)
    assert (DEMO_DIR / "model.safetensors").stat().st_size <= 20 * 1024 * 1024
    cfg = json.loads((DEMO_DIR / "config.json").read_text())
    assert cfg["num_classes"] == len(CLASS_NAMES)
    assert cfg["label_names"] == CLASS_NAMES
    for key in ("img_size", "patch_size", "embed_dim", "depth", "num_heads"):
        assert key in cfg["model_args"]
    pc = cfg["pretrained_cfg"]
    size = cfg["model_args"]["img_size"]
    assert pc["input_size"] == [3, size, size] and pc["crop_pct"] == 1.0
    assert len(pc["mean"]) == len(pc["std"]) == 3 and pc["num_classes"] == len(CLASS_NAMES)


def test_config_rebuilds_with_timm_create_model():
    import timm
    from safetensors.torch import load_file

    cfg = json.loads((DEMO_DIR / "config.json").read_text())
    model = timm.create_model(
        cfg["architecture"], pretrained=False, num_classes=cfg["num_classes"], **cfg["model_args"]
    )
    missing, unexpected = model.load_state_dict(load_file(str(DEMO_DIR / "model.safetensors")), strict=True)
    assert not missing and not unexpected


def test_demo_model_geometry(demo_vit):
    spec = demo_vit.spec
    assert demo_vit.class_names == CLASS_NAMES
    assert spec.img_size[0] == spec.grid_size[0] * spec.patch_size[0]
    imgs, _, _ = generate_samples(2, seed=TEST_SEED)
    pixels = demo_vit.preprocess(imgs[0])
    assert tuple(pixels.shape) == (1, 3, *spec.img_size)


def test_demo_accuracy(demo_metrics):
    assert demo_metrics["accuracy"] >= 0.90, demo_metrics


def test_demo_position_embeddings_are_local(demo_metrics):
    assert demo_metrics["locality_gap"] >= 0.30, demo_metrics


def test_demo_rollout_points_at_the_object(demo_metrics):
    assert demo_metrics["pointing_game"] >= 0.80, demo_metrics
    assert demo_metrics["pointing_game"] > demo_metrics["pointing_chance"] + 0.3, demo_metrics


def test_locality_gap_of_random_embeddings_is_near_zero():
    """The metric itself: an untrained (random) ViT scores about 0."""
    from analysis import load_vit
    from analysis.demo.evaluate import locality_gap
    from training.train_demo_vit import DEFAULT_MODEL_ARGS

    vit = load_vit(
        "vit_tiny_patch16_224", pretrained=False, device="cpu", num_classes=len(CLASS_NAMES), **DEFAULT_MODEL_ARGS
    )
    assert abs(locality_gap(vit)) < 0.1


def test_pointing_game_helpers():
    """The evaluation uses the faithfulness benchmark's rule, batched over scenes."""
    from analysis.faithfulness import patch_mask, pointing_score

    masks = np.zeros((2, 8, 8), dtype=bool)
    masks[0, 0, 5] = True  # one pixel in patch (0, 1) of a 2x2 grid of 4x4 patches
    masks[1, 6:8, 0:2] = True  # patch (1, 0)
    overlap = patch_mask(masks, (4, 4), (2, 2))
    assert overlap.tolist() == [[[False, True], [False, False]], [[False, False], [True, False]]]
    rollout = torch.tensor([[[0.0, 1.0], [0.0, 0.0]], [[1.0, 0.0], [0.0, 0.5]]])
    assert pointing_score(rollout, overlap).tolist() == [1.0, 0.0]


# --------------------------------------------------------------------------- training smoke


def test_training_smoke_run_saves_a_loadable_model(tmp_path):
    from analysis import capture_attention, load_vit
    from training.train_demo_vit import DEFAULT_MODEL_ARGS, train

    tiny = dict(DEFAULT_MODEL_ARGS, embed_dim=32, depth=1, num_heads=2)
    summary = train(tmp_path, seed=3, pool=20, steps=2, batch_size=8, val_size=0, model_args=tiny, log=lambda *_: None)
    assert summary["steps"] == 2
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "config.json").is_file()
    vit = load_vit(str(tmp_path), device="cpu")
    imgs, _, _ = generate_samples(3, seed=4)
    pixels = torch.cat([vit.preprocess(im) for im in imgs])
    record = capture_attention(vit, pixels)
    assert tuple(record.logits.shape) == (3, len(CLASS_NAMES))
    assert vit.spec.grid_size == (8, 8) and vit.spec.num_layers == 1
