"""Train the bundled demo CLIP (a Hugging Face ``CLIPModel``) contrastively on captioned demo scenes (CPU).

Usage (from the repository root; ``python training/train_demo_clip.py ...`` works too)::

    python -m training.train_demo_clip                       # the shipped model -> assets/demo_clip
    python -m training.train_demo_clip --out /tmp/clip --steps 200 --pool 2000   # a quick try
    python -m training.validate_demo_clip /tmp/clip          # its validation numbers (seed 7)

The image tower is a ``CLIPVisionModel`` of the demo ViT's size (48×48 input, 6×6 patches, 128
wide, 4 blocks of 4 heads, GELU, LayerNorm eps 1e-6); the text tower a 2-block, 64-wide causal
transformer over a word-level vocabulary of the caption words (:func:`build_tokenizer`); both
project into a 64-dimensional joint space. Data: :mod:`analysis.demo.text_scenes` (one or two
named objects per scene, a caption naming one of them), a fresh random caption template and
a random flip per sample and step (the caption's position words follow the flip).

Recipe facts worth knowing:

* ``--init-vision`` (default: the bundled demo ViT, ``assets/demo_vit``) starts the image tower
  from the demo ViT's weights (:func:`vision_state_from_timm`: the same blocks, the patch bias
  folded into the position table, ``pre_layrnorm`` set to undo the average token scale);
  ``--init-vision none`` trains from scratch.
* The loss is CLIP's symmetric cross-entropy over the batch (Radford et al. 2021) with one
  change: every caption in the batch that is true of an image is a positive of it (the soft
  target spreads evenly over them; :func:`~analysis.demo.text_scenes.describes`), since with six
  classes ``"a star"`` often fits several images, and a two-object scene fits captions of both.
* Two auxiliary terms (weights 1 and 2 by default), both against the six class prompts
  ``"a {shape}"`` (:data:`~analysis.demo.text_scenes.CLASS_PROMPTS`, encoded by the text tower
  at every step): ``--shape-loss``, the image embedding's cross-entropy over the six prompts
  with the target spread evenly over the shapes the scene holds (a multi-label classification
  read through text), and ``--dense-loss``, a dense alignment term: every patch token of the
  last ``--dense-layers`` blocks' outputs that an object covers at least half of, read out as the
  image embedding is (``post_layernorm``, ``visual_projection``), classified over the six prompts
  by ``exp(t)·cos`` with its object's shape as the target (LSeg's recipe, Li et al. 2022,
  "Language-driven Semantic Segmentation": per-location embeddings classified against label
  text embeddings, supervised by masks; here the locations are patches read out as MaskCLIP,
  Zhou et al. 2022, reads CLIP's patch tokens); background patches are left out. The
  explanation maps are still computed from the image–text score only.
* ``--pair-share`` (default 0.7) of the pool are two-object scenes.
* AdamW; no weight decay on biases, norms, embeddings and the logit scale; the image tower
  learns at ``--lr-vision``, everything else at ``--lr``; linear warm-up then cosine decay.
* Progress: zero-shot accuracy of :data:`~analysis.demo.text_scenes.CLASS_PROMPTS` on
  single-object scenes of ``--seed + 1`` (progress only). The acceptance numbers use seed 2026
  (``tests/test_demo_clip.py``, ``python -m analysis.faithfulness --model demo_clip``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository root holds `analysis` and `training`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
import torch.nn.functional as F

from analysis.base.assets import asset_path
from analysis.demo.config import MEAN, STD, normalize_uint8
from analysis.demo.data import DEFAULT_SIZE
from analysis.demo.text_scenes import (
    CLASS_PROMPTS,
    SceneObject,
    caption_fields,
    caption_text,
    caption_words,
    describes,
    generate_text_scenes,
)
from training.common import warmup_cosine

__all__ = ["VISION", "TEXT", "PROJECTION", "build_model", "build_tokenizer", "vision_state_from_timm", "train", "main"]

DEFAULT_OUT = asset_path("demo_clip")
VISION = dict(
    hidden_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    intermediate_size=256,
    image_size=DEFAULT_SIZE,
    patch_size=6,
    hidden_act="gelu",
    layer_norm_eps=1e-6,
)
SPECIALS = ["<pad>", "<unk>", "<filler>", "<start>", "<end>"]
# <end> is not id 2: CLIP's text model pools the arg-max id (its legacy rule) when eos_token_id == 2
PAD, UNK, START, END = 0, 1, 3, 4
CONTEXT = 12  # "<start> a yellow triangle on the bottom right <end>" is 9 tokens
TEXT = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=128,
    max_position_embeddings=CONTEXT,
    hidden_act="gelu",
    layer_norm_eps=1e-6,
    pad_token_id=PAD,
    bos_token_id=START,
    eos_token_id=END,
)
PROJECTION = 64


def vocabulary() -> dict[str, int]:
    return {
        **{token: i for i, token in enumerate(SPECIALS)},
        **{w: len(SPECIALS) + i for i, w in enumerate(caption_words())},
    }


def build_tokenizer():
    """A lower-casing word-level tokenizer over the caption words that adds ``<start>`` and
    ``<end>``, as a transformers ``PreTrainedTokenizerFast`` (so ``AutoTokenizer`` reads it back)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(vocab=vocabulary(), unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<start> $A <end>", special_tokens=[("<start>", START), ("<end>", END)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<start>",
        eos_token="<end>",
        model_max_length=CONTEXT,
    )


