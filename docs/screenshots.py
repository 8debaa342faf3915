"""Regenerate the documentation's screenshots: one per page of the running app, in Chromium.

    .venv/bin/python docs/screenshots.py          # writes docs/img/*.png
    .venv/bin/python docs/screenshots.py mae      # only the named shots

Serves ``vizapp/app.py`` (the bundled demo model, offline) on a free local port, opens each
page by its URL (see ``vizapp/url_state.py``), waits until the run has finished and every
chart is drawn, and saves the visible window, scaled to :data:`WIDTH` pixels wide.
tests/test_readme.py checks that every page of the app has one and that its page in
docs/app/ shows it.
"""

from __future__ import annotations

import io
import sys
import tempfile
from pathlib import Path

from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from streamlit_server import CHROMIUM, CHROMIUM_ARGS, REPO, streamlit_server  # noqa: E402

OUT = REPO / "docs" / "img"
WIDTH = 1100  # px of the saved PNG (the window is 1440 px wide)

sys.path.insert(0, str(REPO))
from vizapp import views  # noqa: E402

#: page name -> (URL path and query, what the view shows): each page's ``PageInfo.screenshot``
SHOTS = {page.name: page.info.screenshot for page in views.pages()}


def wait_until_drawn(page) -> None:
    page.wait_for_selector("[data-testid='stPlotlyChart'] .main-svg", state="attached")
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", polling=200, timeout=120_000
    )
    # a first open of a slow page draws its first result, then reruns for the rest (vizapp.first_result)
    page.wait_for_selector("iframe[title*='first_result']", state="detached", timeout=120_000)
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", polling=200, timeout=120_000
    )
    page.wait_for_timeout(1500)  # plotly's transitions and images settle


def shrink(png: bytes) -> bytes:
    image = Image.open(io.BytesIO(png)).convert("RGB")
    height = round(image.height * WIDTH / image.width)
    buffer = io.BytesIO()
    # lossless and unquantised: a palette would shift the colour scales the shots are meant to show
    image.resize((WIDTH, height), Image.LANCZOS).save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def main(names: list[str]) -> int:
    from playwright.sync_api import sync_playwright

    unknown = set(names) - set(SHOTS)
    if unknown:
        print(f"no such shot: {', '.join(sorted(unknown))} (choose from {', '.join(SHOTS)})", file=sys.stderr)
        return 1

    if not CHROMIUM.exists():
        print(f"needs Debian's Chromium at {CHROMIUM} (apt-get install -y chromium)", file=sys.stderr)
        return 1
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, streamlit_server(Path(tmp) / "streamlit.log") as (url, _):
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            page.set_default_timeout(120_000)
            for stem, (path, caption) in SHOTS.items():
                if names and stem not in names:
                    continue
                page.goto(url + path)
                wait_until_drawn(page)
                if page.locator("[data-testid='stException']").count():
                    print(f"{stem}: the page shows an exception", file=sys.stderr)
                    return 1
                target = OUT / f"{stem}.png"
                target.write_bytes(shrink(page.screenshot()))
                print(f"{target.relative_to(REPO)}  ({target.stat().st_size // 1024} KiB)  {caption}")
            browser.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
