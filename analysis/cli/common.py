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
    """The subcommand ``name`` of ``subparsers``.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        What ``parser.add_subparsers()`` returned.
    name : str
        The subcommand's name.
    help : str
        Its one-line help in the list of commands.
    description : str
        The text atop its own ``--help``.
    raw_description : bool, default True
        Print ``description`` as written (``argparse.RawDescriptionHelpFormatter``); ``False``
        lets argparse rewrap it.

    Returns
    -------
    argparse.ArgumentParser
        The subcommand's parser.
    """
    formatter = {"formatter_class": argparse.RawDescriptionHelpFormatter} if raw_description else {}
    return subparsers.add_parser(name, help=help, description=description, **formatter)


MODEL_HELP = (
    "what load_vit accepts: demo, a timm name, hf:org/name, torchvision:vit_b_16, a folder "
    "or a file; prefix random: for random weights"
)


def add_model_arguments(parser, *, model_help: str = MODEL_HELP) -> None:
    """Add ``--model`` (required), ``--arch``, ``--img-size`` and ``--device`` to ``parser``.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The command's parser.
    model_help : str, default MODEL_HELP
        The help of ``--model``: what it accepts (by default what :func:`~analysis.load_vit` accepts,
        ``random:`` prefix included).
    """
    parser.add_argument("--model", required=True, help=model_help)
    parser.add_argument("--arch", default=None, help="the architecture of a bare weights file")
    add_img_size_argument(parser)
    add_device_argument(parser)


def add_img_size_argument(parser) -> None:
    """Add ``--img-size`` to ``parser``: the input resolution to load the model at (default ``None``,
    the model's own).

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The command's parser.
    """
    parser.add_argument("--img-size", type=int, default=None, help="input resolution (default: the model's own)")


def add_device_argument(parser) -> None:
    """Add ``--device`` to ``parser``: ``cpu`` or ``cuda``; default ``None``, a GPU per process when
    there are enough, else the CPU (:func:`~analysis.cli.distributed.start`).

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The command's parser.
    """
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="default: a GPU per process when there are enough, else the CPU",
    )


def add_out_argument(parser, help: str) -> None:
    """Add ``--out`` to ``parser``: required, parsed as a ``pathlib.Path``.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The command's parser.
    help : str
        Its help: what is written there.
    """
    from pathlib import Path

    parser.add_argument("--out", required=True, type=Path, help=help)


def load_model(args, device: torch.device):
    """:func:`~analysis.load_vit` of ``--model`` on ``device``.

    A ``random:`` prefix loads the architecture with random weights (``pretrained=False``);
    ``--arch`` and ``--img-size`` (when given) are passed on.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed arguments with ``model``, ``arch`` and ``img_size``.
    device : torch.device
        Where the model is put.

    Returns
    -------
    LoadedViT
        The loaded model, as :func:`~analysis.load_vit` returns it.

    Raises
    ------
    CommandError
        Exit code 1: the model could not be loaded (any :class:`~analysis.base.errors.VitExplorerError`
        of :func:`~analysis.load_vit`, e.g. an unknown model or unavailable weights).
    """
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
    """Print ``message`` to stderr (flushed) on the main rank only.

    Parameters
    ----------
    ranks : Ranks
        This process's place in the run.
    message : str
        One line to print.
    """
    if ranks.is_main:
        print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def progress_bar(
    ranks: Ranks, total: int, label: str, *, unit: str = "img"
) -> Iterator[Callable[[int, int | None], None]]:
    """A ``progress(done, total)`` callback drawing a tqdm bar on rank 0 (its own shard), silent elsewhere.

    Parameters
    ----------
    ranks : Ranks
        This process's place in the run; only the main rank draws.
    total : int
        Images in rank 0's shard; 0 draws nothing.
    label : str
        The bar's description (``" · rank 0 of N"`` appended in a distributed run).
    unit : str, default "img"
        What the bar counts (``"step"`` for a training loop).

    Yields
    ------
    Callable[[int, int or None], None]
        ``progress(done, total=None)``: moves the bar to ``done`` images (the second argument is
        ignored); a no-op off the main rank or when ``total`` is 0.
    """
    if not ranks.is_main or not total:

        def silent(done: int, _total: int | None = None) -> None:
            return None

        yield silent
        return
    from tqdm.auto import tqdm

    description = label if ranks.world == 1 else f"{label} · rank 0 of {ranks.world}"
    with tqdm(total=total, desc=description, unit=unit, file=sys.stderr, dynamic_ncols=True) as bar:

        def advance(done: int, _total: int | None = None) -> None:
            bar.update(done - bar.n)

        yield advance


