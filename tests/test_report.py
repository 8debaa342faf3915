"""``python -m analysis report`` opened as a reader would: offline, from a file:// URL, in
Debian's Chromium (Playwright). No console error, every figure drawn, and the random-weights
warning the app shows (issue 29, items 2 and 8b)."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest

import cli_runner

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
SAMPLES = REPO / "assets" / "samples"
#: the demo model, a random DeiT with a distillation token at 64 px (a 4 x 4 grid), and the demo Swin
#: (windowed layers on stage grids: no position embedding, no rollout across stages)
MODELS = {
    "demo": ["--model", "demo"],
    "deit": ["--model", "random:deit_tiny_distilled_patch16_224", "--img-size", "64"],
    "swin": ["--model", "demo_swin"],
}
#: the sections each report draws figures in, and how many figures at least
FIGURES = {
    "demo": ({"filters", "position", "distance", "attention"}, 6),
    "deit": ({"filters", "position", "distance", "attention"}, 6),
    "swin": ({"filters", "distance", "attention"}, 5),
}


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, Path]:
    """report.html of each model over three sample images, two of them shown."""
    images = tmp_path_factory.mktemp("images")
    for name in ("scene_0_bar.png", "scene_1_star.png", "cat_chelsea.jpg"):
        (images / name).write_bytes((SAMPLES / name).read_bytes())
    out = {}
    for label, model in MODELS.items():
        folder = tmp_path_factory.mktemp(label)
        args = ["report", *model, "--images", str(images), "--out", str(folder), "--examples", "2"]
        result = cli_runner.run("-m", "analysis", *args)  # in this process (tests/cli_runner.py)
        assert result.returncode == 0, result.stderr
        out[label] = folder / "report.html"
    return out


@pytest.mark.parametrize("label", MODELS)
def test_plotly_js_comes_once_before_every_figure(reports, label):
    page = reports[label].read_text(encoding="utf-8")
    library = [m.start() for m in re.finditer(r"\* plotly\.js v\d", page)]
    figures = [m.start() for m in re.finditer(r'class="plotly-graph-div"', page)]
    assert len(library) == 1 and len(figures) >= FIGURES[label][1], (len(library), len(figures))
    assert library[0] < figures[0]


def test_the_random_weights_warning_is_in_the_report_of_a_random_model_only(reports):
    deit = reports["deit"].read_text(encoding="utf-8")
    warning = re.search(r"<p class='warning' role='alert'>(.*?)</p>", deit)
    assert warning and re.sub("<[^>]+>", "", warning.group(1)) == (
        "deit_tiny_distilled_patch16_224 has random weights: its maps mean nothing."
    )
    assert deit.index("role='alert'") < deit.index("<section")  # above every panel
    assert "has random weights" not in reports["demo"].read_text(encoding="utf-8")


DRAWN = """() => [...document.querySelectorAll('.plotly-graph-div')].map(div => {
    const shown = mark => { const box = mark.getBoundingClientRect(); return box.width > 0 && box.height > 0; };
    const painted = mark => { const style = getComputedStyle(mark);
        return parseFloat(style.opacity) > 0 && !/rgba\\(.*, 0\\)$/.test(style.fill) && style.fill !== 'none'; };
    const pictures = [...div.querySelectorAll('.main-svg image.im, .main-svg image.hm')]
        .filter(image => shown(image) && (image.getAttribute('href') || '').startsWith('data:image/'));
    const bars = [...div.querySelectorAll('.main-svg .trace.bars path')].filter(shown);
    const points = [...div.querySelectorAll('.main-svg .trace.scatter path.point')].filter(m => shown(m) && painted(m));
    return {id: div.closest('section') ? div.closest('section').id : '?', svg: !!div.querySelector('.main-svg'),
            traces: (div._fullData || []).length, marks: pictures.length + bars.length + points.length};
})"""


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian Chromium not installed at /usr/bin/chromium")
@pytest.mark.parametrize("label", MODELS)
def test_the_report_draws_every_figure_offline_without_a_console_error(reports, label):
    from playwright.sync_api import sync_playwright

    errors, requests = [], []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            context = browser.new_context(offline=True, viewport={"width": 1280, "height": 1000})
            page = context.new_page()
            page.on("console", lambda message: message.type == "error" and errors.append(message.text))
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.on(
                "request",
                lambda request: (
                    request.url.startswith("file:") or request.url.startswith("data:") or requests.append(request.url)
                ),
            )
            page.goto(reports[label].as_uri(), wait_until="load")
            page.wait_for_timeout(500)
            figures = page.evaluate(DRAWN)
            sections = {s: page.locator(f"section#{s}").count() for s in ("filters", "position", "distance")}
            warning = page.locator("p.warning[role=alert]")
            warning_shown = warning.count() == 1 and warning.is_visible()
        finally:
            browser.close()
    assert errors == [], errors
    assert requests == [], requests  # the file needs nothing from the network
    assert all(sections.values()), sections
    assert {f["id"] for f in figures} >= FIGURES[label][0], figures
    assert len(figures) >= FIGURES[label][1] and all(
        f["svg"] and f["traces"] > 0 and f["marks"] > 0 for f in figures
    ), figures
    assert warning_shown == (label == "deit")


# --------------------------------------------------------------------------- the instant view (issue 28)

VIEW_FRAME = re.compile(
    r"<iframe class='attention-view' title='instant attention view of ([^']+)'[^>]*"
    r"srcdoc=\"([^\"]*)\"></iframe><script type='application/json' class='attention-view-args'>(.*?)</script>"
)


def embedded_views(report: Path) -> list[tuple[str, str, dict]]:
    """``(image name, inlined page, args)`` of each instant view in the report."""
    import html
    import json

    text = report.read_text(encoding="utf-8")
    return [(name, html.unescape(page), json.loads(args)) for name, page, args in VIEW_FRAME.findall(text)]


def test_the_report_embeds_the_apps_view_page_with_each_records_data(reports):
    """The report inlines the app's own page file (one implementation) and feeds it every layer's
    quantised attention, which decodes to ``attention_map`` of that image within half a step."""
    import numpy as np

    import analysis
    from analysis.views.attention_view import PAGE
    from test_attention_view import unpack_blob

    views = embedded_views(reports["demo"])
    assert len(views) == 2 and len(embedded_views(reports["deit"])) == 2 and len(embedded_views(reports["swin"])) == 2
    vit = analysis.load_vit("demo")
    spec = vit.spec
    heads, patches = spec.num_heads, spec.num_patches
    for name, page, args in views:
        assert page == PAGE.read_text(encoding="utf-8")
        assert args["layers"] == list(range(spec.num_layers)) and args["layer"] == spec.num_layers - 1
        assert (args["head"], args["query_row"], args["range_mode"]) == (heads, 0, "robust")  # mean, class token
        assert args["image"].startswith("data:image/png;base64,")
        record = analysis.capture_attention(vit, vit.preprocess(analysis.load_image(SAMPLES / name)))
        codes, ranges = unpack_blob(base64.b64decode(args["data_b64"]), args["layers"], spec)[:2]
        for layer in range(spec.num_layers):
            for head, query in ((None, "cls"), (0, 5), (heads - 1, patches - 1)):
                row = 0 if query == "cls" else spec.num_prefix_tokens + query
                column = heads if head is None else head
                lo, hi = ranges[layer, column, row]
                got = lo + codes[layer, column, row] / 255 * (hi - lo)
                exact = analysis.attention_map(record, layer, head=head, query=query)[0].numpy().ravel()
                assert np.abs(got - exact).max() <= (exact.max() - exact.min()) / 510 + 1e-7, (name, layer, head, query)


def test_a_windowed_models_report_draws_its_last_layers_windows_and_says_why_there_is_no_rollout(reports):
    """The demo Swin's report: each instant view holds the last layer's windows on that layer's
    grid (its mean map decodes to ``attention_map(query="mean")`` within half a step), the distance
    chart's uniform reference is one value per layer (``uniform_attention_distance_by_layer``), and
    the rollout section gives the refusal's reason, once, instead of a map."""
    import html
    import json

    import numpy as np

    import analysis

    vit = analysis.load_vit("demo_swin")
    spec, last = vit.spec, vit.spec.num_layers - 1
    geometry = spec.geometry(last)
    (gh, gw), heads = geometry.grid_size, geometry.num_heads
    windows, slots = geometry.num_windows, geometry.window_tokens
    for name, _page, args in embedded_views(reports["swin"]):
        assert args["windowed"] is True and args["layers"] == [last] and args["layer"] == last
        assert (args["grid"], args["patch_size"]) == (list(geometry.grid_size), list(geometry.stride))
        blob = base64.b64decode(args["data_b64"])
        start = 8 * (heads + 1) * (windows * slots + 1) + 4 * windows * slots + (heads + 1) * windows * slots**2
        mean_ranges = np.frombuffer(blob, "<f4", 2 * (heads + 1), 8 * (heads + 1) * windows * slots).reshape(-1, 2)
        mean = np.frombuffer(blob, np.uint8, (heads + 1) * gh * gw, start).reshape(heads + 1, gh * gw)
        assert len(blob) == start + (heads + 1) * gh * gw
        record = analysis.capture_attention(vit, vit.preprocess(analysis.load_image(SAMPLES / name)))
        exact = analysis.attention_map(record, last, head=None, query="mean")[0].numpy().ravel()
        lo, hi = mean_ranges[heads]
        assert np.abs(lo + mean[heads] / 255 * (hi - lo) - exact).max() <= (hi - lo) / 510 + 1e-7
    text = reports["swin"].read_text(encoding="utf-8")
    rollout = re.search(r"<section id='rollout'>(.*?)</section>", text, re.S).group(1)
    assert "<img" not in rollout and rollout.count(html.escape("Roll out within one stage")) == 1  # said once
    distance = re.search(r"<section id='distance'>(.*?)</section>", text, re.S).group(1)
    figure = json.loads(re.search(r"Plotly\.newPlot\(\s*\"[^\"]+\",\s*(\[.*?\]),\s*\{", distance, re.S).group(1))
    (reference,) = [trace for trace in figure if trace.get("mode") == "lines"]
    y = reference["y"]  # plotly's typed array ({"dtype", "bdata"}) or a list
    y = np.frombuffer(base64.b64decode(y["bdata"]), y["dtype"]) if isinstance(y, dict) else np.asarray(y, float)
    steps = y.reshape(-1, 3)[:, 0]  # a flat piece per layer, then a gap
    np.testing.assert_allclose(steps, analysis.uniform_attention_distance_by_layer(spec).numpy(), rtol=1e-12)


