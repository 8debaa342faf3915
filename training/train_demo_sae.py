"""Train the bundled demo sparse autoencoder (``assets/demo_sae``) on the demo ViT's residual stream, on the CPU.

    python -m training.train_demo_sae --threads 2   # writes assets/demo_sae (cfg.json, weights, README.md)
    python training/train_demo_sae.py --out /tmp/sae --scenes 300 --epochs 1   # a quick try

A TopK SAE (Gao et al. 2024; :mod:`analysis.sae`) on ``blocks.2.resid_post`` of ``load_vit("demo")``
(after the third of its four blocks: late enough that features read as parts of the shapes and
their classes, early enough that the class token has not yet gathered everything), on the 64 patch
tokens of each scene: ``d_sae = 8 · 128 = 1024`` features, ``k = 8`` per token.

Recipe: the patch tokens of ``--scenes`` demo scenes of stream
:data:`~analysis.sae.demo.SAE_TRAIN_SEED` (a stream none of the demo models trained on) are read
once (one forward pass per 256 scenes) and the SAE trains on them with
:func:`~analysis.sae.train_sae_on_activations`: Adam, LR 1e-3 after 100 warm-up steps, 1,024
tokens per step in a seeded order, ``--epochs`` passes, AuxK for features dead for 500 steps.
The same SAE, streamed instead of read once, is ``python -m analysis sae train --model demo
--point blocks.2.resid_post --demo-scenes 2000 --batch-size 16 --k 8 --expansion 8 --epochs 5``
(its steps are batches of images rather than of 1,024 tokens, so its weights differ).

Held-out evaluation (:func:`analysis.sae.demo.held_out_metrics`): scenes ``0..255`` of stream
:data:`~analysis.sae.demo.SAE_HELD_OUT_SEED`, with their true classes; the script writes the
numbers into the card, ``README.md`` in the output folder.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository root holds `analysis` and `training`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from analysis.sae.demo import DEMO_SAE_POINT, HELD_OUT_SCENES, SAE_HELD_OUT_SEED, SAE_TRAIN_SEED, demo_sae_path

DEFAULT_OUT = demo_sae_path()
COMMAND = "python -m training.train_demo_sae --threads 2"


def patch_activations(vit, count: int, seed: int, *, chunk: int = 256) -> torch.Tensor:
    """``(count · 64, 128)``: the patch tokens at :data:`DEMO_SAE_POINT` of scenes ``0..count − 1`` of ``seed``."""
    from PIL import Image

    from analysis.demo.data import render_sample
    from analysis.sae.reading import read_tokens

    size = vit.spec.img_size[0]
    rows = []
    for start in range(0, count, chunk):
        images = [Image.fromarray(render_sample(seed, i, size)[0]) for i in range(start, min(start + chunk, count))]
        pixels = torch.cat([vit.preprocess(image) for image in images])  # (b, 3, H, W)
        with torch.no_grad():
            tokens, _ = read_tokens(vit, pixels, DEMO_SAE_POINT, "patches")  # (b, T_patches, D)
        rows.append(tokens.reshape(-1, tokens.shape[-1]))
    return torch.cat(rows)


def train_demo_sae(
    out: Path | str = DEFAULT_OUT,
    *,
    scenes: int = 2000,
    epochs: int = 5,
    expansion: int = 8,
    k: int = 8,
    lr: float = 1e-3,
    seed: int = 0,
    threads: int = 2,
    log=print,
) -> dict:
    """Train, save to ``out`` with its card, and return a summary (seconds, held-out metrics)."""
    from analysis import load_vit
    from analysis.sae import save_sae, train_sae_on_activations
    from analysis.sae.demo import held_out_metrics

    started, cpu_started = time.time(), time.process_time()
    torch.set_num_threads(threads)
    vit = load_vit("demo")
    acts = patch_activations(vit, scenes, SAE_TRAIN_SEED)
    log(f"[train_demo_sae] {tuple(acts.shape)} patch tokens of {scenes} scenes read in {time.time() - started:.0f} s")
    sae, training_log = train_sae_on_activations(
        acts,
        k=k,
        expansion=expansion,
        epochs=epochs,
        batch_size=1024,
        lr=lr,
        warmup_steps=100,
        seed=seed,
        dead_after=500,
        point=DEMO_SAE_POINT,
        tokens="patches",
        model_name=str(vit.name),
    )
    seconds, cpu_seconds = time.time() - started, time.process_time() - cpu_started
    log(f"[train_demo_sae] trained in {seconds:.0f} s; last mse {training_log.mse[-1]:.3f}")
    folder = save_sae(sae, out)
    metrics = held_out_metrics(vit, sae)
    summary = {
        "seconds": round(seconds, 1),
        "cpu_seconds": round(cpu_seconds, 1),
        "steps": len(training_log.mse),
        "fraction_variance_explained": metrics.fraction_variance_explained,
        "l0": metrics.l0,
        "dead_fraction": metrics.dead_fraction,
        "dense_fraction": metrics.dense_fraction,
        "kl_divergence": metrics.kl_divergence,
        "top1_agreement": metrics.top1_agreement,
        "accuracy_clean": metrics.accuracy_clean,
        "accuracy_spliced": metrics.accuracy_spliced,
        "accuracy_drop": metrics.accuracy_drop,
    }
    (folder / "README.md").write_text(card(sae, summary, scenes=scenes, epochs=epochs, threads=threads))
    log(f"[train_demo_sae] done: {summary}")
    return summary


def card(sae, summary: dict, *, scenes: int, epochs: int, threads: int) -> str:
    """The model card: what the SAE is, how it was trained, and its held-out metrics."""
    c = sae.config
    size = sum(p.numel() for p in sae.parameters())
    return f"""# Demo SAE: features of the demo ViT's residual stream (bundled, offline)

