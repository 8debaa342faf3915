"""Train the bundled demo ViT on procedural shape scenes (CPU, from scratch).

Usage -- the shipped model (assets/demo_vit) is two runs of this script: phase 1 is the
defaults, phase 2 continues from phase 1's weights on a fresh pool of scenes::

    python -m training.train_demo_vit --out artifacts/demo_vit_phase1
    python -m training.train_demo_vit --init artifacts/demo_vit_phase1 --seed 3 --steps 3000 --lr 1e-3

    python -m training.train_demo_vit --out /tmp/vit --epochs 2 --pool 2000   # a quick try

(from the repository root; ``python training/train_demo_vit.py ...`` works too).

The model is a small timm ``VisionTransformer`` built with
``timm.create_model(ARCHITECTURE, pretrained=False, num_classes=..., **model_args)``;
the output folder uses timm's hub layout (``config.json`` + ``model.safetensors``), so
``timm.create_model("local-dir:<folder>", pretrained=True)`` and
``analysis.load_vit("<folder>")`` both rebuild it.

Recipe facts worth knowing:

* ``pos_embed`` / ``cls_token`` / biases / norms are excluded from weight decay (timm's
  ``create_optimizer_v2`` does that via ``model.no_weight_decay()``); with weight decay on
  ``pos_embed`` the position embeddings do not become local.
* Training data is a fixed pool of scenes from ``--seed`` (sample indices
  ``0..pool-1``; ``--seed`` also seeds the model init and the batch order), re-augmented
  every epoch with a random element of the dihedral group
  (flips / 90-degree rotations; every class is invariant under those). A small
  validation set from ``--seed + 1`` is used for progress output only; it never steers
  training. The held-out evaluation (``python -m analysis.demo.evaluate``) uses yet another seed.
* ``--init`` starts from a previous output folder (same architecture) with a fresh AdamW
  state and a fresh warm-up + cosine schedule: the shipped model's second phase.
* The LR schedule is step-based (linear warm-up, cosine decay), so a run is reproducible
  from its arguments. ``--minutes`` instead sizes the run from the measured speed of the
  first steps and prints the equivalent ``--steps`` so it can be replayed exactly.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository root holds `analysis` and `training`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F

from analysis.base.assets import asset_path
from analysis.demo.config import MEAN, STD, demo_pretrained_cfg, normalize_uint8, scenes_to_tensor
from analysis.demo.data import CLASS_NAMES, DEFAULT_SIZE, generate_arrays
from analysis.demo.evaluate import similarity_locality_gap
from training.common import accuracy, dihedral, save_timm_folder

__all__ = [
    "ARCHITECTURE",
    "DEFAULT_MODEL_ARGS",
    "MEAN",
    "STD",
    "build_model",
    "make_config",
    "save_model",
    "train",
    "main",
]

ARCHITECTURE = "vit_tiny_patch16_224"  # timm entry point; model_args override its sizes
DEFAULT_MODEL_ARGS: dict = dict(
    img_size=DEFAULT_SIZE,
    patch_size=6,
    embed_dim=128,
    depth=4,
    num_heads=4,
    mlp_ratio=2.0,
    class_token=True,
    global_pool="token",
)
DEFAULT_OUT = asset_path("demo_vit")  # where load_vit("demo") looks (a checkout or a wheel)


def build_model(model_args: dict | None = None, num_classes: int = len(CLASS_NAMES)):
    import timm

    args = dict(DEFAULT_MODEL_ARGS if model_args is None else model_args)
    return timm.create_model(ARCHITECTURE, pretrained=False, num_classes=num_classes, **args)


def make_config(model_args: dict, num_classes: int, label_names: list[str]) -> dict:
    size = model_args["img_size"]
    h, w = (size, size) if isinstance(size, int) else tuple(size)
    return {
        "architecture": ARCHITECTURE,
        "num_classes": num_classes,
        "num_features": model_args["embed_dim"],
        "model_args": dict(model_args),
        "pretrained_cfg": demo_pretrained_cfg(
            h, w, num_classes, fixed_input_size=True, pool_size=None, first_conv="patch_embed.proj", classifier="head"
        ),
        "label_names": list(label_names),
    }


def save_model(model, out: Path, model_args: dict, label_names: list[str] = CLASS_NAMES) -> None:
    save_timm_folder(model, out, make_config(model_args, len(label_names), label_names))


def _locality_gap(model) -> float:
    """The evaluation's locality metric on the raw timm model, for progress output."""
    pe = F.normalize(model.pos_embed.detach()[0, model.num_prefix_tokens :], dim=-1)  # (N, D)
    gh, gw = model.patch_embed.grid_size
    return similarity_locality_gap((pe @ pe.T).view(gh, gw, gh, gw))


