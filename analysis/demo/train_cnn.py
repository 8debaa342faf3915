"""Train the bundled demo CNN (``assets/demo_cnn``) on the demo ViT's procedural scenes, so the
robustness page compares a ViT and a CNN offline.

    python -m analysis.demo.train_cnn                      # writes assets/demo_cnn (a few minutes)

timm's ``test_resnet`` (a small ResNet: 0.37 M parameters), the same scenes, augmentation
(random dihedral transforms), normalisation and label names as the demo ViT; saved in timm's
hub layout (``config.json`` + ``model.safetensors``), so
``timm.create_model("local-dir:assets/demo_cnn", pretrained=True)`` opens it.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..assets import asset_path
from .data import CLASS_NAMES, DEFAULT_SIZE, generate_arrays
from .train import _accuracy, _dihedral, _normalize, _to_tensor, demo_pretrained_cfg

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
        "pretrained_cfg": demo_pretrained_cfg(size, size, num_classes, fixed_input_size=False,
                                              first_conv="conv1.0", classifier="fc"),
        "label_names": list(label_names),
    }


def train_cnn(out: Path | str = DEFAULT_OUT, *, seed: int = 10, pool: int = 30000, steps: int = 2500,
              batch_size: int = 128, lr: float = 3e-3, weight_decay: float = 0.05, val_size: int = 1000,
              threads: int = 2, log=print) -> dict:
    from safetensors.torch import save_file

    started = time.time()
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    images, labels, _ = generate_arrays(pool, seed, size=DEFAULT_SIZE)
    x_train = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()
    y_train = torch.from_numpy(labels)
    val_images, val_labels, _ = generate_arrays(val_size, seed + 1, size=DEFAULT_SIZE)
    x_val, y_val = _to_tensor(val_images), torch.from_numpy(val_labels)
    log(f"[demo.train_cnn] {pool} scenes (seed {seed}) + {val_size} val ready in {time.time() - started:.0f} s")
    model = build_cnn()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    generator = torch.Generator().manual_seed(seed)
    warm = max(1, steps // 20)
    model.train()
    order, position = torch.randperm(pool, generator=generator), 0
    for step in range(steps):
        rate = lr * (step + 1) / warm if step < warm else 1e-5 + (lr - 1e-5) * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))
        for group in optimizer.param_groups:
            group["lr"] = rate
        if position + batch_size > pool:
            order, position = torch.randperm(pool, generator=generator), 0
        index = order[position : position + batch_size]
        position += batch_size
        loss = F.cross_entropy(model(_normalize(_dihedral(x_train[index], generator))), y_train[index], label_smoothing=0.1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if (step + 1) % 500 == 0 or step + 1 == steps:
            log(f"[demo.train_cnn] step {step + 1}/{steps} loss {loss.item():.3f} "
                f"val acc {_accuracy(model, x_val, y_val):.3f} ({time.time() - started:.0f} s)")
    model.eval()
    accuracy = _accuracy(model, x_val, y_val)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(make_cnn_config(len(CLASS_NAMES), CLASS_NAMES), indent=2) + "\n")
    return {"steps": steps, "seconds": time.time() - started, "val_accuracy": accuracy}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.demo.train_cnn", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--steps", type=int, default=2500)
    parser.add_argument("--seed", type=int, default=10)
    args = parser.parse_args(argv)
    print(json.dumps(train_cnn(args.out, steps=args.steps, seed=args.seed), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
