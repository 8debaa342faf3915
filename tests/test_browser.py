"""The explorer in a real browser: Debian's Chromium driven by Playwright.

Serves ``vizapp/app.py`` with ``python -m streamlit run`` on a free local port, then:
loads it, uploads an image through the file input, clicks a patch on the image to make
it the query, clicks a thumbnail to open it, visits every page, and checks that no
exception is shown anywhere. Screenshots land in ``artifacts/browser/`` (or
``$VIZAPP_ARTIFACTS``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

from model_folders import model_folder, narrow_swin
from streamlit_server import CHROMIUM, CHROMIUM_ARGS, REPO, streamlit_server

PAGES = {  # navigation label -> page header
    "Rollout": "Attention rollout",
    "Why this class?": "Why this class?",
    "Compare layers": "Compare layers",
    "Tokens": "Tokens",
    "Robustness": "Robustness",
    "Position embeddings": "Position embeddings",
    "Patch-embedding filters": "Patch-embedding filters",
    "Attention distance": "Attention distance",
}

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="Debian Chromium not installed at /usr/bin/chromium (apt-get install -y chromium)"
)


@pytest.fixture(scope="module")
def artifacts() -> Path:
    folder = Path(os.environ.get("VIZAPP_ARTIFACTS", REPO / "artifacts")) / "browser"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def server(artifacts):
    try:
        with streamlit_server(artifacts / "streamlit.log") as (url, _process):
            yield url
    except RuntimeError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="module")
def chromium():
    """One Chromium for the module (Playwright's sync API runs one at a time)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def page(server, chromium):
    context = chromium.new_context(viewport={"width": 1440, "height": 1100})
    tab = context.new_page()
    tab.set_default_timeout(60_000)
    from playwright.sync_api import expect

    expect.set_options(timeout=30_000)  # a loaded machine (parallel workers) answers clicks slowly
    yield tab
    context.close()


def wait_idle(page) -> None:
    """Wait until the script run finished (the status widget disappears) and charts are drawn."""
    # a module's first page waits on a cold server (CI imports without bytecode, beside the static checks
    # and the installs): 60 s was once too little for both workers' first page at CI's busiest minute
    page.wait_for_selector("[data-testid='stPlotlyChart'] .main-svg", state="attached", timeout=180_000)
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", polling=200, timeout=60_000
    )
    # a session's first open of a slow page draws its first result, then reruns for the rest (vizapp.first_result)
    page.wait_for_selector("iframe[title*='first_result']", state="detached", timeout=240_000)
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", polling=200, timeout=120_000
    )
    # Every chart, not only the first: a page's later charts can still be drawing (CI once read
    # the Position page before its mosaic existed).
    page.wait_for_function(
        """() => [...document.querySelectorAll('[data-testid="stPlotlyChart"]')]
                 .every(chart => chart.querySelector('.main-svg'))""",
        polling=200,
        timeout=60_000,
    )
    page.wait_for_timeout(300)


def assert_no_exception(page, where: str) -> None:
    assert page.locator("[data-testid='stException']").count() == 0, (
        f"exception shown on {where}: {page.locator('[data-testid=stException]').first.inner_text()}"
    )


def overlay_title(page) -> str:
    return page.locator("[data-testid='stPlotlyChart']").first.locator(".gtitle").inner_text()


def grid_size(page) -> tuple[int, int]:
    text = page.locator("section[data-testid='stSidebar']").inner_text()
    gw, gh = re.search(r"grid (\d+)×(\d+)", text).groups()
    return int(gh), int(gw)


def test_explorer_in_chromium(page, server, artifacts):
    from PIL import Image
    from playwright.sync_api import expect

    page.goto(server)
    wait_idle(page)
    assert_no_exception(page, "start")
    # overlay, top-5, layers × heads (the top-mass panels are opt-in)
    expect(page.locator("[data-testid='stPlotlyChart']")).to_have_count(3)
    page.screenshot(path=str(artifacts / "01_start.png"))

    # upload an image through the real file input
    upload = artifacts / "upload_gradient.png"
    gradient = Image.linear_gradient("L").resize((300, 200)).convert("RGB")
    gradient.save(upload)
    page.locator("section[data-testid='stSidebar'] input[type='file']").set_input_files(str(upload))
    expect(page.locator("section[data-testid='stSidebar']")).to_contain_text(
        re.compile(r"image\s+upload_gradient\.png")
    )
    wait_idle(page)
    assert_no_exception(page, "upload")
    page.screenshot(path=str(artifacts / "02_uploaded.png"))

    # the figure's data downloads as .npz; the plotly toolbar offers the PNG
    with page.expect_download() as download:
        page.get_by_role("button", name="Data (.npz)").first.click()
    saved = artifacts / download.value.suggested_filename
    download.value.save_as(saved)
    with np.load(saved) as data:
        assert data["attention"].shape == grid_size(page)
    page.locator("[data-testid='stPlotlyChart']").first.hover()
    assert (
        page.locator("[data-testid='stPlotlyChart']").first.locator(".modebar-btn[data-title^='Download plot']").count()
        == 1
    )

    # click a patch on the image: it becomes the query
    gh, gw = grid_size(page)
    row, col = 1, gw - 2
    # the chart sits below the instant view (issue 28): scrolled into view before the click
    _click_patch(page, page.locator("[data-testid='stPlotlyChart']").first, row, col, gh, gw)
    expect(page.locator("[data-testid='stPlotlyChart']").first.locator(".gtitle")).to_contain_text(
        f"query: patch {row * gw + col} (row {row}, col {col})"
    )
    wait_idle(page)
    assert_no_exception(page, "patch click")
    page.screenshot(path=str(artifacts / "03_patch_query.png"))

    # click the top-left thumbnail (layer 0, head 0): it opens large
    grid = page.locator("[data-testid='stPlotlyChart']").nth(2)  # overlay, top-5, then the grid
    heads = int(re.search(r"(\d+) heads", page.locator("section[data-testid='stSidebar']").inner_text()).group(1))
    layers = int(re.search(r"(\d+) layers", page.locator("section[data-testid='stSidebar']").inner_text()).group(1))
    title = page.locator("[data-testid='stPlotlyChart']").first.locator(".gtitle")
    for attempt in range(4):  # a click plotly lost while a rerun redrew the grid (CI, a loaded machine) is repeated
        wait_idle(page)
        grid.scroll_into_view_if_needed()
        tiles = grid.locator(".nsewdrag").first.bounding_box()  # aimed afresh: the page may have moved
        tx = tiles["x"] + tiles["width"] * 0.5 / (heads + 1)
        ty = tiles["y"] + tiles["height"] * 0.5 / layers
        _hover_and_click(page, grid, tx, ty, label="layer 0, head 0")
        try:
            expect(title).to_contain_text("Layer 0 · head 0", timeout=20_000)
            break
        except AssertionError:
            if attempt == 3:
                raise
    wait_idle(page)
    assert_no_exception(page, "thumbnail click")

    # every other page, to its first result: its header and a first chart or image drawn, no
    # exception (every section of every page runs in the AppTests, tests/test_app*.py, and in the
    # browser in CI's layout tier, tests/test_browser_layout.py, for three models)
    for index, (name, header) in enumerate(PAGES.items(), start=4):
        page.locator("[data-testid='stSidebarNav'] a", has_text=name).first.click()
        expect(page.locator("h2", has_text=header).first).to_be_visible()
        wait_first_result(page)
        assert_no_exception(page, name)
        page.screenshot(path=str(artifacts / f"{index:02d}_{name.lower().replace(' ', '_')}.png"))


def wait_first_result(page) -> None:
    """Wait until the open page has drawn a first result: a plotly chart, the instant view or an
    image in the main area, after the run that drew it ended (the status widget gone)."""
    page.wait_for_function(
        """() => {
            const main = document.querySelector('section[data-testid="stMain"]') || document;
            const drawn = main.querySelector(
                '[data-testid="stPlotlyChart"] .main-svg, iframe:not([title*="first_result"]), [data-testid="stImage"] img'
            );
            return drawn && !document.querySelector('[data-testid="stStatusWidget"]');
        }""",
        polling=200,
        timeout=120_000,
    )


def _drawn_colour_stops(page) -> list[list[str]]:
    """The colour scale of every heatmap (and colour axis) as plotly drew it in the browser."""
    return page.evaluate(
        """() => {
            const out = [];
            for (const plot of document.querySelectorAll('[data-testid="stPlotlyChart"] .js-plotly-plot')) {
                for (const trace of plot._fullData || []) {
                    if (trace.type === 'heatmap' && trace.colorscale) out.push(trace.colorscale.map(s => s[1]));
                    const marker = trace.marker || {};
                    if (trace.type === 'scatter' && marker.showscale && marker.colorscale)
                        out.push(marker.colorscale.map(s => s[1]));
                }
                const axis = (plot._fullLayout || {}).coloraxis;
                if (axis && axis.colorscale) out.push(axis.colorscale.map(s => s[1]));
            }
            return out;
        }"""
    )


def _rgb(colour: str) -> tuple[int, int, int]:
    from plotly.colors import hex_to_rgb, unlabel_rgb

    colour = colour.strip()
    if colour.startswith("#"):
        return tuple(hex_to_rgb(colour))
    return tuple(int(round(float(v))) for v in unlabel_rgb(colour)[:3])


def test_colour_scales_are_drawn_with_their_true_stops(page, server):
    """Streamlit's chart theme once replaced the dark first stop of Magma/Inferno with pink
    (#ffabab): near-zero attention looked like mid-range. What the browser draws must be the
    scale itself, first stop to last: the default scale as the page opens, then Magma (whose first
    stop the theme replaced) and Cividis chosen in the sidebar. Every scale reaches the browser by
    the same path (the figures' colorscale, the chart drawn with ``theme=None``): the others are
    checked as plotly figures in tests/test_plots.py."""
    from analysis.plots import COLORSCALES

    page.goto(server)
    wait_idle(page)
    sidebar = page.locator("section[data-testid='stSidebar']")
    assert COLORSCALES[0] == "Viridis"  # the default, drawn without a choice
    for index, name in enumerate(("Viridis", "Magma", "Cividis")):
        if index == 0:
            _check_drawn_scale(page, name)
            continue
        selectbox = sidebar.locator("[data-testid='stSelectbox']", has_text="Colour scale")
        selectbox.scroll_into_view_if_needed()  # the sidebar is long: the box may sit at the window's edge
        selectbox.locator("input").first.click()
        page.keyboard.type(name)  # Streamlit's selectbox filters as one types
        option = page.locator("[role='option']", has_text=re.compile(f"^{name}$"))
        try:
            option.click(timeout=15_000)
        except Exception:
            page.screenshot(path=str(REPO / "artifacts" / "browser" / "colour_scale_failure.png"))
            raise
        wait_idle(page)
        _check_drawn_scale(page, name)