def train(
    out: Path | str = DEFAULT_OUT,
    *,
    seed: int = 0,
    pool: int = 60000,
    epochs: float | None = None,
    steps: int | None = 4500,
    minutes: float | None = None,
    batch_size: int = 128,
    lr: float = 2e-3,
    weight_decay: float = 0.05,
    warmup_frac: float = 0.05,
    label_smoothing: float = 0.1,
    val_size: int = 1000,
    model_args: dict | None = None,
    threads: int = 2,
    log_every: int | None = None,
    save_every: int | None = None,
    init: Path | str | None = None,
    log=print,
) -> dict:
    """Train and save; returns a summary dict (steps, wall time, final val numbers)."""
    from timm.optim import create_optimizer_v2

    t_start = time.time()
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    model_args = dict(DEFAULT_MODEL_ARGS if model_args is None else model_args)
    size = model_args["img_size"]

    log(f"[train_demo_vit] generating {pool} training scenes (seed {seed}) + {val_size} val (seed {seed + 1}) ...")
    imgs, labels, _ = generate_arrays(pool, seed, size=size)
    x_train = torch.from_numpy(imgs).permute(0, 3, 1, 2).contiguous()  # uint8 (N,3,H,W)
    y_train = torch.from_numpy(labels)
    del imgs
    if val_size:
        vi, vl, _ = generate_arrays(val_size, seed + 1, size=size)
        x_val, y_val = scenes_to_tensor(vi), torch.from_numpy(vl)
    log(f"[train_demo_vit] data ready in {time.time() - t_start:.1f}s")

    model = build_model(model_args, len(CLASS_NAMES))
    if init is not None:
        from safetensors.torch import load_file

        init_cfg = json.loads((Path(init) / "config.json").read_text())
        if init_cfg.get("model_args") != json.loads(json.dumps(model_args)):
            raise ValueError(
                f"--init {init} was trained with model_args {init_cfg.get('model_args')}, "
                f"not {model_args}; pass the same architecture options."
            )
        model.load_state_dict(load_file(str(Path(init) / "model.safetensors")), strict=True)
        log(f"[train_demo_vit] initialised from {init} (fresh optimizer state and LR schedule)")
    n_params = sum(p.numel() for p in model.parameters())
    log(f"[train_demo_vit] {ARCHITECTURE} {model_args} -> {n_params / 1e6:.2f}M params")
    opt = create_optimizer_v2(model, "adamw", lr=lr, weight_decay=weight_decay)
    no_decay = [n for n, p in model.named_parameters() if p.ndim <= 1 or n in model.no_weight_decay()]
    log(
        f"[train_demo_vit] no weight decay on {len(no_decay)} tensors incl. "
        f"{[n for n in no_decay if n in ('pos_embed', 'cls_token')]}"
    )

    steps_per_epoch = max(1, pool // batch_size)
    g = torch.Generator().manual_seed(seed)

    def lr_at(step: int, total: int) -> float:
        warm = max(1, int(warmup_frac * total))
        if step < warm:
            return lr * (step + 1) / warm
        t = (step - warm) / max(1, total - warm)
        return 1e-5 + (lr - 1e-5) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))

    if epochs is not None:
        steps = None
    total = steps if steps is not None else int(round((epochs or 1) * steps_per_epoch))
    probe = 30
    if minutes is not None:
        steps, total = None, None  # decided after timing the first `probe` steps
    log_every = log_every or steps_per_epoch

    model.train()
    t_train = time.time()
    step = 0
    perm = torch.randperm(pool, generator=g)
    pos = 0
    run_loss, run_correct, run_n = 0.0, 0, 0
    while True:
        cur_total = total if total is not None else 10**9
        if step >= cur_total:
            break
        if pos + batch_size > pool:
            perm, pos = torch.randperm(pool, generator=g), 0
        idx = perm[pos : pos + batch_size]
        pos += batch_size
        xb = normalize_uint8(dihedral(x_train[idx], g))
        yb = y_train[idx]
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cur_total if total is not None else 10**6)
        logits = model(xb)
        loss = F.cross_entropy(logits, yb, label_smoothing=label_smoothing)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        run_loss += loss.item() * len(yb)
        run_correct += (logits.argmax(-1) == yb).sum().item()
        run_n += len(yb)
        if total is None and step == probe:
            per_step = (time.time() - t_train) / probe
            budget = minutes * 60 - (time.time() - t_start) - 30
            total = max(probe + 1, int(budget / per_step))
            log(
                f"[train_demo_vit] {per_step * 1000:.0f} ms/step -> {total} steps for --minutes {minutes} "
                f"(replay exactly with --steps {total})"
            )
        if step % log_every == 0 or step == total:
            msg = (
                f"[train_demo_vit] step {step}/{total} ep {step / steps_per_epoch:.2f} "
                f"lr {opt.param_groups[0]['lr']:.2e} loss {run_loss / run_n:.4f} "
                f"train_acc {run_correct / run_n:.3f}"
            )
            if val_size:
                msg += f" val_acc {accuracy(model, x_val, y_val):.3f}"
            msg += f" loc_gap {_locality_gap(model):.3f} elapsed {time.time() - t_start:.0f}s"
            log(msg)
            sys.stdout.flush()
            run_loss, run_correct, run_n = 0.0, 0, 0
        if save_every and step % save_every == 0 and step != total:
            model.eval()
            save_model(model, Path(out), model_args)  # a usable snapshot if the run is cut short
            model.train()

    model.eval()
    wall = time.time() - t_start
    summary = {
        "steps": step,
        "epochs": step / steps_per_epoch,
        "wall_s": wall,
        "val_acc": accuracy(model, x_val, y_val) if val_size else None,
        "locality_gap": _locality_gap(model),
        "params": n_params,
    }
    save_model(model, Path(out), model_args)
    log(f"[train_demo_vit] done: {json.dumps(summary)} -> {out}")
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m training.train_demo_vit",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", default=str(DEFAULT_OUT), help="output folder (timm hub layout)")
    p.add_argument("--seed", type=int, default=0, help="seed of model init, order and the data pool")
    p.add_argument("--pool", type=int, default=60000, help="number of distinct training scenes")
    p.add_argument("--steps", type=int, default=4500, help="optimizer steps (default: the shipped recipe)")
    p.add_argument("--epochs", type=float, default=None, help="passes over the pool (overrides --steps)")
    p.add_argument(
        "--minutes",
        type=float,
        default=None,
        help="size the run to about this wall time (overrides --steps/--epochs; prints the equivalent --steps)",
    )
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=2e-3, help="peak AdamW learning rate")
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--val-size", type=int, default=1000)
    p.add_argument("--depth", type=int, default=DEFAULT_MODEL_ARGS["depth"])
    p.add_argument("--embed-dim", type=int, default=DEFAULT_MODEL_ARGS["embed_dim"])
    p.add_argument("--num-heads", type=int, default=DEFAULT_MODEL_ARGS["num_heads"])
    p.add_argument("--mlp-ratio", type=float, default=DEFAULT_MODEL_ARGS["mlp_ratio"])
    p.add_argument("--threads", type=int, default=int(os.environ.get("TRAIN_THREADS", 2)))
    p.add_argument("--log-every", type=int, default=None, help="steps between progress lines (default: one epoch)")
    p.add_argument(
        "--init", default=None, help="start from the weights of a folder this script wrote (a continuation phase)"
    )
    p.add_argument("--save-every", type=int, default=None, help="also save a snapshot to --out every N steps")
    a = p.parse_args(argv)
    model_args = dict(
        DEFAULT_MODEL_ARGS, depth=a.depth, embed_dim=a.embed_dim, num_heads=a.num_heads, mlp_ratio=a.mlp_ratio
    )
    train(
        a.out,
        seed=a.seed,
        pool=a.pool,
        epochs=a.epochs,
        steps=a.steps,
        minutes=a.minutes,
        batch_size=a.batch_size,
        lr=a.lr,
        weight_decay=a.weight_decay,
        val_size=a.val_size,
        model_args=model_args,
        threads=a.threads,
        log_every=a.log_every,
        save_every=a.save_every,
        init=a.init,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
