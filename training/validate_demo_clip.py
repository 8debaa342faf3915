"""Validate a demo CLIP folder on scenes of a validation seed (recipe selection; never seed 2026).

Usage (from the repository root)::

    python -m training.validate_demo_clip /tmp/clip            # seed 7: 300 single, 100 two-object scenes

Prints zero-shot accuracy over :data:`~analysis.demo.text_scenes.CLASS_PROMPTS` on single-object
scenes, and the pointing game of ``chefer`` and ``legrad`` for the prompt ``"a {shape}"`` naming
one object of each two-object scene, measured exactly as ``tests/test_demo_clip.py`` measures them
on seed 2026 (the held-out acceptance seed, which recipe selection must not look at).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from analysis import load_clip
from analysis.demo.config import scenes_to_tensor
from analysis.demo.data import CLASS_NAMES
from analysis.demo.text_scenes import CLASS_PROMPTS, generate_text_scenes
from analysis.faithfulness import patch_mask, pointing_score
from analysis.text import explain_text, zero_shot

__all__ = ["validate", "main"]


def pointing(clip, scenes, pixels, method: str) -> float:
    """Pointing game of ``method``'s map of ``"a {shape}"`` over every object of the scenes."""
    spec = clip.image.spec
    scores = []
    for label, name in enumerate(CLASS_NAMES):
        rows = [(i, obj) for i, s in enumerate(scenes) for obj in s.objects if obj.label == label]
        if rows:
            maps = explain_text(clip, pixels[[i for i, _ in rows]], f"a {name}", method=method).maps
            truth = patch_mask(np.stack([obj.mask for _, obj in rows]), spec.patch_size, spec.grid_size)
            scores.extend(pointing_score(maps, truth).tolist())
    return float(np.mean(scores))


def validate(
    folder, seed: int = 7, singles: int = 300, pairs: int = 100, methods: tuple[str, ...] = ("chefer", "legrad")
) -> dict:
    if seed == 2026:
        raise ValueError("seed 2026 is the held-out acceptance seed: select recipes on another")
    clip = load_clip(str(folder), device="cpu")
    single = generate_text_scenes(singles, seed, objects=1)
    pixels = scenes_to_tensor(np.stack([s.image for s in single]))
    labels = np.array([s.objects[0].label for s in single])
    result = {
        "zero_shot": float((zero_shot(clip, pixels, CLASS_PROMPTS).probabilities.argmax(-1).numpy() == labels).mean())
    }
    two = generate_text_scenes(pairs, seed, objects=2)
    pixels2 = scenes_to_tensor(np.stack([s.image for s in two]))
    for method in methods:
        result[method] = pointing(clip, two, pixels2, method)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.validate_demo_clip", description=__doc__.split("\n\n")[0])
    p.add_argument("folder")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--singles", type=int, default=300)
    p.add_argument("--pairs", type=int, default=100)
    p.add_argument("--methods", default="chefer,legrad")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    print(
        json.dumps(
            {
                "folder": a.folder,
                "seed": a.seed,
                **validate(a.folder, a.seed, a.singles, a.pairs, tuple(a.methods.split(","))),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