def _check_drawn_scale(page, name: str) -> None:
    """Every heatmap and colour axis the browser drew uses plotly's scale ``name``, stop for stop."""
    import plotly.colors

    true_scale = [_rgb(c) for _, c in plotly.colors.get_colorscale(name)]
    for _ in range(60):  # charts re-render one by one after the rerun: poll until all are new
        drawn = _drawn_colour_stops(page)
        if drawn and all(_rgb(stops[-1]) == true_scale[-1] for stops in drawn):
            break
        page.wait_for_timeout(250)
    assert drawn, f"no heatmap drawn with {name}"
    for stops in drawn:
        got = [_rgb(c) for c in stops]
        assert got[0] == true_scale[0] and got[-1] == true_scale[-1], (name, got[0], true_scale[0], drawn)
        assert got == true_scale, name


def test_smooth_maps_are_drawn_as_an_image_with_a_true_colour_bar(page, server, artifacts):
    """Bilinear maps travel as a PNG layer: the colour bar must still be drawn, from the true scale."""
    import plotly.colors
    from playwright.sync_api import expect

    page.goto(server + "/?cells=bilinear&colours=Magma")
    wait_idle(page)
    overlay = page.locator("[data-testid='stPlotlyChart']").first
    expect(overlay.locator(".colorbar")).to_have_count(1)
    assert overlay.locator(".heatmaplayer image, .heatmaplayer .hm").count() == 0  # no patch cells
    layers = page.evaluate(
        """() => (document.querySelector('[data-testid="stPlotlyChart"] .js-plotly-plot')._fullData || [])
                 .map(t => t.type + ':' + t.name)"""
    )
    assert "image:attention (bilinear)" in layers, layers
    true_scale = [_rgb(c) for _, c in plotly.colors.get_colorscale("Magma")]
    drawn = _drawn_colour_stops(page)
    assert drawn and all([_rgb(c) for c in stops] == true_scale for stops in drawn), drawn
    bar_box = overlay.locator(".colorbar").bounding_box()
    assert bar_box and bar_box["height"] > 100  # drawn, not collapsed
    assert_no_exception(page, "smooth maps")
    page.screenshot(path=str(artifacts / "smooth_maps.png"))


def test_a_64x64_resample_renders_quickly_and_the_tab_survives(page, server):
    """It once sent 69 MB of JSON, took 59 s and crashed the tab."""
    import time

    from playwright.sync_api import expect

    page.goto(server)
    wait_idle(page)
    page.locator("[data-testid='stSidebarNav'] a", has_text="Position embeddings").first.click()
    expect(page.locator("h2", has_text="Position embeddings").first).to_be_visible()
    wait_idle(page)
    page.get_by_text("Resample the position embedding", exact=False).first.click()
    wait_idle(page)
    started = time.monotonic()
    for label in ("Rows", "Columns"):
        field = page.get_by_label(label, exact=True).first
        field.fill("64")
        field.press("Enter")
        wait_idle(page)
    expect(page.get_by_text("Resampled 64×64", exact=False).first).to_be_visible(timeout=30_000)
    wait_idle(page)
    elapsed = time.monotonic() - started
    assert page.evaluate("() => 1 + 1") == 2  # the tab is alive
    sizes = page.evaluate(
        """() => [...document.querySelectorAll('[data-testid="stPlotlyChart"] .js-plotly-plot')]
                 .map(p => JSON.stringify(p.data || []).length)"""
    )
    assert max(sizes) < 8_000_000, sizes  # bounded: PNG tiles, not a JSON cell per patch
    assert_no_exception(page, "64x64 resample")
    print(f"\n64x64 resample: {elapsed:.1f} s until drawn; largest chart {max(sizes) / 1e6:.1f} MB of data")


def test_a_new_upload_is_explained_and_a_bad_upload_keeps_the_uploaded_image(page, server, artifacts):
    """Upload A, open Why this class?, upload B: the class explained is B's prediction, not A's
    (issue 50, item 2). Then an unreadable upload: B stays, not a bundled sample (item 3; the
    browser replaces a file in two runs, the old one removed first)."""
    from playwright.sync_api import expect

    page.goto(server)
    wait_idle(page)
    sidebar = page.locator("section[data-testid='stSidebar']")
    target = page.get_by_role("combobox", name="Class to explain (type to search)")  # its value: "ring · 91.4%"

    def upload(sample: str, name: str) -> None:
        path = artifacts / name
        path.write_bytes((REPO / "assets" / "samples" / sample).read_bytes())
        sidebar.locator("input[type='file']").set_input_files(str(path))
        expect(sidebar).to_contain_text(re.compile(rf"image\s+{re.escape(name)}"))
        wait_idle(page)

    upload("scene_4_ring.png", "upload_a_ring.png")
    page.locator("[data-testid='stSidebarNav'] a", has_text="Why this class?").first.click()
    expect(page.locator("h2", has_text="Why this class?").first).to_be_visible()
    wait_idle(page)
    expect(target).to_have_value(re.compile(r"^ring · "))
    upload("scene_1_star.png", "upload_b_star.png")
    expect(target).to_have_value(re.compile(r"^star · "))
    assert_no_exception(page, "second upload")
    bad = artifacts / "not_an_image.jpg"
    bad.write_bytes(b"definitely not a jpeg")
    sidebar.locator("input[type='file']").set_input_files(str(bad))
    expect(page.locator("[data-testid='stAlert']", has_text="not_an_image.jpg").first).to_be_visible()
    wait_idle(page)
    expect(sidebar).to_contain_text("Showing upload_b_star.png instead")
    expect(target).to_have_value(re.compile(r"^star · "))
    page.screenshot(path=str(artifacts / "bad_upload_keeps_the_image.png"))


def _click_patch(page, chart, row: int, col: int, gh: int, gw: int, panel: int = 0) -> None:
    """Click the centre of patch (row, col) of a chart's ``panel``-th plot area."""
    area = chart.locator(".nsewdrag").nth(panel)
    area.scroll_into_view_if_needed()
    box = area.bounding_box()
    x = box["x"] + box["width"] * (col + 0.5) / gw
    y = box["y"] + box["height"] * (row + 0.5) / gh
    _hover_and_click(page, chart, x, y)


def _hover_and_click(page, chart, x: float, y: float, label: str | None = None) -> None:
    """Move to (x, y), wait until plotly shows the hovered point's label (containing ``label``, when
    given), then click: plotly throttles hover and its click reports the hovered point, so a click
    before the label (a loaded machine) would report the previous one or none."""
    page.mouse.move(x, y)
    page.wait_for_timeout(300)
    hovered = chart.locator(".hoverlayer .hovertext")
    try:
        (hovered.filter(has_text=label) if label else hovered).first.wait_for(state="attached", timeout=15_000)
    except Exception:  # a chart whose traces show no label: the wait above is all there is
        page.mouse.move(x + 1, y + 1)  # a nudge, so plotly hovers afresh
        page.wait_for_timeout(300)
    page.mouse.click(x, y)


@pytest.mark.parametrize("name, header", [("Rollout", "Attention rollout"), ("Compare layers", "Compare layers")])
def test_a_click_on_rollout_and_compare_changes_the_query(page, server, name, header):
    from playwright.sync_api import expect

    page.goto(server)
    wait_idle(page)
    page.locator("[data-testid='stSidebarNav'] a", has_text=name).first.click()
    expect(page.locator("h2", has_text=header).first).to_be_visible()
    wait_idle(page)
    gh, gw = grid_size(page)
    row, col = gh - 2, 1
    chart = page.locator("[data-testid='stPlotlyChart']").first
    _click_patch(page, chart, row, col, gh, gw, panel=1 if name == "Compare layers" else 0)
    wait_idle(page)
    patch = row * gw + col
    field = page.get_by_label(re.compile(r"Query patch \(row-major"))
    expect(field).to_have_value(str(patch))
    wait_idle(page)
    assert_no_exception(page, f"{name} click")
    count_outlines = """() => {
        const plot = document.querySelector('[data-testid="stPlotlyChart"] .js-plotly-plot');
        return plot && plot._fullLayout ? (plot._fullLayout.shapes || []).filter(s => s.type === 'rect').length : 0;
    }"""
    try:  # the rerun that draws the outline may still be on its way to the browser
        page.wait_for_function(f"({count_outlines})() >= 1", timeout=20_000)
    except Exception:
        pass
    assert page.evaluate(count_outlines) >= 1  # the query patch is outlined


def test_the_url_reproduces_a_view_after_a_reload(page, server):
    from playwright.sync_api import expect

    page.goto(f"{server}/rollout?query=patch&patch=5&colours=Magma")
    wait_idle(page)
    expect(page.locator("h2", has_text="Attention rollout").first).to_be_visible()
    field = page.get_by_label(re.compile(r"Query patch \(row-major"))
    expect(field).to_have_value("5")
    colours = page.get_by_role("combobox", name="Colour scale")
    expect(colours).to_have_value("Magma")
    field.fill("7")
    field.press("Enter")
    wait_idle(page)
    page.wait_for_function("() => location.search.includes('patch=7')", timeout=20_000)
    assert "colours=Magma" in page.url and "/rollout" in page.url, page.url

    page.reload()
    wait_idle(page)
    expect(page.locator("h2", has_text="Attention rollout").first).to_be_visible()
    expect(page.get_by_label(re.compile(r"Query patch \(row-major"))).to_have_value("7")
    expect(page.get_by_role("combobox", name="Colour scale")).to_have_value("Magma")
    assert_no_exception(page, "reload")
    icons = page.evaluate("() => [...document.querySelectorAll('link[rel*=icon]')].map(l => l.href)")
    assert icons and all(href.startswith(server) or href.startswith("data:") for href in icons), icons  # offline


def wrapped_text(text: str) -> re.Pattern:
    """``text`` as plotly draws it wrapped onto lines (panel titles wrap to their panel): the
    lines' text runs on without the spaces at the breaks."""
    return re.compile(r"\s*".join(re.escape(word) for word in text.split()))


