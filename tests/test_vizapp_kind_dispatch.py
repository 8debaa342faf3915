"""The app asks the library, not the kind of model: nowhere in ``vizapp/`` an ``is_windowed``;
``attends_globally`` at most once in a page (``views/``), its one dispatch between two drawings (an
instant view of one token grid, or per-stage drawings), once in ``python_snippet.py`` (the kind of
code a snippet shows, read when its source is made), and nowhere else.
Everything else reads facts that hold for both kinds (``spec.geometry(layer)``, ``spec.layer_cell``,
``analysis.records.queries.query_for_layers``, ...)."""

from __future__ import annotations

import re
from pathlib import Path

VIZAPP = Path(__file__).resolve().parents[1] / "vizapp"

ONE_DISPATCH = ("python_snippet.py",)  # besides every page in views/


def dispatch_lines(path: Path, name: str) -> list[int]:
    """Line numbers of ``name`` as a word in ``path``."""
    return [n for n, line in enumerate(path.read_text().splitlines(), 1) if re.search(rf"\b{name}\b", line)]


def kind_branches(root: Path) -> list[str]:
    """``path:line why`` of every use the rule forbids under ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        found += [f"{relative}:{n} is_windowed" for n in dispatch_lines(path, "is_windowed")]
        globally = dispatch_lines(path, "attends_globally")
        allowed = 1 if relative.startswith("views/") or relative in ONE_DISPATCH else 0
        found += [f"{relative}:{n} attends_globally" for n in globally[allowed:]]
    return found


def test_pages_and_shared_modules_ask_library_facts():
    assert kind_branches(VIZAPP) == [], (
        "ask a fact that holds for both kinds (spec.geometry(layer), spec.layer_cell, query_for_layers, "
        "spec.outlier_grid, ...) or add one to the library; a page may dispatch on attends_globally once"
    )


def test_the_guard_sees_a_second_dispatch_and_a_shared_one(tmp_path):
    for relative in (
        "resources.py",
        "state.py",
        "views/tokens/tokens.py",
        "views/compare/compare.py",
        "python_snippet.py",
    ):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("x = 1\n")
    (tmp_path / "python_snippet.py").write_text("w = not spec.attends_globally\n")
    (tmp_path / "views/tokens/tokens.py").write_text("if spec.attends_globally:\n    pass\ny = spec.attends_globally\n")
    (tmp_path / "views/compare/compare.py").write_text("a = 1\nb = spec.is_windowed\n")
    (tmp_path / "state.py").write_text("z = not spec.attends_globally\n")
    assert kind_branches(tmp_path) == [
        "state.py:1 attends_globally",
        "views/compare/compare.py:2 is_windowed",
        "views/tokens/tokens.py:3 attends_globally",
    ]