def build_model(seed: int = 0):
    import transformers

    torch.manual_seed(seed)
    config = transformers.CLIPConfig(
        text_config=dict(TEXT, vocab_size=len(vocabulary())), vision_config=VISION, projection_dim=PROJECTION
    )
    model = transformers.CLIPModel(config)
    model.set_attn_implementation("eager")
    return model


@torch.no_grad()
def vision_state_from_timm(folder: Path, clip_model, samples: torch.Tensor) -> dict[str, torch.Tensor]:
    """The demo ViT (timm, ``folder``) as ``CLIPModel.vision_model`` weights. The blocks map one to
    one; timm's patch bias is added to the patch rows of the position table (exact); CLIP's extra
    ``pre_layrnorm`` gets ``γ = mean token std``, ``β = mean token mean`` over ``samples`` so it
    roughly passes the embeddings through (an approximation the training then corrects)."""
    from safetensors.torch import load_file

    timm = load_file(str(Path(folder) / "model.safetensors"))
    state = {}
    pos = timm["pos_embed"][0].clone()  # (1 + N, D)
    pos[1:] += timm["patch_embed.proj.bias"]
    state["embeddings.class_embedding"] = timm["cls_token"].reshape(-1)
    state["embeddings.patch_embedding.weight"] = timm["patch_embed.proj.weight"]
    state["embeddings.position_embedding.weight"] = pos
    dim = pos.shape[1]
    layer = 0
    while f"blocks.{layer}.attn.qkv.weight" in timm:
        src, dst = f"blocks.{layer}.", f"encoder.layers.{layer}."
        qkv_w, qkv_b = timm[src + "attn.qkv.weight"], timm[src + "attn.qkv.bias"]
        for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
            state[dst + f"self_attn.{name}.weight"] = qkv_w[i * dim : (i + 1) * dim]
            state[dst + f"self_attn.{name}.bias"] = qkv_b[i * dim : (i + 1) * dim]
        for a, b in (
            ("attn.proj", "self_attn.out_proj"),
            ("norm1", "layer_norm1"),
            ("norm2", "layer_norm2"),
            ("mlp.fc1", "mlp.fc1"),
            ("mlp.fc2", "mlp.fc2"),
        ):
            state[dst + b + ".weight"], state[dst + b + ".bias"] = timm[src + a + ".weight"], timm[src + a + ".bias"]
        layer += 1
    state["post_layernorm.weight"], state["post_layernorm.bias"] = timm["norm.weight"], timm["norm.bias"]
    vision = clip_model.vision_model
    embeddings = vision.embeddings
    embeddings.load_state_dict(
        {k.removeprefix("embeddings."): v for k, v in state.items() if k.startswith("embeddings.")}
    )
    tokens = embeddings(samples)  # (B, T, D) what pre_layrnorm normalises
    state["pre_layrnorm.weight"] = tokens.std(-1, unbiased=False).mean().expand(dim).clone()
    state["pre_layrnorm.bias"] = tokens.mean(-1).mean().expand(dim).clone()
    return state


