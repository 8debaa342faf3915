"""Train the bundled demo CNN (``assets/demo_cnn``) on the demo ViT's procedural scenes, so the
robustness page compares a ViT and a CNN offline.

    python -m training.train_demo_cnn                      # writes assets/demo_cnn (a few minutes)
    python training/train_demo_cnn.py --out /tmp/cnn       # the same, as a file (from the repository root)

timm's ``test_resnet`` (a small ResNet: 0.37 M parameters), the same scenes, augmentation
(random dihedral transforms), normalisation and label names as the demo ViT; saved in timm's
hub layout (``config.json`` + ``model.safetensors``), so
``timm.create_model("local-dir:assets/demo_cnn", pretrained=True)`` opens it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository root holds `analysis` and `training`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F

from analysis.base.assets import asset_path
from analysis.demo.config import demo_pretrained_cfg, normalize_uint8, scenes_to_tensor
from analysis.demo.data import CLASS_NAMES, DEFAULT_SIZE, generate_arrays
from training.common import accuracy, dihedral, save_timm_folder

__all__ = ["ARCHITECTURE", "DEFAULT_OUT", "build_cnn", "make_cnn_config", "train_cnn", "main"]

ARCHITECTURE = "test_resnet"
DEFAULT_OUT = asset_path("demo_cnn")  # where load_cnn("demo") looks (a checkout or a wheel)


def build_cnn(num_classes: int = len(CLASS_NAMES)):
    import timm

    return timm.create_model(ARCHITECTURE, pretrained=False, num_classes=num_classes)


def make_cnn_config(num_classes: int, label_names: list[str], size: int = DEFAULT_SIZE) -> dict:
    return {
        "architecture": ARCHITECTURE,
        "num_classes": num_classes,
        "pretrained_cfg": demo_pretrained_cfg(
            size, size, num_classes, fixed_input_size=False, first_conv="conv1.0", classifier="fc"
        ),
        "label_names": list(label_names),
    }


def train_cnn(
    out: Path | str = DEFAULT_OUT,
    *,
    seed: int = 10,
    pool: int = 30000,
    steps: int = 2500,
    batch_size: int = 128,
    lr: float = 3e-3,
    weight_decay: float = 0.05,
    val_size: int = 1000,
    threads: int = 2,
    log=print,
) -> dict:
    started = time.time()
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    images, labels, _ = generate_arrays(pool, seed, size=DEFAULT_SIZE)
    x_train = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()
    y_train = torch.from_numpy(labels)
    val_images, val_labels, _ = generate_arrays(val_size, seed + 1, size=DEFAULT_SIZE)
    x_val, y_val = scenes_to_tensor(val_images), torch.from_numpy(val_labels)
    log(f"[train_demo_cnn] {pool} scenes (seed {seed}) + {val_size} val ready in {time.time() - started:.0f} s")
    model = build_cnn()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    generator = torch.Generator().manual_seed(seed)
    warm = max(1, steps // 20)
    model.train()
    order, position = torch.randperm(pool, generator=generator), 0
    for step in range(steps):
        rate = (
            lr * (step + 1) / warm
            if step < warm
            else 1e-5 + (lr - 1e-5) * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))
        )
        for group in optimizer.param_groups:
            group["lr"] = rate
        if position + batch_size > pool:
            order, position = torch.randperm(pool, generator=generator), 0
        index = order[position : position + batch_size]
        position += batch_size
        loss = F.cross_entropy(
            model(normalize_uint8(dihedral(x_train[index], generator))), y_train[index], label_smoothing=0.1
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if (step + 1) % 500 == 0 or step + 1 == steps:
            log(
                f"[train_demo_cnn] step {step + 1}/{steps} loss {loss.item():.3f} "
                f"val acc {accuracy(model, x_val, y_val):.3f} ({time.time() - started:.0f} s)"
            )
    model.eval()
    val_accuracy = accuracy(model, x_val, y_val)
    save_timm_folder(model, out, make_cnn_config(len(CLASS_NAMES), CLASS_NAMES))
    return {"steps": steps, "seconds": time.time() - started, "val_accuracy": val_accuracy}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.train_demo_cnn", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--steps", type=int, default=2500)
    parser.add_argument("--seed", type=int, default=10)
    args = parser.parse_args(argv)
    print(json.dumps(train_cnn(args.out, steps=args.steps, seed=args.seed), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
