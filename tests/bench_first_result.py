"""Browser benchmark of every page's first result: Debian's Chromium, driven by Playwright, against
local app servers. Not a test (timings depend on the machine); run it by hand:

    python tests/bench_first_result.py                         # this checkout, the default models
    python tests/bench_first_result.py --ref main              # ... and the version at a git ref, side by side
    python tests/bench_first_result.py --models demo --pages explain,circuits --repeats 3

Two measurements, each from the navigation's start (``performance.now()`` in the page):

* **Each page, warm server**: for each model, one server per version is started and warmed (the
  model loaded and each measured image's forward pass captured, by opening the Attention page on
  it); then every page is opened in a new browser context (a new Streamlit session, an empty
  browser cache) once per image (``--repeats`` images, so each open is the page's first for that
  image: nothing of the page's own analyses is cached). The versions alternate open by open.
  ``first result``: the first result drawn, whichever comes first of a plotly chart's SVG, an
  instant view's canvas painted (its ``attentionView.paints``) or an image of the page's main area
  loaded (e.g. a perturbed input with its prediction); ``complete``: the script run finished (the
  sidebar's server time shown and no running indicator for 1.5 s).
* **Each page, reached by a click** (``--click``): for each model and image, one session opens the
  Attention page and waits until its run is over; then it clicks every other page in the sidebar
  in turn, as a visitor moves through the app. ``first result``: from the click to the first
  result of the new page drawn (a chart, image or instant view of its own run: the previous page's
  elements, which Streamlit marks stale until the new run replaces them, do not count);
  ``complete``: from the click to the end of its run. The new session's start (the app's
  JavaScript, the websocket) is in the first measurement and not in this one.
* **First open after a server start**: a fresh server (``--start`` launchers: ``streamlit``, i.e.
  ``python -m streamlit run vizapp/app.py``, and ``cli``, the ``vit-explorer`` command), the default
  page opened ``--settle`` seconds after the server first answers; for the bundled demo and, as the
  default model (``VIZAPP_DEFAULT_MODEL``), ``--start-model``.

It prints one table per measurement: median and max over the images, per page, model and version.

``--models``: ``demo`` (the bundled demo ViT), ``dinov2`` (the real DINOv2-S/14 backbone of
``tests/real_weights.py`` at 224 px: a 16×16 grid, ViT-S-sized; headless, so the class pages say so),
``dinov2_518`` (the same at its native 518 px: a 37×37 grid, 1,370 tokens)
and any app model text (``random:vit_small_patch16_224``: a ViT-S/16 classifier; random weights
time as trained ones).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from streamlit_server import CHROMIUM, CHROMIUM_ARGS, REPO, streamlit_server  # noqa: E402

IMAGES = ("scene_1_star.png", "cat_chelsea.jpg", "astronaut.jpg", "coffee.jpg", "scene_4_ring.png", "rocket.jpg")
OPEN_TIMEOUT_S = 300

# Run in the page before anything else: note (on the epoch clock, performance.timeOrigin +
# performance.now(), comparable across frames) when the first result is drawn, when the last chart
# came and when a run was last busy. The instant views' iframes keep their own record (attentionView.paints).
MARKS = r"""
(() => {
  if (window.top !== window) return;
  const marks = {first: null, kind: null, busy: 0, charts: 0, last_chart: 0};
  window.__marks = marks;
  const now = () => performance.timeOrigin + performance.now();
  const note = (kind) => { if (marks.first === null) { marks.first = now(); marks.kind = kind; } };
  const check = () => {
    const charts = document.querySelectorAll('[data-testid="stPlotlyChart"] .main-svg').length;
    if (charts) note('chart');
    if (charts > marks.charts) { marks.charts = charts; marks.last_chart = now(); }
    for (const img of document.querySelectorAll('[data-testid="stMain"] [data-testid="stImage"] img')) {
      if (img.complete && img.naturalWidth) note('image');
    }
    if (document.querySelector('[data-testid="stStatusWidget"]')) marks.busy = now();
    requestAnimationFrame(check);
  };
  requestAnimationFrame(check);
})();
"""
FINISHED = r"""() => {
  const sidebar = document.querySelector('section[data-testid="stSidebar"]');
  const m = window.__marks;
  const quiet = performance.timeOrigin + performance.now() - (m ? m.busy : 0);
  // the run's end: the sidebar's server time, or a run that stopped early (st.stop) and has been quiet 3 s
  return !!(m && sidebar && (sidebar.innerText.includes('Server time for this view') || (m.busy && quiet > 3000))
            && !document.querySelector('[data-testid="stStatusWidget"]')
            && !document.querySelector('iframe[title*="first_result"]')  // a held page: the rest follows
            && performance.timeOrigin + performance.now() - m.busy > 1500);
}"""
VIEW_PAINTED = """() => window.attentionView && window.attentionView.paints && window.attentionView.paints.length
    ? performance.timeOrigin + window.attentionView.paints[0].painted : null"""
NOTHING_DRAWN_S = 10  # a finished run with nothing drawn for this long: the page drew no result (it refused)


def app_pages() -> list[tuple[str, str]]:
    """(url path, title) of every page, in the app's order (:func:`vizapp.views.pages`; the first is at ``/``)."""
    from vizapp import views

    return [("" if i == 0 else page.name, page.info.title) for i, page in enumerate(views.pages())]


