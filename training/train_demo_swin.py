"""Train the bundled demo Swin (``assets/demo_swin``) on the demo scenes, from scratch, on the CPU.

    python -m training.train_demo_swin --threads 1   # writes assets/demo_swin (the shipped run: 24 minutes)
    python training/train_demo_swin.py --out /tmp/swin --steps 300 --pool 3000   # a quick try

A timm ``SwinTransformer`` (v1) sized for the 48 x 48 scenes, built with
``timm.create_model(ARCHITECTURE, pretrained=False, num_classes=6, **MODEL_ARGS)``:

=======  ===========  =======================  ==========================
stage    grid         windows (side)           blocks
=======  ===========  =======================  ==========================
0        12 x 12      4 windows of 6 x 6       plain, then shifted by 3
1        6 x 6        1 window of 6 x 6        2, no shift (window = grid)
2        3 x 3        1 window of 3 x 3        2, no shift (window = grid)
=======  ===========  =======================  ==========================

(4 x 4 patches; patch merging halves the grid between stages; timm shrinks a window to its
stage grid and drops the shift where one window covers it.) Same scenes, augmentation
(random dihedral transforms), normalisation and label names as the demo ViT and CNN, so the
three compare on the same inputs. Saved in timm's hub layout (``config.json`` with
``model_args`` + ``model.safetensors``): ``load_vit("demo_swin")`` and
``timm.create_model("local-dir:assets/demo_swin", pretrained=True)`` open it.

Recipe: AdamW (peak LR 2e-3, 5% linear warm-up, cosine decay; weight decay 0.05, none on
biases, norms and the relative-position bias tables), label smoothing 0.1, gradient clipping
at 1.0, batch 128. On top of the labels, a **training-only object-mask loss**: a linear head
per stage (not saved; the shipped model is a plain timm Swin) predicts, for every cell of the
stage grid, the share of its pixels on the object (the scenes' exact masks, under the same
dihedral transform as the image), scored by binary cross-entropy and weighted by
``--mask-weight``. Without it this small Swin stays near chance for the first thousands of
steps (validation accuracy 0.26 after 1,500 of 3,000 steps, with timm's default drop path
0.1); in 600-step probe runs of this script on 6,000 scenes (drop path 0) it had 0.22 after
400 steps with labels alone and 0.40 with the mask loss at weight 3 (0.37 at weight 1).

Seeds: the pool is scenes ``0..pool-1`` of ``--seed`` (default 20; also the init and batch
order), progress-only validation from ``--seed + 1``. The demo ViT used 0, 1, 3, 4, the CNN
10, 11; held-out evaluation uses 2026 and the tests 777.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository root holds `analysis` and `training`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F

from analysis.base.assets import asset_path
from analysis.demo.config import demo_pretrained_cfg
from analysis.demo.data import CLASS_NAMES, DEFAULT_SIZE
from training.common import accuracy, batch_of, save_timm_folder, scene_pool, warmup_cosine

__all__ = ["ARCHITECTURE", "MODEL_ARGS", "DEFAULT_OUT", "build_swin", "make_swin_config", "train_swin", "main"]

ARCHITECTURE = "swin_tiny_patch4_window7_224"  # timm entry point; MODEL_ARGS override its sizes
MODEL_ARGS: dict = dict(
    img_size=DEFAULT_SIZE,
    patch_size=4,
    window_size=6,
    embed_dim=32,
    depths=(2, 2, 2),
    num_heads=(2, 4, 8),
    mlp_ratio=2.0,
    drop_path_rate=0.0,  # timm's default 0.1 slows this small, short run
)
DEFAULT_OUT = asset_path("demo_swin")  # where load_vit("demo_swin") looks (a checkout or a wheel)


def build_swin(num_classes: int = len(CLASS_NAMES), model_args: dict | None = None):
    import timm

    return timm.create_model(ARCHITECTURE, pretrained=False, num_classes=num_classes, **(model_args or MODEL_ARGS))


def make_swin_config(label_names: list[str] = CLASS_NAMES, model_args: dict | None = None) -> dict:
    args = json.loads(json.dumps(model_args or MODEL_ARGS))  # tuples -> lists, as json writes them
    size = int(args["img_size"])
    return {
        "architecture": ARCHITECTURE,
        "num_classes": len(label_names),
        "num_features": int(args["embed_dim"]) * 2 ** (len(args["depths"]) - 1),
        "model_args": args,
        "pretrained_cfg": demo_pretrained_cfg(
            size, size, len(label_names), fixed_input_size=True, first_conv="patch_embed.proj", classifier="head.fc"
        ),
        "label_names": list(label_names),
    }


def forward_with_stages(model, pixels: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """timm's ``SwinTransformer.forward`` step by step: the logits ``(B, classes)`` and each
    stage's output ``(B, gh, gw, C)`` (tests check the logits equal ``model(pixels)``)."""
    x = model.patch_embed(pixels)
    stages = []
    for layer in model.layers:
        x = layer(x)
        stages.append(x)
    return model.forward_head(model.norm(x)), stages


