"""The bundled demo CNN (assets/demo_cnn): small, safetensors, opens with timm offline, and
classifies held-out demo scenes (a seed neither its training, seed 10, nor validation, 11, used)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from analysis.demo.config import scenes_to_tensor
from analysis.demo.data import CLASS_NAMES, generate_arrays

CNN_DIR = Path(__file__).resolve().parent.parent / "assets" / "demo_cnn"
HELD_OUT_SEED = 777  # also the demo ViT's test seed, so the two are scored on the same scenes
HELD_OUT_N = 300


def test_files_are_small_safetensors_with_a_complete_config():
    files = sorted(p.name for p in CNN_DIR.iterdir())
    assert files == ["MODEL_CARD.md", "config.json", "model.safetensors"]
    assert (CNN_DIR / "model.safetensors").stat().st_size <= 5 * 1024 * 1024
    cfg = json.loads((CNN_DIR / "config.json").read_text())
    assert cfg["label_names"] == CLASS_NAMES and cfg["num_classes"] == len(CLASS_NAMES)
    assert cfg["pretrained_cfg"]["input_size"] == [3, 48, 48]


def test_the_demo_cnn_classifies_held_out_scenes():
    import timm

    torch.manual_seed(0)
    model = timm.create_model(f"local-dir:{CNN_DIR}", pretrained=True).eval()
    images, labels, _ = generate_arrays(HELD_OUT_N, HELD_OUT_SEED)
    with torch.no_grad():
        predictions = model(scenes_to_tensor(images)).argmax(-1)
    accuracy = float((predictions == torch.from_numpy(labels)).float().mean())
    assert accuracy >= 0.90, accuracy