def model_params(model: str) -> dict[str, str]:
    """The app's URL parameters for a ``--models`` entry."""
    if model == "demo":
        return {}
    if model in ("dinov2", "dinov2_518"):
        from real_weights import real_dinov2_folder  # converted once per machine, cached

        return {"model": str(real_dinov2_folder()), "res": "518" if model == "dinov2_518" else "224"}
    return {"model": model}


def _views_painted(page) -> list[float]:
    """When each instant view (an iframe) first painted, on the epoch clock."""
    painted = []
    for frame in page.frames[1:]:
        with contextlib.suppress(Exception):  # a frame gone meanwhile
            if (at := frame.evaluate(VIEW_PAINTED)) is not None:
                painted.append(at)
    return painted


# Installed in the page just before a click: when the clicked page's header (``title``) is drawn by
# the new run and, after it, its first result (not a stale element of the previous page).
AFTER_CLICK = r"""(title) => {
  const now = () => performance.timeOrigin + performance.now();
  const fresh = (el) => { const c = el.closest('[data-testid="stElementContainer"]'); return !c || c.getAttribute('data-stale') !== 'true'; };
  const m = {t0: now(), header: null, first: null, kind: null};
  window.__click = m;
  // What the previous page left: a chart of its counts only once plotly redraws it for the new page
  // (Streamlit reuses an element in the same place), an image only once its source changes; a
  // leftover the new run never replaced (a page that refused early) never counts.
  const oldCharts = new WeakSet(document.querySelectorAll('.js-plotly-plot'));
  const oldImages = new Map([...document.querySelectorAll('[data-testid="stMain"] [data-testid="stImage"] img')].map((img) => [img, img.src]));
  const note = (kind) => { if (m.header !== null && m.first === null) { m.first = now(); m.kind = kind; } };
  for (const div of document.querySelectorAll('.js-plotly-plot')) {
    if (div.on) div.on('plotly_afterplot', () => { if (fresh(div)) note('chart'); });
  }
  const check = () => {
    if (m.header === null) {
      for (const h of document.querySelectorAll('[data-testid="stMain"] h2')) {
        if (h.textContent.trim() === title && fresh(h)) { m.header = now(); break; }
      }
    }
    if (m.header !== null && m.first === null) {
      for (const svg of document.querySelectorAll('[data-testid="stPlotlyChart"] .main-svg')) {
        const div = svg.closest('.js-plotly-plot');
        if (div && !oldCharts.has(div) && fresh(svg)) { note('chart'); break; }
      }
      for (const img of document.querySelectorAll('[data-testid="stMain"] [data-testid="stImage"] img')) {
        const changed = !oldImages.has(img) || oldImages.get(img) !== img.src;
        if (changed && img.complete && img.naturalWidth && fresh(img)) note('image');
      }
    }
    if (m.first === null) requestAnimationFrame(check);
  };
  requestAnimationFrame(check);
  return m.t0;
}"""
#: a page whose header is not its title in the navigation
HEADERS = {"Rollout": "Attention rollout"}
QUIET_S = 1.5  # a run is over once no status widget has shown for this long


