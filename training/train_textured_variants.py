"""Fine-tune the bundled demo ViT, CNN and Swin on scenes where shape **and** texture carry the class:
the textured variants (``assets/demo_vit_textured``, ``assets/demo_cnn_textured``,
``assets/demo_swin_textured``), demo models that can read texture, so a shape-bias measure on
cue-conflict scenes means something (the plain demo models never saw a textured object).

    python -m training.train_textured_variants --threads 1              # all three, the shipped runs
    python -m training.train_textured_variants --model cnn --threads 1  # one of them
    python -m training.train_textured_variants --model vit --steps 20 --out /tmp/vit_tex   # a quick try

Each variant starts from its plain demo model's weights (``assets/demo_vit``, ``demo_cnn``,
``demo_swin``; the architecture, preprocessing and label names stay, and the output folder has the
same timm hub layout, ``config.json`` + ``model.safetensors``) and trains on a mix, half of each batch
from each pool:

* **plain** demo scenes (:func:`analysis.demo.data.render_sample`), scenes ``0..pool-1`` of seed 30,
  each under a random element of the dihedral group (as the plain models were trained), so the variant
  keeps the plain task;
* **textured** scenes (:func:`analysis.demo.cue_conflict.textured_scene`: the object filled with its
  own class's texture), scenes ``0..pool-1`` of seed 31, each turned by 180° or not at random. A
  half-turn keeps every class's texture a texture of the same class (dots, checks, diagonal and
  vertical stripes map onto themselves; waves and zigzags onto themselves, shifted, their two colours swapped),
  while a quarter-turn or a flip would turn the vertical stripes horizontal or the diagonal stripes the
  other way: textures no class has.

The same recipe for the three: AdamW (weight decay 0.05, none on biases, norms and position tables:
timm's ``create_optimizer_v2``), linear warm-up over 5% of the steps to ``--lr`` then cosine decay,
label smoothing 0.1, gradient clipping at 1.0, batch 128 (64 + 64); the steps and peak learning rate
of each (:data:`VARIANTS`): ViT 600 at 5e-4, CNN 1,200 at 1e-3, Swin 1,200 at 5e-4, the batch order seeded by
``--seed``. Progress lines score 500 plain scenes of seed 32 and 500 textured scenes of seed 33
(progress only). The held-out numbers at the end
(:func:`analysis.demo.evaluate.cue_accuracies`, 2,000 images of seed 2026 each) are what the model
cards report.

Seeds used elsewhere: the demo ViT 0, 1, 3, 4; the CNN 10, 11; the Swin 20, 21; held-out evaluation
2026, the tests 777, the robustness benchmark 20261204 (its cue-conflict scenes too).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository root holds `analysis` and `training`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
import torch.nn.functional as F

from analysis.base.assets import asset_path
from analysis.demo.config import normalize_uint8, scenes_to_tensor
from analysis.demo.cue_conflict import textured_scenes
from analysis.demo.data import DEFAULT_SIZE, generate_arrays
from training.common import accuracy, dihedral, save_timm_folder, warmup_cosine

__all__ = ["VARIANTS", "Variant", "half_turn", "half_precision", "textured_pool", "train_variant", "held_out", "main"]

PLAIN_SEED = 30  # the plain pool; PLAIN_SEED + 2 the plain progress scenes
TEXTURED_SEED = 31  # the textured pool; TEXTURED_SEED + 2 the textured progress scenes


@dataclass(frozen=True)
class Variant:
    """A textured variant: the plain demo model it starts from, where it goes, how it is built and
    loaded, and its shipped number of steps."""

    source: str  # asset folder of the plain demo model
    out: str  # asset folder of the variant
    load_name: str  # what load_vit / load_cnn call it
    steps: int
    lr: float  # peak learning rate: a quarter to a third of the plain model's from-scratch peak


VARIANTS: dict[str, Variant] = {
    "vit": Variant("demo_vit", "demo_vit_textured", "demo_textured", 600, 5e-4),
    "cnn": Variant("demo_cnn", "demo_cnn_textured", "demo_textured", 1200, 1e-3),
    "swin": Variant("demo_swin", "demo_swin_textured", "demo_swin_textured", 1200, 5e-4),
}


def _build(kind: str, config: dict):
    """The timm model of ``kind`` with the architecture of the plain model's ``config.json``."""
    if kind == "vit":
        from training.train_demo_vit import build_model

        return build_model(config["model_args"], int(config["num_classes"]))
    if kind == "cnn":
        from training.train_demo_cnn import build_cnn

        return build_cnn(int(config["num_classes"]))
    from training.train_demo_swin import build_swin

    return build_swin(int(config["num_classes"]), config["model_args"])


