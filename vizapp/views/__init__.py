"""The app's pages: one folder each, found by the router (``vizapp/app.py``) in ``PageInfo.order``.

A page is a folder ``vizapp/views/<name>/`` holding

* ``<name>.py``: the script Streamlit runs for the page (its URL path is ``/<name>``);
* ``__init__.py``: ``PAGE = PageInfo(...)``, how the app lists the page and which of its settings
  (session keys) survive a page switch;
* anything else only that page uses (its cached computations, its parts).

Adding a page is adding a folder, its docs page (``docs/app/<name>.md``) and its line in the
documentation's navigation (``mkdocs.yml``): docs/contributing/add-page.md walks through it.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FOLDER", "PageInfo", "Page", "pages", "persistent_keys"]

FOLDER = Path(__file__).resolve().parent


@dataclass(frozen=True)
class PageInfo:
    """How the app shows one page, declared in the page folder's ``__init__.py``.

    Attributes
    ----------
    title : str
        The navigation's label and the browser tab's title.
    icon : str
        A Material icon (``":material/visibility:"``).
    order : int
        Position in the navigation; the lowest is the default page, served at ``/``.
    kept_keys : tuple of str
        Session keys of the page's settings kept when the user switches pages
        (:func:`vizapp.state.keep_page_state`). A key several pages draw is declared by each.
    transient_keys : tuple of str
        Widget keys the page draws that are deliberately not kept (a chart selection, a one-shot
        button); every literal widget key of the page is one or the other (tests/test_page_keys.py).
    screenshot : tuple of (str, str)
        The documentation's screenshot of the page: its URL (path and query) and caption
        (``docs/screenshots.py`` writes ``docs/img/<name>.png``).
    """

    title: str
    icon: str
    order: int
    kept_keys: tuple[str, ...] = ()
    transient_keys: tuple[str, ...] = ()
    screenshot: tuple[str, str] = ("", "")


@dataclass(frozen=True)
class Page:
    """One page found in :data:`FOLDER`: its name (folder, script stem and URL path), script and
    :class:`PageInfo`."""

    name: str
    script: Path
    info: PageInfo


def pages(folder: Path = FOLDER, package: str = __name__) -> list[Page]:
    """Every page folder under ``folder`` (a package whose ``__init__`` defines ``PAGE`` beside a
    script of the folder's name), in ``PageInfo.order``.

    Raises
    ------
    ValueError
        A page folder without its script or its ``PAGE``, or two pages with one order.
    """
    found = []
    for module in pkgutil.iter_modules([str(folder)]):
        if not module.ispkg:
            continue
        info = getattr(importlib.import_module(f"{package}.{module.name}"), "PAGE", None)
        script = folder / module.name / f"{module.name}.py"
        if not isinstance(info, PageInfo) or not script.is_file():
            raise ValueError(
                f"vizapp/views/{module.name}/ needs PAGE = PageInfo(...) in __init__.py and {script.name}."
            )
        found.append(Page(module.name, script, info))
    orders = [page.info.order for page in found]
    if len(set(orders)) != len(orders):
        raise ValueError(f"Two pages share an order: {sorted((p.info.order, p.name) for p in found)}.")
    return sorted(found, key=lambda page: page.info.order)


def persistent_keys() -> tuple[str, ...]:
    """Every setting kept across page switches, once each: the shared controls' (:data:`vizapp.ui.KEPT_KEYS`:
    head and query, drawn on several pages), then each page's ``kept_keys`` in page order."""
    from vizapp.ui import KEPT_KEYS as shared

    keys = dict.fromkeys(shared)
    for page in pages():
        keys.update(dict.fromkeys(page.info.kept_keys))
    return tuple(keys)