def _wait_quiet(page, since: float, deadline: float) -> None:
    """Wait until no run has been busy for :data:`QUIET_S` (the page's ``__marks``), after ``since``."""
    while True:
        page.wait_for_timeout(200)
        busy = page.evaluate("() => (window.__marks ? window.__marks.busy : 0)")
        clock = page.evaluate("() => performance.timeOrigin + performance.now()")
        if clock - max(busy, since) > QUIET_S * 1000 and not page.evaluate(
            "() => !!document.querySelector('iframe[title*=\"first_result\"]')"
        ):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"still running after {OPEN_TIMEOUT_S} s")


def click_through(browser, url: str, pages: list[tuple[str, str]]) -> dict[str, dict]:
    """One session: open ``url`` (the Attention page), then click each of ``pages`` in the sidebar;
    per page title, the first result and the end of its run in s since the click."""
    context = browser.new_context(viewport={"width": 1440, "height": 1100})
    context.add_init_script(MARKS)
    page = context.new_page()
    page.set_default_timeout(OPEN_TIMEOUT_S * 1000)
    results = {}
    try:
        page.goto(url)
        page.wait_for_selector("[data-testid='stSidebarNav'] a")
        _wait_quiet(page, 0, time.monotonic() + OPEN_TIMEOUT_S)
        nav = page.locator("[data-testid='stSidebarNav']")
        for _path, title in pages:
            link = nav.get_by_role("link", name=title, exact=True)
            if not link.is_visible():  # under the navigation's "View more"
                nav.get_by_role("button").filter(has_text="View").first.click()
            t0 = page.evaluate(AFTER_CLICK, HEADERS.get(title, title))
            link.click()
            deadline = time.monotonic() + OPEN_TIMEOUT_S
            while True:
                page.wait_for_timeout(100)
                m = page.evaluate("() => window.__click")
                views = [at for at in _views_painted(page) if at > t0]
                if m["first"] is not None or views or time.monotonic() > deadline:
                    break
                if (
                    m["header"] is not None
                    and page.evaluate(FINISHED)
                    and time.monotonic() > deadline - OPEN_TIMEOUT_S + NOTHING_DRAWN_S
                ):
                    break  # the run ended with nothing drawn (a page that refused)
            _wait_quiet(page, t0, deadline)
            m = page.evaluate("() => window.__click")
            views = [at for at in _views_painted(page) if at > t0]
            candidates = [(at, "view") for at in views] + ([(m["first"], m["kind"])] if m["first"] else [])
            first, kind = min(candidates) if candidates else (None, None)
            busy = page.evaluate("() => window.__marks.busy")
            results[title] = {
                "first": (first - t0) / 1000 if first is not None else None,
                "kind": kind,
                # the run's end: the last moment it was busy, its first result or its header, after the click
                "complete": (max(busy, first or 0, m["header"] or 0, t0) - t0) / 1000,
            }
    finally:
        context.close()
    return results


TABLE_HEAD = ("| page | model | version | first result | complete | drawn first |", "|---|---|---|---|---|---|")


def _table_line(title: str, model: str, version: str, opened: list[dict]) -> str:
    """One row of a page's results (printed as it comes): median / max of the first results and of the completions."""
    firsts = [o["first"] for o in opened if o["first"] is not None]
    completes = [o["complete"] for o in opened if o["complete"] is not None]
    kinds = sorted({o["kind"] for o in opened if o["kind"]})
    line = (
        f"| {title} | {model} | {version} | {_stats(firsts)} | {_stats(completes)} "
        f"| {', '.join(kinds) or 'nothing (the page refused)'} |"
    )
    print(line, flush=True)
    return line