def half_turn(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Each image of ``x (B, C, H, W)`` turned by 180° or not, at random (probability 1/2)."""
    turn = torch.randint(0, 2, (x.shape[0],), generator=g).bool()
    return torch.where(turn.view(-1, 1, 1, 1), x.flip(-2, -1), x)


def textured_pool(n: int, seed: int, size: int = DEFAULT_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """Textured scenes ``0..n-1`` of ``seed`` as uint8 ``(n, 3, H, W)`` and their (shape = texture) classes."""
    scenes = textured_scenes(n, seed, size)
    images = torch.from_numpy(np.stack([s.image for s in scenes])).permute(0, 3, 1, 2).contiguous()
    return images, torch.tensor([s.shape_class for s in scenes], dtype=torch.int64)


def half_precision(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with every floating tensor stored as float16 (integer buffers as they are): the variants
    ship at half the size of the plain models (the wheel carries six demo models); loading casts them
    back to the float32 parameters, and the held-out numbers are measured on what was saved."""
    return {k: v.half() if v.is_floating_point() else v for k, v in state.items()}


def held_out(kind: str, folder: Path | str, n: int = 2000) -> dict[str, float]:
    """:func:`analysis.demo.evaluate.cue_accuracies` of the model in ``folder`` (plain, textured and
    texture-only accuracy on ``n`` images of seed 2026 each), loaded as the app loads it."""
    from analysis.demo.evaluate import cue_accuracies

    if kind == "cnn":
        from analysis.robustness import load_cnn

        model = load_cnn(str(folder), device="cpu")
    else:
        from analysis import load_vit

        model = load_vit(str(folder), device="cpu")
    return cue_accuracies(model, n)


def train_variant(
    kind: str,
    out: Path | str | None = None,
    *,
    steps: int | None = None,
    seed: int = 0,
    pool: int = 8000,
    batch_size: int = 128,
    lr: float | None = None,
    weight_decay: float = 0.05,
    val_size: int = 500,
    threads: int = 1,
    log_every: int = 200,
    eval_size: int = 2000,
    log=print,
) -> dict:
    """Fine-tune the plain demo model of ``kind`` (a key of :data:`VARIANTS`) and save it to ``out``
    (default: its asset folder); returns a summary (steps, wall and CPU seconds, held-out accuracies)."""
    from safetensors.torch import load_file
    from timm.optim import create_optimizer_v2

    variant = VARIANTS[kind]
    steps = variant.steps if steps is None else int(steps)
    lr = variant.lr if lr is None else float(lr)
    out = Path(out) if out is not None else asset_path(variant.out)
    started, cpu_started = time.time(), time.process_time()
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    tag = f"[textured {kind}]"

    plain_images, plain_labels, _ = generate_arrays(pool, PLAIN_SEED)
    x_plain = torch.from_numpy(plain_images).permute(0, 3, 1, 2).contiguous()  # uint8 (pool, 3, H, W)
    y_plain = torch.from_numpy(plain_labels)
    x_tex, y_tex = textured_pool(pool, TEXTURED_SEED)  # uint8 (pool, 3, H, W), (pool,)
    val_images, val_labels, _ = generate_arrays(val_size, PLAIN_SEED + 2)
    x_val_plain, y_val_plain = scenes_to_tensor(val_images), torch.from_numpy(val_labels)
    val_tex, y_val_tex = textured_pool(val_size, TEXTURED_SEED + 2)
    x_val_tex = normalize_uint8(val_tex)
    log(f"{tag} {pool} plain (seed {PLAIN_SEED}) + {pool} textured (seed {TEXTURED_SEED}) scenes ready")

    source = asset_path(variant.source)
    config = json.loads((source / "config.json").read_text())
    model = _build(kind, config)
    model.load_state_dict(load_file(str(source / "model.safetensors")), strict=True)
    log(
        f"{tag} from {source}: val plain {accuracy(model, x_val_plain, y_val_plain):.3f} "
        f"textured {accuracy(model, x_val_tex, y_val_tex):.3f}"
    )
    optimizer = create_optimizer_v2(model, "adamw", lr=lr, weight_decay=weight_decay)
    generator = torch.Generator().manual_seed(seed)
    warm = max(1, steps // 20)
    half = batch_size // 2
    order_plain, order_tex, position = (
        torch.randperm(pool, generator=generator),
        torch.randperm(pool, generator=generator),
        0,
    )
    progress = []
    model.train()
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = warmup_cosine(step, steps, lr, warm)
        if position + half > pool:
            order_plain, order_tex, position = (
                torch.randperm(pool, generator=generator),
                torch.randperm(pool, generator=generator),
                0,
            )
        ip, it = order_plain[position : position + half], order_tex[position : position + half]
        position += half
        pixels = normalize_uint8(torch.cat([dihedral(x_plain[ip], generator), half_turn(x_tex[it], generator)]))
        labels = torch.cat([y_plain[ip], y_tex[it]])
        loss = F.cross_entropy(model(pixels), labels, label_smoothing=0.1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if (step + 1) % log_every == 0 or step + 1 == steps:
            plain_acc = accuracy(model, x_val_plain, y_val_plain)
            tex_acc = accuracy(model, x_val_tex, y_val_tex)
            progress.append((step + 1, round(plain_acc, 3), round(tex_acc, 3)))
            log(
                f"{tag} step {step + 1}/{steps} loss {loss.item():.3f} val plain {plain_acc:.3f} "
                f"textured {tex_acc:.3f} ({time.time() - started:.0f} s wall, "
                f"{time.process_time() - cpu_started:.0f} s CPU)"
            )
            sys.stdout.flush()
    model.eval()
    # float16 on disk (half_precision); the plain model's config: architecture, classes, preprocessing
    save_timm_folder(copy.deepcopy(model).half(), out, config)
    summary = {
        "variant": kind,
        "steps": steps,
        "wall_s": round(time.time() - started, 1),
        "cpu_s": round(time.process_time() - cpu_started, 1),
        "progress": progress,
        "out": str(out),
    }
    if eval_size:
        summary["held_out"] = held_out(kind, out, eval_size)
        summary["held_out_n"] = eval_size
    log(f"{tag} done: {json.dumps(summary)}")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m training.train_textured_variants", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--model", choices=["all", *VARIANTS], default="all", help="which variant (default: all)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (one variant only; default: its asset)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the shipped run's)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the batch order and augmentation")
    parser.add_argument("--pool", type=int, default=8000, help="distinct scenes in each pool (plain, textured)")
    parser.add_argument("--lr", type=float, default=None, help="peak AdamW learning rate (default: the shipped run's)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--eval-size", type=int, default=2000, help="held-out images of each kind (0: none)")
    args = parser.parse_args(argv)
    kinds = list(VARIANTS) if args.model == "all" else [args.model]
    if args.out is not None and len(kinds) > 1:
        parser.error("--out names one folder: give --model too")
    for kind in kinds:
        train_variant(
            kind,
            args.out,
            steps=args.steps,
            seed=args.seed,
            pool=args.pool,
            lr=args.lr,
            threads=args.threads,
            eval_size=args.eval_size,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