A TopK sparse autoencoder on `{c.hook_name}` of the bundled demo ViT (`load_vit("demo")`), on its
patch tokens, trained on the CPU by `training/train_demo_sae.py`. It is what the app's Features page
and the sparse-autoencoder guide open without any download: `analysis.sae.load_demo_sae()`.

| | |
|---|---|
| Files | `cfg.json` and `sae_weights.safetensors` in SAELens's format (`SAE.load_from_disk` reads them) |
| SAE | TopK, `d_in = {c.d_in}`, `d_sae = {c.d_sae}` (expansion {c.d_sae // c.d_in}), `k = {c.k}`, {size:,} parameters, float32 |
| Reads | `{c.hook_name}` (after block 2 of 0–3), tokens `{c.tokens}` (the 8×8 patch grid, not the class token) |
| Data | the patch tokens of {scenes:,} demo scenes of stream {SAE_TRAIN_SEED} (`analysis.sae.demo.SAE_TRAIN_SEED`; no demo model trained on it) |
| Recipe | Adam, LR 1e-3 after 100 warm-up steps, 1,024 tokens a step, {epochs} epochs ({summary["steps"]} steps), AuxK for features dead 500 steps, seed 0 |
| Time | reading the tokens and training: {summary["seconds"]:.0f} s wall, {summary["cpu_seconds"]:.0f} s of CPU time, {threads} threads on a 2-core machine shared with other jobs |

Reproduce (from the repository root, offline):

```bash
{COMMAND}
```

## Held-out metrics

Measured by `analysis.sae.demo.held_out_metrics` (`sae_metrics`) on demo scenes 0–{HELD_OUT_SCENES - 1} of stream
{SAE_HELD_OUT_SEED} (`SAE_HELD_OUT_SEED`), with their true classes; "spliced" is the forward pass
with the SAE's reconstruction in place of the patch tokens at `{c.hook_name}` (no error term).

| Metric | Value |
|---|---|
| Fraction of variance explained (FVE) | {summary["fraction_variance_explained"]:.4f} |
| L0 (features firing per token) | {summary["l0"]:.4f} |
| Dead fraction (never fire on these scenes) | {summary["dead_fraction"]:.4f} |
| Dense fraction (fire on more than 10 % of tokens) | {summary["dense_fraction"]:.4f} |
| KL(clean ‖ spliced), mean per scene | {summary["kl_divergence"]:.4f} |
| Top-1 agreement, clean vs spliced | {summary["top1_agreement"]:.4f} |
| Accuracy clean → spliced | {summary["accuracy_clean"]:.4f} → {summary["accuracy_spliced"]:.4f} (drop {summary["accuracy_drop"]:.4f}) |

`tests/test_demo_sae.py` measures FVE and L0 again on the same scenes and compares them with this
table (to 0.005). Expect small numerical differences from a retraining on other CPUs or torch builds.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.train_demo_sae", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (SAELens layout + README.md)")
    parser.add_argument("--scenes", type=int, default=2000, help="training scenes (64 patch tokens each)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--expansion", type=int, default=8)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    train_demo_sae(
        args.out,
        scenes=args.scenes,
        epochs=args.epochs,
        expansion=args.expansion,
        k=args.k,
        lr=args.lr,
        seed=args.seed,
        threads=args.threads,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
