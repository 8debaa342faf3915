"""What the subcommands share: typed failures with exit codes, the model arguments, progress, and
the image-set commands' arguments, start (resolve, load, shard) and skipped-image report."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator

import torch

from ..base.errors import VitExplorerError
from .distributed import Ranks

__all__ = [
    "CommandError",
    "add_command",
    "add_model_arguments",
    "add_img_size_argument",
    "add_device_argument",
    "add_out_argument",
    "load_model",
    "progress_bar",
    "say",
    "add_image_set_arguments",
    "open_image_set",
    "gather_skipped",
    "images_used",
]


class CommandError(Exception):
    """A failure to report in one line, with the process's exit code (2: bad arguments,
    1: nothing could be done)."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def add_command(subparsers, name: str, *, help: str, description: str, raw_description: bool = True):
    """The subcommand ``name`` of ``subparsers`` (its one-line ``help`` in the list of commands, its
    ``description`` atop its own ``--help``, printed as written unless ``raw_description=False``)."""
    formatter = {"formatter_class": argparse.RawDescriptionHelpFormatter} if raw_description else {}
    return subparsers.add_parser(name, help=help, description=description, **formatter)


MODEL_HELP = (
    "what load_vit accepts: demo, a timm name, hf:org/name, torchvision:vit_b_16, a folder "
    "or a file; prefix random: for random weights"
)


def add_model_arguments(parser, *, model_help: str = MODEL_HELP) -> None:
    """``--model`` (``model_help``: what it accepts), ``--arch``, ``--img-size`` and ``--device``."""
    parser.add_argument("--model", required=True, help=model_help)
    parser.add_argument("--arch", default=None, help="the architecture of a bare weights file")
    add_img_size_argument(parser)
    add_device_argument(parser)


def add_img_size_argument(parser) -> None:
    """``--img-size``: the input resolution to load the model at."""
    parser.add_argument("--img-size", type=int, default=None, help="input resolution (default: the model's own)")


def add_device_argument(parser) -> None:
    """``--device``: ``cpu`` or ``cuda``, default a GPU per process when there are enough."""
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="default: a GPU per process when there are enough, else the CPU",
    )


def add_out_argument(parser, help: str) -> None:
    """``--out`` (required, a path): ``help`` says what is written there."""
    from pathlib import Path

    parser.add_argument("--out", required=True, type=Path, help=help)


def load_model(args, device: torch.device):
    """``load_vit`` of ``--model`` on ``device``; an unknown model is a :class:`CommandError`."""
    from ..model.loading import load_vit

    source, pretrained = args.model, True
    if source.startswith("random:"):
        source, pretrained = source.removeprefix("random:"), False
    kwargs = {"img_size": args.img_size} if args.img_size else {}
    try:
        return load_vit(source, pretrained=pretrained, arch=args.arch, device=device, **kwargs)
    except VitExplorerError as exc:  # ModelLoadError, WeightsUnavailableError, ...
        raise CommandError(f"could not load the model {args.model!r}: {exc}", code=1) from exc


def say(ranks: Ranks, message: str) -> None:
    if ranks.is_main:
        print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def progress_bar(ranks: Ranks, total: int, label: str) -> Iterator[Callable[[int, int | None], None]]:
    """A ``progress(done, total)`` callback drawing a tqdm bar on rank 0 (its own shard), silent elsewhere."""
    if not ranks.is_main or not total:

        def silent(done: int, _total: int | None = None) -> None:
            return None

        yield silent
        return
    from tqdm.auto import tqdm

    description = label if ranks.world == 1 else f"{label} · rank 0 of {ranks.world}"
    with tqdm(total=total, desc=description, unit="img", file=sys.stderr, dynamic_ncols=True) as bar:

        def advance(done: int, _total: int | None = None) -> None:
            bar.update(done - bar.n)

        yield advance


def add_image_set_arguments(parser, *, out_help: str, batch_size: int) -> None:
    """``--images``, ``--out``, ``--batch-size`` and ``--workers`` of a command over an image set."""
    parser.add_argument("--images", required=True, help="a folder (searched recursively), a .zip, or a glob pattern")
    add_out_argument(parser, out_help)
    parser.add_argument(
        "--batch-size", type=int, default=batch_size, help=f"images per forward pass (default {batch_size})"
    )
    parser.add_argument("--workers", type=int, default=None, help="decode threads per process")


def open_image_set(args, ranks: Ranks, require: Callable | None = None, load: Callable | None = None):
    """``(source, vit, shard)`` of an image-set command: ``--batch-size`` checked, ``--images``
    resolved (exit code 2 when it names nothing usable), ``--model`` loaded (by ``load(args,
    device)``, default :func:`load_model`), ``require(vit)`` (which may raise a
    :class:`CommandError`) called, this rank's shard taken and the run announced."""
    from .sources import resolve_images

    if args.batch_size < 1:
        raise CommandError("--batch-size must be at least 1.", code=2)
    try:
        source = resolve_images(args.images)
    except VitExplorerError as exc:  # AnalysisError, ArchiveError
        raise CommandError(str(exc), code=2) from exc
    vit = (load or load_model)(args, ranks.device)
    if require is not None:
        require(vit)
    shard = source.shard(ranks.rank, ranks.world)
    say(
        ranks,
        f"{args.model}: {len(source)} images ({source.description}) on {ranks.world} "
        f"process{'es' if ranks.world > 1 else ''}, {ranks.device.type}",
    )
    return source, vit, shard


def gather_skipped(ranks: Ranks, shard, skipped) -> list[tuple[str, str]]:
    """``(name, reason)`` of every rank's skipped images (``SkippedImage`` indices into its shard),
    in rank order; the same list on every rank."""
    return [
        (names[item.index], item.reason)
        for names, items in ranks.gather((list(shard.names), list(skipped)))
        for item in items
    ]


def images_used(ranks: Ranks, shard, source, count: int, skipped) -> tuple[int, list[str]] | None:
    """After every rank has run its shard: ``(images used over all ranks, "name: reason" of each
    image left out)`` on the main rank, which also prints what was left out; ``None`` on the
    others. Raises CommandError (exit 1) when no image could be used at all."""
    used = int(ranks.sum(torch.tensor([count], dtype=torch.float64))[0])
    left_out = [f"{name}: {reason}" for name, reason in gather_skipped(ranks, shard, skipped)]
    left_out += list(source.problems)  # left out before decoding
    if not ranks.is_main:
        return None
    for entry in left_out:
        print(f"skipped {entry}", file=sys.stderr)
    if used == 0:
        raise CommandError(f"None of the {len(source)} images could be read: nothing to average.", code=1)
    return used, left_out
