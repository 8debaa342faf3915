"""The bundled demo Swin (assets/demo_swin): small, safetensors, opens offline through
``load_vit("demo_swin")`` and timm alike, is really windowed (several windows and a shift in
stage 0), and classifies held-out demo scenes (seed 777: neither its training, seed 20, nor
validation, 21, used; the demo ViT's and CNN's tests score the same scenes)."""

from __future__ import annotations

import json

import pytest
import torch

from analysis import capture_attention, load_vit
from analysis.base.assets import asset_path
from analysis.base.errors import ModelLoadError
from analysis.demo.config import scenes_to_tensor
from analysis.demo.data import CLASS_NAMES, generate_arrays, generate_samples
from analysis.records.windowed import WindowedAttentionRecord

SWIN_DIR = asset_path("demo_swin")
HELD_OUT_SEED = 777
HELD_OUT_N = 300


@pytest.fixture(scope="module")
def swin():
    return load_vit("demo_swin", device="cpu")


def test_files_are_small_safetensors_with_the_training_scripts_config():
    from training.train_demo_swin import make_swin_config

    files = sorted(p.name for p in SWIN_DIR.iterdir())
    assert files == ["MODEL_CARD.md", "config.json", "model.safetensors"]
    assert (SWIN_DIR / "model.safetensors").stat().st_size <= 5 * 1024 * 1024
    config = json.loads((SWIN_DIR / "config.json").read_text())
    assert config == make_swin_config()  # what the shipped recipe writes today
    assert config["label_names"] == CLASS_NAMES and config["pretrained_cfg"]["input_size"] == [3, 48, 48]


def test_the_demo_swin_classifies_held_out_scenes():
    import timm

    model = timm.create_model(f"local-dir:{SWIN_DIR}", pretrained=True).eval()
    images, labels, _ = generate_arrays(HELD_OUT_N, HELD_OUT_SEED)
    with torch.no_grad():
        predictions = model(scenes_to_tensor(images)).argmax(-1)
    accuracy = float((predictions == torch.from_numpy(labels)).float().mean())
    assert accuracy >= 0.90, accuracy


def test_load_vit_feeds_it_as_the_training_did(swin):
    """``load_vit("demo_swin")``'s preprocessing of a PIL scene gives the training's normalised
    tensor, and the held-out accuracy helper counts what a plain loop counts."""
    from analysis.demo.evaluate import accuracy

    images, labels, _ = generate_samples(40, HELD_OUT_SEED)
    arrays, _, _ = generate_arrays(40, HELD_OUT_SEED)
    pixels = torch.cat([swin.preprocess(image) for image in images])
    torch.testing.assert_close(pixels, scenes_to_tensor(arrays), atol=1e-6, rtol=0)
    with torch.no_grad():
        hits = sum(int(swin.model(pixels[i : i + 1]).argmax()) == labels[i] for i in range(40))
    assert accuracy(swin, 40, HELD_OUT_SEED, batch_size=16) == hits / 40
    assert swin.class_names == CLASS_NAMES


def test_stage_zero_has_four_windows_and_a_shift(swin):
    """12x12 grid of 4 px cells in windows of 6x6: 4 windows, the second block shifted by 3;
    patch merging halves the grid to 6x6 and 3x3 (one window each, no shift)."""
    image, _, _ = generate_samples(1, HELD_OUT_SEED)
    pixels = swin.preprocess(image[0])
    record = capture_attention(swin, pixels)
    assert isinstance(record, WindowedAttentionRecord)
    stages = [swin.spec.geometry(layer) for layer in range(swin.spec.num_layers)]
    assert [(g.stage, g.grid_size, g.stride, g.window_size, g.shift) for g in stages] == [
        (0, (12, 12), (4, 4), (6, 6), (0, 0)),
        (0, (12, 12), (4, 4), (6, 6), (3, 3)),
        (1, (6, 6), (8, 8), (6, 6), (0, 0)),
        (1, (6, 6), (8, 8), (6, 6), (0, 0)),
        (2, (3, 3), (16, 16), (3, 3), (0, 0)),
        (2, (3, 3), (16, 16), (3, 3), (0, 0)),
    ]
    first = record.layer_windows(0)
    assert first.shape == (1, 4, 2, 36, 36)  # (B, windows, heads, Wt, Wt)
    torch.testing.assert_close(first.sum(-1), torch.ones(1, 4, 2, 36))
    # the shifted block masks pairs from different image regions: exact zeros appear
    assert (record.layer_windows(1) == 0).any() and not (first == 0).any()
    with torch.no_grad():
        torch.testing.assert_close(record.logits, swin.model(pixels), atol=1e-5, rtol=1e-5)