def mask_loss(stages: list[torch.Tensor], heads: torch.nn.ModuleList, masks: torch.Tensor) -> torch.Tensor:
    """Mean over stages of the binary cross-entropy between each cell's predicted and true share
    of object pixels (the mask ``(B, 1, H, W)`` averaged over the cell's pixels)."""
    losses = []
    for stage, head in zip(stages, heads):
        share = F.adaptive_avg_pool2d(masks, stage.shape[1:3])[:, 0]  # (B, gh, gw)
        losses.append(F.binary_cross_entropy_with_logits(head(stage)[..., 0], share))
    return torch.stack(losses).mean()


def train_swin(
    out: Path | str = DEFAULT_OUT,
    *,
    seed: int = 20,
    pool: int = 30000,
    steps: int = 4500,
    batch_size: int = 128,
    lr: float = 2e-3,
    weight_decay: float = 0.05,
    val_size: int = 1000,
    mask_weight: float = 3.0,
    threads: int = 2,
    log_every: int = 500,
    init: Path | str | None = None,
    log=print,
) -> dict:
    """Train and save to ``out``; returns a summary (steps, seconds, final validation accuracy).
    ``init``: start from the weights of a folder this script wrote (a continuation phase, with a
    fresh optimizer and schedule)."""
    from timm.optim import create_optimizer_v2

    started = time.time()
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    x_train, y_train, m_train, x_val, y_val = scene_pool(
        pool, seed, val_size, log=lambda m: log(f"[train_demo_swin] {m}")
    )
    model = build_swin()
    # Training-only heads (not saved): each stage's cells predict the share of their pixels on the object.
    mask_heads = torch.nn.ModuleList(torch.nn.Linear(int(info["num_chs"]), 1) for info in model.feature_info)
    if init is not None:
        from safetensors.torch import load_file

        model.load_state_dict(load_file(str(Path(init) / "model.safetensors")), strict=True)
        log(f"[train_demo_swin] initialised from {init} (fresh optimizer state and schedule)")
    n_params = sum(p.numel() for p in model.parameters())
    log(f"[train_demo_swin] {ARCHITECTURE} {MODEL_ARGS} -> {n_params / 1e6:.3f} M parameters")
    # AdamW without weight decay on biases, norms and the relative-position bias tables
    # (timm's create_optimizer_v2 reads model.no_weight_decay()).
    optimizer = create_optimizer_v2(model, "adamw", lr=lr, weight_decay=weight_decay)
    optimizer.add_param_group({"params": list(mask_heads.parameters()), "weight_decay": 0.0})
    generator = torch.Generator().manual_seed(seed)
    warm = max(1, steps // 20)
    model.train()
    order, position = torch.randperm(pool, generator=generator), 0
    progress = []
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = warmup_cosine(step, steps, lr, warm)
        if position + batch_size > pool:
            order, position = torch.randperm(pool, generator=generator), 0
        index = order[position : position + batch_size]
        position += batch_size
        pixels, masks = batch_of(x_train, m_train, index, generator)
        logits, stages = forward_with_stages(model, pixels)
        loss = F.cross_entropy(logits, y_train[index], label_smoothing=0.1)
        if mask_weight:
            loss = loss + mask_weight * mask_loss(stages, mask_heads, masks)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([*model.parameters(), *mask_heads.parameters()], 1.0)
        optimizer.step()
        if (step + 1) % log_every == 0 or step + 1 == steps:
            val = accuracy(model, x_val, y_val)
            progress.append((step + 1, val))
            log(
                f"[train_demo_swin] step {step + 1}/{steps} loss {loss.item():.3f} val acc {val:.3f} "
                f"({time.time() - started:.0f} s)"
            )
            sys.stdout.flush()
    model.eval()
    save_timm_folder(model, out, make_swin_config())
    summary = {
        "steps": steps,
        "seconds": round(time.time() - started, 1),
        "parameters": n_params,
        "val_accuracy": progress[-1][1],
        "progress": progress,
        "out": str(out),
    }
    log(f"[train_demo_swin] done: {json.dumps(summary)}")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.train_demo_swin", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (timm hub layout)")
    parser.add_argument("--steps", type=int, default=4500)
    parser.add_argument("--seed", type=int, default=20)
    parser.add_argument("--pool", type=int, default=30000, help="number of distinct training scenes")
    parser.add_argument("--lr", type=float, default=2e-3, help="peak AdamW learning rate")
    parser.add_argument(
        "--mask-weight",
        type=float,
        default=3.0,
        help="weight of the training-only object-mask loss on every stage (0: labels only)",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--log-every", type=int, default=500)
    parser.add_argument(
        "--init",
        type=Path,
        default=None,
        help="start from the weights of a folder this script wrote (a continuation phase)",
    )
    args = parser.parse_args(argv)
    train_swin(
        args.out,
        steps=args.steps,
        seed=args.seed,
        pool=args.pool,
        lr=args.lr,
        mask_weight=args.mask_weight,
        threads=args.threads,
        log_every=args.log_every,
        init=args.init,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