def test_explain_page_takes_a_class_and_a_method(page, server):
    from playwright.sync_api import expect

    page.goto(server + "/explain")
    wait_idle(page)
    assert_no_exception(page, "explain")
    classes = page.locator("[data-testid='stSelectbox']", has_text="Class to explain")
    classes.click()
    options = page.locator("[role='option']")
    expect(options.first).to_be_visible()
    second_name = options.nth(1).inner_text().split(" · ")[0]
    options.nth(1).click()
    wait_idle(page)
    methods = page.locator("[data-testid='stMultiSelect']", has_text="Methods")
    methods.locator("input").first.click()
    page.keyboard.type("input")
    page.locator("[role='option']", has_text="input × gradient").first.click()
    page.keyboard.press("Escape")
    wait_idle(page)
    panels = page.locator("[data-testid='stPlotlyChart']").first  # the maps, then the curves
    expect(panels.locator(".annotation-text", has_text=wrapped_text("input × gradient"))).to_have_count(1)
    expect(
        panels.locator(".annotation-text", has_text=wrapped_text(f"Chefer et al. 2021 · {second_name}"))
    ).to_have_count(1)
    assert_no_exception(page, "explain after a class and a method")


def test_a_long_run_shows_its_progress_and_a_stop_button(page, server):
    """The toolbar once hid Streamlit's running indicator: 8-19 s runs showed nothing but faded
    elements. A fresh ViT-B/16 (load + first forward, several seconds here) must show a spinner
    naming the step, and the status widget with Stop."""
    import time

    page.goto(server + "/?model=random:vit_base_patch16_224")
    seen: set[str] = set()
    started = time.monotonic()
    while time.monotonic() - started < 90:
        for selector, name in (("[data-testid='stSpinner']", "spinner"), ("[data-testid='stStatusWidget']", "status")):
            found = page.locator(selector)
            if found.count() and found.first.is_visible():
                seen.add(name if name == "spinner" else f"status:{'Stop' in found.first.inner_text()}")
        if {"spinner", "status:True"} <= seen:
            break
        page.wait_for_timeout(100)
    assert {"spinner", "status:True"} <= seen, seen
    wait_idle(page)
    assert_no_exception(page, "ViT-B/16 from the URL")


def test_a_click_on_the_token_pca_shows_that_patchs_similarity(page, server):
    from playwright.sync_api import expect

    page.goto(server + "/tokens")
    wait_idle(page)
    gh, gw = grid_size(page)
    pca = page.locator("[data-testid='stPlotlyChart']").first
    row, col = gh - 2, 1
    _click_patch(page, pca, row, col, gh, gw)
    expect(
        page.locator("h3", has_text=f"similarity to the patch {row * gw + col} (row {row}, col {col})").first
    ).to_be_visible(timeout=30_000)
    wait_idle(page)
    assert_no_exception(page, "token PCA click")


def test_moving_the_robustness_level_slider_changes_the_prediction(page, server):
    """The perturbed ViT's prediction (the second "prediction:" line) is recomputed when the
    drop fraction moves: at 100% only the prefix tokens remain."""
    from playwright.sync_api import expect

    page.goto(server + "/robustness")
    wait_idle(page)
    predictions = page.locator("[data-testid='stMarkdownContainer'] p", has_text="prediction:")
    expect(predictions).to_have_count(4 if (REPO / "assets" / "demo_cnn" / "config.json").is_file() else 2)
    before = predictions.nth(1).inner_text()
    slider = page.locator("[data-testid='stSlider']", has_text="Fraction of patches dropped")
    expect(slider.locator("[data-testid='stSliderThumbValue']")).to_have_text("0.50")
    slider.get_by_role("slider").focus()
    page.keyboard.press("End")
    expect(slider.locator("[data-testid='stSliderThumbValue']")).to_have_text("1.00")
    expect(predictions.nth(1)).not_to_have_text(before, timeout=30_000)
    wait_idle(page)
    assert_no_exception(page, "robustness after moving the level")


def test_the_shape_bias_measured_in_the_browser_is_the_librarys(page, server):
    """A click on "Measure the shape bias" draws one bar per model whose height, read from the drawn
    plotly figure, is the library's shape bias over the page's cue-conflict scenes (seed 0), of the
    textured variants of the page's demo models (the page's default)."""
    from playwright.sync_api import expect

    import analysis
    from analysis.demo.cue_conflict import cue_conflict_scenes
    from analysis.robustness import load_cnn, shape_bias_of
    from vizapp.views.robustness.sections import CUE_CONFLICT_SCENES

    page.goto(server + "/robustness")
    wait_idle(page)
    button = page.get_by_role("button", name=f"Measure the shape bias ({CUE_CONFLICT_SCENES} scenes)")
    button.scroll_into_view_if_needed()
    button.click()
    expect(page.get_by_text("Shape bias (Geirhos et al. 2019)", exact=False)).to_be_visible(timeout=120_000)
    wait_idle(page)
    drawn = page.evaluate(
        """() => {
            for (const plot of document.querySelectorAll('[data-testid="stPlotlyChart"] .js-plotly-plot')) {
                const bars = (plot._fullData || []).filter(t => t.type === 'bar');
                if (bars.length && bars.every(t => t.x.length === 1 && t.x[0] === 'shape bias'))
                    return Object.fromEntries(bars.map(t => [t.name, t.y[0]]));
            }
            return null;
        }"""
    )
    models = {"ViT (textured)": analysis.load_vit("demo_textured")}
    if (REPO / "assets" / "demo_cnn" / "config.json").is_file():
        models["CNN (textured)"] = load_cnn("demo_textured")
    expected = shape_bias_of(models, cue_conflict_scenes(CUE_CONFLICT_SCENES, 0))
    assert drawn is not None, "no shape-bias chart drawn"
    for name, bias in expected.items():
        assert abs(drawn[name] - bias.fraction) < 1e-9, (name, drawn[name], bias)
    assert_no_exception(page, "robustness after measuring the shape bias")


def _nav(page, name: str) -> None:
    """Click a page in the sidebar navigation (by its exact title)."""
    page.locator("[data-testid='stSidebarNav']").get_by_role("link", name=name, exact=True).click()


def _slider_text(page, label: str):
    return page.locator("[data-testid='stSlider']", has_text=label).locator("[data-testid='stSliderThumbValue']")


def _overlay_opacity(page) -> float | None:
    """The opacity of the first chart's attention layer, as plotly drew it."""
    return page.evaluate("""() => {
        const plot = document.querySelector('[data-testid="stPlotlyChart"] .js-plotly-plot');
        const trace = plot && plot._fullData ? plot._fullData.find(t => t.type === 'heatmap') : null;
        return trace ? trace.opacity : null;
    }""")


def test_the_view_survives_page_switches(page, server):
    """Layer, head, a patch query and the opacity, set on the Attention page, stay what they
    were through 10 switches to Rollout and back: every widget, the chart title, the drawn
    opacity and the URL agree after each switch (issue 29, item 1: they fell back to
    defaults, opacity 0.00 and layer 0, while the URL and title kept the old values)."""
    from playwright.sync_api import expect

    page.goto(f"{server}/?query=patch&patch=21")
    wait_idle(page)
    expect(page.get_by_label(re.compile(r"Query patch \(row-major"))).to_have_value("21")
    layers = int(re.search(r"(\d+) layers", page.locator("section[data-testid='stSidebar']").inner_text()).group(1))
    assert layers >= 3, "the test needs a non-default layer below the last"
    layer, head, patch = 1, 2, 21
    page.get_by_role("combobox", name="Head").click()
    page.get_by_role("option", name=f"head {head}", exact=True).click()
    wait_idle(page)
    layer_slider = page.locator("[data-testid='stSlider']", has_text="Layer (block index)").get_by_role("slider")
    layer_slider.focus()
    page.keyboard.press("Home")
    wait_idle(page)
    for _ in range(layer):
        layer_slider.focus()
        page.keyboard.press("ArrowRight")
        wait_idle(page)
    opacity_slider = page.locator("[data-testid='stSlider']", has_text="Overlay opacity").get_by_role("slider")
    for _ in range(2):  # 0.60 -> 0.70
        opacity_slider.focus()
        page.keyboard.press("ArrowRight")
        wait_idle(page)
    opacity = 0.7

    def check(where: str) -> None:
        title = page.locator("[data-testid='stPlotlyChart']").first.locator(".gtitle")
        expect(title).to_contain_text(f"query: patch {patch} (row")
        expect(page.get_by_role("radio", name="one patch")).to_be_checked()
        expect(page.get_by_label(re.compile(r"Query patch \(row-major"))).to_have_value(str(patch))
        expect(_slider_text(page, "Overlay opacity")).to_have_text(f"{opacity:.2f}")
        if where == "Attention":
            expect(title).to_contain_text(f"Layer {layer} · head {head} · ")
            expect(_slider_text(page, "Layer (block index)")).to_have_text(str(layer))
            expect(page.get_by_role("combobox", name="Head")).to_have_value(f"head {head}")
        page.wait_for_function(f"() => location.search.includes('patch={patch}')", timeout=20_000)
        params = dict(p.split("=", 1) for p in page.url.split("?", 1)[1].split("&"))
        assert (params.get("layer"), params.get("head"), params.get("query"), params.get("patch")) == (
            str(layer),
            str(head),
            "patch",
            str(patch),
        ), f"{where}: {page.url}"
        # the slider's text can change before the rerun redraws the chart (a loaded machine): wait for
        # the drawn opacity, then compare (a wrong one that stays fails after the wait)
        try:
            page.wait_for_function(
                """(want) => {
                    const plot = document.querySelector('[data-testid="stPlotlyChart"] .js-plotly-plot');
                    const trace = plot && plot._fullData ? plot._fullData.find(t => t.type === 'heatmap') : null;
                    return trace && Math.abs(trace.opacity - want) < 1e-6;
                }""",
                arg=opacity,
                timeout=20_000,
            )
        except Exception:  # noqa: BLE001 - playwright's TimeoutError: the assertion below names the value
            pass
        assert _overlay_opacity(page) == pytest.approx(opacity), where
        assert_no_exception(page, where)

    check("Attention")
    for switch in range(10):
        name, header = ("Rollout", "Attention rollout") if switch % 2 == 0 else ("Attention", "Attention")
        _nav(page, name)
        expect(page.locator("h2", has_text=header).first).to_be_visible()
        wait_idle(page)
        try:
            check(name)
        except AssertionError as exc:
            raise AssertionError(f"after switch {switch + 1} (to {name}): {exc}") from exc


