"""Command line: ``python -m analysis <command>`` (``distance``, ``heads``, ``mae``, ``report``,
``robustness attack|corruptions|texture|patch|probe``, ``sae train|metrics``, ``similarity``).

Every command runs as one process, or under ``torchrun --nproc_per_node=N -m analysis ...``
as N ranks that split the images and reduce their sums (see :mod:`analysis.cli.distributed`).
Exit codes: 0 done (unreadable images are skipped and counted), 1 nothing could be done
(unknown model, no usable image), 2 bad arguments (a missing path, an empty folder).
"""

from __future__ import annotations

import argparse
import sys

from .common import CommandError
from .distributed import start, stop

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m analysis`` parser, one subcommand per command module.

    Returns
    -------
    argparse.ArgumentParser
        The parser; each subcommand's parsed arguments carry its ``run(args, ranks)`` callback as
        ``args.run``.
    """
    from . import distance, heads, mae, report, robustness, sae, similarity

    parser = argparse.ArgumentParser(prog="python -m analysis", description=__doc__.split("\n\n")[0])
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="command")
    distance.add_parser(subparsers)
    heads.add_parser(subparsers)
    mae.add_parser(subparsers)
    report.add_parser(subparsers)
    robustness.add_parser(subparsers)
    sae.add_parser(subparsers)
    similarity.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, join the ranks (:func:`analysis.cli.distributed.start`), run the
    command and leave the process group.

    A :class:`~analysis.cli.common.CommandError` is printed as one ``error:`` line (on the main
    rank) and becomes the exit code instead of a traceback.

    Parameters
    ----------
    argv : list of str or None, default None
        The arguments after the program name; ``None`` reads ``sys.argv[1:]``.

    Returns
    -------
    int
        The exit code: 0 done, 1 nothing could be done, 2 bad arguments (argparse's own usage
        errors exit with 2 through ``SystemExit``).
    """
    args = build_parser().parse_args(argv)
    ranks = start(args.device)
    try:
        return args.run(args, ranks)
    except CommandError as exc:
        if ranks.is_main:
            print(f"error: {exc}", file=sys.stderr)
        return exc.code
    finally:
        stop(ranks)
