"""The README's screenshots: one per page of the app, each on disk, each made by the script."""

from __future__ import annotations

import re
from pathlib import Path

import readme_screenshots

REPO = Path(__file__).resolve().parent.parent


def test_every_page_has_a_screenshot_that_the_readme_shows():
    app = (REPO / "vizapp" / "app.py").read_text()
    pages = set(re.findall(r'st\.Page\(VIEWS / "(\w+)\.py"', app))
    assert pages and pages == set(readme_screenshots.SHOTS), (pages, set(readme_screenshots.SHOTS))
    readme = (REPO / "README.md").read_text()
    shown = set(re.findall(r"\]\(assets/screenshots/(\w+)\.png\)", readme))
    assert shown == pages
    for stem in pages:
        png = REPO / "assets" / "screenshots" / f"{stem}.png"
        assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png


def test_each_shot_opens_its_own_page_by_url():
    for stem, (path, _caption) in readme_screenshots.SHOTS.items():
        route = path.split("?")[0].strip("/")
        assert route == ("" if stem == "attention" else stem), (stem, path)  # the default page is "/"