def _data_uri_image(href: str):
    """The picture of an ``<image>`` element's ``data:`` href, decoded."""
    import base64
    import io

    from PIL import Image

    assert href.startswith("data:image/"), href[:40]
    return Image.open(io.BytesIO(base64.b64decode(href.split(",", 1)[1]))).convert("RGB")


def test_a_37x37_position_grid_shows_tiles_of_at_least_8_px(page, server, artifacts):
    """DINOv2 ViT-S/14 at 518 px has a 37×37 grid: its position mosaic (37×37 tiles of 37×37
    cells) is sent as a PNG. It was box-averaged by a factor that had to divide 37, so each
    tile became ONE pixel, a flat square (issue 29, item 3). The picture the browser draws must
    keep at least 8 pixels per tile side, each tile must show a pattern (not
    one colour), and on screen a tile must be at least 8 CSS px wide."""
    from playwright.sync_api import expect

    min_pixels = 8  # the floor (analysis.plots.mosaics.MIN_TILE_PIXELS)
    folder = model_folder("vit_small_patch14_reg4_dinov2", img_size=518, embed_dim=48, depth=2)  # narrow, shallow
    page.goto(f"{server}/position?model={folder}")
    expect(page.locator("h2", has_text="Position embeddings").first).to_be_visible(timeout=60_000)  # loads the model
    wait_idle(page)
    assert_no_exception(page, "position embeddings at 518 px")
    assert grid_size(page) == (37, 37)
    expect(page.get_by_text("37×37 grid").first).to_be_visible()
    # The mosaic is the page's second chart: it can still be drawing when the status widget is
    # gone (a slower machine drew it after the first look), so wait for the picture itself.
    page.locator("[data-testid='stPlotlyChart']").last.scroll_into_view_if_needed()
    find_picture = """() => {
            for (const plot of document.querySelectorAll('[data-testid="stPlotlyChart"] .js-plotly-plot')) {
                if (!(plot._fullData || []).some(t => t.type === 'image')) continue;
                const image = plot.querySelector('.imagelayer image, g.im image');
                const href = image && (image.getAttribute('href') || image.getAttribute('xlink:href'));
                if (!href) continue;
                const box = image.getBoundingClientRect();
                if (!(box.width > 0)) continue;
                return {href: href, width: box.width, height: box.height};
            }
            return null;
        }"""
    try:
        drawn = page.wait_for_function(find_picture, polling=200, timeout=60_000).json_value()
    except Exception as error:  # playwright's TimeoutError: say what the page drew instead
        page.screenshot(path=str(artifacts / "position_37x37_missing.png"))
        traces = page.evaluate(
            """() => [...document.querySelectorAll('[data-testid="stPlotlyChart"] .js-plotly-plot')]
                     .map(p => (p._fullData || []).map(t => t.type))"""
        )
        raise AssertionError(f"no mosaic drawn as a picture within 60 s; chart traces: {traces}") from error
    tiles = 37
    picture = _data_uri_image(drawn["href"])
    px_w, px_h = picture.width / tiles, picture.height / tiles
    assert px_w >= min_pixels and px_h >= min_pixels, (picture.size, "pixels per tile", px_w, px_h)
    assert picture.width % tiles == 0 and picture.height % tiles == 0, picture.size  # whole pixels per tile
    pixels = np.asarray(picture)  # each tile keeps its own pattern: many colours, not one
    side_h, side_w = picture.height // tiles, picture.width // tiles
    colours_per_tile = [
        len(np.unique(pixels[r * side_h : (r + 1) * side_h, c * side_w : (c + 1) * side_w].reshape(-1, 3), axis=0))
        for r in (0, 18, 36)
        for c in (0, 18, 36)
    ]
    assert min(colours_per_tile) >= min_pixels, colours_per_tile
    on_screen = drawn["width"] / tiles, drawn["height"] / tiles
    assert min(on_screen) >= min_pixels, ("CSS px per tile", on_screen)
    page.screenshot(path=str(artifacts / "position_37x37.png"))
    print(
        f"\n37x37 position mosaic: picture {picture.width}x{picture.height} px "
        f"({px_w:.0f} px per tile), on screen {on_screen[0]:.1f}x{on_screen[1]:.1f} CSS px per tile"
    )


def test_the_12_layer_thumbnails_are_at_least_120_px_on_screen(page, server, artifacts):
    """The Attention page's layers × heads mosaic of a 12-layer model: each thumbnail, measured
    on the drawn plot (plotly's own axis lengths in CSS px), is at least 120 px a side, with
    square cells; so is each tile of the Rollout page's per-layer strip."""
    from playwright.sync_api import expect

    measure = """(titles) => {
        const plots = [...document.querySelectorAll('[data-testid="stPlotlyChart"] .js-plotly-plot')];
        for (const [index, plot] of plots.entries()) {
            const layout = plot._fullLayout;
            if (!layout || !layout.xaxis || !layout.yaxis) continue;
            const x = layout.xaxis, y = layout.yaxis;
            if ((titles[0] && x.title.text !== titles[0]) || y.title.text !== titles[1]) continue;
            return {w: x._length, h: y._length, xr: x.range, yr: y.range, index: index};
        }
        return null;
    }"""
    wrapped = "head (upper / lower row of each layer)"  # 12 heads and the mean: two rows of 7 and 6 per layer
    for model, path, titles, rows, cols in (
        ("vit_tiny", "", ["head", "layer"], 12, 4),
        ("vit_tiny", "/rollout", ["", "after layers"], 2, 6),
        ("vit_small", "", ["head", "layer"], 12, 7),
        ("vit_base", "", [wrapped, "layer"], 24, 7),
    ):  # 12 layers of 3, 6 and 12 heads, a 7×7 grid
        width = {"vit_tiny": 24, "vit_small": 48, "vit_base": 96}[model]  # 8 channels a head: the heads are the point
        page.goto(f"{server}{path}?model={model_folder(f'{model}_patch16_224', img_size=112, embed_dim=width)}")
        expect(page.locator("h2").first).to_be_visible(timeout=60_000)
        wait_idle(page)
        assert_no_exception(page, path or "attention")
        try:
            drawn = page.wait_for_function(
                measure, arg=[t or None for t in titles], polling=200, timeout=60_000
            ).json_value()
        except Exception as error:  # playwright's TimeoutError: say which charts were drawn
            page.screenshot(path=str(artifacts / "thumbnails_missing.png"), full_page=True)
            axes = page.evaluate("""() => [...document.querySelectorAll('[data-testid="stPlotlyChart"] .js-plotly-plot')]
                .map(p => p._fullLayout && p._fullLayout.xaxis ? [p._fullLayout.xaxis.title.text, p._fullLayout.yaxis.title.text] : null)""")
            raise AssertionError(
                f"{path or 'attention'}: no thumbnail mosaic drawn; axis titles of the charts: {axes}"
            ) from error
        cells_w, cells_h = abs(drawn["xr"][1] - drawn["xr"][0]), abs(drawn["yr"][1] - drawn["yr"][0])
        tile_w, tile_h = drawn["w"] / cols, drawn["h"] / rows
        assert min(tile_w, tile_h) >= 120, (path, "CSS px per tile", tile_w, tile_h)
        assert drawn["w"] / cells_w == pytest.approx(drawn["h"] / cells_h, rel=0.02)  # square cells
        page.locator("[data-testid='stPlotlyChart'] .js-plotly-plot").nth(drawn["index"]).screenshot(
            path=str(artifacts / f"thumbnails_{model}{path.replace('/', '_') or '_attention'}.png")
        )
        print(f"\n{model} {path or '/'}: {tile_w:.0f}x{tile_h:.0f} CSS px per thumbnail")


def _scale_positions(png: bytes, stops: list[str]) -> tuple[np.ndarray, float]:
    """Where each drawn pixel lies on the colour scale: ``(positions in 0..1, share on the scale)``.

    Each pixel is matched to the nearest of 256 colours sampled from ``stops`` (the scale as
    plotly drew it); pixels farther than a small tolerance from every scale colour (separator
    lines, the page background) are left out and lower the share.
    """
    import io

    import plotly.colors
    from PIL import Image

    scale = [[i / (len(stops) - 1), f"rgb{_rgb(c)}"] for i, c in enumerate(stops)]
    lut = np.array([_rgb(c) for c in plotly.colors.sample_colorscale(scale, 256)], dtype=np.float64)  # (256, 3)
    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).reshape(-1, 3)
    colours, which = np.unique(pixels, axis=0, return_inverse=True)  # (colours, 3), (pixels,)
    distance = np.linalg.norm(colours[:, None, :].astype(np.float64) - lut[None, :, :], axis=2)  # (colours, 256)
    nearest = distance.argmin(axis=1)
    on_colour = distance[np.arange(len(colours)), nearest] <= 20
    on_scale = on_colour[which.reshape(-1)]
    return nearest[which.reshape(-1)][on_scale] / 255, float(on_scale.mean())


