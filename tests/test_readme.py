"""The documentation's screenshots: one per page of the app, each on disk, each made by the
script (docs/screenshots.py), each shown on that page's page in docs/app/; the README shows one."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("docs_screenshots", REPO / "docs" / "screenshots.py")
screenshots = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(screenshots)


def test_every_page_has_a_screenshot_that_its_docs_page_shows():
    from vizapp import views

    pages = {page.name for page in views.pages()}
    assert len(pages) >= 13 and pages == set(screenshots.SHOTS), (pages, set(screenshots.SHOTS))
    for stem in pages:
        png = REPO / "docs" / "img" / f"{stem}.png"
        assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
        page = (REPO / "docs" / "app" / f"{stem}.md").read_text()
        assert f"](../img/{stem}.png)" in page, f"docs/app/{stem}.md does not show its screenshot"
    shown = set(re.findall(r"\]\(docs/img/(\w+)\.png\)", (REPO / "README.md").read_text()))
    assert shown and shown <= pages, shown


def test_each_shot_opens_its_own_page_by_url():
    for stem, (path, _caption) in screenshots.SHOTS.items():
        route = path.split("?")[0].strip("/")
        assert route == ("" if stem == "attention" else stem), (stem, path)  # the default page is "/"
