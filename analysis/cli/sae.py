"""``python -m analysis sae train|metrics``: train a sparse autoencoder on one hook point of a ViT
over an image set, the tokens of many images shuffled together (data-parallel under ``torchrun``:
each rank reads its share of every shuffle buffer and the gradients are summed, so N ranks train
the weights one process would), or print a saved SAE's quality on an image set (fraction of
variance explained, L0, the dead fraction (never firing on the image set) and dense fraction, and
the KL divergence and accuracy drop with the SAE spliced into the forward pass).

``train`` writes the SAE to ``--out`` in SAELens's format (``cfg.json`` + ``sae_weights.safetensors``),
the per-step losses to ``--out/training_log.json`` and, after each epoch, a checkpoint to
``--out/last`` that ``--resume`` continues from. Images: ``--images`` (a folder, a .zip or a glob
pattern) or ``--demo-scenes N`` (demo scenes, with their true classes for ``metrics``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from ..base.errors import VitExplorerError
from .common import CommandError, add_model_arguments, load_model, progress_bar, say
from .distributed import Ranks

__all__ = ["add_parser", "run_train", "run_metrics"]


def _tokens(text: str) -> str:
    from ..sae import TOKEN_CHOICES

    choice = {"patch": "patches"}.get(text, text)
    if choice not in TOKEN_CHOICES:
        raise argparse.ArgumentTypeError(f"{text!r}: use patch (or patches), class or all")
    return choice


def add_parser(subparsers) -> None:
    """Add the ``sae`` command and its actions ``train`` (:func:`run_train`) and ``metrics``
    (:func:`run_metrics`), each with its arguments.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        What ``parser.add_subparsers()`` returned (:func:`analysis.cli.build_parser`).
    """
    from ..sae.demo import SAE_HELD_OUT_SEED, SAE_TRAIN_SEED

    parser = subparsers.add_parser(
        "sae",
        help="sparse autoencoders: train one on a hook point, or measure one",
        description=__doc__.split("\n\n")[0],
    )
    commands = parser.add_subparsers(dest="sae_command", required=True, metavar="action")
    train = commands.add_parser(
        "train", help="train an SAE on a hook point's activations over an image set", description=__doc__
    )
    train.formatter_class = argparse.RawDescriptionHelpFormatter
    add_model_arguments(train)
    train.add_argument("--point", required=True, help="the hook point, e.g. blocks.2.resid_post")
    _image_arguments(train, SAE_TRAIN_SEED)
    train.add_argument("--out", required=True, type=Path, help="the SAE's folder (SAELens format)")
    train.add_argument("--tokens", type=_tokens, default="patches", help="which tokens: patch (default), class or all")
    train.add_argument("--architecture", choices=("topk", "relu"), default="topk", help="default topk")
    train.add_argument("--expansion", type=int, default=8, help="features = expansion × width (default 8)")
    train.add_argument("--k", type=int, default=8, help="TopK: features kept per token (default 8)")
    train.add_argument("--l1", type=float, default=None, help="ReLU: the L1 coefficient (e.g. 1e-3)")
    train.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate (default 1e-3)")
    train.add_argument("--warmup", type=int, default=100, help="linear warm-up steps (default 100)")
    train.add_argument("--epochs", type=int, default=1, help="passes over the images (default 1)")
    train.add_argument(
        "--batch-size", type=int, default=16, help="images' tokens per step, over all ranks (default 16)"
    )
    train.add_argument(
        "--buffer-batches", type=int, default=16, help="steps per shuffle buffer: tokens of this many batches mixed"
    )
    train.add_argument("--normalise", action="store_true", help="scale inputs to a mean norm of sqrt(width)")
    train.add_argument("--seed", type=int, default=0, help="the initialisation and token order (default 0)")
    train.add_argument("--dead-after", type=int, default=200, help="steps without firing before a feature is dead")
    train.add_argument("--resume", action="store_true", help="continue from --out/last")
    train.set_defaults(run=run_train)

    metrics = commands.add_parser("metrics", help="print an SAE's quality on an image set", description=__doc__)
    metrics.formatter_class = argparse.RawDescriptionHelpFormatter
    metrics.add_argument("--sae", required=True, help="an SAE folder (SAELens format), or demo (the bundled one)")
    add_model_arguments(metrics)
    _image_arguments(metrics, SAE_HELD_OUT_SEED)
    metrics.add_argument("--batch-size", type=int, default=16, help="images per forward pass (default 16)")
    metrics.add_argument("--json", type=Path, default=None, help="also write the numbers to this .json file")
    metrics.set_defaults(run=run_metrics)


def _image_arguments(parser, seed: int) -> None:
    found = parser.add_mutually_exclusive_group(required=True)
    found.add_argument("--images", help="a folder (searched recursively), a .zip or a glob pattern")
    found.add_argument("--demo-scenes", type=int, help="N demo scenes (with their true classes)")
    parser.add_argument("--scene-seed", type=int, default=seed, help=f"the demo scenes' stream (default {seed})")


class _LazyImages(Sequence):
    """The images of an image set, decoded when read (a training run holds one batch at a time)."""

    def __init__(self, read, count: int) -> None:
        self._read, self._count = read, count

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._read(i) for i in range(*index.indices(self._count))]
        return self._read(range(self._count)[index])


def _image_set(args, ranks: Ranks):
    """``(description, images (a lazy sequence, the same on every rank), labels or None)``; each
    rank checks its share of a folder's images once, and the unreadable ones are left out on all."""
    if args.demo_scenes is not None:
        if args.demo_scenes < 1:
            raise CommandError("--demo-scenes must be at least 1.", code=2)
        from PIL import Image

        from ..demo.data import render_sample

        labels = [render_sample(args.scene_seed, i)[1] for i in range(args.demo_scenes)]
        images = _LazyImages(lambda i: Image.fromarray(render_sample(args.scene_seed, i)[0]), args.demo_scenes)
        return f"{args.demo_scenes} demo scenes, seed {args.scene_seed}", images, labels
    from ..base.images import load_image
    from .sources import resolve_images

    try:
        source = resolve_images(args.images)
    except VitExplorerError as exc:
        raise CommandError(str(exc), code=2) from exc
    shard = source.shard(ranks.rank, ranks.world)
    bad = []
    for name, item in zip(shard.names, shard.items):
        try:
            load_image(item)
        except VitExplorerError as exc:  # ImageLoadError
            bad.append((name, str(exc)))
    every_bad = [entry for entries in ranks.gather(bad) for entry in entries]
    left_out = {name for name, _ in every_bad}
    for name, reason in every_bad:
        say(ranks, f"skipped {name}: {reason}")
    for problem in source.problems:
        say(ranks, f"skipped {problem}")
    items = [item for name, item in zip(source.names, source.items) if name not in left_out]
    if not items:
        raise CommandError(f"None of the {len(source)} images could be read: nothing to train on.", code=1)
    return source.description, _LazyImages(lambda i: load_image(items[i]), len(items)), None