def warm_servers(
    stack: contextlib.ExitStack,
    browser,
    versions: dict[str, Path],
    model: str,
    repeats: int,
    log_dir: Path,
    tag: str = "",
) -> tuple[dict[str, str], tuple[str, ...]]:
    """One server per version, in ``stack``, each warmed (the model loaded, each of the first
    ``repeats`` images' forward pass captured, by opening the Attention page on it); their URLs by
    version and the images."""
    params = model_params(model)
    urls = {}
    for name, repo in versions.items():
        log = log_dir / f"bench_first_result_{tag}{name}_{re.sub(r'[^A-Za-z0-9]+', '_', model)}.log"
        urls[name], _ = stack.enter_context(streamlit_server(log, repo=repo))
    images = IMAGES[:repeats]
    for url in urls.values():
        for image in images:
            open_once(browser, f"{url}/?{urllib.parse.urlencode({**params, 'img': image})}")
    return urls, images


def bench_clicks(
    browser, versions: dict[str, Path], models: list[str], pages: list[tuple[str, str]], repeats: int, log_dir: Path
) -> list[str]:
    lines = [
        "Each page reached by a click, warm server: first result / complete, s since the click (median / max over "
        f"{repeats} images, one session per image)",
        *TABLE_HEAD,
    ]
    clicked = [(path, title) for path, title in pages if path]  # the sessions start on the Attention page
    for model in models:
        params = model_params(model)
        with contextlib.ExitStack() as stack:
            urls, images = warm_servers(stack, browser, versions, model, repeats, log_dir, "click_")
            results = {(title, name): [] for _path, title in clicked for name in urls}
            for image in images:
                for name, url in urls.items():
                    opened = click_through(
                        browser, f"{url}/?{urllib.parse.urlencode({**params, 'img': image})}", clicked
                    )
                    for title, result in opened.items():
                        results[title, name].append(result)
            for _path, title in clicked:
                for name in urls:
                    lines.append(_table_line(title, model, name, results[title, name]))
    return lines


def open_once(browser, url: str) -> dict:
    """Open ``url`` in a new browser context; the first result and the end of the run, in s since
    the navigation started (``first`` is None when nothing was drawn: a page that refused)."""
    context = browser.new_context(viewport={"width": 1440, "height": 1100})
    context.add_init_script(MARKS)
    page = context.new_page()
    page.set_default_timeout(OPEN_TIMEOUT_S * 1000)
    try:
        page.goto(url, wait_until="commit")
        deadline, finished_since = time.monotonic() + OPEN_TIMEOUT_S, None
        while True:
            page.wait_for_timeout(200)
            marks = page.evaluate("() => window.__marks || null")
            views = _views_painted(page)
            drawn = bool(views) or bool(marks and marks["first"])
            if page.evaluate(FINISHED):
                finished_since = finished_since or time.monotonic()
                if drawn or time.monotonic() - finished_since > NOTHING_DRAWN_S:
                    break
            else:
                finished_since = None
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url}: no finished run after {OPEN_TIMEOUT_S} s")
        origin = page.evaluate("() => performance.timeOrigin")
        candidates = [(at, "view") for at in views] + ([(marks["first"], marks["kind"])] if marks["first"] else [])
        first, kind = min(candidates) if candidates else (None, None)
        return {
            "first": (first - origin) / 1000 if first is not None else None,
            "kind": kind,
            "complete": (end - origin) / 1000 if (end := max(marks["busy"], marks["last_chart"], first or 0)) else None,
        }
    finally:
        context.close()


@contextlib.contextmanager
def checkout(ref: str | None):
    """This checkout (``ref`` None) or the files of ``ref`` exported into a temporary folder."""
    if ref is None:
        yield REPO
        return
    with tempfile.TemporaryDirectory(prefix="bench-first-result-") as folder:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
        yield Path(folder)


def _stats(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} / {max(values):6.2f}" if values else "     —        "