def test_a_random_models_maps_and_thumbnails_are_not_saturated_at_the_default(page, server, artifacts):
    """A random ViT attends almost uniformly (every key near 1/T). Scaled from 0 to its own
    maximum such a map filled the whole colour scale: the main map and all layers × heads
    thumbnails were solid top colour (yellow), while the help said a near-uniform map "stays
    pale". At the default range, the pixels the browser draws for the map (at opacity 1) and for
    the thumbnails must stay off the scale's top tenth."""
    from playwright.sync_api import expect

    page.goto(f"{server}/?model=random:vit_tiny_patch16_224")
    expect(page.locator("h2", has_text="Attention").first).to_be_visible(timeout=60_000)
    wait_idle(page)
    assert_no_exception(page, "random ViT-Ti")
    expect(page.get_by_role("radio", name=re.compile("one scale per layer"))).to_be_checked()  # the default
    opacity = page.locator("[data-testid='stSlider']", has_text="Overlay opacity")
    opacity.get_by_role("slider").focus()
    page.keyboard.press("End")  # opacity 1: the drawn colours are the map's own, not mixed with the image
    expect(opacity.locator("[data-testid='stSliderThumbValue']")).to_have_text("1.00")
    wait_idle(page)
    page.wait_for_function(
        """() => { const p = document.querySelector('[data-testid="stPlotlyChart"] .js-plotly-plot');
                   const t = p && p._fullData ? p._fullData.find(t => t.type === 'heatmap') : null;
                   return t && t.opacity === 1; }""",
        timeout=20_000,
    )
    page.wait_for_timeout(500)
    wait_idle(page)  # every chart drawn again after the opacity's rerun (CI once read them mid-rerun)
    charts = page.evaluate(
        """() => [...document.querySelectorAll('[data-testid="stPlotlyChart"] .js-plotly-plot')].map(p => {
               const t = (p._fullData || []).find(t => t.type === 'heatmap');
               return t ? {name: t.name || '', stops: t.colorscale.map(s => s[1])} : null; })"""
    )
    thumbnails = next(i for i, c in enumerate(charts) if c and c["name"] == "tiles")
    results = {}
    for label, index in (("main map", 0), ("thumbnails", thumbnails)):
        area = page.locator("[data-testid='stPlotlyChart']").nth(index).locator(".nsewdrag").first
        area.scroll_into_view_if_needed()
        page.wait_for_timeout(300)
        box = area.bounding_box()
        inset = 0.03 * min(box["width"], box["height"])
        png = page.screenshot(
            clip=dict(
                x=box["x"] + inset, y=box["y"] + inset, width=box["width"] - 2 * inset, height=box["height"] - 2 * inset
            )
        )
        (artifacts / f"unsaturated_{label.replace(' ', '_')}.png").write_bytes(png)
        positions, share = _scale_positions(png, charts[index]["stops"])
        assert share > 0.8, f"{label}: only {share:.0%} of the drawn pixels are colours of the scale"
        results[label] = (float(positions.mean()), float((positions > 0.9).mean()))
    for label, (mean, top_share) in results.items():
        # a random model's maps stay within 1.15× uniform, under 1.15/UNIFORM_FLOOR = 0.77 of the scale;
        # saturated maps sat near 1
        assert mean < 0.8 and top_share < 0.05, (
            label,
            f"mean scale position {mean:.2f}",
            f"{top_share:.0%} of pixels in the top tenth",
        )
    print(
        "\n"
        + "; ".join(
            f"{label}: mean scale position {mean:.2f}, {top:.1%} in the top tenth"
            for label, (mean, top) in results.items()
        )
    )


