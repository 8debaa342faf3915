"""mkdocs hooks: pages that are generated from the code, so they cannot fall out of date.

A page line ``<!-- generated: NAME -->`` is replaced, at build time, by:

- ``hook-points``: the table of :data:`analysis.engine.activations.HOOK_POINTS` (and the pooling point);
- ``cli``: the ``--help`` text of every command-line parser (``python -m analysis`` and each of
  its commands, ``python -m analysis.faithfulness``, ``.robustness``, ``.bench``,
  ``.demo.evaluate``), and the usage of ``vit-explorer`` from its module docstring.

An unknown NAME fails the build.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!-- generated: ([\w-]+) -->$", re.M)


def hook_points_table() -> str:
    from analysis.engine.activations.points import HOOK_POINTS, POOL_POINT

    rows = ["| name | shape | what it is |", "|---|---|---|"]
    rows += [f"| `blocks.{{i}}.{p.suffix}` | `{p.shape}` | {p.meaning} |" for p in HOOK_POINTS]
    rows.append(f"| `{POOL_POINT.suffix}` | `{POOL_POINT.shape}` | {POOL_POINT.meaning} |")
    return "\n".join(rows)


def _help_of_main(main) -> str:
    """What ``main(["--help"])`` prints: argparse prints the help and exits before any work."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main(["--help"])
    return out.getvalue()


def _fenced(title: str, text: str) -> str:
    return f"### `{title}`\n\n```text\n{text.rstrip()}\n```\n"


def cli_help() -> str:
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal's width: one width for the page
    from analysis import cli

    parser = cli.build_parser()
    sections = [_fenced("python -m analysis", parser.format_help())]
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subparsers.choices.items():
        sections.append(_fenced(f"python -m analysis {name}", sub.format_help()))
    from analysis.bench.__main__ import main as bench
    from analysis.demo.evaluate import main as evaluate
    from analysis.faithfulness.__main__ import main as faithfulness
    from analysis.robustness.__main__ import main as robustness

    for title, main in (
        ("python -m analysis.faithfulness", faithfulness),
        ("python -m analysis.robustness", robustness),
        ("python -m analysis.bench", bench),
        ("python -m analysis.demo.evaluate", evaluate),
    ):
        sections.append(_fenced(title, _help_of_main(main)))
    import vizapp.cli

    sections.append(f"### `vit-explorer`\n\n```text\n{vizapp.cli.__doc__.strip()}\n```\n")
    return "\n".join(sections)


GENERATORS = {"hook-points": hook_points_table, "cli": cli_help}


def on_page_markdown(markdown: str, page, config, files) -> str:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))

    def replace(match):
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"{page.file.src_path}: no generator named {name!r} (known: {', '.join(GENERATORS)})")
        return GENERATORS[name]()

    return MARKER.sub(replace, markdown)