def _flip(obj: SceneObject, horizontal: bool, vertical: bool, size: int) -> SceneObject:
    cx, cy = obj.centre
    return SceneObject(
        obj.label, obj.colour, (size - cx if horizontal else cx, size - cy if vertical else cy), obj.mask
    )


@torch.no_grad()
def zero_shot_accuracy(model, tokenizer, pixels: torch.Tensor, labels: torch.Tensor) -> float:
    model.eval()
    text = tokenizer(CLASS_PROMPTS, padding=True, return_tensors="pt")
    v = F.normalize(model.text_projection(model.text_model(**text).pooler_output), dim=-1)  # (6, E)
    u = F.normalize(model.visual_projection(model.vision_model(pixel_values=pixels).pooler_output), dim=-1)  # (B, E)
    model.train()
    return ((u @ v.T).argmax(-1) == labels).float().mean().item()


def train(
    out: Path | str = DEFAULT_OUT,
    *,
    seed: int = 0,
    pool: int = 20000,
    steps: int = 1000,
    batch_size: int = 96,
    lr: float = 2e-3,
    lr_vision: float = 5e-4,
    weight_decay: float = 0.05,
    warmup: int = 30,
    val_size: int = 500,
    init_vision: str | None = str(asset_path("demo_vit")),
    threads: int = 2,
    log_every: int = 100,
    save_every: int | None = None,
    init: str | None = None,
    objects: int | None = None,
    pair_share: float | None = 0.7,
    shape_loss: float = 1.0,
    dense_loss: float = 2.0,
    dense_layers: int = 3,
    log=print,
) -> dict:
    """Train and save to ``out``; returns a summary dict."""
    t_start = time.time()
    torch.set_num_threads(threads)
    out = Path(out)
    size = VISION["image_size"]
    if pair_share is None:
        scenes = generate_text_scenes(pool, seed, size=size, objects=objects)
    else:  # a fixed share of two-object scenes (disjoint indices of the stream)
        n_pairs = round(pool * pair_share)
        scenes = generate_text_scenes(pool - n_pairs, seed, size=size, objects=1) + generate_text_scenes(
            n_pairs, seed, size=size, objects=2, start=pool
        )
    patch = VISION["patch_size"]
    grid = size // patch
    # (N, gh, gw) int64: the class of the object covering at least half of each patch, -1 for none
    patch_labels = torch.full((len(scenes), grid, grid), -1, dtype=torch.long)
    for n, s in enumerate(scenes):
        for obj in s.objects:
            cover = obj.mask[: grid * patch, : grid * patch].reshape(grid, patch, grid, patch).mean(axis=(1, 3))
            patch_labels[n][torch.from_numpy(cover >= 0.5)] = obj.label
    x_train = (
        torch.from_numpy(np.stack([s.image for s in scenes])).permute(0, 3, 1, 2).contiguous()
    )  # uint8 (N, 3, H, W)
    objects = [s.objects for s in scenes]
    pool = len(scenes)
    del scenes
    val = generate_text_scenes(val_size, seed + 1, size=size, objects=1)
    x_val = normalize_uint8(torch.from_numpy(np.stack([s.image for s in val])).permute(0, 3, 1, 2))
    y_val = torch.tensor([s.objects[0].label for s in val])
    log(
        f"[train_demo_clip] {pool} scenes (seed {seed}) + {val_size} val (seed {seed + 1}) in {time.time() - t_start:.0f} s"
    )

    tokenizer = build_tokenizer()
    model = build_model(seed)
    if init:
        import transformers

        model = transformers.CLIPModel.from_pretrained(init)
        model.set_attn_implementation("eager")
        log(f"[train_demo_clip] initialised from {init} (fresh optimizer state and schedule)")
    elif init_vision:
        state = vision_state_from_timm(Path(init_vision), model, x_val[:256])
        model.vision_model.load_state_dict(state, strict=True)
        log(f"[train_demo_clip] image tower from {init_vision}")
    n_params = sum(p.numel() for p in model.parameters())
    log(
        f"[train_demo_clip] {n_params / 1e6:.2f}M params; zero-shot val acc at start "
        f"{zero_shot_accuracy(model, tokenizer, x_val, y_val):.3f}"
    )

    groups: dict[tuple[bool, bool], list] = {}
    for name, param in model.named_parameters():
        vision = name.startswith("vision_model.")
        decay = param.ndim >= 2 and "embedding" not in name
        groups.setdefault((vision, decay), []).append(param)
    opt = torch.optim.AdamW(
        [
            {"params": params, "weight_decay": weight_decay if decay else 0.0, "peak": lr_vision if vision else lr}
            for (vision, decay), params in groups.items()
        ]
    )

    cache: dict[str, list[int]] = {}
    class_text = tokenizer(CLASS_PROMPTS, padding=True, return_tensors="pt")
    class_ids, class_mask = class_text["input_ids"], class_text["attention_mask"]
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    t_train, run_loss, run_n = time.time(), 0.0, 0
    model.train()
    for step in range(steps):
        index = torch.randint(0, pool, (batch_size,), generator=g)
        flips = rng.integers(0, 2, size=(batch_size, 2)).astype(bool)
        images = x_train[index]
        labels_grid = patch_labels[index]  # (B, gh, gw)
        captions, fields, seen = [], [], []
        for row, (i, (fh, fv)) in enumerate(zip(index.tolist(), flips)):
            if fh:
                images[row] = images[row].flip(-1)
                labels_grid[row] = labels_grid[row].flip(-1)
            if fv:
                images[row] = images[row].flip(-2)
                labels_grid[row] = labels_grid[row].flip(-2)
            flipped = [_flip(obj, fh, fv, size) for obj in objects[i]]
            fields.append(caption_fields(flipped[int(rng.integers(len(flipped)))], size, rng))
            captions.append(caption_text(fields[-1]))
            seen.append(flipped)
        for text in captions:
            if text not in cache:
                cache[text] = tokenizer(text)["input_ids"]
        longest = max(len(cache[t]) for t in captions)
        ids = torch.full((batch_size, longest), PAD, dtype=torch.long)
        for row, text in enumerate(captions):
            ids[row, : len(cache[text])] = torch.tensor(cache[text])
        mask = (ids != PAD).long()
        # (B images, B captions): caption j is true of image i (names one of its objects correctly)
        true = torch.tensor(
            [[any(describes(f, obj, size) for obj in objs) for f in fields] for objs in seen], dtype=torch.float32
        )
        target_image = true / true.sum(-1, keepdim=True)  # each image: spread over every caption true of it
        target_text = true.T / true.T.sum(-1, keepdim=True)  # each caption: over every image it is true of

        for group in opt.param_groups:
            group["lr"] = warmup_cosine(step, steps, group["peak"], warmup)
        auxiliary = shape_loss > 0 or dense_loss > 0
        output = model(
            input_ids=ids,
            attention_mask=mask,
            pixel_values=normalize_uint8(images),
            output_hidden_states=dense_loss > 0,
        )
        logits = output.logits_per_image  # (B, B) exp(t)·cos
        loss = 0.5 * (F.cross_entropy(logits, target_image) + F.cross_entropy(logits.T, target_text))
        if auxiliary:
            classes = F.normalize(
                model.text_projection(model.text_model(input_ids=class_ids, attention_mask=class_mask).pooler_output),
                dim=-1,
            )  # (6, E)
            scale = model.logit_scale.exp()
        if shape_loss > 0:  # every image against the six class prompts; target: the shapes it holds, evenly
            present = torch.zeros(batch_size, len(CLASS_PROMPTS))
            for row, objs in enumerate(seen):
                for obj in objs:
                    present[row, obj.label] = 1.0
            u = F.normalize(output.image_embeds, dim=-1)
            loss = loss + shape_loss * F.cross_entropy(scale * u @ classes.T, present / present.sum(-1, keepdim=True))
        if dense_loss > 0:  # each object patch, read out like the image embedding, against the six class prompts
            keep = labels_grid.reshape(batch_size, -1) >= 0  # (B, N)
            dense = 0.0
            for hidden in output.vision_model_output.hidden_states[-dense_layers:]:
                tokens = model.visual_projection(model.vision_model.post_layernorm(hidden[:, 1:]))  # (B, N, E)
                cos = F.normalize(tokens[keep], dim=-1) @ classes.T  # (P, 6)
                dense = dense + F.cross_entropy(scale * cos, labels_grid.reshape(batch_size, -1)[keep])
            loss = loss + dense_loss * dense / dense_layers
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, 4.6052)  # CLIP's cap: exp(t) ≤ 100
        run_loss, run_n = run_loss + loss.item(), run_n + 1
        done = step + 1
        if done % log_every == 0 or done == steps:
            log(
                f"[train_demo_clip] step {done}/{steps} loss {run_loss / run_n:.4f} scale {model.logit_scale.exp().item():.1f} "
                f"val zero-shot acc {zero_shot_accuracy(model, tokenizer, x_val, y_val):.3f} "
                f"({(time.time() - t_train) / done * 1000:.0f} ms/step, elapsed {time.time() - t_start:.0f} s)"
            )
            sys.stdout.flush()
            run_loss, run_n = 0.0, 0
        if save_every and done % save_every == 0 and done != steps:
            save(model, tokenizer, out)

    model.eval()
    summary = {
        "steps": steps,
        "wall_s": round(time.time() - t_start),
        "params": n_params,
        "val_zero_shot_acc": zero_shot_accuracy(model, tokenizer, x_val, y_val),
    }
    save(model, tokenizer, out)
    log(f"[train_demo_clip] done: {json.dumps(summary)} -> {out}")
    return summary


