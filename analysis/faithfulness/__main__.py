"""``python -m analysis.faithfulness --model demo --n 500 [--seed S]``: the benchmark table.

With ``--model demo`` (or another bundled classifier of the demo scenes, ``demo_swin``,
``demo_textured``, ``demo_swin_textured``) the images are held-out demo scenes (a seed the model
never trained on) with their exact object masks; any other model needs ``--images DIR`` (no masks:
the pointing game and IoU read n/a). A windowed model's maps are each scored on their own grid. With ``--model demo_clip`` the text methods of the demo CLIP
are scored on held-out two-object scenes, each explained for a prompt naming one of its
objects (:func:`.text_benchmark.text_benchmark`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..explanations import EXPLANATION_METHODS
from .benchmark import benchmark, format_table

BENCHMARK_SEED = 20261203  # held out: the demo model trained and was evaluated on other seeds
# the bundled classifiers trained on the demo scenes, scored on held-out scenes with their object masks
DEMO_SCENE_MODELS = ("demo", "demo_textured", "demo_swin", "demo_swin_textured")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.faithfulness", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="demo", help="what load_vit accepts (default: the bundled demo model)")
    parser.add_argument("--n", type=int, default=500, help="number of images")
    parser.add_argument("--seed", type=int, default=BENCHMARK_SEED, help="demo scene stream")
    parser.add_argument("--images", type=Path, help="a folder of images (for models other than the demo)")
    parser.add_argument(
        "--methods",
        default=None,
        help=f"comma-separated (default: every method; {', '.join(EXPLANATION_METHODS)}), or separated by ';' "
        "when a method carries options: \"attnlrp(attention='cp', gamma=None);chefer\"",
    )
    parser.add_argument("--steps", type=int, default=16, help="points on the deletion / insertion curves")
    parser.add_argument("--ig-steps", type=int, default=32, help="integrated-gradients steps")
    parser.add_argument("--sanity-images", type=int, default=50, help="images in the randomisation check")
    args = parser.parse_args(argv)
    from ..model.loading.two_tower import DEMO_CLIP_NAMES

    if args.model in DEMO_CLIP_NAMES:
        return _text_main(args)

    from .. import load_image, load_vit

    vit = load_vit(args.model)
    masks = None
    if args.images is not None:
        files = sorted(
            p for p in args.images.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png", ".webp", ".bmp")
        )
        images = [load_image(p) for p in files[: args.n]]
    elif args.model in DEMO_SCENE_MODELS:
        from ..demo.data import generate_samples

        images, _labels, masks = generate_samples(args.n, args.seed)
    else:
        parser.error(f"--images DIR is needed for a model other than the demo models ({', '.join(DEMO_SCENE_MODELS)})")
    methods = _methods(args.methods, EXPLANATION_METHODS)
    started = time.perf_counter()

    progress = _progress(started)
    results = benchmark(
        vit,
        images,
        masks,
        methods=methods,
        steps=args.steps,
        sanity_images=min(args.sanity_images, len(images)),
        method_options={"integrated_gradients": {"steps": args.ig_steps}},
        progress=progress,
    )
    source = f"demo scenes, seed {args.seed}" if masks is not None else str(args.images)
    print(
        f"{args.model}: {len(images)} images ({source}); explained class = the prediction; "
        f"removed patches take the mean colour; {time.perf_counter() - started:.0f} s\n"
    )
    print(format_table(results))
    return 0


def _methods(text: str | None, default) -> list[str]:
    if text is None:
        return list(default)
    return [m.strip() for m in text.split(";" if ";" in text or "(" in text else ",") if m.strip()]


def _progress(started: float):
    def progress(done: int, total: int) -> None:
        if done == total or done % max(1, total // 10) == 0:
            print(f"  {done}/{total} images, {time.perf_counter() - started:.0f} s", file=sys.stderr)

    return progress


def _text_main(args) -> int:
    """The demo CLIP: scene ``i`` is explained for ``"a {shape}"`` of its object ``i mod 2``."""
    from PIL import Image

    from .. import load_clip
    from ..demo.text_scenes import generate_text_scenes
    from ..text import TEXT_METHODS
    from .text_benchmark import TEXT_COLUMNS, text_benchmark

    clip = load_clip(args.model)
    scenes = generate_text_scenes(args.n, args.seed, objects=2)
    named = [scene.objects[index % 2] for index, scene in enumerate(scenes)]
    started = time.perf_counter()
    results = text_benchmark(
        clip,
        [Image.fromarray(scene.image) for scene in scenes],
        [f"a {obj.shape}" for obj in named],
        [obj.mask for obj in named],
        methods=_methods(args.methods, TEXT_METHODS),
        steps=args.steps,
        progress=_progress(started),
    )
    print(
        f"{args.model}: {len(scenes)} two-object scenes (seed {args.seed}), each explained for the prompt "
        f"'a <shape>' of one of its objects; deletion / insertion AUC of the image-text score exp(t)·cos(u, v) "
        f"(removed patches take the mean colour); {time.perf_counter() - started:.0f} s\n"
    )
    print(format_table(results, TEXT_COLUMNS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
