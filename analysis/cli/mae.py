"""``python -m analysis mae``: a masked autoencoder's mean reconstruction loss at each mask ratio
over an image set, on one process or sharded across ``torchrun`` ranks. Writes ``OUT.npz``.

Image ``i`` of the set is masked with MAE's own draw from ``--seed`` + i, so the result does
not depend on the batch size or the number of ranks (:mod:`analysis.mae.dataset`)."""

from __future__ import annotations

import numpy as np
import torch

from ..base.errors import VitExplorerError
from .common import (
    CommandError,
    add_command,
    add_device_argument,
    add_image_set_arguments,
    add_img_size_argument,
    images_used,
    open_image_set,
    progress_bar,
)
from .distributed import Ranks

__all__ = ["add_parser", "run", "parse_ratios"]


def add_parser(subparsers) -> None:
    """Add the ``mae`` subcommand: ``--model`` (what :func:`~analysis.mae.load_mae` accepts),
    ``--ratios`` (default ``0.25,0.5,0.75,0.9``), ``--seed`` (default 0), ``--img-size``,
    ``--device``, the image-set arguments (``--batch-size`` default 16) and :func:`run` as its callback.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        What ``parser.add_subparsers()`` returned (:func:`analysis.cli.build_parser`).
    """
    parser = add_command(
        subparsers,
        "mae",
        help="masked autoencoder: mean reconstruction loss per mask ratio over an image set",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument(
        "--model",
        required=True,
        help="what load_mae accepts: a ViTMAEForPreTraining save_pretrained folder or hf:org/name "
        "(e.g. hf:facebook/vit-mae-base)",
    )
    parser.add_argument("--ratios", default="0.25,0.5,0.75,0.9", help="comma-separated mask ratios in [0, 1)")
    parser.add_argument("--seed", type=int, default=0, help="image i is masked with MAE's draw from seed + i")
    add_img_size_argument(parser)
    add_device_argument(parser)
    add_image_set_arguments(parser, out_help="result .npz", batch_size=16)
    parser.set_defaults(run=run)


def parse_ratios(text: str) -> tuple[float, ...]:
    """The mask ratios of ``--ratios``. Only parsed here; their range is checked against the model
    once it is loaded (:func:`analysis.mae.dataset.check_ratios`).

    Parameters
    ----------
    text : str
        Comma-separated numbers, e.g. ``"0.25,0.5,0.75,0.9"``; empty parts are ignored.

    Returns
    -------
    tuple of float
        The ratios, in the order given.

    Raises
    ------
    CommandError
        Exit code 2: a part is not a number, or there is no ratio at all.
    """
    try:
        ratios = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise CommandError(
            f"--ratios must be comma-separated numbers, e.g. 0.25,0.5,0.75,0.9; got {text!r}.", code=2
        ) from None
    if not ratios:
        raise CommandError("--ratios is empty: give some mask ratios, e.g. 0.25,0.5,0.75,0.9.", code=2)
    return ratios


def load_mae_model(args, device: torch.device):
    from ..mae import load_mae

    try:
        return load_mae(args.model, device=device, img_size=args.img_size)
    except VitExplorerError as exc:  # MissingDecoderError, ModelLoadError, WeightsUnavailableError
        raise CommandError(f"could not load the masked autoencoder {args.model!r}: {exc}", code=1) from exc


def run(args, ranks: Ranks) -> int:
    """Run ``mae``: every rank sums its shard's per-image masked-patch MSE at each ratio
    (:func:`~analysis.mae.dataset.dataset_mae_loss`, image ``i`` of the set masked with MAE's draw
    from ``--seed`` + i), the sums are reduced, and the main rank writes ``--out`` (.npz: ``ratios``,
    ``mean_loss`` ``(R,)``, ``visible_patches`` ``(R,)``, ``count``, the skipped images, the seed,
    ``norm_pix_loss`` and the geometry) and prints the mean loss per ratio.

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
        Exit code 2: ``--ratios`` unparsable or out of range for the model, ``--batch-size`` below 1
        or ``--images`` naming nothing usable; exit code 1: the masked autoencoder could not be loaded,
        or no image could be used.
    """
    from ..mae.dataset import check_ratios, dataset_mae_loss

    ratios = parse_ratios(args.ratios)

    def require(mae) -> None:
        try:
            check_ratios(ratios, mae.spec.num_patches)
        except VitExplorerError as exc:
            raise CommandError(f"--ratios: {exc}", code=2) from exc

    source, mae, shard = open_image_set(args, ranks, require, load=load_mae_model)
    skipped: list = []
    with progress_bar(ranks, len(shard), "mae") as advance:
        losses = dataset_mae_loss(
            mae,
            shard.items,
            ratios,
            seed=args.seed,
            batch_size=args.batch_size,
            workers=args.workers,
            index_of=lambda j: ranks.rank + j * ranks.world,
            skipped=skipped,
            progress=advance,
        )  # (n, R)
    total = ranks.sum(losses.sum(0))  # (R,)
    outcome = images_used(ranks, shard, source, losses.shape[0], skipped)
    if outcome is None:  # not the main rank
        return 0
    used, left_out = outcome
    mean_loss = (total / used).numpy()
    spec = mae.spec
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(
        args.out,
        ratios=np.array(ratios),
        mean_loss=mean_loss,
        visible_patches=np.array([int(spec.num_patches * (1 - r)) for r in ratios], dtype=np.int64),
        count=np.int64(used),
        skipped=np.int64(len(left_out)),
        skipped_images=np.array(left_out, dtype=str),
        model=np.array(args.model),
        images=np.array(source.description),
        seed=np.int64(args.seed),
        norm_pix_loss=np.bool_(mae.norm_pix_loss),
        patch_size=np.array(spec.patch_size),
        grid_size=np.array(spec.grid_size),
        img_size=np.array(spec.img_size),
        world_size=np.int64(ranks.world),
    )
    loss_kind = "per-patch normalised pixels (norm_pix_loss)" if mae.norm_pix_loss else "model-input pixels"
    print(
        f"{used} images used, {len(left_out)} skipped; mean masked-patch MSE in {loss_kind}: "
        + ", ".join(f"{r:g}: {loss:.4f}" for r, loss in zip(ratios, mean_loss))
    )
    print(f"wrote {args.out}")
    return 0
