"""The Masked-autoencoder page in a real browser (Chromium via Playwright, the fixtures of
``tests/test_browser.py``): a click on a visible patch hides it, and the reconstruction the
browser draws changes."""

from __future__ import annotations

import pytest

from streamlit_server import CHROMIUM, REPO
from test_browser import _click_patch, artifacts, assert_no_exception, page, server, wait_idle  # noqa: F401 - fixtures

pytestmark = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian Chromium not installed at /usr/bin/chromium"),
    pytest.mark.skipif(not (REPO / "assets" / "demo_mae" / "config.json").is_file(),
                       reason="needs the bundled demo MAE (assets/demo_mae)"),
]

PANEL_SOURCES = """() => {
    const plot = document.querySelector('[data-testid="stPlotlyChart"] .js-plotly-plot');
    return plot && plot.data ? plot.data.filter(t => t.type === 'image').map(t => t.source) : null;
}"""


def test_a_click_hides_a_patch_and_the_reconstruction_changes(page, server, artifacts):
    from playwright.sync_api import expect

    from analysis.mae import draw_mask, load_mae

    mae = load_mae("demo_mae", device="cpu")
    gh, gw = mae.spec.grid_size
    drawn = draw_mask(1, gh * gw, 0.75, 0)[0]  # the page's default ratio and seed
    patch = next(p for p in range(gh * gw) if not drawn[p])  # visible at first
    hidden = int(drawn.sum())
    page.goto(server + "/mae")
    wait_idle(page)
    expect(page.locator("h2", has_text="Masked autoencoder").first).to_be_visible()
    count = page.locator("[data-testid='stMarkdownContainer'] p", has_text="patches hidden (")
    expect(count.first).to_contain_text(f"{hidden} of {gh * gw}")
    before = page.evaluate(PANEL_SOURCES)
    assert before and len(before) == 4, before  # original, masked, reconstruction, composite
    chart = page.locator("[data-testid='stPlotlyChart']").first
    _click_patch(page, chart, patch // gw, patch % gw, gh, gw, panel=0)
    expect(count.first).to_contain_text(f"{hidden + 1} of {gh * gw}", timeout=30_000)
    wait_idle(page)
    page.wait_for_function(f"() => {{ const s = ({PANEL_SOURCES})(); return s && s[2] !== {before[2]!r}; }}",
                           timeout=30_000)
    after = page.evaluate(PANEL_SOURCES)
    assert after[0] == before[0]  # the original is the same picture
    assert after[1] != before[1] and after[2] != before[2] and after[3] != before[3]
    page.screenshot(path=str(artifacts / "mae_after_click.png"), full_page=True)
    # a click on a visible patch of the attention map makes it the query (the map's title says so)
    query = next(p for p in range(gh * gw) if not drawn[p] and p != patch)
    attention = page.locator("[data-testid='stPlotlyChart']").nth(2)
    expect(attention.locator(".gtitle")).to_have_text("query: the class token")
    _click_patch(page, attention, query // gw, query % gw, gh, gw)
    expect(attention.locator(".gtitle")).to_have_text(f"query: patch {query} (row {query // gw}, col {query % gw})",
                                                      timeout=30_000)
    assert_no_exception(page, "masked autoencoder after a click")
