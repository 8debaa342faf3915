"""What the subcommands share: typed failures with exit codes, the model arguments, progress."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

import torch

from ..errors import VitExplorerError
from .distributed import Ranks

__all__ = ["CommandError", "add_model_arguments", "load_model", "progress_bar", "say"]


class CommandError(Exception):
    """A failure to report in one line, with the process's exit code (2: bad arguments,
    1: nothing could be done)."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def add_model_arguments(parser) -> None:
    parser.add_argument("--model", required=True,
                        help="what load_vit accepts: demo, a timm name, hf:org/name, torchvision:vit_b_16, a folder "
                             "or a file; prefix random: for random weights")
    parser.add_argument("--arch", default=None, help="the architecture of a bare weights file")
    parser.add_argument("--img-size", type=int, default=None, help="input resolution (default: the model's own)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="default: a GPU per process when there are enough, else the CPU")


def load_model(args, device: torch.device):
    """``load_vit`` of ``--model`` on ``device``; an unknown model is a :class:`CommandError`."""
    from ..loading import load_vit

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
        yield lambda done, _total=None: None
        return
    from tqdm.auto import tqdm

    description = label if ranks.world == 1 else f"{label} · rank 0 of {ranks.world}"
    with tqdm(total=total, desc=description, unit="img", file=sys.stderr, dynamic_ncols=True) as bar:
        def advance(done: int, _total: int | None = None) -> None:
            bar.update(done - bar.n)

        yield advance
