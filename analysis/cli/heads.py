"""``python -m analysis heads``: over an image set, the mean effect of zero-ablating each head and
each head's mean direct logit attribution, for each image's predicted class; on one process or
sharded across ``torchrun`` ranks. Writes ``OUT.npz``."""

from __future__ import annotations

import sys

import numpy as np

from ..circuits import dataset_head_effects
from ..model.windowed_support import require_global_attention
from .common import (
    CommandError,
    add_command,
    add_image_set_arguments,
    add_model_arguments,
    images_used,
    open_image_set,
    progress_bar,
)
from .distributed import Ranks

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> None:
    """Add the ``heads`` subcommand: the model arguments, the image-set arguments (``--batch-size``
    default 16) and :func:`run` as its callback.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        What ``parser.add_subparsers()`` returned (:func:`analysis.cli.build_parser`).
    """
    parser = add_command(
        subparsers,
        "heads",
        help="mean head-ablation effect and direct logit attribution per layer and head",
        description=__doc__.split("\n\n")[0],
    )
    add_model_arguments(parser)
    add_image_set_arguments(parser, out_help="result .npz", batch_size=16)
    parser.set_defaults(run=run)


def run(args, ranks: Ranks) -> int:
    """Run ``heads``: every rank sums its shard's head effects
    (:func:`~analysis.circuits.dataset_head_effects`), the sums are reduced, and the main rank writes
    ``--out`` (.npz: ``ablation_delta_logit``, ``ablation_delta_probability`` and
    ``direct_logit_attribution``, each ``(L, heads)``, the mean over the images used, with ``count``,
    the skipped images and ``attribution_note``) and prints the head whose removal costs the most.

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
        Exit code 1: the model has windowed attention or no classifier head; otherwise as
        :func:`~analysis.cli.common.open_image_set` and :func:`~analysis.cli.common.images_used`.
    """

    def require(vit) -> None:
        def refusal(windowed: str):
            return CommandError(
                f"{args.model}: heads needs a global-attention classifier (this one has a "
                f"{vit.spec.head} head{windowed}).",
                code=1,
            )

        require_global_attention(vit, lambda _: refusal(", windowed attention"))
        if not vit.spec.has_classifier:
            raise refusal("")

    source, vit, shard = open_image_set(args, ranks, require)
    with progress_bar(ranks, len(shard), "heads") as advance:
        sums = dataset_head_effects(
            vit, shard.items, batch_size=args.batch_size, workers=args.workers, progress=advance
        )
    totals = {key: ranks.sum(getattr(sums, key)) for key in ("delta_logit", "delta_probability", "direct_logit")}
    outcome = images_used(ranks, shard, source, sums.count, sums.skipped)
    if outcome is None:  # not the main rank
        return 0
    used, left_out = outcome
    if sums.attribution_note:
        print(f"direct logit attribution not computed: {sums.attribution_note}", file=sys.stderr)
    means = {key: (value / used).numpy() for key, value in totals.items()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(
        args.out,
        ablation_delta_logit=means["delta_logit"],
        ablation_delta_probability=means["delta_probability"],
        direct_logit_attribution=means["direct_logit"],
        count=np.int64(used),
        skipped=np.int64(len(left_out)),
        skipped_images=np.array(left_out, dtype=str),
        model=np.array(args.model),
        images=np.array(source.description),
        world_size=np.int64(ranks.world),
        attribution_note=np.array(sums.attribution_note),
    )
    strongest = np.unravel_index(np.argmin(means["delta_logit"]), means["delta_logit"].shape)
    print(
        f"{used} images used, {len(left_out)} skipped; the head whose removal costs the most: layer {strongest[0]}, "
        f"head {strongest[1]} ({means['delta_logit'][strongest]:+.3f} logit on average)"
    )
    print(f"wrote {args.out}")
    return 0
