"""Which page settings survive page switches: each module that draws them declares its own.

A page (``vizapp/views/*.py``) or a module that draws widgets for pages (``ui.py``,
``attention_view.py``, …) names, at its top, the session keys of its settings that
:func:`vizapp.state.keep_page_state` keeps when the user switches pages::

    KEPT_KEYS = ("filt_mode", "filt_n")  # this page's settings kept across page switches

and a page names the widget keys it draws that are deliberately not kept (a view's chart
selection, a one-shot button) as ``TRANSIENT_KEYS``, so that every literal widget key of a page
is one or the other (tests/test_page_keys.py). A key drawn on several pages is declared by each.

Page scripts run only under ``st.navigation`` (importing one would draw the page), so the
declarations are read from the modules' source, not imported: both names must be assigned a
literal tuple of strings at module level.
"""

from __future__ import annotations

import ast
from pathlib import Path

__all__ = ["DECLARING_MODULES", "declared_keys", "persistent_keys"]

PACKAGE = Path(__file__).resolve().parent


def declaring_modules() -> tuple[Path, ...]:
    """Every module of the app that may declare keys: ``vizapp/*.py`` and the pages ``vizapp/views/*.py``."""
    return tuple(sorted(PACKAGE.glob("*.py")) + sorted((PACKAGE / "views").glob("*.py")))


DECLARING_MODULES = declaring_modules()


def declared_keys(path: Path, name: str = "KEPT_KEYS") -> tuple[str, ...]:
    """The literal tuple of strings assigned to ``name`` at the top level of the module at
    ``path`` (``()`` when it assigns none). Raises ValueError when it is not such a literal."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), filename=str(path))
    value: ast.expr | None
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign):
            targets, value = [node.target], node.value  # value: None for a bare annotation
        else:
            continue
        if any(isinstance(target, ast.Name) and target.id == name for target in targets):
            elements = value.elts if isinstance(value, (ast.Tuple, ast.List)) else None
            strings = [e.value for e in elements or () if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if elements is None or len(strings) != len(elements):
                raise ValueError(f"{path}: {name} must be a literal tuple of strings (it is read, not imported).")
            return tuple(strings)
    return ()


def persistent_keys() -> tuple[str, ...]:
    """Every key some module declares in ``KEPT_KEYS``, once each, in the modules' order (read from the
    source files on each call: ``vizapp.state.PERSISTENT_KEYS`` holds them once)."""
    keys: dict[str, None] = {}
    for path in DECLARING_MODULES:
        keys.update(dict.fromkeys(declared_keys(path)))
    return tuple(keys)