def _window_cells_by_hand(grid, window, shift, cell) -> set[tuple[int, int]]:
    """The (row, col) cells of the window holding ``cell``, written out: slot (i, j) of rolled,
    padded window (a, b) holds ((a·wh + i + sh) mod gh, (b·ww + j + sw) mod gw)."""
    (gh, gw), (wh, ww), (sh, sw) = grid, window, shift
    for a in range(-(-gh // wh)):
        for b in range(-(-gw // ww)):
            cells = {
                ((a * wh + i + sh) % gh, (b * ww + j + sw) % gw)
                for i in range(wh)
                for j in range(ww)
                if a * wh + i < gh and b * ww + j < gw
            }
            if cell in cells:
                return cells
    raise AssertionError(f"no window holds {cell}")


def test_a_click_on_a_swin_outlines_the_query_window(page, server, artifacts):
    """A random (narrow) Swin at 112 px, layer 1 (28×28 cells of 4 px, 7×7 windows, shift 3): clicking
    cell (1, 26) makes it the query; its rolled window wraps around both image borders, so the
    outline is 4 rectangles exactly over the window's cells, and the map is 0 outside them."""
    from playwright.sync_api import expect

    page.goto(f"{server}/?model={narrow_swin()}&layer=1&query=mean")
    wait_idle(page)
    assert_no_exception(page, "Swin attention")
    overlay = page.locator("[data-testid='stPlotlyChart']").first
    expect(overlay.locator(".gtitle")).to_contain_text("Layer 1 (stage 0)")
    row, col, gh, gw = 1, 26, 28, 28
    _click_patch(page, overlay, row, col, gh, gw)
    expect(overlay.locator(".gtitle")).to_contain_text(f"cell (row {row}, col {col})")
    wait_idle(page)
    assert_no_exception(page, "Swin patch click")
    expect(page.get_by_label(re.compile(r"Query patch \(row-major"))).to_have_value(str(row * gw + col))
    drawn = page.evaluate(
        """() => {
            const plot = document.querySelector('[data-testid="stPlotlyChart"] .js-plotly-plot');
            const heatmap = plot._fullData.find(t => t.type === 'heatmap');
            return {
                shapes: (plot._fullLayout.shapes || []).filter(s => s.name === 'query window')
                        .map(s => [s.x0, s.y0, s.x1, s.y1]),
                z: Array.from(heatmap.z, r => Array.from(r)),
                dx: heatmap.dx,
            };
        }"""
    )
    expected = _window_cells_by_hand((gh, gw), (7, 7), (3, 3), (row, col))
    assert len(drawn["shapes"]) == 4, drawn["shapes"]  # rows 24-27 and 0-2, the same columns: 4 pieces
    stride = 4
    covered = sorted(
        (r, c)
        for x0, y0, x1, y1 in drawn["shapes"]
        for r in range(int(y0) // stride, int(y1) // stride)
        for c in range(int(x0) // stride, int(x1) // stride)
    )
    assert covered == sorted(expected)
    z = np.asarray(drawn["z"], dtype=np.float64)
    assert z.shape == (gh, gw) and drawn["dx"] == stride
    inside = np.zeros((gh, gw), bool)
    for r, c in expected:
        inside[r, c] = True
    assert np.all(z[~inside] == 0) and z[inside].sum() > 0.99
    page.screenshot(path=str(artifacts / "swin_window_outline.png"))

    # the instant view (the served windowed file): the pinned cell's window drawn with the chart's
    # colours (within one step), nothing outside it; hovering another cell draws that cell's window
    from analysis.plots import colour_range

    frame = attention_view_frame(page)
    frame.wait_for_function(f"() => window.attentionView.shown?.patch === {row * gw + col}")
    colorscale = page.get_by_role("combobox", name="Colour scale").input_value()
    pixels = np.asarray(
        frame.evaluate(
            f"() => Array.from(document.getElementById('map').getContext('2d').getImageData(0, 0, {gw}, {gh}).data)"
        ),
        np.uint8,
    ).reshape(gh, gw, 4)
    assert np.all(pixels[..., 3][inside] == 255) and np.all(pixels[..., 3][~inside] == 0)
    lo, hi, _ = colour_range("robust", z, uniform=1 / 49, inside=inside)  # the quantile of the window's cells
    assert_within_one_colour_step(
        np.where(inside[..., None], pixels[..., :3], colour_lut_rgb(colorscale, 0.0, lo, hi)),
        z,
        colorscale,
        lo,
        hi,
        "the view's window",
    )
    other = (gh // 2) * gw + 3
    page.mouse.move(*view_patch_position(page, frame, other, (gh, gw)))
    frame.wait_for_function(f"() => window.attentionView.shown?.patch === {other}")
    alpha = np.asarray(
        frame.evaluate(
            f"() => Array.from(document.getElementById('map').getContext('2d').getImageData(0, 0, {gw}, {gh}).data)"
        ),
        np.uint8,
    ).reshape(gh, gw, 4)[..., 3]
    assert sorted(zip(*np.nonzero(alpha))) == sorted(_window_cells_by_hand((gh, gw), (7, 7), (3, 3), divmod(other, gw)))


# --------------------------------------------------------------------------- the instant attention view (issue 28)


def attention_view_frame(page):
    """The instant view's iframe (a Frame), once it has drawn a map."""
    page.wait_for_selector("iframe[title*='attention_view']", timeout=60_000)
    for _ in range(100):
        frame = next((f for f in page.frames if "attention_view" in f.url), None)
        if frame is not None:
            break
        page.wait_for_timeout(100)
    frame.wait_for_function("() => window.attentionView && window.attentionView.shown", timeout=60_000)
    return frame


def view_patch_position(page, frame, patch: int, grid: tuple[int, int]) -> tuple[float, float]:
    """Page coordinates of the centre of ``patch`` on the view's map canvas."""
    iframe = page.locator("iframe[title*='attention_view']").first
    iframe.scroll_into_view_if_needed()
    outer = iframe.bounding_box()
    inner = frame.evaluate(
        "() => { const b = document.getElementById('map').getBoundingClientRect();"
        " return {x: b.left, y: b.top, width: b.width, height: b.height}; }"
    )
    gh, gw = grid
    row, col = divmod(patch, gw)
    return (
        outer["x"] + inner["x"] + inner["width"] * (col + 0.5) / gw,
        outer["y"] + inner["y"] + inner["height"] * (row + 0.5) / gh,
    )


def canvas_rgb(frame, grid: tuple[int, int], element_id: str = "map") -> np.ndarray:
    """``(gh, gw, 3)`` uint8: the view's map canvas (a panel's: ``map-<i>``), one pixel per patch."""
    gh, gw = grid
    data = frame.evaluate(f"""() => Array.from(document.getElementById('{element_id}').getContext('2d')
                                .getImageData(0, 0, {gw}, {gh}).data)""")
    return np.asarray(data, dtype=np.uint8).reshape(gh, gw, 4)[..., :3]


def assert_within_one_colour_step(
    drawn: np.ndarray, values: np.ndarray, colorscale: str, lo: float, hi: float, what: str
) -> None:
    """Every drawn pixel is the scale's colour of its value (``colorize``'s index), or a neighbour."""
    from analysis.plots import colour_lut

    lut = colour_lut(colorscale).astype(int)  # (256, 3)
    index = np.clip(np.rint((values - lo) / (hi - lo) * 255), 0, 255).astype(int)
    for (r, c), i in np.ndenumerate(index):
        near = [lut[j] for j in (i - 1, i, i + 1) if 0 <= j <= 255]
        assert any((drawn[r, c] == colour).all() for colour in near), (
            f"{what}: patch ({r}, {c}) drawn {drawn[r, c].tolist()}, expected ≈ {lut[i].tolist()} (index {i})"
        )


def decoded_matrix(record, layer: int, head: int) -> np.ndarray:
    """``(T, T)``: one head's full matrix (``head = heads``: the mean) as the page decodes it, each
    query's row over every key, prefix keys first (``attention_rows(keys="all")``, quantised as sent)."""
    import analysis
    from analysis.plots import quantise_maps

    full = analysis.attention_rows(record, layer, keys="all")[0, head].numpy()  # (T, T)
    P = record.spec.num_prefix_tokens
    prefix = quantise_maps(full[:, :P].ravel()).decoded().reshape(-1, P) if P else full[:, :0]
    return np.concatenate([prefix, quantise_maps(full[:, P:]).decoded()], axis=1)


def matrix_rgb(frame, tokens: int) -> np.ndarray:
    """``(T, T, 3)`` uint8: the view's T×T matrix canvas, one pixel per (query, key)."""
    data = frame.evaluate(
        f"() => Array.from(document.getElementById('matrix').getContext('2d')"
        f".getImageData(0, 0, {tokens}, {tokens}).data)"
    )
    return np.asarray(data, np.uint8).reshape(tokens, tokens, 4)[..., :3]


def _demo_inputs():
    """``(vit, pixels)``: the bundled demo model and the app's first sample, as the server shows them."""
    import analysis
    from streamlit_server import DEMO_PRESENT

    if not DEMO_PRESENT:
        pytest.skip("the pixel check needs the bundled demo model (the server's random fallback has other weights)")
    samples = sorted((REPO / "assets" / "samples").iterdir(), key=lambda p: (not p.name.startswith("scene_"), p.name))
    image = analysis.load_image(next(p for p in samples if p.suffix.lower() in (".png", ".jpg", ".jpeg")))
    vit = analysis.load_vit("demo")
    return vit, vit.preprocess(image)


def _demo_record():
    import analysis

    return analysis.capture_attention(*_demo_inputs())


def test_hovering_the_attention_view_draws_each_patchs_map_in_the_browser(page, server, artifacts):
    """Hover two patches: the canvas shows, cell for cell, the colours of ``attention_map`` for
    those queries after quantisation (within one colour step), with no rerun; the column toggle
    shows who looks at the hovered patch; ↓ draws the previous layer's map from the page's data
    and the layer slider follows; a click makes the patch the page's query."""
    from playwright.sync_api import expect

    import analysis
    from analysis.plots import colour_range, quantise_maps

    record = _demo_record()
    spec = record.spec
    page.goto(server)
    wait_idle(page)
    frame = attention_view_frame(page)
    colorscale = page.get_by_role("combobox", name="Colour scale").input_value()
    layer, grid, uniform = (
        spec.num_layers - 1,
        spec.grid_size,
        1 / spec.num_tokens,
    )  # the default view: last layer, mean
    gh, gw = grid
    reruns = page.evaluate("() => performance.getEntriesByType('resource').length")
    for patch in (0, gh * gw - gw // 2 - 2):
        page.mouse.move(*view_patch_position(page, frame, patch, grid))
        frame.wait_for_function(
            f"() => window.attentionView.shown?.patch === {patch} && window.attentionView.hover === {patch}"
        )
        exact = analysis.attention_map(record, layer, head=None, query=patch)[0].numpy()
        decoded = quantise_maps(exact.ravel()).decoded().reshape(grid)
        lo, hi, _ = colour_range("robust", decoded, uniform=uniform)
        assert_within_one_colour_step(canvas_rgb(frame, grid), decoded, colorscale, lo, hi, f"row of patch {patch}")
        assert frame.evaluate("() => window.attentionView.shown?.hi") == pytest.approx(hi, rel=1e-5)
    frame.locator("#mode").click()
    key = gh * gw // 2
    page.mouse.move(*view_patch_position(page, frame, key, grid))
    frame.wait_for_function(
        f"() => window.attentionView.shown?.patch === {key} && window.attentionView.shown?.mode === 'col'"
    )
    column = analysis.attention_rows(record, layer)[0, spec.num_heads, spec.num_prefix_tokens :, key].numpy()
    decoded = quantise_maps(column).decoded().reshape(grid)
    lo, hi, _ = colour_range("robust", decoded, uniform=uniform)
    assert_within_one_colour_step(canvas_rgb(frame, grid), decoded, colorscale, lo, hi, f"column of patch {key}")
    # the T×T matrix, from the served file (its prefix keys after the rows and columns)
    frame.locator("#matrix-toggle").click()
    frame.wait_for_function(
        f"() => window.attentionView.matrixShown && window.attentionView.matrixShown.layer === {layer}"
    )
    decoded = decoded_matrix(record, layer, spec.num_heads)
    lo, hi, _ = colour_range("robust", decoded, uniform=uniform)
    assert_within_one_colour_step(
        matrix_rgb(frame, spec.num_tokens), decoded, colorscale, lo, hi, "T×T matrix (served)"
    )
    page.screenshot(path=str(artifacts / "attention_view_matrix.png"))
    frame.locator("#matrix-toggle").click()
    page.screenshot(path=str(artifacts / "attention_view_hover.png"))
    assert page.evaluate("() => performance.getEntriesByType('resource').length") == reruns  # nothing was fetched
    assert page.get_by_role("radio", name="class token").is_checked()  # hovering changed nothing on the server

    # arrow keys step the head (←/→) and the layer (↑/↓) in the browser: the new layer's map is
    # drawn from the data already in the page, then the page's layer slider follows
    frame.locator("#mode").click()
    frame.locator("#stage").focus()
    frame.locator("#stage").press("ArrowRight")  # mean over heads -> head 0
    frame.wait_for_function("() => window.attentionView.shown?.head === 0")
    assert spec.num_layers >= 2
    new_layer = layer - 1
    fetched = page.evaluate("() => performance.getEntriesByType('resource').length")
    frame.locator("#stage").press("ArrowDown")
    frame.wait_for_function(
        f"() => window.attentionView.shown?.layer === {new_layer} && window.attentionView.shown?.mode === 'row'"
    )
    assert frame.evaluate("() => [window.attentionView.hover, window.attentionView.pinnedRow]") == [None, 0]
    exact = analysis.attention_map(record, new_layer, head=0, query="cls")[0].numpy()  # the page's query
    decoded = quantise_maps(exact.ravel()).decoded().reshape(grid)
    lo, hi, _ = colour_range("robust", decoded, uniform=uniform)
    assert_within_one_colour_step(canvas_rgb(frame, grid), decoded, colorscale, lo, hi, f"layer {new_layer}, head 0")
    assert frame.evaluate("() => window.attentionView.shown?.hi") == pytest.approx(hi, rel=1e-5)
    assert (
        page.evaluate("() => performance.getEntriesByType('resource').length") == fetched
    )  # drawn from the page's data
    layer_slider = page.locator("[data-testid='stSlider']", has_text="Layer (block index)").get_by_role("slider")
    expect(layer_slider).to_have_value(str(new_layer), timeout=30_000)  # the page follows
    wait_idle(page)
    frame = attention_view_frame(page)
    layer = new_layer

    # a click pins the patch and the page follows (head and layer too)
    patch = gw + 1
    page.mouse.click(*view_patch_position(page, frame, patch, grid))
    row, col = divmod(patch, gw)
    expect(page.get_by_label(re.compile(r"Query patch \(row-major"))).to_have_value(str(patch), timeout=30_000)
    expect(page.locator("[data-testid='stPlotlyChart']").first.locator(".gtitle")).to_contain_text(
        f"Layer {layer} · head 0 · query: patch {patch} (row {row}, col {col})", timeout=30_000
    )
    page.wait_for_function(f"() => location.search.includes('patch={patch}')", timeout=20_000)
    wait_idle(page)
    frame = attention_view_frame(page)
    frame.wait_for_function(f"() => window.attentionView.pinnedPatch === {patch}")
    assert_no_exception(page, "attention view click")


def test_hovering_the_rollout_pages_view_draws_each_patchs_rollout(page, server, artifacts):
    """The Rollout page's instant view: the hovered patch's rollout (``attention_rollout`` of that
    query after quantisation, within one colour step), and ↓ rolls out one layer fewer."""
    import analysis
    from analysis.plots import colour_range, quantise_maps

    record = _demo_record()
    spec = record.spec
    page.goto(server)
    wait_idle(page)
    _nav(page, "Rollout")
    wait_idle(page)
    frame = attention_view_frame(page)
    colorscale = page.get_by_role("combobox", name="Colour scale").input_value()
    args = frame.evaluate("() => window.attentionView.args")
    fusion, discard = re.fullmatch(r"(\w+) fusion, discard ([\d.]+)", args["head_names"][0]).groups()
    start, grid, uniform = args["layers"][0], spec.grid_size, 1 / spec.num_tokens
    gh, gw = grid
    patch = gh * gw - 2
    page.mouse.move(*view_patch_position(page, frame, patch, grid))
    for end in (spec.num_layers - 1, spec.num_layers - 2):
        if end != spec.num_layers - 1:
            frame.locator("#stage").press("ArrowDown")
        frame.wait_for_function(
            f"() => window.attentionView.shown?.patch === {patch} && window.attentionView.shown?.layer === {end}"
        )
        exact = analysis.attention_rollout(
            record, head_fusion=fusion, discard_ratio=float(discard), start_layer=start, end_layer=end, query=patch
        )[0].numpy()
        decoded = quantise_maps(exact.ravel()).decoded().reshape(grid)
        lo, hi, _ = colour_range("robust", decoded, uniform=uniform)
        assert_within_one_colour_step(canvas_rgb(frame, grid), decoded, colorscale, lo, hi, f"rollout to {end}")
        assert f"Rollout layers {start} to {end}" in frame.locator("#title").text_content()
    page.screenshot(path=str(artifacts / "rollout_view_hover.png"))
    assert_no_exception(page, "rollout view")


# --------------------------------------------------------------------------- the view's page on its own (no server)


def _grey_png_uri(size: tuple[int, int]) -> str:
    import base64
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (size[1], size[0]), (128, 128, 128)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


@pytest.fixture
def static_browser(chromium):
    """A Chromium page with no network, for the view's own page inlined as the report inlines it."""
    context = chromium.new_context(offline=True, viewport={"width": 1280, "height": 1400})
    tab = context.new_page()
    tab.set_default_timeout(30_000)
    tab.errors = []
    tab.on("pageerror", lambda error: tab.errors.append(str(error)))
    yield tab
    context.close()


def open_static_view(tab, folder: Path, args: dict):
    """Write ``analysis.views.attention_view.embed(args)`` to a file, open it; returns ``(iframe locator, frame)``."""
    from analysis.views.attention_view import embed

    path = folder / "view.html"
    path.write_text(f"<!doctype html><html><body>{embed(args)}</body></html>", encoding="utf-8")
    tab.goto(path.as_uri(), wait_until="load")
    iframe = tab.locator("iframe.attention-view").first
    frame = iframe.element_handle().content_frame()
    frame.wait_for_function("() => window.attentionView && window.attentionView.shown", timeout=30_000)
    return iframe, frame


def element_point(tab, iframe, frame, element_id: str, row: float, col: float, rows: int, cols: int):
    """Page coordinates of cell ``(row, col)`` of a ``rows × cols`` grid drawn on ``element_id``."""
    outer = iframe.bounding_box()
    box = frame.evaluate(
        f"() => {{ const b = document.getElementById('{element_id}').getBoundingClientRect();"
        " return [b.left, b.top, b.width, b.height]; }"
    )
    return outer["x"] + box[0] + box[2] * (col + 0.5) / cols, outer["y"] + box[1] + box[3] * (row + 0.5) / rows


def test_the_views_robust_range_leaves_outliers_out_and_outlines_the_clipped_cells(static_browser, tmp_path):
    """The view's "robust" range is ``analysis.plots.colour_range("robust", ...)`` of the decoded map
    (the 99th percentile without the ``left_out`` outlier tokens): the same top, the same colours
    within one step, one dotted box over exactly each cell above the top, and the colour bar
    saying so; ``hide_left_out`` draws the outlier cells blank."""
    import analysis
    from analysis.plots import colour_range, quantise_maps
    from analysis.views.attention_view import view_args, view_data
    from conftest import make_vit
    from planted import PLANTED, plant_artifacts

    vit = plant_artifacts(make_vit("class_token", img_size=160))
    record = analysis.capture_attention(vit, torch_pixels(vit))
    spec = record.spec
    grid, layer, uniform, scale = spec.grid_size, spec.num_layers - 1, 1 / spec.num_tokens, "Viridis"
    args = view_args(
        data=view_data(record, range(spec.num_layers)),
        image_uri=_grey_png_uri(spec.img_size),
        spec=spec,
        layer=layer,
        head="mean",
        query="cls",
        colorscale=scale,
        map_range="robust",
        opacity=1.0,
        left_out=PLANTED,
    )
    iframe, frame = open_static_view(static_browser, tmp_path, args)
    exact = analysis.attention_map(record, layer, head=None, query="cls")[0].numpy()
    decoded = quantise_maps(exact.ravel()).decoded().reshape(grid)
    lo, hi, label = colour_range("robust", decoded, uniform=uniform, left_out=PLANTED)
    assert frame.evaluate("() => window.attentionView.shown?.hi") == pytest.approx(hi, rel=1e-5)
    assert_within_one_colour_step(canvas_rgb(frame, grid), np.minimum(decoded, hi), scale, lo, hi, "robust range")
    boxes = frame.evaluate("""() => Array.from(document.querySelectorAll('#clip-boxes .clip-box'), b =>
                                 [parseFloat(b.style.top), parseFloat(b.style.left)])""")
    gh, gw = grid
    clipped = sorted(np.flatnonzero(decoded.ravel() > hi).tolist())
    assert clipped == sorted(PLANTED)
    assert sorted(round(top * gh / 100) * gw + round(left * gw / 100) for top, left in boxes) == clipped
    title = frame.locator("#bar-title").text_content()
    assert "top without 3 outlier tokens" in title and "3 cells above" in title and label.split(": ", 1)[0] in title

    hidden = dict(args, hide_left_out=True)
    _, frame = open_static_view(static_browser, tmp_path, hidden)
    alpha = np.asarray(
        frame.evaluate(
            f"() => Array.from(document.getElementById('map').getContext('2d').getImageData(0, 0, {gw}, {gh}).data)"
        ),
        np.uint8,
    ).reshape(gh, gw, 4)[..., 3]
    assert sorted(np.flatnonzero(alpha.ravel() == 0).tolist()) == sorted(PLANTED)
    assert static_browser.errors == []


def torch_pixels(vit, seed: int = 3):
    import torch

    height, width = vit.spec.img_size
    return torch.randn(1, 3, height, width, generator=torch.Generator().manual_seed(seed))


def test_the_txt_matrix_names_the_prefix_tokens_and_hovering_it_draws_that_row_on_the_image(static_browser, tmp_path):
    """The bertviz-style matrix of a model with registers: every prefix token named on both axes
    (``spec.token_names``), the matrix's pixels the colours of ``attention_rows(keys="all")`` after
    the page's quantisation, and hovering a row (a register's, a patch's) or a column draws on the
    image canvas ``attention_map`` of that query (its column) within one colour step."""
    import analysis
    from analysis.plots import colour_range, quantise_maps
    from analysis.views.attention_view import view_args, view_data
    from families import family_pixels, load_family

    record = analysis.capture_attention(load_family("dinov2_registers"), family_pixels("dinov2_registers", batch=1))
    spec = record.spec
    T, P, grid, layer = spec.num_tokens, spec.num_prefix_tokens, spec.grid_size, spec.num_layers - 1
    assert P == 5 and spec.token_names[1:] == ("register 1", "register 2", "register 3", "register 4")
    uniform, scale = 1 / T, "Viridis"
    args = view_args(
        data=view_data(record, range(spec.num_layers)),
        image_uri=_grey_png_uri(spec.img_size),
        spec=spec,
        layer=layer,
        head=1,
        query="cls",
        colorscale=scale,
        map_range="zero",
        opacity=1.0,
    )
    iframe, frame = open_static_view(static_browser, tmp_path, args)
    frame.locator("#matrix-toggle").click()
    frame.wait_for_function("() => window.attentionView.matrixShown && window.attentionView.matrixShown.head === 1")
    for kind in ("query", "key"):
        names = frame.eval_on_selector_all(
            f".axis-label.{kind}[data-token]", "els => els.map(e => [+e.dataset.token, e.textContent])"
        )
        assert names == [[i, name] for i, name in enumerate(spec.token_names)], kind

    decoded = decoded_matrix(record, layer, 1)
    lo, hi, _ = colour_range("zero", decoded, uniform=uniform)
    assert_within_one_colour_step(matrix_rgb(frame, T), decoded, scale, lo, hi, "T×T matrix")
    assert frame.evaluate("() => window.attentionView.matrixShown.hi") == pytest.approx(hi, rel=1e-5)
    assert f": 0–{hi:.3g}; uniform" in frame.locator("#matrix-bar-title").text_content()  # the range, stated

    # hovering a row draws that query's map on the image: a register, then a patch
    for token, query in ((2, "prefix:2"), (P + 5, 5)):
        static_browser.mouse.move(*element_point(static_browser, iframe, frame, "matrix", token, 3, T, T))
        frame.wait_for_function(f"() => window.attentionView.shown?.row === {token}")
        exact = analysis.attention_map(record, layer, head=1, query=query)[0].numpy()
        expected = quantise_maps(exact.ravel()).decoded().reshape(grid)
        lo, hi, _ = colour_range("zero", expected, uniform=uniform)
        assert_within_one_colour_step(canvas_rgb(frame, grid), expected, scale, lo, hi, f"row of token {token}")
        assert frame.evaluate("() => window.attentionView.matrixCell") == {"q": token, "k": 3}
        assert f"key {spec.token_names[3]} token" in frame.locator("#status").text_content()

    # the column toggle: hovering a patch key's column draws who looks at that patch
    frame.locator("#mode").click()
    key = spec.num_patches - 2
    static_browser.mouse.move(*element_point(static_browser, iframe, frame, "matrix", 0, P + key, T, T))
    frame.wait_for_function(
        f"() => window.attentionView.shown && window.attentionView.shown?.patch === {key}"
        " && window.attentionView.shown?.mode === 'col'"
    )
    column = analysis.attention_rows(record, layer)[0, 1, P:, key].numpy()
    expected = quantise_maps(column).decoded().reshape(grid)
    lo, hi, _ = colour_range("zero", expected, uniform=uniform)
    assert_within_one_colour_step(canvas_rgb(frame, grid), expected, scale, lo, hi, f"column of patch {key}")
    # a prefix key has no column on the image: nothing is drawn, and the status says why
    static_browser.mouse.move(*element_point(static_browser, iframe, frame, "matrix", 7, 1, T, T))
    frame.wait_for_function("() => window.attentionView.shown === null")
    assert "prefix key" in frame.locator("#status").text_content()
    assert static_browser.errors == []


def _panel_point(page, frame, panel: int, patch: int, grid: tuple[int, int]) -> tuple[float, float]:
    iframe = page.locator("iframe[title*='attention_view']").first
    iframe.scroll_into_view_if_needed()
    return element_point(page, iframe, frame, "map" if panel == 0 else f"map-{panel}", *divmod(patch, grid[1]), *grid)


def test_the_compare_pages_view_draws_every_layer_of_the_hovered_patch_on_one_scale(page, server, artifacts):
    """Compare layers: the view's panels are the chosen layers; hovering a patch in any panel draws
    in every panel ``attention_map`` of that query (after quantisation, within one colour step) on
    one colour scale over the panels; a click makes it the page's query and the chart follows."""
    from playwright.sync_api import expect

    import analysis
    from analysis.plots import colour_range, quantise_maps

    record = _demo_record()
    spec = record.spec
    page.goto(server)
    wait_idle(page)
    _nav(page, "Compare layers")
    wait_idle(page)
    frame = attention_view_frame(page)
    colorscale = page.get_by_role("combobox", name="Colour scale").input_value()
    layers, grid = frame.evaluate("() => window.attentionView.args.panels"), spec.grid_size
    assert len(layers) >= 2 and frame.locator(".panel-label").all_text_contents() == [
        f"layer {layer}" for layer in layers
    ]
    gh, gw = grid
    patch = gh * gw - gw - 3
    page.mouse.move(*_panel_point(page, frame, 1, patch, grid))
    frame.wait_for_function(f"() => window.attentionView.shown && window.attentionView.shown?.patch === {patch}")
    decoded = [
        quantise_maps(analysis.attention_map(record, layer, head=None, query=patch)[0].numpy().ravel()).decoded()
        for layer in layers
    ]
    lo, hi, _ = colour_range("robust", np.concatenate(decoded), uniform=1 / spec.num_tokens)
    for panel, (layer, values) in enumerate(zip(layers, decoded)):
        assert_within_one_colour_step(
            canvas_rgb(frame, grid, "map" if panel == 0 else f"map-{panel}"),
            values.reshape(grid),
            colorscale,
            lo,
            hi,
            f"layer {layer}",
        )
    assert frame.evaluate("() => window.attentionView.shown?.hi") == pytest.approx(hi, rel=1e-5)
    page.screenshot(path=str(artifacts / "compare_view_hover.png"))
    # a click pins the patch; the page's query and the chart follow
    page.mouse.click(*_panel_point(page, frame, 0, patch, grid))
    expect(page.get_by_label(re.compile(r"Query patch \(row-major"))).to_have_value(str(patch), timeout=30_000)
    row, col = divmod(patch, gw)
    expect(page.get_by_text(f"query: patch {patch} (row {row}, col {col})").first).to_be_visible(timeout=30_000)
    wait_idle(page)
    frame = attention_view_frame(page)
    frame.wait_for_function(
        f"() => window.attentionView.pinnedPatch === {patch} && window.attentionView.args.query_patch === {patch}"
    )
    assert_no_exception(page, "compare view")


def test_the_tokens_pages_view_draws_each_patchs_similarity(page, server, artifacts):
    """Tokens: hovering a patch draws its cosine similarity to every patch (``patch_similarity``
    after quantisation, on the fixed −1..1 scale, within one colour step); a click makes it the
    query and the similarity section follows."""
    from playwright.sync_api import expect

    import analysis
    from analysis.plots import quantise_maps

    vit, pixels = _demo_inputs()
    spec = vit.spec
    page.goto(server + "/tokens")
    wait_idle(page)
    frame = attention_view_frame(page)
    colorscale = page.get_by_role("combobox", name="Colour scale").input_value()
    args = frame.evaluate("() => window.attentionView.args")
    (layer,), grid = args["layers"], spec.grid_size
    assert args["head_names"] == ["block outputs"] and args["range_mode"] == "fixed"
    tokens = analysis.capture_tokens(vit, pixels, kind="token").layer_tokens(layer)  # (1, T, D)
    gh, gw = grid
    for patch in (0, gh * gw // 2 + 1):
        page.mouse.move(*view_patch_position(page, frame, patch, grid))
        frame.wait_for_function(f"() => window.attentionView.shown?.patch === {patch}")
        exact = analysis.patch_similarity(tokens, spec, patch).numpy()
        decoded = quantise_maps(exact.ravel()).decoded().reshape(grid)
        assert_within_one_colour_step(canvas_rgb(frame, grid), decoded, colorscale, -1.0, 1.0, f"similarity of {patch}")
    assert "cosine similarity (fixed: -1–1)" in frame.locator("#bar-title").text_content()
    assert not frame.locator("#mode").is_visible()  # no "who looks at" for similarities
    page.screenshot(path=str(artifacts / "tokens_view_hover.png"))
    page.mouse.click(*view_patch_position(page, frame, patch, grid))
    row, col = divmod(patch, gw)
    expect(page.locator("h3", has_text=f"similarity to the patch {patch} (row {row}, col {col})").first).to_be_visible(
        timeout=30_000
    )
    wait_idle(page)
    assert_no_exception(page, "tokens view")


@pytest.mark.parametrize("family, layer", [("swin", 1), ("sam", 0)])
def test_a_windowed_layer_in_the_view_draws_the_hovered_cells_window_only(static_browser, tmp_path, family, layer):
    """A windowed layer (Swin with its shifted windows wrapping the border; SAM with windows padded
    past the grid): hovering a cell draws ``attention_map`` of that cell on the layer's grid within
    one colour step inside the cell's window, and nothing (transparent) outside it; the pinned
    "mean" query draws the whole grid. The data: ``attention_view_blob`` of the windowed record."""
    import base64

    import analysis
    from analysis.plots import colour_range
    from analysis.views.attention_view import attention_view_args, attention_view_blob
    from windowed_models import small_pixels, small_sam, small_swin

    vit = small_swin() if family == "swin" else small_sam()
    record = analysis.capture_attention(vit, small_pixels()[:1])
    spec, geometry = record.spec, record.spec.geometry(layer)
    assert not geometry.is_global
    grid, scale = geometry.grid_size, "Viridis"
    blob, meta = attention_view_blob(record, [layer])
    args = attention_view_args(
        data={**meta, "data_b64": base64.b64encode(blob).decode("ascii")},
        image_uri=_grey_png_uri(spec.img_size),
        spec=spec,
        layer=layer,
        head="mean",
        query="mean",
        colorscale=scale,
        map_range="zero",
        opacity=1.0,
    )
    iframe, frame = open_static_view(static_browser, tmp_path, args)

    def drawn() -> np.ndarray:  # (gh, gw, 4) RGBA
        data = frame.evaluate(
            f"() => Array.from(document.getElementById('map').getContext('2d')"
            f".getImageData(0, 0, {grid[1]}, {grid[0]}).data)"
        )
        return np.asarray(data, np.uint8).reshape(*grid, 4)

    uniform = 1 / geometry.window_tokens
    mean = analysis.attention_map(record, layer, head=None, query="mean")[0].numpy()
    lo, hi, _ = colour_range("zero", mean, uniform=uniform)
    assert np.all(drawn()[..., 3] == 255)
    assert_within_one_colour_step(drawn()[..., :3], mean, scale, lo, hi, "mean over cells")
    gh, gw = grid
    for cell in (0, gh * gw - 1, (gh // 2) * gw + gw // 2 - 1):  # corners wrap (Swin) or meet the padding (SAM)
        static_browser.mouse.move(*element_point(static_browser, iframe, frame, "map", *divmod(cell, gw), gh, gw))
        frame.wait_for_function(f"() => window.attentionView.shown && window.attentionView.shown?.patch === {cell}")
        exact = analysis.attention_map(record, layer, head=None, query=cell)[0].numpy()  # (gh, gw), 0 outside
        inside = np.zeros(grid, bool)
        for r, c in _window_cells_by_hand(grid, geometry.window_size, geometry.shift, divmod(cell, gw)):
            inside[r, c] = True
        assert np.all(exact[~inside] == 0)
        pixels = drawn()
        assert np.all(pixels[..., 3][inside] == 255) and np.all(pixels[..., 3][~inside] == 0), f"cell {cell}: window"
        lo, hi, _ = colour_range("zero", exact, uniform=uniform)
        values = np.where(inside, exact, lo)
        shown = np.where(inside[..., None], pixels[..., :3], colour_lut_rgb(scale, lo, lo, hi))
        assert_within_one_colour_step(shown, values, scale, lo, hi, f"cell {cell}")
        assert frame.evaluate("() => window.attentionView.shown?.hi") == pytest.approx(hi, rel=1e-5)
    assert static_browser.errors == []


def colour_lut_rgb(scale: str, value: float, lo: float, hi: float) -> np.ndarray:
    """The scale's colour of ``value`` on ``lo..hi`` (``colorize``'s index)."""
    from analysis.plots import colour_lut

    return colour_lut(scale)[int(np.clip(np.rint((value - lo) / (hi - lo) * 255), 0, 255))]


def test_a_layer_step_fetches_a_layer_the_page_does_not_hold(chromium, artifacts):
    """With ``VIZAPP_VIEW_MB`` under all layers of a random ViT-S/16 (0.5 MiB a layer, 6 MiB in
    all, 1 MiB allowed) the page holds only the shown layer: ↓ says it is loading, asks the server,
    and once the new layer's file arrives draws its map, the colours of the page's own chart of
    that layer (the server's ``attention_map``) within one colour step."""
    from playwright.sync_api import expect

    from analysis.plots import colour_range

    model, tokens = model_folder("vit_small_patch16_224", embed_dim=48), 197  # 12 layers of 6 heads, narrow
    with streamlit_server(artifacts / "streamlit_view_mb.log", extra_env={"VIZAPP_VIEW_MB": "1"}) as (url, _process):
        context = chromium.new_context(viewport={"width": 1440, "height": 1100})
        page = context.new_page()
        page.set_default_timeout(90_000)
        try:
            page.goto(f"{url}/?model={model}")
            wait_idle(page)
            frame = attention_view_frame(page)
            args = frame.evaluate("() => window.attentionView.args")
            last, grid = args["num_layers"] - 1, tuple(args["grid"])
            assert args["layers"] == [last] and "Only this layer is in the page" in args["note"]
            colorscale = page.get_by_role("combobox", name="Colour scale").input_value()
            frame.locator("#stage").focus()
            frame.locator("#stage").press("ArrowDown")
            frame.wait_for_function(f"() => window.attentionView.layer === {last - 1}", timeout=5_000)
            layer_slider = page.locator("[data-testid='stSlider']", has_text="Layer (block index)").get_by_role(
                "slider"
            )
            expect(layer_slider).to_have_value(str(last - 1), timeout=60_000)  # the server heard the step
            wait_idle(page)
            frame = attention_view_frame(page)
            frame.wait_for_function(
                f"() => window.attentionView.shown && window.attentionView.shown?.layer === {last - 1}"
                f" && window.attentionView.layers.length === 1 && window.attentionView.layers[0] === {last - 1}",
                timeout=60_000,
            )
            fetched = frame.evaluate(
                "() => performance.getEntriesByType('resource').map(e => e.name).filter(n => n.endsWith('.bin'))"
            )
            assert len(set(fetched)) == 2, fetched  # the first layer's file, then the new one's
            chart = page.locator("[data-testid='stPlotlyChart']").first
            expect(chart.locator(".gtitle")).to_contain_text(f"Layer {last - 1} · mean over heads · query: class token")
            z = np.asarray(
                page.evaluate(
                    """() => { const plot = document.querySelector('[data-testid="stPlotlyChart"] .js-plotly-plot');
                           return Array.from(plot._fullData.find(t => t.type === 'heatmap').z, r => Array.from(r)); }"""
                ),
                np.float64,
            )
            assert z.shape == grid
            lo, hi, _ = colour_range("robust", z, uniform=1 / tokens)
            assert_within_one_colour_step(canvas_rgb(frame, grid), z, colorscale, lo, hi, f"fetched layer {last - 1}")
            page.screenshot(path=str(artifacts / "attention_view_fetched_layer.png"))
            assert_no_exception(page, "a fetched layer")
        finally:
            context.close()
