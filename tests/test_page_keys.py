"""Each page declares the settings it keeps across page switches (``PageInfo.kept_keys`` in its
folder's ``__init__.py``), and the session state keeps exactly those (vizapp.state.keep_page_state
reads them through :func:`vizapp.views.persistent_keys`).

* every key a page declares (kept or transient) is one its folder's modules use: a string in their
  code, or the ``<key>_other`` text box of a second-model picker they draw;
* every literal widget key a page's modules draw (``key="..."``) is declared by the page as kept or
  transient, or kept by the shared controls (:data:`vizapp.ui.KEPT_KEYS`): a new widget must be given
  one or the other.
"""

from __future__ import annotations

import ast

import pytest

from vizapp import ui, views

PAGES = views.pages()


def _trees(page: views.Page) -> list[ast.Module]:
    """The page's modules (its script and its parts), without the declaring ``__init__.py``."""
    return [
        ast.parse(path.read_text(encoding="utf-8"))
        for path in sorted(page.script.parent.glob("*.py"))
        if path.name != "__init__.py"
    ]


def _strings_used(trees: list[ast.Module]) -> set[str]:
    """Every string constant of the modules' code."""
    return {
        node.value
        for tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


def _picker_keys(trees: list[ast.Module]) -> set[str]:
    """``<key>_other`` of each ``second_model_control("<key>", …)`` call: the picker's text box."""
    return {
        f"{node.args[0].value}_other"
        for tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", getattr(node.func, "attr", None)) == "second_model_control"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }


def _widget_keys(trees: list[ast.Module]) -> set[str]:
    """The literal ``key="..."`` of every call in the modules (their widgets' keys)."""
    return {
        keyword.value.value
        for tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        for keyword in node.keywords
        if keyword.arg == "key" and isinstance(keyword.value, ast.Constant) and isinstance(keyword.value.value, str)
    }


def test_the_session_keeps_exactly_the_declared_keys():
    from vizapp import state

    declared = list(ui.KEPT_KEYS) + [key for page in PAGES for key in page.info.kept_keys]
    assert set(state.PERSISTENT_KEYS) == set(declared) and len(state.PERSISTENT_KEYS) == len(set(declared))
    assert len(PAGES) >= 13 and all(page.info.kept_keys for page in PAGES), "every page declares its keys"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_declared_key_is_used_by_the_page_that_declares_it(page):
    trees = _trees(page)
    used = _strings_used(trees) | _picker_keys(trees)
    declared = page.info.kept_keys + page.info.transient_keys
    assert [key for key in declared if key not in used] == []
    assert set(page.info.kept_keys).isdisjoint(page.info.transient_keys)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_widget_key_a_page_draws_is_declared_kept_or_transient(page):
    declared = set(page.info.kept_keys) | set(page.info.transient_keys) | set(ui.KEPT_KEYS)
    assert sorted(_widget_keys(_trees(page)) - declared) == []


def test_a_page_folder_without_its_declaration_or_script_is_refused(tmp_path, monkeypatch):
    package = tmp_path / "toy_views"
    (package / "toy").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "toy" / "__init__.py").write_text("")  # no PAGE
    (package / "toy" / "toy.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="needs PAGE"):
        views.pages(package, "toy_views")
    (package / "toy" / "__init__.py").write_text(
        "from vizapp.views import PageInfo\nPAGE = PageInfo(title='Toy', icon=':material/toys:', order=1)\n"
    )
    monkeypatch.delitem(__import__("sys").modules, "toy_views.toy")
    assert [(page.name, page.info.title) for page in views.pages(package, "toy_views")] == [("toy", "Toy")]
    (package / "toy" / "toy.py").unlink()
    with pytest.raises(ValueError, match="toy.py"):
        views.pages(package, "toy_views")
