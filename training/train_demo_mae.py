"""Train the bundled demo masked autoencoder (``assets/demo_mae``) on the demo scenes, from scratch, on the CPU.

    python -m training.train_demo_mae --threads 1   # writes assets/demo_mae
    python training/train_demo_mae.py --out /tmp/mae --steps 200 --pool 2000   # a quick try

A Hugging Face ``ViTMAEForPreTraining`` (MAE, He et al. 2022: an encoder that sees only the
visible patches, a lighter decoder that predicts every patch from them and mask tokens)
sized for the 48 x 48 scenes: 6 x 6 patches on an 8 x 8 grid, encoder width 64, 4 layers,
4 heads; decoder width 64, 2 layers, 4 heads. ``norm_pix_loss`` is off: the decoder predicts
the pixels themselves (in the scenes' normalisation, ``(x / 255 − 0.5) / 0.25``), so the
reconstruction needs nothing from the hidden patches to be shown and compares honestly with
a baseline. Saved with ``save_pretrained`` plus a ``preprocessor_config.json``:
``analysis.mae.load_mae("demo_mae")`` opens it.

Recipe: the model's own random masking at ratio 0.75 and its own loss (MSE over the hidden
patches); random dihedral transforms of the scenes (as for the other demo models); AdamW
(betas 0.9, 0.95 as in MAE; peak LR 2e-3, 5% linear warm-up, cosine decay; weight decay 0.05),
batch 128. Seeds: the pool is scenes ``0..pool-1`` of ``--seed`` (default 30; also the init,
batch order and masks). Held-out evaluation: :func:`held_out_mse` on scenes of seed 2026
(the demo classifiers' held-out stream), masks drawn as MAE draws them from seed ``i`` for
scene ``i``, against filling each hidden patch with the mean colour of the visible pixels.
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

from analysis.base.assets import asset_path
from analysis.demo.config import MEAN, STD, normalize_uint8, scenes_to_tensor
from analysis.demo.data import DEFAULT_SIZE, generate_arrays
from training.common import dihedral, warmup_cosine

__all__ = ["MODEL_CONFIG", "DEFAULT_OUT", "HELD_OUT_SEED", "build_mae", "held_out_mse", "train_mae", "main"]

MODEL_CONFIG: dict = dict(
    image_size=DEFAULT_SIZE,
    patch_size=6,
    num_channels=3,
    hidden_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    intermediate_size=128,
    decoder_hidden_size=64,
    decoder_num_hidden_layers=2,
    decoder_num_attention_heads=4,
    decoder_intermediate_size=128,
    mask_ratio=0.75,
    norm_pix_loss=False,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)
DEFAULT_OUT = asset_path("demo_mae")  # where load_mae("demo_mae") looks (a checkout or a wheel)
HELD_OUT_SEED = 2026


def sincos_positions(grid: tuple[int, int], dim: int) -> torch.Tensor:
    """``(1, 1 + gh·gw, dim)`` MAE's fixed 2-D sine-cosine position table, a zero row for the
    class token first. Half the channels encode the column, half the row, each as

        [sin(p·ω_k), cos(p·ω_k)],  ω_k = 10000^(−k / (dim/4)),  k = 0 .. dim/4 − 1

    (Vaswani et al. 2017 per axis; MAE ``util/pos_embed.py`` puts the column half first)."""
    gh, gw = grid
    omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim // 4))  # (dim/4,)
    rows, cols = torch.meshgrid(
        torch.arange(gh, dtype=torch.float64), torch.arange(gw, dtype=torch.float64), indexing="ij"
    )

    def encode(positions: torch.Tensor) -> torch.Tensor:  # (N,) -> (N, dim/2)
        angles = positions.reshape(-1, 1) * omega
        return torch.cat([angles.sin(), angles.cos()], dim=1)

    table = torch.cat([encode(cols), encode(rows)], dim=1)  # (N, dim)
    return torch.cat([torch.zeros(1, dim, dtype=torch.float64), table]).unsqueeze(0).float()


def build_mae():
    """A fresh model with its fixed sine-cosine position tables filled in (transformers 5 leaves
    both zero when a model is built from a config: fine for loading weights, but from scratch
    the encoder and the decoder would not know where any patch is)."""
    import transformers

    model = transformers.ViTMAEForPreTraining(transformers.ViTMAEConfig(**MODEL_CONFIG))
    side = MODEL_CONFIG["image_size"] // MODEL_CONFIG["patch_size"]
    with torch.no_grad():
        model.vit.embeddings.position_embeddings.copy_(sincos_positions((side, side), MODEL_CONFIG["hidden_size"]))
        model.decoder.decoder_pos_embed.copy_(sincos_positions((side, side), MODEL_CONFIG["decoder_hidden_size"]))
        model.decoder.mask_token.normal_(std=0.02)
    return model


def preprocessor_config() -> dict:
    """The scenes' preprocessing, as a transformers image processor writes it."""
    return {
        "image_processor_type": "ViTImageProcessor",
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": list(MEAN),
        "image_std": list(STD),
        "resample": 3,
        "size": {"height": DEFAULT_SIZE, "width": DEFAULT_SIZE},
    }


