"""``python -m analysis robustness attack|corruptions|texture|patch|probe``: accuracy against the
FGSM/PGD budget ε, against the ImageNet-C severity, with the texture taken away (and the shape bias
on cue-conflict scenes) or against an adversarial patch's size, for the ViT of ``--model`` beside a
CNN (``--cnn``) and other models (``--also``, e.g. ``demo_swin``); or the linear-probe accuracy of
each block's token against depth (off-the-shelf tokens), as in Naseer et al. 2021. Writes
``OUT.npz`` and ``OUT.csv``.

Images: ``--demo-scenes N`` (held-out demo scenes with their true classes: top-1 accuracy), or
``--images`` (no labels: each model is scored against its own clean prediction). Every model must
predict the ViT's classes (:func:`~analysis.shared_label_space`). Under ``torchrun`` each rank takes
every ``world``-th image and the ranks sum their correct counts.

The shape bias (``texture --cue-conflict N``) needs models that can read texture: by default
(``--shape-bias-of textured``) each bundled demo model given is measured by its variant fine-tuned on
textured scenes as well (``demo`` by ``demo_textured``, ``demo_swin`` by ``demo_swin_textured``, the demo
CNN by the textured demo CNN); the output names the model behind each row."""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np
import torch

from ..base.errors import AnalysisError, VitExplorerError
from ..model.loading.loaded import LoadedModel
from ..robustness.adversarial_patch import (
    PATCH_BATCH_SIZE,
    PATCH_SHARE,
    PATCH_STEPS,
    PATCH_TRAIN_SCENES,
    PATCH_TRAIN_SEED,
)
from .common import CommandError, add_command, add_model_arguments, add_out_argument, load_model, progress_bar, say
from .distributed import Ranks

__all__ = ["add_parser", "run_attack", "run_corruptions", "run_texture", "run_patch", "run_probe", "BENCHMARK_SEED"]

BENCHMARK_SEED = 20261204  # the held-out demo stream of python -m analysis.robustness


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: numbers separated by commas") from exc


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: integers separated by commas") from exc