def test_a_missing_demo_swin_says_how_to_train_it(monkeypatch, tmp_path):
    """The message names the folder and a training command that exists."""
    import importlib.util

    import analysis.model.loading as loading

    folder, command = loading.DEMO_MODELS["demo_swin"]
    assert folder == SWIN_DIR and importlib.util.find_spec(command.removeprefix("python -m ")) is not None
    monkeypatch.setitem(loading.DEMO_MODELS, "demo_swin", (tmp_path / folder.name, command))
    with pytest.raises(ModelLoadError, match=r"git checkout -- assets/demo_swin.*python -m training\.train_demo_swin`"):
        load_vit("demo_swin")


def test_training_smoke_run_saves_a_loadable_swin(tmp_path):
    from training.train_demo_swin import make_swin_config, train_swin

    summary = train_swin(tmp_path, pool=16, steps=2, batch_size=8, val_size=8, log_every=1, log=lambda *_: None)
    assert summary["steps"] == 2 and len(summary["progress"]) == 2
    assert json.loads((tmp_path / "config.json").read_text()) == make_swin_config()
    vit = load_vit(str(tmp_path), device="cpu")
    assert vit.spec.geometry(1).shift == (3, 3) and vit.spec.num_layers == 6


# --------------------------------------------------------------------------- the training script's parts


def test_forward_with_stages_is_timms_forward():
    from training.train_demo_swin import build_swin, forward_with_stages

    torch.manual_seed(0)
    model = build_swin().eval()
    pixels = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        logits, stages = forward_with_stages(model, pixels)
        assert torch.equal(logits, model(pixels))
    assert [tuple(s.shape) for s in stages] == [(2, 12, 12, 32), (2, 6, 6, 64), (2, 3, 3, 128)]


def test_mask_loss_is_the_cells_object_share_cross_entropy():
    """Against explicit loops over cells: target = mean of the cell's mask pixels."""
    import math

    from training.train_demo_swin import mask_loss

    torch.manual_seed(1)
    masks = (torch.rand(2, 1, 48, 48) > 0.7).float()
    stages = [torch.randn(2, 12, 12, 4), torch.randn(2, 6, 6, 8)]
    heads = torch.nn.ModuleList([torch.nn.Linear(4, 1), torch.nn.Linear(8, 1)])
    per_stage = []
    for stage, head in zip(stages, heads):
        cell = 48 // stage.shape[1]
        total, count = 0.0, 0
        for b in range(2):
            for i in range(stage.shape[1]):
                for j in range(stage.shape[2]):
                    share = float(masks[b, 0, i * cell : (i + 1) * cell, j * cell : (j + 1) * cell].mean())
                    with torch.no_grad():
                        z = float(head(stage[b, i, j])[0])
                    p = 1 / (1 + math.exp(-z))
                    total += -(share * math.log(p) + (1 - share) * math.log(1 - p))
                    count += 1
        per_stage.append(total / count)
    with torch.no_grad():
        assert float(mask_loss(stages, heads, masks)) == pytest.approx(sum(per_stage) / 2, rel=1e-5)


def test_the_mask_turns_with_its_image():
    """batch_of applies one dihedral transform to a scene and its mask."""
    from training.common import batch_of

    torch.manual_seed(2)
    x_train = torch.randint(0, 256, (16, 3, 48, 48), dtype=torch.uint8)
    m_train = (x_train[:, :1] > 127).to(torch.uint8)
    pixels, masks = batch_of(x_train, m_train, torch.arange(16), torch.Generator().manual_seed(0))
    assert not torch.equal(pixels, scenes_to_tensor(x_train.permute(0, 2, 3, 1).numpy()))  # something turned
    red = pixels[:, 0] * 0.25 + 0.5  # back to x / 255
    assert torch.equal(masks[:, 0], (red > 127.5 / 255).float())
