"""The app asks the library, not the kind of model: in the modules below, no ``is_windowed`` at all;
``attends_globally`` never in the shared modules (resources, state, ui) and at most once in a page,
its one dispatch between two drawings (an instant view of one token grid, or per-stage drawings).
Everything else reads facts that hold for both kinds (``spec.geometry(layer)``, ``spec.layer_cell``,
``analysis.queries.query_for_layers``, ...)."""

from __future__ import annotations

import re
from pathlib import Path

VIZAPP = Path(__file__).resolve().parents[1] / "vizapp"

SHARED = ("resources.py", "state.py", "ui.py")  # no dispatch at all
PAGES = ("views/tokens.py", "views/compare.py")  # at most one dispatch each


def dispatch_lines(path: Path, name: str) -> list[int]:
    """Line numbers of ``name`` as a word in ``path``."""
    return [n for n, line in enumerate(path.read_text().splitlines(), 1) if re.search(rf"\b{name}\b", line)]


def kind_branches(root: Path) -> list[str]:
    """``path:line why`` of every use the rule forbids under ``root``."""
    found = []
    for relative in SHARED + PAGES:
        path = root / relative
        found += [f"{relative}:{n} is_windowed" for n in dispatch_lines(path, "is_windowed")]
        globally = dispatch_lines(path, "attends_globally")
        allowed = 1 if relative in PAGES else 0
        found += [f"{relative}:{n} attends_globally" for n in globally[allowed:]]
    return found


def test_pages_and_shared_modules_ask_library_facts():
    assert kind_branches(VIZAPP) == [], (
        "ask a fact that holds for both kinds (spec.geometry(layer), spec.layer_cell, query_for_layers, "
        "spec.outlier_grid, ...) or add one to the library; a page may dispatch on attends_globally once"
    )


def test_the_guard_sees_a_second_dispatch_and_a_shared_one(tmp_path):
    for relative in SHARED + PAGES:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("x = 1\n")
    (tmp_path / "views/tokens.py").write_text("if spec.attends_globally:\n    pass\ny = spec.attends_globally\n")
    (tmp_path / "views/compare.py").write_text("a = 1\nb = spec.is_windowed\n")
    (tmp_path / "state.py").write_text("z = not spec.attends_globally\n")
    assert kind_branches(tmp_path) == [
        "state.py:1 attends_globally",
        "views/tokens.py:3 attends_globally",
        "views/compare.py:2 is_windowed",
    ]
