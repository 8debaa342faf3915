"""``python -m analysis heads``: over an image set, the mean effect of zero-ablating each head and
each head's mean direct logit attribution, for each image's predicted class; on one process or
sharded across ``torchrun`` ranks. Writes ``OUT.npz``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from ..circuits import dataset_head_effects
from ..errors import VitExplorerError
from .common import CommandError, add_model_arguments, load_model, progress_bar, say
from .distributed import Ranks
from .sources import resolve_images

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "heads", help="mean head-ablation effect and direct logit attribution per layer and head",
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_arguments(parser)
    parser.add_argument("--images", required=True, help="a folder (searched recursively), a .zip, or a glob pattern")
    parser.add_argument("--out", required=True, type=Path, help="result .npz")
    parser.add_argument("--batch-size", type=int, default=16, help="images per forward pass (default 16)")
    parser.add_argument("--workers", type=int, default=None, help="decode threads per process")
    parser.set_defaults(run=run)


def run(args, ranks: Ranks) -> int:
    if args.batch_size < 1:
        raise CommandError("--batch-size must be at least 1.", code=2)
    try:
        source = resolve_images(args.images)
    except VitExplorerError as exc:
        raise CommandError(str(exc), code=2) from exc
    vit = load_model(args, ranks.device)
    if not vit.spec.has_classifier or vit.spec.is_windowed:
        raise CommandError(f"{args.model}: heads needs a global-attention classifier (this one has a {vit.spec.head} "
                           f"head{', windowed attention' if vit.spec.is_windowed else ''}).", code=1)
    shard = source.shard(ranks.rank, ranks.world)
    say(ranks, f"{args.model}: {len(source)} images ({source.description}) on {ranks.world} "
               f"process{'es' if ranks.world > 1 else ''}, {ranks.device.type}")
    with progress_bar(ranks, len(shard), "heads") as advance:
        sums = dataset_head_effects(vit, shard.items, batch_size=args.batch_size, workers=args.workers, progress=advance)
    totals = {key: ranks.sum(getattr(sums, key)) for key in ("delta_logit", "delta_probability", "direct_logit")}
    used = int(ranks.sum(torch.tensor([sums.count], dtype=torch.float64))[0])
    skipped = [(names[item.index], item.reason) for names, items in ranks.gather((list(shard.names), sums.skipped))
               for item in items]
    if not ranks.is_main:
        return 0
    for name, reason in skipped:
        print(f"skipped {name}: {reason}", file=sys.stderr)
    if used == 0:
        raise CommandError(f"None of the {len(source)} images could be read: nothing to average.", code=1)
    if sums.attribution_note:
        print(f"direct logit attribution not computed: {sums.attribution_note}", file=sys.stderr)
    means = {key: (value / used).numpy() for key, value in totals.items()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(args.out, ablation_delta_logit=means["delta_logit"], ablation_delta_probability=means["delta_probability"],
             direct_logit_attribution=means["direct_logit"], count=np.int64(used), skipped=np.int64(len(skipped)),
             skipped_images=np.array([f"{n}: {r}" for n, r in skipped], dtype=str), model=np.array(args.model),
             images=np.array(source.description), world_size=np.int64(ranks.world),
             attribution_note=np.array(sums.attribution_note))
    strongest = np.unravel_index(np.argmin(means["delta_logit"]), means["delta_logit"].shape)
    print(f"{used} images used, {len(skipped)} skipped; the head whose removal costs the most: layer {strongest[0]}, "
          f"head {strongest[1]} ({means['delta_logit'][strongest]:+.3f} logit on average)")
    print(f"wrote {args.out}")
    return 0