@torch.no_grad()
def held_out_mse(mae, *, scenes: int = 200, seed: int = HELD_OUT_SEED, ratio: float = 0.75, batch: int = 50) -> dict:
    """Masked-patch MSE of ``mae`` (a :class:`~analysis.mae.LoadedMAE`) on ``scenes`` held-out
    scenes of ``seed``, scene ``i`` masked with MAE's draw from seed ``i``, in [0, 1] RGB units,
    and the same for the baseline that fills every hidden patch with the mean colour of the
    image's visible pixels. Returns ``{"model", "baseline", "reduction"}``."""
    from analysis.mae import draw_mask, mae_reconstruct

    images, _, _ = generate_arrays(scenes, seed)
    pixels = scenes_to_tensor(images)  # (n, 3, H, W), normalised
    std = torch.tensor(STD).view(1, 3, 1, 1)
    squared = {"model": 0.0, "baseline": 0.0}  # summed over hidden pixels and channels, in [0, 1] RGB units
    hidden_values = 0.0
    for start in range(0, scenes, batch):
        chunk = pixels[start : start + batch]  # (b, 3, H, W)
        mask = torch.cat([draw_mask(1, mae.spec.num_patches, ratio, start + i) for i in range(len(chunk))])
        result = mae_reconstruct(mae, chunk, mask=mask)
        hidden = result.hidden_pixels()  # (b, 1, H, W), 1 on hidden patches
        visible = 1.0 - hidden
        mean_colour = (chunk * visible).sum((2, 3), keepdim=True) / visible.sum((2, 3), keepdim=True)  # (b, 3, 1, 1)
        for name, estimate in (("model", result.reconstruction), ("baseline", mean_colour)):
            squared[name] += float((((estimate - chunk) * std) ** 2 * hidden).sum())
        hidden_values += float(hidden.sum()) * 3
    model, baseline = squared["model"] / hidden_values, squared["baseline"] / hidden_values
    return {"model": model, "baseline": baseline, "reduction": 1.0 - model / baseline}


def save_with_original_names(model, out: Path) -> None:
    """``save_pretrained``, with the decoder's layers under the names of MAE's released checkpoints
    (``decoder.decoder_layers.N...``, as in ``facebook/vit-mae-base``): transformers 5.25 writes them as
    ``decoder.decoder_encoder.layer.N...``, which it reads back itself but transformers 4 does not
    (it would leave the decoder layers random). Every version reads the released names."""
    from safetensors.torch import load_file, save_file

    model.save_pretrained(out)
    path = out / "model.safetensors"
    state = load_file(str(path))
    renamed = {
        key.replace("decoder.decoder_encoder.layer.", "decoder.decoder_layers."): value for key, value in state.items()
    }
    save_file(renamed, str(path), metadata={"format": "pt"})


def train_mae(
    out: Path | str = DEFAULT_OUT,
    *,
    seed: int = 30,
    pool: int = 20000,
    steps: int = 4000,
    batch_size: int = 128,
    lr: float = 2e-3,
    weight_decay: float = 0.05,
    threads: int = 1,
    log_every: int = 250,
    log=print,
) -> dict:
    """Train and save to ``out``; returns a summary (steps, seconds, held-out MSE)."""
    from analysis.mae import load_mae

    started = time.time()
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    images, _, _ = generate_arrays(pool, seed)
    x_train = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()  # uint8 (pool, 3, H, W)
    del images
    log(f"[train_demo_mae] {pool} scenes (seed {seed}) ready in {time.time() - started:.0f} s")
    model = build_mae()
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log(f"[train_demo_mae] ViTMAEForPreTraining {n_params / 1e6:.3f} M trainable parameters")
    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.ndim >= 2 and "token" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and (p.ndim < 2 or "token" in n)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
    )
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
        pixels = normalize_uint8(dihedral(x_train[index], generator))
        noise = torch.rand(len(index), model.vit.embeddings.patch_embeddings.num_patches, generator=generator)
        loss = model(pixel_values=pixels, noise=noise).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if (step + 1) % log_every == 0 or step + 1 == steps:
            progress.append((step + 1, round(loss.item(), 4)))
            log(f"[train_demo_mae] step {step + 1}/{steps} loss {loss.item():.4f} ({time.time() - started:.0f} s)")
            sys.stdout.flush()
    model.eval()
    out = Path(out)
    save_with_original_names(model, out)
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor_config(), indent=2) + "\n")
    training_seconds = round(time.time() - started, 1)
    evaluation = held_out_mse(load_mae(out, device="cpu"))
    summary = {
        "steps": steps,
        "seconds": training_seconds,
        "parameters": n_params,
        "progress": progress,
        "held_out": evaluation,
        "out": str(out),
    }
    log(f"[train_demo_mae] done: {json.dumps(summary)}")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.train_demo_mae", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (save_pretrained layout)")
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=30)
    parser.add_argument("--pool", type=int, default=20000, help="number of distinct training scenes")
    parser.add_argument("--lr", type=float, default=2e-3, help="peak AdamW learning rate")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--log-every", type=int, default=250)
    args = parser.parse_args(argv)
    train_mae(
        args.out,
        steps=args.steps,
        seed=args.seed,
        pool=args.pool,
        lr=args.lr,
        threads=args.threads,
        log_every=args.log_every,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
