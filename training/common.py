"""What the training scripts of the demo models share: scene pool, augmentation, schedule, output.

Every demo model trains on the same scenes (:mod:`analysis.demo.data`) with the same
augmentation (a random element of the dihedral group per sample: every class is invariant
under flips and 90-degree rotations) and the same normalisation
(:func:`analysis.demo.config.normalize_uint8`), so their accuracies compare on the same inputs.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch

from analysis.demo.config import normalize_uint8, scenes_to_tensor
from analysis.demo.data import DEFAULT_SIZE, generate_arrays

__all__ = ["dihedral", "accuracy", "warmup_cosine", "scene_pool", "save_timm_folder"]


def dihedral(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Apply a random dihedral transform per sample (x: B,C,H,W with H == W)."""
    k = torch.randint(0, 4, (x.shape[0],), generator=g)
    flip = torch.randint(0, 2, (x.shape[0],), generator=g).bool()
    x = torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)
    out = torch.empty_like(x)
    for r in range(4):
        sel = k == r
        if sel.any():
            out[sel] = torch.rot90(x[sel], r, dims=(-2, -1))
    return out


@torch.no_grad()
def accuracy(model, x: torch.Tensor, y: torch.Tensor, batch: int = 500) -> float:
    """Share of arg-max hits of ``model`` on normalised ``x (N, 3, H, W)``; leaves it in train mode."""
    model.eval()
    correct = 0
    for i in range(0, len(x), batch):
        correct += (model(x[i : i + batch]).argmax(-1) == y[i : i + batch]).sum().item()
    model.train()
    return correct / max(len(x), 1)


def warmup_cosine(step: int, total: int, peak: float, warm: int, floor: float = 1e-5) -> float:
    """Learning rate at ``step`` (0-based): linear warm-up over ``warm`` steps to ``peak``, then
    cosine decay to ``floor`` at ``total``."""
    if step < warm:
        return peak * (step + 1) / warm
    t = (step - warm) / max(1, total - warm)
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))


def scene_pool(pool: int, seed: int, val_size: int, *, size: int = DEFAULT_SIZE, log=print):
    """Training scenes ``0..pool-1`` of stream ``seed`` as uint8 ``(pool, 3, H, W)``, their labels
    and object masks (uint8 ``(pool, 1, H, W)``, 1 on the object), and ``val_size`` normalised
    validation scenes of stream ``seed + 1`` (progress output only) with their labels."""
    started = time.time()
    images, labels, masks = generate_arrays(pool, seed, size=size)
    x_train = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()
    y_train = torch.from_numpy(labels)
    m_train = torch.from_numpy(masks).to(torch.uint8)[:, None]
    del images, masks
    val_images, val_labels, _ = generate_arrays(val_size, seed + 1, size=size)
    x_val, y_val = scenes_to_tensor(val_images), torch.from_numpy(val_labels)
    log(f"{pool} scenes (seed {seed}) + {val_size} val (seed {seed + 1}) ready in {time.time() - started:.0f} s")
    return x_train, y_train, m_train, x_val, y_val


def batch_of(
    x_train: torch.Tensor, m_train: torch.Tensor, index: torch.Tensor, g: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """The augmented training batch of ``index``: normalised scenes ``(B, 3, H, W)`` and their
    object masks ``(B, 1, H, W)`` in {0, 1}, both under the same random dihedral transform."""
    both = dihedral(torch.cat([x_train[index], m_train[index]], dim=1), g)
    return normalize_uint8(both[:, :3]), both[:, 3:].float()


def save_timm_folder(model, out: Path | str, config: dict) -> Path:
    """timm's hub layout: ``model.safetensors`` (the state dict) + ``config.json`` (``config``)."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out