def save(model, tokenizer, out: Path) -> None:
    """``save_pretrained`` of the model and tokenizer, and the image preprocessing (the demo scenes')."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    size = VISION["image_size"]
    preprocessor = {
        "image_processor_type": "CLIPImageProcessor",
        "do_resize": True,
        "size": {"height": size, "width": size},
        "resample": 3,
        "do_center_crop": False,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": list(MEAN),
        "image_std": list(STD),
        "do_convert_rgb": True,
    }
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m training.train_demo_clip",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", default=str(DEFAULT_OUT), help="output folder (save_pretrained layout)")
    p.add_argument("--seed", type=int, default=0, help="seed of the scenes, the init, the batches and the captions")
    p.add_argument("--pool", type=int, default=20000, help="number of distinct training scenes")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=96)
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate of the text tower, projections, scale")
    p.add_argument("--lr-vision", type=float, default=5e-4, help="peak learning rate of the image tower")
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--warmup", type=int, default=30, help="linear warm-up steps")
    p.add_argument("--val-size", type=int, default=500)
    p.add_argument(
        "--init-vision",
        default=str(asset_path("demo_vit")),
        help="a demo ViT folder to start the image tower from, or 'none'",
    )
    p.add_argument(
        "--init", default=None, help="continue from a folder this script wrote (fresh optimizer and schedule)"
    )
    p.add_argument("--objects", type=int, default=None, choices=(1, 2), help="only scenes with this many objects")
    p.add_argument(
        "--pair-share",
        type=float,
        default=0.7,
        help="share of two-object scenes in the pool (a negative value: drawn per scene, about half)",
    )
    p.add_argument(
        "--shape-loss",
        type=float,
        default=1.0,
        help="weight of each image against the six class prompts (target: the shapes it holds)",
    )
    p.add_argument(
        "--dense-loss",
        type=float,
        default=2.0,
        help="weight of each object patch's readout against the six class prompts (its object's shape)",
    )
    p.add_argument("--dense-layers", type=int, default=3, help="how many of the last blocks the dense loss reads")
    p.add_argument("--threads", type=int, default=int(os.environ.get("TRAIN_THREADS", 2)))
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--save-every", type=int, default=None, help="also save a snapshot to --out every N steps")
    a = p.parse_args(argv)
    train(
        a.out,
        seed=a.seed,
        pool=a.pool,
        steps=a.steps,
        batch_size=a.batch_size,
        lr=a.lr,
        lr_vision=a.lr_vision,
        weight_decay=a.weight_decay,
        warmup=a.warmup,
        val_size=a.val_size,
        init_vision=None if a.init_vision.lower() == "none" else a.init_vision,
        threads=a.threads,
        log_every=a.log_every,
        save_every=a.save_every,
        init=a.init,
        objects=a.objects,
        pair_share=None if a.pair_share < 0 else a.pair_share,
        shape_loss=a.shape_loss,
        dense_loss=a.dense_loss,
        dense_layers=a.dense_layers,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
