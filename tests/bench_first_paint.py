"""Browser benchmark of the Attention page's first paint with a warm server (issue 28, item 2):
Debian's Chromium, driven by Playwright, against a local ``streamlit run vizapp/app.py``. Not a
test (timings depend on the machine); run it by hand:

    python tests/bench_first_paint.py                                   # the bundled demo model
    python tests/bench_first_paint.py --model random:vit_base_patch16_224 --repeats 5

The server is started and the page opened once first (the model loaded, its pass captured and
the caches filled: a warm server); then each of ``--repeats`` (≥ 5) opens is a new browser
context (a new Streamlit session, nothing cached in the browser) that loads the page and
measures, from the navigation's start (``performance.now()`` in the page):

* ``first chart``: the first map drawn, the instant view's canvas painted or a plotly chart's
  SVG, whichever comes first (what the person first sees of the data);
* ``instant view``: the view's iframe has drawn its map (its data file fetched and decoded);
* ``main chart``: the first plotly chart (the map with hover values and downloads) drawn;
* ``every chart``: every plotly chart on the page drawn;
* ``idle``: the script run finished (no running indicator) and every chart drawn;
* the server's own time for the run (the sidebar's "Server time for this view").

It prints the median and max of each.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from streamlit_server import CHROMIUM, CHROMIUM_ARGS, REPO, streamlit_server  # noqa: E402

VIEW = "iframe[title*='attention_view']"

# Run in every page and in the view's iframe before anything else: note, on the page's own clock
# (performance.now(), from the navigation's start), when each milestone first holds.
MARKS = r"""
(() => {
  if (window.top !== window) return;  // the view's iframe keeps its own record (attentionView.paints)
  const marks = {charts: [], busy: 0};
  window.__marks = marks;
  const check = () => {
    for (const chart of document.querySelectorAll('[data-testid="stPlotlyChart"]')) {
      if (!chart.dataset.drawnAt && chart.querySelector('.main-svg')) {
        chart.dataset.drawnAt = performance.now();
        marks.charts.push(performance.now());
      }
    }
    if (document.querySelector('[data-testid="stStatusWidget"]')) marks.busy = performance.now();
    requestAnimationFrame(check);
  };
  requestAnimationFrame(check);
})();
"""


def _view_frame(page):
    for frame in page.frames:
        if "attention_view" in frame.url:
            return frame
    return None


def open_once(browser, url: str, with_view: bool) -> dict[str, float]:
    """One page open in a fresh context: the milestones in ms since the navigation started."""
    context = browser.new_context(viewport={"width": 1440, "height": 1100})
    context.add_init_script(MARKS)
    page = context.new_page()
    page.set_default_timeout(180_000)
    page.goto(url, wait_until="commit")
    frame = None
    if with_view:
        page.wait_for_selector(VIEW, timeout=180_000)
        while (frame := _view_frame(page)) is None:
            page.wait_for_timeout(20)
        frame.wait_for_function("() => window.attentionView && window.attentionView.paints.length", timeout=180_000)
    idle = """() => { const m = window.__marks; const charts = document.querySelectorAll('[data-testid="stPlotlyChart"]');
        return m && charts.length && [...charts].every(c => c.dataset.drawnAt) && performance.now() - m.busy > 1000; }"""
    page.wait_for_function(idle, polling=100, timeout=180_000)  # a second with no run: a follow-up rerun is over
    marks = page.evaluate("() => window.__marks")
    out = {"plotly": min(marks["charts"]), "every": max(marks["charts"])}
    out["idle"] = max(out["every"], marks["busy"])
    if frame is not None:
        # the iframe's clock starts at its own navigation: shift it onto the page's clock
        origin = frame.evaluate("() => performance.timeOrigin") - page.evaluate("() => performance.timeOrigin")
        out["view"] = frame.evaluate("() => window.attentionView.paints[0].painted") + origin
    sidebar = page.locator("section[data-testid='stSidebar']").inner_text()
    found = re.search(r"Server time for this view: (\d+) ms", sidebar)
    out["server"] = float(found.group(1)) if found else float("nan")
    out["first"] = min(v for k, v in out.items() if k in ("view", "plotly"))
    context.close()
    return out


def _summary(name: str, values_ms: list[float]) -> str:
    return (
        f"{name}: median {statistics.median(values_ms) / 1000:.2f} s, max {max(values_ms) / 1000:.2f} s "
        f"(n={len(values_ms)})"
    )


LABELS = {
    "first": "first chart (the instant view or a plotly chart, whichever is first)",
    "view": "instant view drawn",
    "plotly": "first plotly chart drawn",
    "every": "every plotly chart drawn",
    "idle": "idle (run finished, every chart drawn)",
}


def run(model: str | None, repeats: int, path: str = "/") -> list[str]:
    from playwright.sync_api import sync_playwright

    lines = []
    url_tail = path + (f"?model={model}" if model else "")
    with streamlit_server(REPO / "artifacts" / "bench_first_paint.log") as (url, _process):
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            started = time.perf_counter()
            warm = open_once(browser, url + url_tail, with_view=path == "/")
            lines.append(
                f"model: {model or 'the bundled demo'}; the warm-up open (cold server, model loading): "
                f"first chart {warm['first'] / 1000:.1f} s, {time.perf_counter() - started:.1f} s in all"
            )
            opens = [open_once(browser, url + url_tail, with_view=path == "/") for _ in range(repeats)]
            browser.close()
    load = os.getloadavg()
    for key, label in LABELS.items():
        values = [o[key] for o in opens if key in o]
        if values:
            lines.append(_summary(label, values))
    lines.append(
        f"server time of the run: median {statistics.median(o['server'] for o in opens):.0f} ms, "
        f"max {max(o['server'] for o in opens):.0f} ms"
    )
    lines.append(f"load average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} cores")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a model for the app's ?model= (default: the bundled demo)")
    parser.add_argument("--repeats", type=int, default=5, help="page opens measured (at least 5)")
    options = parser.parse_args(argv)
    if options.repeats < 5:
        parser.error("--repeats must be at least 5")
    if not CHROMIUM.exists():
        print(f"no Chromium at {CHROMIUM}", file=sys.stderr)
        return 2
    for line in run(options.model, options.repeats):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
