"""``python -m analysis similarity``: linear CKA between every layer of two models over an image
set (Raghu et al. 2021), on one process or with the minibatches shared across ``torchrun`` ranks
(their HSIC sums added up: the matrix one process gives). Writes ``OUT.npz`` and, next to it,
``OUT.png`` and ``OUT.html``.

A model is what load_vit accepts, or ``cnn:NAME`` for a CNN (``cnn:demo``, a timm CNN name or
folder; ``cnn:random:resnet18`` for random weights). Without ``--model-b`` the first model is
compared with itself."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from ..base.errors import VitExplorerError
from ..similarity import CKAAccumulator, accumulate_similarity, minibatches
from ..similarity.cka import ESTIMATORS
from .common import CommandError, add_command, add_device_argument, add_out_argument, progress_bar, say
from .distributed import Ranks

__all__ = ["add_parser", "run", "load_any"]

MODEL_HELP = "what load_vit accepts (demo, a timm name, hf:org/name, a folder; random: prefix), or cnn:NAME"


def add_parser(subparsers) -> None:
    """Add the ``similarity`` subcommand: ``--model-a`` (required), ``--model-b`` (default model A),
    ``--images`` (required; also ``demo`` / ``demo:N``), ``--estimator`` (default ``minibatch``),
    ``--batch-size`` (default 32), ``--out``, ``--device`` and :func:`run` as its callback.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        What ``parser.add_subparsers()`` returned (:func:`analysis.cli.build_parser`).
    """
    parser = add_command(
        subparsers,
        "similarity",
        help="linear CKA between the layers of two models (Raghu et al. 2021)",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("--model-a", required=True, help=MODEL_HELP)
    parser.add_argument("--model-b", default=None, help=f"{MODEL_HELP} (default: model A itself)")
    parser.add_argument(
        "--images", required=True, help="a folder (searched recursively), a .zip, a glob pattern, or demo / demo:N"
    )
    parser.add_argument("--estimator", choices=ESTIMATORS, default="minibatch", help="default: minibatch")
    parser.add_argument("--batch-size", type=int, default=32, help="images per minibatch (at least 4; default 32)")
    add_out_argument(parser, "result .npz (the .png and .html go next to it)")
    add_device_argument(parser)
    parser.set_defaults(run=run)


def load_any(text: str, device: torch.device):
    """A transformer (:func:`~analysis.load_vit`) or, for ``cnn:NAME``, a CNN
    (:func:`~analysis.robustness.load_cnn`).

    Parameters
    ----------
    text : str
        What ``load_vit`` accepts, or ``cnn:NAME``; ``random:`` in front of the name (after ``cnn:``)
        loads random weights.
    device : torch.device
        Where the model is put.

    Returns
    -------
    LoadedViT or LoadedCNN
        The loaded model.

    Raises
    ------
    CommandError
        Exit code 1: the model could not be loaded (an unknown model, unavailable weights, ...).
    """
    from ..model.loading import load_vit
    from ..robustness import load_cnn

    cnn = text.startswith("cnn:")
    source = text.removeprefix("cnn:")
    pretrained = not source.startswith("random:")
    source = source.removeprefix("random:")
    try:
        if cnn:
            return load_cnn(source, pretrained=pretrained, device=device)
        return load_vit(source, pretrained=pretrained, device=device)
    except VitExplorerError as exc:
        raise CommandError(f"could not load the model {text!r}: {exc}", code=1) from exc


def _images(text: str):
    """``(description, items, problems)``: the demo scenes or what ``--images`` names
    (cli.sources; ``problems``: archive entries left out before decoding)."""
    from ..similarity import resolve_images as similarity_images
    from .sources import resolve_images

    try:
        if text == "demo" or text.startswith("demo:"):
            items = similarity_images(text)
            return f"{len(items)} demo scenes", list(items), []
        source = resolve_images(text)
    except (VitExplorerError, ValueError) as exc:
        raise CommandError(str(exc), code=2) from exc
    return source.description, list(source.items), list(source.problems)


def run(args, ranks: Ranks) -> int:
    """Run ``similarity``: the image set split into minibatches (:func:`~analysis.similarity.minibatches`),
    whole minibatches dealt to the ranks, each rank's HSIC sums
    (:func:`~analysis.similarity.accumulate_similarity`) added up; the main rank writes ``--out``
    (.npz: ``matrix`` ``(La, Lb)`` linear CKA, ``layers_a``, ``layers_b``, ``estimator``, ``images``
    used, the models) with ``OUT.png`` and ``OUT.html`` next to it.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed arguments of :func:`add_parser`.
    ranks : Ranks
        This process's place in the run (:func:`analysis.cli.distributed.start`).

    Returns
    -------
    int
        The exit code, 0.

    Raises
    ------
    CommandError
        Exit code 2: ``--batch-size`` below 4 with the minibatch estimator (below 1 with ``full``),
        ``--estimator full`` on more than one rank, ``--images`` naming nothing usable or fewer than
        2 images; exit code 1: a model could not be loaded.
    """
    if args.batch_size < (4 if args.estimator == "minibatch" else 1):
        raise CommandError("--batch-size must be at least 4 for the minibatch estimator.", code=2)
    if args.estimator == "full" and ranks.world > 1:
        raise CommandError(
            "estimator full needs every image's representations in one process: run it without torchrun, or use "
            "--estimator minibatch (its sums add up across processes).",
            code=2,
        )
    description, items, problems = _images(args.images)
    if len(items) < 2:
        raise CommandError(f"{args.images}: representation similarity needs at least 2 images.", code=2)
    model_a = load_any(args.model_a, ranks.device)
    model_b = load_any(args.model_b, ranks.device) if args.model_b else None
    batches = minibatches(items, args.batch_size)[ranks.rank :: ranks.world]  # whole minibatches per rank
    say(
        ranks,
        f"{args.model_a} against {args.model_b or 'itself'}: {len(items)} images ({description}), "
        f"{ranks.world} process{'es' if ranks.world > 1 else ''}",
    )
    with progress_bar(ranks, sum(len(batch) for batch in batches), "similarity") as advance:
        done = 0

        def step(count: int) -> None:
            nonlocal done
            done += count
            advance(done, None)

        skipped: list[str] = []
        accumulator, names_a, names_b = accumulate_similarity(
            model_a, batches, model_b, estimator=args.estimator, progress=step, skipped=skipped
        )
    unreadable = [entry for names in ranks.gather(skipped) for entry in names]  # every rank's, on every rank
    if ranks.is_main:
        for entry in [*problems, *unreadable]:
            print(f"skipped {entry}", file=sys.stderr)
    if ranks.world > 1:
        accumulator.reduce(ranks.sum, (len(names_a), len(names_b)))
    if not ranks.is_main:
        return 0
    matrix = accumulator.matrix().numpy()
    write_similarity(
        args.out,
        matrix,
        names_a,
        names_b,
        accumulator,
        model_a=args.model_a,
        model_b=args.model_b or args.model_a,
        images=description,
        world=ranks.world,
    )
    print(f"{accumulator.images_used} images used; CKA of the last layers: {matrix[-1, -1]:.3f}")
    print(f"wrote {args.out}, {args.out.with_suffix('.png')} and {args.out.with_suffix('.html')}")
    return 0


def write_similarity(
    out: Path,
    matrix: np.ndarray,
    names_a,
    names_b,
    accumulator: CKAAccumulator,
    *,
    model_a: str,
    model_b: str,
    images: str,
    world: int,
) -> None:
    """``out`` (.npz: matrix, layer names, estimator, images used and the models), the heatmap
    as ``.png`` (one square of 24 px per cell, Viridis from 0 to 1, model A's first layer at the
    bottom; drawn with Pillow) and ``.html`` (:func:`analysis.plots.cka_heatmap`)."""
    from PIL import Image

    from ..plots import cka_heatmap, colorize

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(
        out,
        matrix=matrix,
        layers_a=np.array(names_a, dtype=str),
        layers_b=np.array(names_b, dtype=str),
        estimator=np.array(accumulator.estimator),
        images=np.int64(accumulator.images_used),
        model_a=np.array(model_a),
        model_b=np.array(model_b),
        image_set=np.array(images),
        world_size=np.int64(world),
    )
    cells = colorize(
        np.nan_to_num(matrix[::-1], nan=0.0), "Viridis", 0.0, 1.0
    )  # (La, Lb, 3), first layer at the bottom
    Image.fromarray(cells).resize((24 * matrix.shape[1], 24 * matrix.shape[0]), Image.Resampling.NEAREST).save(
        out.with_suffix(".png")
    )
    title = f"{model_a} against {model_b} · linear CKA over {accumulator.images_used} images ({accumulator.estimator})"
    cka_heatmap(matrix, names_a, names_b, model_a=model_a, model_b=model_b, title=title).write_html(
        out.with_suffix(".html"), include_plotlyjs=True, full_html=True
    )
