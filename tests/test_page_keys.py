"""Each page declares its own settings kept across page switches (vizapp.page_keys), and the
session state keeps exactly those (vizapp.state.keep_page_state reads them, its logic unchanged).

* every key a module declares (``KEPT_KEYS``, ``TRANSIENT_KEYS``) is one it uses: a string in its
  code outside the declaration, or the ``<key>_other`` text box of a second-model picker it draws;
* every literal widget key a page draws (``key="..."``) is declared by it as kept or transient,
  or kept by the shared module that draws it for pages: a new widget must be given one or the other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from vizapp import page_keys

PAGES = sorted(p for p in page_keys.DECLARING_MODULES if p.parent.name == "views")
DECLARING = [
    p for p in page_keys.DECLARING_MODULES if page_keys.declared_keys(p) or page_keys.declared_keys(p, "TRANSIENT_KEYS")
]


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _declaration(node: ast.stmt) -> bool:
    return isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id in ("KEPT_KEYS", "TRANSIENT_KEYS") for t in node.targets
    )


def _strings_used(tree: ast.Module) -> set[str]:
    """Every string constant of the module's code, outside its key declarations."""
    return {
        node.value
        for statement in tree.body
        if not _declaration(statement)
        for node in ast.walk(statement)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


def _picker_keys(tree: ast.Module) -> set[str]:
    """``<key>_other`` of each ``second_model_control("<key>", …)`` call: the picker's text box."""
    return {
        f"{node.args[0].value}_other"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", getattr(node.func, "attr", None)) == "second_model_control"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }


def _widget_keys(tree: ast.Module) -> set[str]:
    """The literal ``key="..."`` of every call in the module (its widgets' keys)."""
    return {
        keyword.value.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        for keyword in node.keywords
        if keyword.arg == "key" and isinstance(keyword.value, ast.Constant) and isinstance(keyword.value.value, str)
    }


def test_the_session_keeps_exactly_the_declared_keys():
    from vizapp import state

    declared = [key for path in page_keys.DECLARING_MODULES for key in page_keys.declared_keys(path)]
    assert set(state.PERSISTENT_KEYS) == set(declared) and len(state.PERSISTENT_KEYS) == len(set(declared))
    assert len(PAGES) >= 12 and all(page_keys.declared_keys(page) for page in PAGES), "every page declares its keys"


@pytest.mark.parametrize("path", DECLARING, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_declared_key_is_used_by_the_module_that_declares_it(path):
    tree = _tree(path)
    used = _strings_used(tree) | _picker_keys(tree)
    declared = page_keys.declared_keys(path) + page_keys.declared_keys(path, "TRANSIENT_KEYS")
    assert [key for key in declared if key not in used] == []
    assert set(page_keys.declared_keys(path)).isdisjoint(page_keys.declared_keys(path, "TRANSIENT_KEYS"))


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_every_widget_key_a_page_draws_is_declared_kept_or_transient(path):
    shared = {
        key
        for module in page_keys.DECLARING_MODULES
        if module.parent.name != "views"
        for key in page_keys.declared_keys(module)
    }
    declared = set(page_keys.declared_keys(path)) | set(page_keys.declared_keys(path, "TRANSIENT_KEYS")) | shared
    assert sorted(_widget_keys(_tree(path)) - declared) == []


def test_a_declaration_that_is_not_a_literal_is_refused(tmp_path):
    module = tmp_path / "page.py"
    module.write_text("KEYS = ('a',)\nKEPT_KEYS = KEYS\n")
    with pytest.raises(ValueError, match="literal tuple of strings"):
        page_keys.declared_keys(module)
    module.write_text("KEPT_KEYS = ('a', 'b')\n")
    assert page_keys.declared_keys(module) == ("a", "b")