def add_image_set_arguments(parser, *, out_help: str, batch_size: int) -> None:
    """Add ``--images`` (required), ``--out`` (required), ``--batch-size`` and ``--workers`` (decode
    threads per process, default ``None``) to a command over an image set.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The command's parser.
    out_help : str
        The help of ``--out``: what is written there.
    batch_size : int
        The default of ``--batch-size`` (images per forward pass).
    """
    parser.add_argument("--images", required=True, help="a folder (searched recursively), a .zip, or a glob pattern")
    add_out_argument(parser, out_help)
    parser.add_argument(
        "--batch-size", type=int, default=batch_size, help=f"images per forward pass (default {batch_size})"
    )
    parser.add_argument("--workers", type=int, default=None, help="decode threads per process")


def open_image_set(args, ranks: Ranks, require: Callable | None = None, load: Callable | None = None):
    """Start an image-set command: ``--batch-size`` checked, ``--images`` resolved, ``--model``
    loaded, ``require(vit)`` called, this rank's shard taken and the run announced (:func:`say`).

    Parameters
    ----------
    args : argparse.Namespace
        Parsed arguments with ``batch_size``, ``images`` and ``model`` (and what ``load`` reads).
    ranks : Ranks
        This process's place in the run; the model goes on ``ranks.device``.
    require : Callable or None, default None
        ``require(vit)``, called after loading; may raise a :class:`CommandError` to refuse the model.
    load : Callable or None, default None
        ``load(args, device)`` returning the model; ``None`` is :func:`load_model`.

    Returns
    -------
    tuple of (ImageSource, LoadedViT, ImageSource)
        ``(source, vit, shard)``: every image, the model, and this rank's shard of ``source``
        (:meth:`~analysis.cli.sources.ImageSource.shard`).

    Raises
    ------
    CommandError
        Exit code 2: ``--batch-size`` below 1, or ``--images`` names nothing usable
        (:func:`~analysis.cli.sources.resolve_images` failed); exit code 1: the model could not be
        loaded; or whatever ``require`` raises.
    """
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
    """Every rank's skipped images, in rank order; the same list on every rank.

    Parameters
    ----------
    ranks : Ranks
        This process's place in the run (a collective call: every rank must make it).
    shard : ImageSource
        This rank's shard; its ``names`` name the skipped images.
    skipped : Iterable of SkippedImage
        This rank's skipped images, each with an ``index`` into ``shard`` and a ``reason``.

    Returns
    -------
    list of tuple of (str, str)
        ``(name, reason)`` of each skipped image over all ranks.
    """
    return [
        (names[item.index], item.reason)
        for names, items in ranks.gather((list(shard.names), list(skipped)))
        for item in items
    ]


def images_used(ranks: Ranks, shard, source, count: int, skipped) -> tuple[int, list[str]] | None:
    """After every rank has run its shard: how many images were used over all ranks, and which were
    left out. The main rank also prints a ``skipped name: reason`` line per image left out.

    Parameters
    ----------
    ranks : Ranks
        This process's place in the run (a collective call: every rank must make it).
    shard : ImageSource
        This rank's shard.
    source : ImageSource
        Every image; its ``problems`` (left out before decoding) are reported too.
    count : int
        Images this rank used.
    skipped : Iterable of SkippedImage
        This rank's skipped images (indices into ``shard``).

    Returns
    -------
    tuple of (int, list of str) or None
        ``(images used over all ranks, "name: reason" of each image left out)`` on the main rank;
        ``None`` on the others.

    Raises
    ------
    CommandError
        Exit code 1, on the main rank: no image could be used at all.
    """
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