def bench_pages(
    browser, versions: dict[str, Path], models: list[str], pages: list[tuple[str, str]], repeats: int, log_dir: Path
) -> list[str]:
    lines = [
        "Each page, warm server: first result / complete, s since opening (median / max over "
        f"{repeats} images, each open the page's first for its image)",
        *TABLE_HEAD,
    ]
    for model in models:
        params = model_params(model)
        with contextlib.ExitStack() as stack:
            urls, images = warm_servers(stack, browser, versions, model, repeats, log_dir)
            results = {(path, name): [] for path, _ in pages for name in urls}
            for path, title in pages:
                for image in images:
                    for name, url in urls.items():
                        query = urllib.parse.urlencode({**params, "img": image})
                        results[path, name].append(open_once(browser, f"{url}/{path}?{query}"))
                for name in urls:
                    lines.append(_table_line(title, model, name, results[path, name]))
    return lines


def bench_starts(
    browser,
    versions: dict[str, Path],
    start_models: list[str],
    launchers: list[str],
    settles: list[float],
    log_dir: Path,
) -> list[str]:
    lines = [
        "First open after a server start: the default page opened `settle` s after the server answered; "
        "first result / complete, s since opening",
        "| default model | launcher | settle | version | first result | complete |",
        "|---|---|---|---|---|---|",
    ]
    for model in start_models:
        env = {} if model == "demo" else {"VIZAPP_DEFAULT_MODEL": model}
        for launcher in launchers:
            for settle in settles:
                for name, repo in versions.items():
                    log = log_dir / f"bench_first_result_start_{name}_{launcher}.log"
                    with streamlit_server(log, extra_env=env, repo=repo, launcher=launcher) as (url, _):
                        time.sleep(settle)
                        opened = open_once(browser, url + "/")
                    first = f"{opened['first']:.2f}" if opened["first"] is not None else "—"
                    complete = f"{opened['complete']:.2f}" if opened["complete"] is not None else "—"
                    line = f"| {model} | {launcher} | {settle:g} s | {name} | {first} | {complete} |"
                    lines.append(line)
                    print(line, flush=True)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", default=None, help="also measure the version at this git ref (e.g. main)")
    parser.add_argument(
        "--models",
        default="demo,dinov2,random:vit_small_patch16_224",
        help="comma-separated: demo, dinov2, dinov2_518, or an app model text",
    )
    parser.add_argument("--pages", default="all", help="comma-separated url paths (attention for the default page)")
    parser.add_argument("--repeats", type=int, default=3, help=f"images per page (1 to {len(IMAGES)})")
    parser.add_argument(
        "--start-models",
        default="demo,random:vit_small_patch16_224",
        help="default models for the first open after a server start ('' to skip)",
    )
    parser.add_argument("--start", default="streamlit,cli", help="launchers for the first open after a start")
    parser.add_argument("--settle", default="0,20", help="seconds between the server's first answer and the open")
    parser.add_argument(
        "--click",
        action="store_true",
        help="reach each page by a click in one session instead of a new session per page",
    )
    options = parser.parse_args(argv)
    if not 1 <= options.repeats <= len(IMAGES):
        parser.error(f"--repeats must be 1 to {len(IMAGES)}")
    if not CHROMIUM.exists():
        print(f"no Chromium at {CHROMIUM}", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    pages = app_pages()
    if options.pages != "all":
        wanted = {"" if p == "attention" else p for p in options.pages.split(",")}
        pages = [(path, title) for path, title in pages if path in wanted]
    models = [m for m in options.models.split(",") if m]
    start_models = [m for m in options.start_models.split(",") if m]
    log_dir = REPO / "artifacts"
    log_dir.mkdir(exist_ok=True)
    lines = []
    with checkout(options.ref) as other:
        versions = {"this": REPO} if options.ref is None else {options.ref: other, "this": REPO}
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            if models and pages:
                bench = bench_clicks if options.click else bench_pages
                lines += bench(browser, versions, models, pages, options.repeats, log_dir)
            if start_models:
                lines += bench_starts(
                    browser,
                    versions,
                    start_models,
                    options.start.split(","),
                    [float(s) for s in options.settle.split(",")],
                    log_dir,
                )
            browser.close()
    load = os.getloadavg()
    lines.append(f"load average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} cores")
    print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