def test_a_view_over_view_mb_is_left_out_with_its_size(tmp_path):
    """A last layer whose data exceeds ``--view-mb`` gets no view, and a note that says how large it is."""
    import analysis
    from analysis.views.attention_view import view_layer_bytes

    images = tmp_path / "images"
    images.mkdir()
    (images / "scene_0_bar.png").write_bytes((SAMPLES / "scene_0_bar.png").read_bytes())
    budget = 1e-4  # MiB: 104 bytes, under the demo Swin's last layer
    args = ["report", "--model", "demo_swin", "--images", str(images), "--out", str(tmp_path), "--view-mb", f"{budget}"]
    result = cli_runner.run("-m", "analysis", *args, "--examples", "1")
    assert result.returncode == 0, result.stderr
    spec = analysis.load_vit("demo_swin").spec
    size = view_layer_bytes(spec, spec.num_layers - 1)
    assert size > budget * 2**20
    text = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert not embedded_views(tmp_path / "report.html")
    assert f"the last layer's attention for every query is {size / 2**20:.3g} MiB, over --view-mb {budget:g}" in text


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian Chromium not installed at /usr/bin/chromium")
def test_hovering_a_patch_in_the_saved_report_draws_its_map(reports):
    """Opened from file:// with no network: the view in the report draws the hovered patch's
    attention (``attention_map`` after quantisation, within one colour step), ↓ the layer below."""
    from playwright.sync_api import sync_playwright

    import analysis
    from analysis.plots import colour_range, quantise_maps
    from test_browser import assert_within_one_colour_step, canvas_rgb

    name = embedded_views(reports["demo"])[0][0]
    vit = analysis.load_vit("demo")
    spec = vit.spec
    record = analysis.capture_attention(vit, vit.preprocess(analysis.load_image(SAMPLES / name)))
    grid, last = spec.grid_size, spec.num_layers - 1
    errors = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            context = browser.new_context(offline=True, viewport={"width": 1280, "height": 1000})
            page = context.new_page()
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(reports["demo"].as_uri(), wait_until="load")
            iframe = page.locator("iframe.attention-view").first
            iframe.scroll_into_view_if_needed()
            frame = iframe.element_handle().content_frame()
            frame.wait_for_function("() => window.attentionView && window.attentionView.shown", timeout=30_000)
            patch = grid[1] + 2
            outer = iframe.bounding_box()
            inner = frame.evaluate(
                "() => { const b = document.getElementById('map').getBoundingClientRect();"
                " return [b.left, b.top, b.width, b.height]; }"
            )
            row, col = divmod(patch, grid[1])
            page.mouse.move(
                outer["x"] + inner[0] + inner[2] * (col + 0.5) / grid[1],
                outer["y"] + inner[1] + inner[3] * (row + 0.5) / grid[0],
            )
            checks = []
            for layer in (last, last - 1):
                if layer != last:
                    frame.locator("#stage").press("ArrowDown")
                frame.wait_for_function(
                    f"() => window.attentionView.shown?.patch === {patch}"
                    f" && window.attentionView.shown?.layer === {layer}",
                    timeout=10_000,
                )
                checks.append((layer, canvas_rgb(frame, grid)))
            title = frame.locator("#title").text_content()
        finally:
            browser.close()
    assert errors == [], errors
    assert f"query: patch {patch}" in title
    for layer, drawn in checks:
        exact = analysis.attention_map(record, layer, head=None, query=patch)[0].numpy()
        decoded = quantise_maps(exact.ravel()).decoded().reshape(grid)
        lo, hi, _ = colour_range("robust", decoded, uniform=1 / spec.num_tokens)  # the demo has no outlier tokens
        assert_within_one_colour_step(drawn, decoded, "Viridis", lo, hi, f"report, layer {layer}, patch {patch}")
