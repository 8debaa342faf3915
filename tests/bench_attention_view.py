"""Browser benchmark of the Attention page's instant view (issue 28): Debian's Chromium, driven
by Playwright, against a local ``streamlit run vizapp/app.py``. Not a test (timings depend on
the machine); run it by hand:

    python tests/bench_attention_view.py                        # the bundled demo model
    python tests/bench_attention_view.py --model random:vit_base_patch16_224 --repeats 10

It prints, median and max over ``--repeats`` (≥ 5) changes each:

* hover → map repainted: a real mouse move onto another patch until the view's canvas holds that
  patch's map. ``in page``: from the mousemove event's timestamp to the end of the animation-frame
  callback that wrote the pixels (what the person waits for, less the compositor's last frame);
  ``round trip``: the same measured from this script, with Playwright's own messages in it.
* a layer step → new map: ↓/↑ pressed in the view until it has drawn the new layer (from the
  data in the page when it holds every layer; ``in page`` from the keydown event's timestamp),
  and the same from the page's layer slider (a Streamlit rerun, then the view follows).
* a click on the view → the rest of the page updated: until the plotly chart's title names the
  clicked patch (a rerun, as before).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from streamlit_server import CHROMIUM, CHROMIUM_ARGS, REPO, streamlit_server  # noqa: E402

VIEW = "iframe[title*='attention_view']"


def _frame(page):
    page.wait_for_selector(VIEW, timeout=180_000)
    while True:
        frame = next((f for f in page.frames if "attention_view" in f.url), None)
        if frame is not None:
            frame.wait_for_function("() => window.attentionView && window.attentionView.shown", timeout=180_000)
            return frame
        page.wait_for_timeout(100)


def _idle(page) -> None:
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", polling=100, timeout=180_000
    )


def _centre(page, frame, patch: int, grid: tuple[int, int]) -> tuple[float, float]:
    outer = page.locator(VIEW).first.bounding_box()
    inner = frame.evaluate(
        "() => { const b = document.getElementById('map').getBoundingClientRect();"
        " return [b.left, b.top, b.width, b.height]; }"
    )
    gh, gw = grid
    row, col = divmod(patch, gw)
    return outer["x"] + inner[0] + inner[2] * (col + 0.5) / gw, outer["y"] + inner[1] + inner[3] * (row + 0.5) / gh


def _summary(name: str, values_ms: list[float]) -> str:
    return f"{name}: median {statistics.median(values_ms):.1f} ms, max {max(values_ms):.1f} ms (n={len(values_ms)})"


def run(model: str | None, repeats: int) -> list[str]:
    from playwright.sync_api import sync_playwright

    lines = []
    with streamlit_server(REPO / "artifacts" / "bench_attention_view.log") as (url, _process):
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            page = browser.new_context(viewport={"width": 1440, "height": 1100}).new_page()
            page.set_default_timeout(180_000)
            started = time.perf_counter()
            page.goto(url + (f"/?model={model}" if model else ""))
            frame = _frame(page)
            _idle(page)
            lines.append(
                f"model: {model or 'the bundled demo'}; first view drawn {time.perf_counter() - started:.1f} s "
                "after opening the page (server started, model possibly loading)"
            )
            args = frame.evaluate("() => window.attentionView.args")
            grid = tuple(args["grid"])
            gh, gw = grid
            page.locator(VIEW).first.scroll_into_view_if_needed()

            in_page, round_trip = [], []
            patches = [(i * 7 + 3) % (gh * gw) for i in range(repeats + 1)]
            page.mouse.move(*_centre(page, frame, patches[0], grid))
            frame.wait_for_function(f"() => window.attentionView.hover === {patches[0]}")
            for patch in patches[1:]:
                count = frame.evaluate("() => window.attentionView.paints.length")
                position = _centre(page, frame, patch, grid)
                page.wait_for_timeout(50)
                t0 = time.perf_counter()
                page.mouse.move(*position)
                frame.wait_for_function(
                    f"() => {{ const p = window.attentionView.paints; return p.length > {count} && p[p.length - 1].hover === {patch}; }}",
                    polling="raf",
                )
                round_trip.append((time.perf_counter() - t0) * 1000)
                last = frame.evaluate("() => window.attentionView.paints[window.attentionView.paints.length - 1]")
                in_page.append(last["painted"] - last["input"])
            lines.append(_summary("hover -> map repainted, in page", in_page))
            lines.append(_summary("hover -> map repainted, round trip from the script", round_trip))

            layers = args["num_layers"]
            held = len(frame.evaluate("() => window.attentionView.layers"))
            lines.append(f"layers in the page: {held} of {layers}")
            key_in_page, key_round_trip, slider_steps = [], [], []
            stage = frame.locator("#stage")
            for _ in range(repeats if layers > 1 else 0):  # ↑/↓ in the view: drawn from the page's data
                current = frame.evaluate("() => window.attentionView.layer")
                target = current - 1 if current > 0 else current + 1
                count = frame.evaluate("() => window.attentionView.paints.length")
                stage.focus()
                page.wait_for_timeout(50)
                t0 = time.perf_counter()
                stage.press("ArrowDown" if target < current else "ArrowUp")
                frame.wait_for_function(
                    f"() => {{ const p = window.attentionView.paints; return p.length > {count} && p[p.length - 1].layer === {target}; }}",
                    polling="raf",
                    timeout=120_000,
                )
                key_round_trip.append((time.perf_counter() - t0) * 1000)
                last = frame.evaluate("() => window.attentionView.paints[window.attentionView.paints.length - 1]")
                key_in_page.append(last["painted"] - last["input"])
                page.wait_for_timeout(400)  # the report to Python (after 250 ms of rest) and its rerun
                _idle(page)
            if key_in_page:
                lines.append(_summary("layer step (↓/↑ in the view) -> new map, in page", key_in_page))
                lines.append(
                    _summary("layer step (↓/↑ in the view) -> new map, round trip from the script", key_round_trip)
                )
            slider = page.locator("[data-testid='stSlider']", has_text="Layer (block index)").get_by_role("slider")
            for _ in range(repeats if layers > 1 else 0):  # the page's slider: a rerun, then the view follows
                current = frame.evaluate("() => window.attentionView.layer")
                target = current - 1 if current > 0 else current + 1
                slider.focus()
                t0 = time.perf_counter()
                page.keyboard.press("ArrowLeft" if target < current else "ArrowRight")
                frame.wait_for_function(
                    f"() => {{ const p = window.attentionView.paints; return p.length && p[p.length - 1].layer === {target}; }}",
                    polling="raf",
                    timeout=120_000,
                )
                slider_steps.append((time.perf_counter() - t0) * 1000)
                _idle(page)
            if slider_steps:
                lines.append(_summary("layer step (the page's slider, a rerun) -> new map in the view", slider_steps))

            clicks = []
            title = "[data-testid='stPlotlyChart'] .gtitle"
            for i in range(repeats):
                patch = (i * 11 + 5) % (gh * gw)
                position = _centre(page, frame, patch, grid)
                t0 = time.perf_counter()
                page.mouse.click(*position)
                page.wait_for_function(
                    f"() => {{ const t = document.querySelector(\"{title}\"); return t && t.textContent.includes('query: patch {patch} ('); }}",
                    polling="raf",
                    timeout=120_000,
                )
                clicks.append((time.perf_counter() - t0) * 1000)
                _idle(page)
                page.locator(VIEW).first.scroll_into_view_if_needed()
            lines.append(_summary("click on the view -> chart title names the patch (a rerun)", clicks))
            browser.close()
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a model for the app's ?model= (default: the bundled demo)")
    parser.add_argument("--repeats", type=int, default=10, help="changes measured per kind (at least 5)")
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
