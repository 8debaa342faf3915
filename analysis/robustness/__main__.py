"""``python -m analysis.robustness --n 500``: the demo ViT against the demo CNN, as in Naseer et
al. 2021, "Intriguing Properties of Vision Transformers".

Top-1 accuracy on held-out demo scenes (a seed neither model trained on) under random patch
drop (tokens removed from the ViT's sequence after the position embedding, or patches set to
the mean colour for both models) and under patch shuffle. Image ``i`` uses seed ``seed + i`` at
every level, so both models lose exactly the same patches. ``--vit`` / ``--cnn`` take any model
``load_vit`` / ``load_cnn`` accept, two models that predict the same classes
(:func:`~analysis.shared_label_space`; other models than the demo pair need ``--images DIR``,
scored by agreement with their clean prediction).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .curves import SET_LEVELS, RobustnessCurve, robustness_curve

BENCHMARK_SEED = 20261204  # held out: the demo models trained on seeds 0-4 and 10-11, were evaluated on 2026
DROP_LEVELS = SET_LEVELS["token_drop"]
SHUFFLE_GRIDS = (1, 2, 4, 8)
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp")


LABEL_WIDTH = 30


def format_row(label: str, curve: RobustnessCurve) -> str:
    return f"{label:<{LABEL_WIDTH}}" + "".join(f"{value:>8.3f}" for value in curve.score)


def format_table(rows: list[tuple[str, RobustnessCurve]]) -> str:
    """Rows grouped by their levels: one header per perturbation."""
    lines, header = [], None
    for label, curve in rows:
        names = "".join(
            f"{f'{level:.0%}' if curve.perturbation.endswith('drop') else f'g={level:.0f}':>8}"
            for level in curve.levels
        )
        if names != header:
            title = "random patch drop" if curve.perturbation.endswith("drop") else "patch shuffle (g x g blocks)"
            lines += ["", f"{title:<{LABEL_WIDTH}}{names}"]
            header = names
        lines.append(format_row(label, curve))
    return "\n".join(lines[1:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.robustness", description=__doc__.split("\n")[0])
    parser.add_argument("--vit", default="demo", help="what load_vit accepts (default: the bundled demo ViT)")
    parser.add_argument("--cnn", default="demo", help="what load_cnn accepts (default: the bundled demo CNN)")
    parser.add_argument("--n", type=int, default=500, help="number of images")
    parser.add_argument("--seed", type=int, default=BENCHMARK_SEED, help="demo scene stream, and the drop seed")
    parser.add_argument("--images", type=Path, help="a folder of images (instead of demo scenes; no labels)")
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error("--n must be at least 1")

    from .. import load_image, load_vit
    from ..base.errors import AnalysisError
    from ..base.label_space import shared_label_space
    from .cnn import load_cnn
    from .perturbations import shuffle_grids

    vit, cnn = load_vit(args.vit), load_cnn(args.cnn)
    match = shared_label_space(vit, cnn, ("the ViT", "the CNN"))
    if not match:  # their rows would compare predictions about different things
        parser.error(f"{match.reason} Pick a CNN with the ViT's classes (--cnn).")
    if args.images is not None:
        if not args.images.is_dir():
            parser.error(f"--images {args.images}: not a folder")
        files = sorted(p for p in args.images.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)[: args.n]
        if not files:
            parser.error(f"--images {args.images}: no images ({', '.join(IMAGE_SUFFIXES)})")
        images, labels, source = [load_image(p) for p in files], None, str(args.images)
    elif args.vit == "demo" and args.cnn == "demo":
        from ..demo.data import generate_samples

        images, labels, _masks = generate_samples(args.n, args.seed)
        source = f"held-out demo scenes, seed {args.seed}"
    else:
        parser.error("--images DIR is needed unless both models are the demo pair")

    started = time.perf_counter()
    runs = [
        ("ViT token drop", vit, "token_drop", DROP_LEVELS),
        ("ViT pixel drop", vit, "pixel_drop", DROP_LEVELS),
        ("CNN pixel drop", cnn, "pixel_drop", DROP_LEVELS),
    ]
    for label, model in (("ViT", vit), ("CNN", cnn)):
        grids = [g for g in SHUFFLE_GRIDS if g in shuffle_grids(model.spec)]
        runs.append((f"{label} shuffle", model, "shuffle", grids))
    rows = []
    for label, model, perturbation, levels in runs:
        try:
            curve = robustness_curve(model, images, perturbation, levels, labels, seed=args.seed, attention=False)
        except AnalysisError as exc:
            print(f"{label}: skipped ({exc})", file=sys.stderr)
            continue
        rows.append((label, curve))
        print(f"  {label}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    metric = "top-1 accuracy" if labels is not None else "agreement with the clean prediction"
    print(
        f"ViT {args.vit} vs CNN {args.cnn}: {len(images)} images ({source}); {metric}; dropped patches take "
        f"the mean colour (pixel drop) or leave the sequence (token drop); {time.perf_counter() - started:.0f} s\n"
    )
    print(format_table(rows))
    if labels is not None:
        print(f"\nchance: {1 / vit.spec.num_outputs:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
