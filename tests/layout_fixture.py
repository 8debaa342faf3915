"""Every public analysis on one model of each family, saved and compared: the guard for changes
of the attention layout (issue 48) that must leave every number as it was.

    # on the commit before the change (a worktree of it), then on the change:
    .venv/bin/python tests/layout_fixture.py save /tmp/before.npz --repo /tmp/worktree-of-before
    .venv/bin/python tests/layout_fixture.py save /tmp/after.npz
    .venv/bin/python tests/layout_fixture.py compare /tmp/before.npz /tmp/after.npz

``--repo`` imports ``analysis`` (and these tests' model builders) from that checkout. The models:
the 20 families of ``tests/families.py``, the demo ViT and Swin, and random-weight Swin v1, Swin
v2 and SAM image encoders (``tests/windowed_models.py``), two fixed random images each. Each
analysis is saved under ``model/analysis[/part]``; one that refuses the model saves its message
(a refusal that changes is a change too). ``compare`` prints every array that differs by more
than ``--atol`` + ``--rtol`` · |before| (1e-6 each by default), every key only one file has,
and exits 1 if any.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def _models(analysis) -> dict:
    import torch

    import windowed_models
    from families import FAMILIES, load_family

    models = {name: load_family(name) for name in FAMILIES}
    models["demo"] = analysis.load_vit("demo")
    models["demo_swin"] = analysis.load_vit("demo_swin")
    torch.manual_seed(0)
    models["swin"] = windowed_models.small_swin()
    torch.manual_seed(0)
    models["swin_v2"] = windowed_models.small_swin("swinv2_tiny_window8_256")
    torch.manual_seed(0)
    models["sam"] = windowed_models.small_sam()
    return models


def _arrays(value, key: str, out: dict) -> None:
    """``value`` (a tensor, an array, a number, a tuple/list/dict or a dataclass of them) into
    ``out`` under ``key`` (its parts under ``key/part``)."""
    import dataclasses

    import torch

    if isinstance(value, torch.Tensor):
        out[key] = value.detach().float().cpu().numpy() if value.is_floating_point() else value.cpu().numpy()
    elif isinstance(value, np.ndarray | int | float | bool | np.generic):
        out[key] = np.asarray(value)
    elif isinstance(value, dict):
        for name, part in value.items():
            _arrays(part, f"{key}/{name}", out)
    elif isinstance(value, list | tuple):
        for index, part in enumerate(value):
            _arrays(part, f"{key}/{index}", out)
    elif dataclasses.is_dataclass(value):
        for field in dataclasses.fields(value):
            if field.name != "spec":
                _arrays(getattr(value, field.name), f"{key}/{field.name}", out)


def _analyses(analysis, vit, pixels, images) -> dict[str, Callable]:
    """Name -> a call of one public analysis on this model and input."""
    from analysis import robustness
    from analysis.explanations import EXPLANATION_METHODS
    from analysis.records.token_matrix import layer_windows

    spec = vit.spec
    last = spec.num_layers - 1
    h, w = spec.img_size
    record = analysis.capture_attention(vit, pixels)
    tokens = analysis.capture_tokens(vit, pixels)
    calls: dict[str, Callable] = {
        "logits": lambda: record.logits,
        "windows": lambda: {str(layer): layer_windows(record, layer) for layer in range(spec.num_layers)},
        "map_default": lambda: [analysis.attention_map(record, layer) for layer in (0, last)],
        "map_mean_head0": lambda: [analysis.attention_map(record, layer, head=0, query="mean") for layer in (0, last)],
        "map_pixel": lambda: [analysis.attention_map(record, layer, query=(h // 2, w // 3)) for layer in (0, last)],
        "map_cls": lambda: analysis.attention_map(record, last, query="cls"),
        "rollout": lambda: analysis.attention_rollout(record),
        "rollout_mean_query": lambda: analysis.attention_rollout(record, query="mean"),
        "rollout_maps": lambda: analysis.rollout_maps(record),
        "distance": lambda: analysis.mean_attention_distance(record),
        "uniform_distance": lambda: analysis.uniform_attention_distance_by_layer(spec),
        "dataset_distance": lambda: analysis.dataset_attention_distance(vit, images, batch_size=2, workers=1),
        "position_similarity": lambda: analysis.position_embedding_similarity(vit),
        "relative_position_bias": lambda: [analysis.relative_position_bias(vit, layer) for layer in (0, last)],
        "decomposed_relative_position": lambda: analysis.decomposed_relative_position(vit, last),
        "rollout_stage_mean_merge": lambda: analysis.attention_rollout(record, merge="mean_2x2", query="mean"),
        "filters": lambda: analysis.patch_embedding_filters(vit),
        "tokens": lambda: {str(layer): tokens.layer_tokens(layer) for layer in tokens.layers},
        "high_norm": lambda: analysis.high_norm_tokens(tokens),
        "pca": lambda: analysis.feature_pca(tokens.layer_tokens(last), tokens.geometry(last)),
        "similarity": lambda: analysis.patch_similarity(tokens.layer_tokens(last), tokens.geometry(last), "mean"),
        "keys": lambda: analysis.capture_tokens(vit, pixels, kind="key", layers=[0]).layer_tokens(0),
        "logit_lens": lambda: analysis.logit_lens(vit, pixels),
        "attention_mass": lambda: analysis.attention_mass(record, [0]),
        "robustness_probe": lambda: robustness.probe(vit, pixels[:1], "pixel_drop", 0.25, seed=0),
        "robustness_curve": lambda: robustness.robustness_curve(vit, images[:2], "pixel_drop", [0.0, 0.5]),
    }
    for method in EXPLANATION_METHODS:
        target = {} if method in ("attention", "rollout") else {"target": 1}  # not class-specific: no target
        calls[f"explain_{method}"] = lambda method=method, target=target: analysis.explain(
            vit, pixels, method=method, **target
        )
    return calls


def save(path: Path) -> None:
    import torch

    import analysis

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # the analyses' own warnings (post-norm rollout, merge='mean_2x2'): not changes
    out: dict[str, np.ndarray] = {}
    began = time.perf_counter()
    for name, vit in sorted(_models(analysis).items()):
        h, w = vit.spec.img_size
        pixels = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(1))
        from PIL import Image

        images = [
            Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8))
            for seed in (0, 1, 2)
        ]
        for what, call in _analyses(analysis, vit, pixels, images).items():
            key = f"{name}/{what}"
            try:
                _arrays(call(), key, out)
            except analysis.AnalysisError as error:  # a refusal is pinned by its message
                out[f"{key}/refused"] = np.asarray(str(error))
        print(f"{name}: {sum(k.startswith(name + '/') for k in out)} arrays", flush=True)
    np.savez_compressed(path, **out)
    print(f"{len(out)} arrays from {analysis.__file__} in {time.perf_counter() - began:.0f} s -> {path}")


def compare(before: Path, after: Path, *, rtol: float = 1e-6, atol: float = 1e-6) -> list[str]:
    """The differences between two saved fixtures, one line each (empty: they agree)."""
    old, new = np.load(before), np.load(after)
    lines = [f"only in {before.name}: {key}" for key in sorted(set(old.files) - set(new.files))]
    lines += [f"only in {after.name}: {key}" for key in sorted(set(new.files) - set(old.files))]
    for key in sorted(set(old.files) & set(new.files)):
        a, b = old[key], new[key]
        if a.dtype.kind in "US" or b.dtype.kind in "US":
            if not np.array_equal(a, b):
                lines.append(f"{key}: {a} -> {b}")
        elif a.shape != b.shape:
            lines.append(f"{key}: shape {a.shape} -> {b.shape}")
        elif not np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
            worst = float(np.nanmax(np.abs(a.astype(np.float64) - b.astype(np.float64))))
            lines.append(f"{key}: differs by up to {worst:.3g} (largest |before| {float(np.nanmax(np.abs(a))):.3g})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    saving = commands.add_parser("save", help="run every analysis and save the arrays")
    saving.add_argument("out", type=Path)
    saving.add_argument("--repo", type=Path, default=HERE.parent, help="the checkout to import analysis from")
    comparing = commands.add_parser("compare", help="compare two saved fixtures")
    comparing.add_argument("before", type=Path)
    comparing.add_argument("after", type=Path)
    comparing.add_argument("--rtol", type=float, default=1e-6)
    comparing.add_argument("--atol", type=float, default=1e-6)
    args = parser.parse_args(argv)
    if args.command == "save":
        repo = args.repo.resolve()
        sys.path[:0] = [str(repo), str(repo / "tests")]
        save(args.out)
        return 0
    lines = compare(args.before, args.after, rtol=args.rtol, atol=args.atol)
    print("\n".join(lines) if lines else f"{len(np.load(args.before).files)} arrays agree")
    return 1 if lines else 0


if __name__ == "__main__":
    raise SystemExit(main())