def run_train(args, ranks: Ranks) -> int:
    """Run ``sae train``: :func:`~analysis.sae.train_sae` on ``--point`` over the image set,
    data-parallel over the ranks (each reads its share of every shuffle buffer, the gradients are summed),
    checkpointing to ``--out/last`` after each epoch (``--resume`` continues from it). The main rank
    saves the SAE to ``--out`` (SAELens format) with ``--out/training_log.json`` (the per-step
    ``loss`` and ``mse``, the per-epoch ``inactive_fraction``: the share of features that fired in none
    of the last ``--dead-after`` steps, and ``norm_scaling_factor``).

    Parameters
    ----------
    args : argparse.Namespace
        The parsed arguments of the subcommand (:func:`add_parser`).
    ranks : Ranks
        This process's place in the run (:func:`analysis.cli.distributed.start`).

    Returns
    -------
    int
        The exit code, 0.

    Raises
    ------
    CommandError
        Exit code 2: ``--batch-size``, ``--buffer-batches``, ``--epochs`` or ``--expansion`` below 1,
        ``--demo-scenes`` below
        1, ``--images`` naming nothing usable, or an :class:`~analysis.sae.SAEError` of the training
        (e.g. an unknown hook point); exit code 1: no image could be read, or the model could not be
        loaded.
    """
    from ..sae import SAEError, save_sae, train_sae
    from ..sae.parallel import DataParallel

    for name in ("batch_size", "buffer_batches", "epochs", "expansion"):
        if getattr(args, name) < 1:
            raise CommandError(f"--{name.replace('_', '-')} must be at least 1.", code=2)
    description, images, _ = _image_set(args, ranks)
    vit = load_model(args, ranks.device)
    say(
        ranks,
        f"{args.model}: an SAE on {args.point} over {len(images)} images ({description}) on {ranks.world} "
        f"process{'es' if ranks.world > 1 else ''}",
    )
    steps = -(-len(images) // args.batch_size) * args.epochs
    try:
        with progress_bar(ranks, steps, "sae train (steps, not images)") as advance:
            sae, log = train_sae(
                vit,
                images,
                args.point,
                architecture=args.architecture,
                expansion=args.expansion,
                k=args.k if args.architecture == "topk" else None,
                l1_coefficient=args.l1,
                lr=args.lr,
                warmup_steps=args.warmup,
                epochs=args.epochs,
                batch_size=args.batch_size,
                buffer_batches=args.buffer_batches,
                tokens=args.tokens,
                seed=args.seed,
                dead_after=args.dead_after,
                normalise=args.normalise,
                progress=advance,
                checkpoint_dir=args.out,
                resume=args.resume,
                parallel=DataParallel(ranks.rank, ranks.world, ranks.sum),
            )
    except SAEError as exc:
        raise CommandError(str(exc), code=2) from exc
    if not ranks.is_main:
        return 0
    save_sae(sae, args.out)
    record = {
        "model": args.model,
        "point": sae.config.hook_name,
        "images": description,
        "count": len(images),
        "world_size": ranks.world,
        "loss": log.loss,
        "mse": log.mse,
        "inactive_fraction": log.inactive_fraction,
        "norm_scaling_factor": sae.config.norm_scaling_factor,
    }
    (args.out / "training_log.json").write_text(json.dumps(record, indent=1))
    last = f"last mse {log.mse[-1]:.4g}, " if log.mse else ""
    inactive = (
        f"inactive fraction {log.inactive_fraction[-1]:.3f} (no firing in the last {args.dead_after} steps)"
        if log.inactive_fraction
        else "nothing left to train"
    )
    print(f"{sae.config.d_sae} features on {sae.config.hook_name}: {last}{inactive}; wrote {args.out}")
    return 0


def _load(args):
    from ..sae import SAEError, load_demo_sae, load_sae

    try:
        return load_demo_sae() if args.sae == "demo" else load_sae(args.sae)
    except SAEError as exc:
        raise CommandError(str(exc), code=2) from exc


def run_metrics(args, ranks: Ranks) -> int:
    """Run ``sae metrics``: :func:`~analysis.sae.sae_metrics` of ``--sae`` (a folder, or ``demo``) on
    the image set, on the main rank only (the other ranks return once the images are checked). Prints
    the fraction of variance explained, L0, the dead and dense fractions, the KL divergence, top-1
    agreement and the accuracies (with ``--demo-scenes``' true classes), and with ``--json`` writes them
    there too.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed arguments of the subcommand (:func:`add_parser`).
    ranks : Ranks
        This process's place in the run (:func:`analysis.cli.distributed.start`).

    Returns
    -------
    int
        The exit code, 0.

    Raises
    ------
    CommandError
        Exit code 2: ``--batch-size`` or ``--demo-scenes`` below 1, ``--images`` naming nothing usable,
        or an :class:`~analysis.sae.SAEError` (an unreadable SAE, one that does not fit the model);
        exit code 1: no image could be read, or the model could not be loaded.
    """
    from ..sae import SAEError, sae_metrics

    if args.batch_size < 1:
        raise CommandError("--batch-size must be at least 1.", code=2)
    sae = _load(args)
    description, images, labels = _image_set(args, ranks)
    if not ranks.is_main:  # one process measures; the metrics are cheap next to training
        return 0
    vit = load_model(args, ranks.device)
    try:
        with progress_bar(ranks, len(images), "sae metrics") as advance:
            m = sae_metrics(vit, sae, images, labels=labels, batch_size=args.batch_size, progress=advance)
    except SAEError as exc:
        raise CommandError(str(exc), code=2) from exc
    numbers = {
        "fraction_variance_explained": m.fraction_variance_explained,
        "l0": m.l0,
        "dead_fraction": m.dead_fraction,
        "dense_fraction": m.dense_fraction,
        "kl_divergence": m.kl_divergence,
        "top1_agreement": m.top1_agreement,
        "accuracy_clean": m.accuracy_clean,
        "accuracy_spliced": m.accuracy_spliced,
        "accuracy_drop": m.accuracy_drop,
        "tokens": m.tokens,
        "images": m.images,
    }
    print(f"{sae.config.d_sae} features on {sae.config.hook_name} ({sae.config.tokens}), {description}:")
    for key, value in numbers.items():
        print(f"  {key:<28} {'-' if value is None else (f'{value:.4f}' if isinstance(value, float) else value)}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"sae": args.sae, "model": args.model, "images": description, **numbers}))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0