def _names(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


def _target(text: str) -> int:
    """A class index, or a demo class name (its index in :data:`analysis.demo.data.CLASS_NAMES`)."""
    from ..demo.data import CLASS_NAMES

    name = text.strip()
    if name in CLASS_NAMES:
        return CLASS_NAMES.index(name)
    try:
        return int(name)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: a class index or one of {', '.join(CLASS_NAMES)}") from exc


def add_parser(subparsers) -> None:
    """Add the ``robustness`` command and its curves ``attack``, ``corruptions``, ``texture``,
    ``patch`` and ``probe``, each with its arguments and its ``run_*`` function as its callback.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        What ``parser.add_subparsers()`` returned (:func:`analysis.cli.build_parser`).
    """
    parser = add_command(
        subparsers,
        "robustness",
        help="accuracy against an attack's ε or a corruption's severity",
        description=__doc__.split("\n\n")[0],
        raw_description=False,
    )
    commands = parser.add_subparsers(dest="curve", required=True, metavar="curve")
    from ..robustness.attacks import ATTACKS
    from ..robustness.corruptions import FAST_CORRUPTIONS, PROTOCOLS

    attack = add_command(
        commands, "attack", help="accuracy against ε (FGSM or PGD, L∞, 0–255 pixel units)", description=__doc__
    )
    _common_arguments(attack)
    attack.add_argument("--attack", choices=tuple(ATTACKS), default="pgd")
    attack.add_argument(
        "--epsilons",
        type=_floats,
        default=(0.0, 1.0, 2.0, 4.0, 8.0),
        help="L∞ budgets in 0–255 pixel units, comma-separated (default 0,1,2,4,8)",
    )
    attack.add_argument("--steps", type=int, default=10, help="PGD steps (default 10)")
    attack.set_defaults(run=run_attack)

    corruptions = add_command(
        commands, "corruptions", help="accuracy against ImageNet-C severity (imagecorruptions)", description=__doc__
    )
    _common_arguments(corruptions)
    corruptions.add_argument(
        "--corruptions",
        type=_names,
        default=FAST_CORRUPTIONS,
        help=f"comma-separated (default: the fast ones, {','.join(FAST_CORRUPTIONS)})",
    )
    corruptions.add_argument(
        "--severities",
        type=_ints,
        default=(0, 1, 2, 3, 4, 5),
        help="0 (clean) to 5, comma-separated (default 0,1,2,3,4,5)",
    )
    corruptions.add_argument(
        "--protocol",
        choices=PROTOCOLS,
        default="imagenet-c",
        help="imagenet-c (default): corrupt each model's input crop at its input size, as ImageNet-C was made; "
        "native: corrupt the image at its own size, then preprocess",
    )
    corruptions.set_defaults(run=run_corruptions)

    from ..robustness.texture import TEXTURE_PROBES

    texture = add_command(
        commands,
        "texture",
        help="accuracy with the texture taken away, and the shape bias on cue-conflict scenes",
        description=__doc__,
    )
    _common_arguments(texture)
    texture.add_argument(
        "--probes",
        type=_names,
        default=None,
        help=f"comma-separated, of {','.join(TEXTURE_PROBES)} (default: every one; silhouette needs the "
        "demo scenes' object masks)",
    )
    texture.add_argument(
        "--cue-conflict",
        type=int,
        default=0,
        metavar="N",
        help="also the shape bias over N cue-conflict demo scenes (shape of one demo class, texture of "
        "another; the models must predict the demo classes)",
    )
    texture.add_argument(
        "--shape-bias-of",
        choices=("textured", "given"),
        default="textured",
        help="whose shape bias: 'textured' (default) measures each bundled demo model given (demo, demo_swin, "
        "the demo CNN) by its variant fine-tuned on textured scenes (demo_textured, demo_swin_textured, the "
        "textured demo CNN), since the plain ones never saw a textured object; other models as given. "
        "'given': the models given",
    )
    texture.set_defaults(run=run_texture)

    patch = add_command(
        commands,
        "patch",
        help="accuracy against an adversarial patch's size (each model's own universal patch, and noise)",
        description=__doc__,
    )
    _common_arguments(patch)
    patch.add_argument(
        "--train-scenes",
        type=int,
        default=PATCH_TRAIN_SCENES,
        help=f"the demo scenes each patch is trained on (stream {PATCH_TRAIN_SEED}, disjoint from the held-out "
        f"scenes; the models must predict the demo classes; default {PATCH_TRAIN_SCENES})",
    )
    patch.add_argument(
        "--shares",
        type=_floats,
        default=(PATCH_SHARE,),
        help=f"shares of the image area the square covers, comma-separated (default {PATCH_SHARE:g}; "
        "e.g. 0.02,0.05,0.1 for a curve, one training per share and model)",
    )
    patch.add_argument("--steps", type=int, default=None, help=f"optimiser steps per patch (default {PATCH_STEPS})")
    patch.add_argument(
        "--batch-size", type=int, default=PATCH_BATCH_SIZE, help=f"images per step (default {PATCH_BATCH_SIZE})"
    )
    patch.add_argument(
        "--epochs", type=int, default=None, help="instead of --steps: whole passes over the training scenes"
    )
    patch.add_argument(
        "--target",
        type=_target,
        default=None,
        help="a targeted patch: the class (index or demo class name) every image is pushed towards; the output "
        "adds the share of patched images predicted as it (default: untargeted)",
    )
    patch.set_defaults(run=run_patch)

    probe = add_command(
        commands,
        "probe",
        help="linear-probe accuracy of each block's token against depth (off-the-shelf tokens)",
        description=__doc__,
    )
    add_model_arguments(probe)
    _also_argument(probe)
    labelled = _demo_scenes_or(probe)
    labelled.add_argument("--folder", type=Path, help="a folder with one subfolder of images per class")
    probe.add_argument("--test-share", type=float, default=0.5, help="the share held out to score the probe")
    probe.add_argument(
        "--concat", type=_ints, default=(2, 4), help="the last k blocks' tokens concatenated, for each k (default 2,4)"
    )
    probe.add_argument("--ridge", type=float, default=1.0, help="the ridge penalty (default 1)")
    probe.add_argument("--seed", type=int, default=BENCHMARK_SEED, help="the demo scene stream and the split")
    add_out_argument(probe, RESULT_HELP)
    probe.set_defaults(run=run_probe)


RESULT_HELP = "result .npz (the .csv goes next to it)"


def _common_arguments(parser) -> None:
    """The arguments of the accuracy curves: the models, the images, the seed and the result file."""
    add_model_arguments(parser)
    parser.add_argument("--cnn", default=None, help="a comparison CNN (what load_cnn accepts, e.g. demo)")
    _also_argument(parser)
    found = _demo_scenes_or(parser)
    found.add_argument(
        "--images", help="a folder, a .zip or a glob pattern (no labels: agreement with the clean prediction)"
    )
    parser.add_argument("--seed", type=int, default=BENCHMARK_SEED, help="the demo scene stream (and PGD's start)")
    add_out_argument(parser, RESULT_HELP)


def _also_argument(parser) -> None:
    parser.add_argument(
        "--also", type=_names, default=(), help="more models load_vit accepts, comma-separated (e.g. demo_swin)"
    )


def _demo_scenes_or(parser):
    """A required choice of ``--demo-scenes N`` or another image source the caller adds to it."""
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--demo-scenes", type=int, help="N held-out demo scenes with their true classes")
    return group


def _models(args, ranks: Ranks) -> dict[str, LoadedModel]:
    """``{"ViT": …, "CNN": …, <also>: …}``, each checked to predict the ViT's classes."""
    from ..base.label_space import shared_label_space
    from ..model.loading import load_vit
    from ..robustness.cnn import load_cnn

    models = {"ViT": load_model(args, ranks.device)}
    try:
        if args.cnn:
            models["CNN"] = load_cnn(args.cnn, device=ranks.device)
        for name in args.also:
            models[name] = load_vit(name, device=ranks.device)
    except VitExplorerError as exc:
        raise CommandError(f"could not load a comparison model: {exc}", code=1) from exc
    for name, model in list(models.items())[1:]:
        match = shared_label_space(models["ViT"], model, ("the ViT", name))
        if not match:  # never a comparison of predictions about different classes
            raise CommandError(f"{match.reason} Compare models that predict the ViT's classes.", code=2)
    return models


def _images(args, ranks: Ranks):
    """``(description, this rank's images, their labels or None, skipped "name: reason")``."""
    description, images, labels, skipped, _ = _images_and_masks(args, ranks)
    return description, images, labels, skipped


def _images_and_masks(args, ranks: Ranks):
    """:func:`_images` and the objects' masks (boolean ``(H, W)`` each; the demo scenes) or None."""
    from ..base.images import load_image

    if args.demo_scenes is not None:
        if args.demo_scenes < 1:
            raise CommandError("--demo-scenes must be at least 1.", code=2)
        from PIL import Image

        from ..demo.data import render_sample

        found = [render_sample(args.seed, i) for i in range(ranks.rank, args.demo_scenes, ranks.world)]
        return (
            f"{args.demo_scenes} held-out demo scenes, seed {args.seed}",
            [Image.fromarray(image) for image, _, _ in found],
            [label for _, label, _ in found],
            [],
            [mask for _, _, mask in found],
        )
    from .sources import resolve_images

    try:
        source = resolve_images(args.images)
    except VitExplorerError as exc:
        raise CommandError(str(exc), code=2) from exc
    shard = source.shard(ranks.rank, ranks.world)
    images, skipped = [], list(source.problems)
    for name, item in zip(shard.names, shard.items):
        try:
            images.append(load_image(item))
        except AnalysisError as exc:
            skipped.append(f"{name}: {exc}")
    return source.description, images, None, skipped, None


def _summed(ranks: Ranks, correct: dict[str, np.ndarray], count: int) -> tuple[dict[str, np.ndarray], int]:
    """Every rank's correct counts summed, divided by every rank's images: the accuracy over all of them."""
    names = list(correct)
    stacked = torch.tensor(np.stack([correct[n] for n in names]), dtype=torch.float64)
    total = ranks.sum(stacked)
    used = int(ranks.sum(torch.tensor([count], dtype=torch.float64))[0])
    if used == 0:
        raise CommandError("No image could be read: nothing to measure.", code=1)
    return {n: (total[i] / used).numpy() for i, n in enumerate(names)}, used


def run_attack(args, ranks: Ranks) -> int:
    """Run ``robustness attack``: each model's accuracy against the FGSM / PGD budget ε
    (:func:`~analysis.robustness.attack_curve`) on this rank's images, the correct counts summed over
    the ranks; the main rank writes ``--out`` (.npz: ``accuracy`` ``(models, epsilons)``, ``models``,
    ``epsilons``, ``count``, ...) and the ``.csv`` next to it.

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
        Exit code 2: a negative or no ε, ``--steps`` below 1, ``--demo-scenes`` below 1,
        ``--images`` naming nothing usable, a model that does not predict the ViT's classes, or an
        :class:`~analysis.base.errors.AnalysisError` of the attack; exit code 1: the ViT or a comparison model
        could not be loaded, or no image could be read.
    """
    from ..robustness.attacks import attack_curve

    if args.steps < 1 or any(e < 0 for e in args.epsilons) or not args.epsilons:
        raise CommandError("--epsilons must be 0 or more (0–255 pixel units) and --steps at least 1.", code=2)
    models = _models(args, ranks)
    description, images, labels, skipped = _images(args, ranks)
    say(ranks, f"{args.attack} attack on {', '.join(models)}: {description}, ε = {list(args.epsilons)}")
    correct = {}
    try:
        for name, model in models.items():
            if not images:
                correct[name] = np.zeros(len(args.epsilons))
                continue
            targets = labels if labels is not None else model.top1(images).tolist()
            curve = attack_curve(
                {name: model},
                images,
                targets,
                epsilons=args.epsilons,
                attack_name=args.attack,
                steps=args.steps,
                seed=args.seed,
            )
            correct[name] = curve.accuracy[name] * len(images)
    except AnalysisError as exc:
        raise CommandError(str(exc), code=2) from exc
    accuracy, used = _summed(ranks, correct, len(images))
    if not ranks.is_main:
        return 0
    scored = "labels" if labels is not None else "clean prediction"
    names = list(accuracy)
    _write(
        args.out,
        dict(
            models=np.array(names),
            epsilons=np.array(args.epsilons),
            attack=np.array(args.attack),
            steps=np.int64(args.steps),
            accuracy=np.stack([accuracy[n] for n in names]),
            count=np.int64(used),
            images=np.array(description),
            scored_against=np.array(scored),
            skipped_images=np.array(skipped, dtype=str),
            world_size=np.int64(ranks.world),
        ),
        ["model", "epsilon", "accuracy"],
        [(n, e, float(a)) for n in names for e, a in zip(args.epsilons, accuracy[n])],
    )
    for n in names:
        print(f"{n:<12}" + "".join(f"{a:>8.3f}" for a in accuracy[n]))
    print(
        f"{used} images, accuracy against ε = {list(args.epsilons)} ({scored}); wrote {args.out} and "
        f"{args.out.with_suffix('.csv')}"
    )
    return 0


def run_corruptions(args, ranks: Ranks) -> int:
    """Run ``robustness corruptions``: each model's accuracy against the ImageNet-C severity
    (:func:`~analysis.robustness.corruption_curve`, image ``i`` of the whole set corrupted with seed
    ``--seed`` + i on any rank), the correct counts summed over the ranks; the main rank writes
    ``--out`` (.npz: ``accuracy`` ``(models, corruptions, severities)``, and with a ``--cnn`` and a
    severity of 1 or more ``corruption_error`` ``(models, corruptions)`` and ``mean_corruption_error``
    ``(models,)`` relative to the CNN) and the ``.csv`` next to it.

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
        Exit code 2: ``--demo-scenes`` below 1, ``--images`` naming nothing usable, a model that does
        not predict the ViT's classes, or an :class:`~analysis.base.errors.AnalysisError` of the curve
        (an unknown corruption, a severity out of range); exit code 1: the ViT or a comparison model
        could not be loaded, or no image could be read.
    """
    from ..robustness.corruptions import (
        CorruptionCurve,
        corruption_curve,
        corruption_errors,
    )

    models = _models(args, ranks)
    description, images, labels, skipped = _images(args, ranks)
    say(ranks, f"corruptions on {', '.join(models)}: {description}")
    try:
        if images:
            seeds = [args.seed + i for i in range(ranks.rank, ranks.rank + ranks.world * len(images), ranks.world)]
            curve = corruption_curve(
                models,
                images,
                labels,
                corruptions=args.corruptions,
                severities=args.severities,
                image_seeds=seeds,
                protocol=args.protocol,
            )  # image i of the whole set: seed + i on any rank
            correct = {n: a * len(images) for n, a in curve.accuracy.items()}
        else:
            corruption_curve(
                models, [np.zeros((8, 8, 3), np.uint8)], None, corruptions=args.corruptions, severities=(0,)
            )  # the arguments' checks, on a rank without images
            correct = {n: np.zeros((len(args.corruptions), len(args.severities))) for n in models}
    except AnalysisError as exc:
        raise CommandError(str(exc), code=2) from exc
    accuracy, used = _summed(ranks, correct, len(images))
    if not ranks.is_main:
        return 0
    names = list(accuracy)
    scored = "labels" if labels is not None else "clean prediction"
    fields = dict(
        models=np.array(names),
        corruptions=np.array(args.corruptions),
        severities=np.array(args.severities),
        accuracy=np.stack([accuracy[n] for n in names]),
        count=np.int64(used),
        images=np.array(description),
        scored_against=np.array(scored),
        protocol=np.array(args.protocol),
        skipped_images=np.array(skipped, dtype=str),
        world_size=np.int64(ranks.world),
    )
    if "CNN" in accuracy and any(s >= 1 for s in args.severities):
        whole = CorruptionCurve(tuple(args.corruptions), tuple(args.severities), accuracy, used, scored, args.protocol)
        errors = corruption_errors(whole, "CNN")
        fields.update(
            corruption_error=np.stack([errors[n][0] for n in names]),
            mean_corruption_error=np.array([errors[n][1] for n in names]),
        )
        for n in names:
            print(f"mCE relative to the CNN, {n}: {errors[n][1]:.3f}")
    _write(
        args.out,
        fields,
        ["model", "corruption", "severity", "accuracy"],
        [
            (n, c, s, float(accuracy[n][i, j]))
            for n in names
            for i, c in enumerate(args.corruptions)
            for j, s in enumerate(args.severities)
        ],
    )
    print(f"{used} images ({scored}, protocol {args.protocol}); wrote {args.out} and {args.out.with_suffix('.csv')}")
    return 0


def _shape_bias_models(args, models: dict[str, LoadedModel], ranks: Ranks) -> dict[str, tuple[str, LoadedModel]]:
    """``{row: (source, model)}`` whose shape bias the ``texture`` command measures: with
    ``--shape-bias-of textured``, each bundled demo model given is replaced by its variant fine-tuned on
    textured scenes (:data:`analysis.model.loading.TEXTURED_DEMO_MODELS`,
    :data:`analysis.robustness.cnn.TEXTURED_DEMO_CNNS`); any other model is measured as given."""
    from ..model.loading import TEXTURED_DEMO_MODELS, load_vit
    from ..robustness.cnn import TEXTURED_DEMO_CNNS, load_cnn

    sources = {"ViT": args.model, **({"CNN": args.cnn} if args.cnn else {}), **{n: n for n in args.also}}
    judged = {}
    for name, model in models.items():
        source = sources[name]
        variant = (TEXTURED_DEMO_CNNS if name == "CNN" else TEXTURED_DEMO_MODELS).get(source)
        if args.shape_bias_of != "textured" or variant is None or args.img_size:
            judged[name] = (source, model)
            continue
        try:
            loaded = load_cnn(variant, device=ranks.device) if name == "CNN" else load_vit(variant, device=ranks.device)
        except VitExplorerError as exc:
            raise CommandError(
                f"could not load {variant!r}, the textured variant of {source!r} (for the shape bias): {exc} "
                "Pass --shape-bias-of given to measure the models as given.",
                code=1,
            ) from exc
        say(ranks, f"shape bias of {name}: {variant}, the textured variant of {source}")
        judged[name] = (("cnn:" if name == "CNN" else "") + variant, loaded)
    return judged


def run_texture(args, ranks: Ranks) -> int:
    """Run ``robustness texture``: each model's accuracy with the texture taken away
    (:func:`~analysis.robustness.texture_curve`, scored against the labels or the ViT's clean
    prediction) and, with ``--cue-conflict N``, the shape bias over N cue-conflict demo scenes (by
    each bundled demo model's textured variant unless ``--shape-bias-of given``); counts summed over
    the ranks. The main rank writes ``--out`` (.npz: ``clean_accuracy`` ``(models,)``, ``accuracy``
    ``(models, probes)``, and ``shape_texture_neither`` ``(models, 3)``, ``shape_bias`` ``(models,)``
    and ``shape_bias_models`` with ``--cue-conflict``) and the ``.csv`` next to it.

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
        Exit code 2: ``--cue-conflict`` negative, or given for a ViT that does not predict the demo
        classes; ``--demo-scenes`` below 1, ``--images`` naming nothing usable, a model that does not
        predict the ViT's classes, or an :class:`~analysis.base.errors.AnalysisError` of the probes;
        exit code 1: the ViT or a comparison model
        could not be loaded (or a textured variant, for the shape bias), or no image could be read.
    """
    from ..demo.cue_conflict import cue_conflict_scene
    from ..demo.data import CLASS_NAMES
    from ..robustness.texture import ShapeBias, shape_bias_of, texture_curve

    if args.cue_conflict < 0:
        raise CommandError("--cue-conflict must be 0 or more scenes.", code=2)
    models = _models(args, ranks)
    if args.cue_conflict and list(models["ViT"].class_names or ()) != list(CLASS_NAMES):
        raise CommandError(
            f"--cue-conflict scenes are of the demo classes ({', '.join(CLASS_NAMES)}); {args.model} predicts "
            "other classes: leave --cue-conflict out, or give a demo model.",
            code=2,
        )
    description, images, labels, skipped, masks = _images_and_masks(args, ranks)
    say(ranks, f"texture probes on {', '.join(models)}: {description}")
    try:
        if images:
            targets = labels
            if targets is None:  # no labels: each model against its own clean prediction
                targets = models["ViT"].top1(images).tolist()
            curve = texture_curve(models, images, targets, probes=args.probes, masks=masks)
            probes = curve.probes
            correct = {n: np.concatenate([[curve.clean[n]], curve.accuracy[n]]) * len(images) for n in models}
        else:  # a rank without images: the arguments' checks, and zeros to sum
            dummy_masks = None if masks is None else [np.ones((8, 8), bool)]  # the same probes as the other ranks
            probes = texture_curve(
                {}, [np.zeros((8, 8, 3), np.uint8)], [0], probes=args.probes, masks=dummy_masks
            ).probes
            correct = {n: np.zeros(1 + len(probes)) for n in models}
        mine = range(ranks.rank, args.cue_conflict, ranks.world)
        scenes = [cue_conflict_scene(args.seed, i) for i in mine]  # at the demo scenes' size
        counts = {n: np.zeros(3) for n in models}
        judged = _shape_bias_models(args, models, ranks) if args.cue_conflict else {}
        if scenes:
            for n, bias in shape_bias_of({n: model for n, (_, model) in judged.items()}, scenes).items():
                counts[n] = np.array([bias.shape, bias.texture, bias.neither], dtype=np.float64)
    except AnalysisError as exc:
        raise CommandError(str(exc), code=2) from exc
    accuracy, used = _summed(ranks, correct, len(images))
    names = list(accuracy)
    summed = ranks.sum(torch.tensor(np.stack([counts[n] for n in names]), dtype=torch.float64)).numpy()
    if not ranks.is_main:
        return 0
    scored = "labels" if labels is not None else "the ViT's clean prediction"
    fields = dict(
        models=np.array(names),
        probes=np.array(probes),
        clean_accuracy=np.array([accuracy[n][0] for n in names]),
        accuracy=np.stack([accuracy[n][1:] for n in names]),  # (models, probes)
        count=np.int64(used),
        images=np.array(description),
        scored_against=np.array(scored),
        skipped_images=np.array(skipped, dtype=str),
        world_size=np.int64(ranks.world),
    )
    rows = [(n, "clean", float(accuracy[n][0])) for n in names]
    rows += [(n, p, float(accuracy[n][1 + j])) for n in names for j, p in enumerate(probes)]
    for n in names:
        print(
            f"{n:<12} clean {accuracy[n][0]:.3f}" + "".join(f"  {p} {a:.3f}" for p, a in zip(probes, accuracy[n][1:]))
        )
    if args.cue_conflict:
        biases = {n: ShapeBias(*(int(round(v)) for v in summed[i])) for i, n in enumerate(names)}
        fields.update(
            cue_conflict_scenes=np.int64(args.cue_conflict),
            shape_bias_models=np.array([judged[n][0] for n in names]),  # what each row's shape bias measured
            shape_texture_neither=summed.astype(np.int64),  # (models, 3)
            shape_bias=np.array([biases[n].fraction for n in names]),
        )
        rows += [(n, "shape bias", biases[n].fraction) for n in names]
        for n in names:
            bias = biases[n]
            print(
                f"{n:<12} shape bias {bias.fraction:.3f} ({bias.shape} shape, {bias.texture} texture, "
                f"{bias.neither} neither, of {args.cue_conflict} cue-conflict scenes; model {judged[n][0]})"
            )
    _write(args.out, fields, ["model", "measure", "value"], rows)
    print(f"{used} images ({scored}); wrote {args.out} and {args.out.with_suffix('.csv')}")
    return 0


def run_patch(args, ranks: Ranks) -> int:
    """Run ``robustness patch``: each model's accuracy against an adversarial patch (its own universal
    patch per share, trained for ``--steps`` steps of ``--batch-size`` images on ``--train-scenes``
    demo scenes, and a noise patch of the same size as the control), on held-out demo scenes of
    stream ``--seed``, disjoint from the training scenes (:func:`~analysis.robustness.demo_patch_scenes`).
    With ``--target``, the patches are targeted and the output adds the target-hit rate (the share of
    patched images predicted as the target) with each patch.

    Every rank trains the same patches (the same scenes and seeds: a universal patch is one
    optimisation over the whole training set; the main rank draws the training's progress bar) and
    scores its share of the evaluation images at their rows of the whole set's positions, so the
    summed counts are one process's, and :func:`~analysis.robustness.patch_size_curve`'s on the same
    images. The main rank prints, per model and share, the accuracy with its own patch and with the
    noise patch and the margin between them, and writes ``--out`` (.npz: ``accuracy``,
    ``fooling_rate``, ``noise_accuracy`` and ``noise_fooling_rate``, each ``(models, shares)``;
    targeted, ``target_rate`` and ``noise_target_rate`` too; ``clean_accuracy`` ``(models,)``;
    ``losses`` ``(models, shares, steps)``, the training loss of each step) and the ``.csv`` next to it.

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
        Exit code 2: ``--train-scenes``, ``--steps``, ``--epochs`` or ``--batch-size`` below 1, both
        ``--steps`` and ``--epochs``, no share, a ViT that does not predict the demo classes,
        ``--images`` instead of ``--demo-scenes`` (or ``--demo-scenes`` below 1), ``--seed`` equal to the
        training stream, a target outside the classes, a model that does not predict the ViT's classes,
        or an :class:`~analysis.base.errors.AnalysisError` (a share out of range); exit code 1: the ViT
        or a comparison model could not be loaded.
    """
    from ..base.progress import within
    from ..demo.data import CLASS_NAMES
    from ..robustness.adversarial_patch import (
        demo_patch_scenes,
        evaluate_patch,
        noise_patch,
        patch_side,
        random_patch_positions,
        train_patch,
        unit_images,
    )

    budget = [args.train_scenes, args.batch_size, *(v for v in (args.steps, args.epochs) if v is not None)]
    if min(budget) < 1 or not args.shares:
        raise CommandError(
            "--train-scenes, --steps, --epochs and --batch-size must be at least 1, with one share at least.", code=2
        )
    if args.steps is not None and args.epochs is not None:
        raise CommandError("Give the training budget one way: --steps or --epochs.", code=2)
    if args.seed == PATCH_TRAIN_SEED:
        raise CommandError(
            f"--seed {args.seed} is the stream the patches train on: score them on held-out scenes of another seed.",
            code=2,
        )
    if args.target is not None and not 0 <= args.target < len(CLASS_NAMES):
        raise CommandError(f"--target {args.target}: a demo class index 0..{len(CLASS_NAMES) - 1}.", code=2)
    models = _models(args, ranks)
    if list(models["ViT"].class_names or ()) != list(CLASS_NAMES):
        raise CommandError(
            f"The patches train on demo scenes ({', '.join(CLASS_NAMES)}); {args.model} predicts other classes: "
            "give a demo model, or train with analysis.robustness.train_patch on your own labelled images.",
            code=2,
        )
    if args.demo_scenes is None:
        raise CommandError(
            "The patch curve is scored on held-out demo scenes (--demo-scenes N): the patches train on demo "
            "scenes, so the models predict the demo classes.",
            code=2,
        )
    description, images, labels, skipped = _images(args, ranks)
    whole = int(args.demo_scenes)
    mine = list(range(ranks.rank, whole, ranks.world))  # this rank's rows of the whole evaluation set
    target = "untargeted" if args.target is None else f"target {CLASS_NAMES[args.target]} ({args.target})"
    say(ranks, f"adversarial patches on {', '.join(models)}: {description}, shares {list(args.shares)}, {target}")
    measures = ["clean", "accuracy", "fooling_rate", "noise_accuracy", "noise_fooling_rate"]
    if args.target is not None:
        measures += ["target_rate", "noise_target_rate"]
    counts = {name: np.zeros((len(measures), len(args.shares))) for name in models}
    losses: dict[str, list] = {name: [] for name in models}
    try:
        for share in args.shares:
            patch_side((10**6, 10**6), share)  # the share's range, before any training
        scenes = demo_patch_scenes(whole, args.seed, train_scenes=args.train_scenes)  # checked disjoint
        per_patch = args.steps if args.epochs is None else args.epochs * -(-args.train_scenes // args.batch_size)
        per_patch = PATCH_STEPS if per_patch is None else int(per_patch)
        total = len(models) * len(args.shares) * per_patch
        with progress_bar(ranks, total, "patch training", unit="step") as advance:
            for m, (name, model) in enumerate(models.items()):
                size = tuple(int(v) for v in unit_images(model, scenes.train_images[:1]).shape[-2:])  # (H, W)
                for k, share in enumerate(args.shares):
                    found = train_patch(
                        model, scenes.train_images, scenes.train_labels, share=share, target=args.target,
                        steps=args.steps, batch_size=args.batch_size, epochs=args.epochs, seed=args.seed + 1000 * k,
                        progress=within(advance, (m * len(args.shares) + k) * per_patch, per_patch, total),
                    )  # fmt: skip
                    losses[name].append(found.losses)
                    where = random_patch_positions(
                        whole, size, found.side, generator=torch.Generator().manual_seed(args.seed + 1)
                    )[mine]
                    if not images:
                        continue
                    adversarial = evaluate_patch(model, images, labels, found, positions=where)
                    noise = noise_patch(found.side, channels=int(found.patch.shape[0]), seed=args.seed + 2)
                    control = evaluate_patch(model, images, labels, noise, positions=where, target=args.target)
                    measured = [adversarial.clean_accuracy, adversarial.accuracy, adversarial.fooling_rate]
                    measured += [control.accuracy, control.fooling_rate]
                    if adversarial.target_rate is not None and control.target_rate is not None:  # --target
                        measured += [adversarial.target_rate, control.target_rate]
                    counts[name][:, k] = np.array(measured, dtype=np.float64) * len(images)
    except AnalysisError as exc:
        raise CommandError(str(exc), code=2) from exc
    names = list(models)
    summed = ranks.sum(torch.tensor(np.stack([counts[n] for n in names]), dtype=torch.float64)).numpy()
    if not ranks.is_main:
        return 0
    rates = summed / whole  # (models, measures, shares)
    scored = "labels"
    fields = dict(
        models=np.array(names),
        shares=np.array(args.shares),
        **{m: rates[:, i] for i, m in enumerate(measures) if m != "clean"},
        clean_accuracy=rates[:, 0, 0],
        losses=np.array([losses[n] for n in names], dtype=np.float64),  # (models, shares, steps)
        count=np.int64(whole),
        train_scenes=np.int64(args.train_scenes),
        steps=np.int64(per_patch),
        batch_size=np.int64(args.batch_size),
        target=np.int64(-1 if args.target is None else args.target),
        images=np.array(description),
        scored_against=np.array(scored),
        skipped_images=np.array(skipped, dtype=str),
        world_size=np.int64(ranks.world),
    )
    rows = [
        (n, float(s), m, float(rates[i, j, k]))
        for i, n in enumerate(names)
        for k, s in enumerate(args.shares)
        for j, m in enumerate(measures)
        if m != "clean"
    ]
    _write(args.out, fields, ["model", "share", "measure", "value"], rows)
    print(
        f"{per_patch} steps of {args.batch_size} scenes per patch ({args.train_scenes} training scenes, stream "
        f"{PATCH_TRAIN_SEED}), {target}"
    )
    for i, n in enumerate(names):
        print(
            f"{n:<12} clean {rates[i, 0, 0]:.3f}; own patch / noise patch (margin): "
            + ", ".join(
                f"{s:g}: {rates[i, 1, k]:.3f} / {rates[i, 3, k]:.3f} ({100 * (rates[i, 3, k] - rates[i, 1, k]):+.1f} points)"
                for k, s in enumerate(args.shares)
            )
        )
        if args.target is not None:
            print(
                f"{'':<12} target-hit rate, own patch / noise patch: "
                + ", ".join(f"{s:g}: {rates[i, 5, k]:.3f} / {rates[i, 6, k]:.3f}" for k, s in enumerate(args.shares))
            )
        print(
            f"{'':<12} training loss, mean of the first / last 10 steps: "
            + ", ".join(
                f"{s:g}: {np.mean(losses[n][k][:10]):.3f} / {np.mean(losses[n][k][-10:]):.3f}"
                for k, s in enumerate(args.shares)
            )
        )
    print(f"{whole} held-out images ({scored}); wrote {args.out} and {args.out.with_suffix('.csv')}")
    return 0


def _gathered_features(model, images, mine: list[int], count: int, ranks: Ranks):
    """Every rank's :func:`~analysis.robustness.block_features` of its images (``mine``: their indices in
    the set of ``count``), summed into the whole set's ``(layers, features (count, D_l) each, logits)``:
    each rank fills its own rows and zeros elsewhere, so the sum over the ranks is the set in order."""
    from ..robustness.linear_probe import block_features

    # every rank reads one image at least, for the shapes (a rank without images contributes zeros)
    layers, features, logits = block_features(model, [images[i] for i in mine] or images[:1])
    rows = torch.as_tensor(mine, dtype=torch.long)
    whole = []
    for part in [*features, logits]:
        full = torch.zeros((count, part.shape[1]), dtype=torch.float64)
        if mine:
            full[rows] = part.double()
        whole.append(ranks.sum(full).float())
    return layers, whole[:-1], whole[-1]


def run_probe(args, ranks: Ranks) -> int:
    """Run ``robustness probe``: the linear-probe accuracy of each block's token against depth
    (:func:`~analysis.robustness.probe_curve`, Naseer et al. 2021), for the ViT and each ``--also``
    model, on ``--demo-scenes`` or a ``--folder`` of class subfolders. Every rank extracts the block
    features of its share of the images; the sums give the whole set on every rank. The main rank
    writes ``--out`` (.npz: per model ``<name>_layers``, ``<name>_accuracy``, ``<name>_concat_k``,
    ``<name>_concat_accuracy`` and ``<name>_model_accuracy``) and the ``.csv`` next to it.

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
        Exit code 2: ``--test-share`` outside ``(0, 1)``, ``--ridge`` negative, ``--demo-scenes``
        below 2, or an :class:`~analysis.base.errors.AnalysisError` of the probe (e.g. a ``--folder``
        without class subfolders or images, too few images to split); exit code 1: the ViT or an
        ``--also`` model could not be loaded.
    """
    from ..demo.data import generate_samples
    from ..model.loading import load_vit
    from ..robustness.linear_probe import folder_labels, load_image_folder, probe_curve, probe_feature

    if not 0 < args.test_share < 1 or args.ridge < 0:
        raise CommandError("--test-share must lie in (0, 1) and --ridge be 0 or more.", code=2)
    models = {"ViT": load_model(args, ranks.device)}
    try:
        for name in args.also:
            models[name] = load_vit(name, device=ranks.device)
    except VitExplorerError as exc:
        raise CommandError(f"could not load a comparison model: {exc}", code=1) from exc
    try:
        if args.demo_scenes is not None:
            if args.demo_scenes < 2:
                raise CommandError("--demo-scenes must be at least 2 (a training and a test split).", code=2)
            images, labels, _ = generate_samples(args.demo_scenes, args.seed)
            labels_of = {name: (labels, True) for name in models}
            description = f"{args.demo_scenes} held-out demo scenes, seed {args.seed}"
        else:
            folder = load_image_folder(args.folder)
            images = folder.images
            labels_of = {name: folder_labels(model, folder)[1:] for name, model in models.items()}
            description = f"{len(images)} images in {len(folder.class_names)} class folders of {args.folder}"
        say(ranks, f"linear probe of {', '.join(models)}: {description}")
        mine = list(range(ranks.rank, len(images), ranks.world))
        curves = {}
        for name, model in models.items():
            layers, features, logits = _gathered_features(model, images, mine, len(images), ranks)
            labels, model_labels = labels_of[name]
            curves[name] = probe_curve(
                layers,
                features,
                logits,
                labels,
                feature=probe_feature(model.spec),
                test_share=args.test_share,
                concat_k=args.concat,
                ridge=args.ridge,
                seed=args.seed,
                model_labels=model_labels,
            )
    except AnalysisError as exc:
        raise CommandError(str(exc), code=2) from exc
    if not ranks.is_main:
        return 0
    fields: dict = dict(
        models=np.array(list(curves)), count=np.int64(len(images)), images=np.array(description),
        test_share=np.float64(args.test_share), ridge=np.float64(args.ridge), world_size=np.int64(ranks.world),
    )  # fmt: skip
    rows = []
    for name, curve in curves.items():
        fields[f"{name}_layers"] = np.array(curve.layers)
        fields[f"{name}_accuracy"] = curve.accuracy
        fields[f"{name}_concat_k"] = np.array(curve.concat_k, dtype=np.int64)
        fields[f"{name}_concat_accuracy"] = curve.concat_accuracy
        fields[f"{name}_model_accuracy"] = np.float64(np.nan if curve.model_accuracy is None else curve.model_accuracy)
        rows += [(name, f"block {layer}", float(a)) for layer, a in zip(curve.layers, curve.accuracy)]
        rows += [(name, f"last {k} blocks", float(a)) for k, a in zip(curve.concat_k, curve.concat_accuracy)]
        if curve.model_accuracy is not None:
            rows.append((name, "the model itself", curve.model_accuracy))
        own = "" if curve.model_accuracy is None else f"; the model itself {curve.model_accuracy:.3f}"
        print(
            f"{name:<12} {curve.feature} by block: " + " ".join(f"{a:.3f}" for a in curve.accuracy)
            + "".join(f"; last {k} {a:.3f}" for k, a in zip(curve.concat_k, curve.concat_accuracy)) + own
        )  # fmt: skip
    _write(args.out, fields, ["model", "feature", "accuracy"], rows)
    print(f"{len(images)} images, test share {args.test_share}; wrote {args.out} and {args.out.with_suffix('.csv')}")
    return 0


def _write(out: Path, fields: dict, header: list[str], rows: list[tuple]) -> None:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out, **fields)
    with out.with_suffix(".csv").open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(header)
        writer.writerows(rows)
