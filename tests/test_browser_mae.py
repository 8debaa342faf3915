"""The Masked-autoencoder page in a real browser (Chromium via Playwright, the fixtures of
``tests/test_browser.py``): a click on a visible patch hides it, and the reconstruction the
browser draws changes; a second click on the same patch reveals it again, and the pictures
drawn return to what they were, pixel for pixel."""

from __future__ import annotations

import pytest

from streamlit_server import CHROMIUM, REPO
from test_browser import _click_patch, artifacts, assert_no_exception, chromium, page, server, wait_idle  # noqa: F401 - fixtures

pytestmark = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian Chromium not installed at /usr/bin/chromium"),
    pytest.mark.skipif(
        not (REPO / "assets" / "demo_mae" / "config.json").is_file(),
        reason="needs the bundled demo MAE (assets/demo_mae)",
    ),
]

DRAWN_PANELS = """() => {
    const plot = document.querySelector('[data-testid="stPlotlyChart"] .js-plotly-plot');
    if (!plot) return null;
    return [...plot.querySelectorAll('g.imagelayer image')]
        .map(image => image.getAttribute('href') || image.getAttribute('xlink:href'));
}"""  # the pictures the browser paints: the <image> elements plotly drew, left to right

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
    page.wait_for_function(
        f"() => {{ const s = ({PANEL_SOURCES})(); return s && s[2] !== {before[2]!r}; }}", timeout=30_000
    )
    after = page.evaluate(PANEL_SOURCES)
    assert after[0] == before[0]  # the original is the same picture
    assert after[1] != before[1] and after[2] != before[2] and after[3] != before[3]
    page.screenshot(path=str(artifacts / "mae_after_click.png"), full_page=True)
    # a click on a visible patch of the attention map makes it the query (the map's title says so)
    query = next(p for p in range(gh * gw) if not drawn[p] and p != patch)
    attention = page.locator("[data-testid='stPlotlyChart']").nth(2)
    expect(attention.locator(".gtitle")).to_have_text("query: the class token")
    _click_patch(page, attention, query // gw, query % gw, gh, gw)
    expect(attention.locator(".gtitle")).to_have_text(
        f"query: patch {query} (row {query // gw}, col {query % gw})", timeout=30_000
    )
    assert_no_exception(page, "masked autoencoder after a click")


def _decode(href: str):
    import base64
    import io

    import numpy as np
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(base64.b64decode(href.split(",", 1)[1]))).convert("RGB"))


def _drawn_pictures(page) -> list:
    """The four Figure 2 pictures as the browser drew them, ``(H, W, 3)`` uint8 each."""
    hrefs = page.evaluate(DRAWN_PANELS)
    assert hrefs and len(hrefs) == 4, hrefs
    return [_decode(h) for h in hrefs]


def wait_drawn_changed(page, hrefs: list) -> None:
    """Wait until the reconstruction the browser paints is no longer ``hrefs[2]``."""
    page.wait_for_function(
        f"() => {{ const s = ({DRAWN_PANELS})(); return s && s.length === 4 && s[2] !== {hrefs[2]!r}; }}",
        timeout=30_000,
    )


def test_clicking_one_patch_twice_hides_it_then_reveals_it_and_the_pictures_return(page, server):
    """Two real clicks on the same patch: the first hides it (the masked input goes grey there,
    the reconstruction the browser draws changes and is the library's for that mask), the second
    reveals it, and every drawn picture is again the one of the page's own draw."""
    import numpy as np
    from playwright.sync_api import expect

    import analysis
    from analysis import plots
    from analysis.mae import draw_mask, figure_2_images, load_mae, mae_reconstruct
    from vizapp.inputs import sample_paths

    mae = load_mae("demo_mae", device="cpu")
    gh, gw = mae.spec.grid_size
    ph, pw = mae.spec.patch_size
    drawn = draw_mask(1, gh * gw, 0.75, 0)[0]  # the page's default ratio and seed
    patch = [p for p in range(gh * gw) if not drawn[p]][-1]  # visible at first
    hidden = int(drawn.sum())
    pixels = mae.preprocess(analysis.load_image(sample_paths()[0]))  # the image the app opens on

    def library(mask) -> list:
        result = mae_reconstruct(mae, pixels, mask=mask.unsqueeze(0))
        return [plots.unit_to_uint8(picture) for picture in figure_2_images(result, mae.preprocessing).values()]

    clicked = drawn.clone()
    clicked[patch] = True
    page.goto(server + "/mae")
    wait_idle(page)
    count = page.locator("[data-testid='stMarkdownContainer'] p", has_text="patches hidden (")
    expect(count.first).to_contain_text(f"{hidden} of {gh * gw}")
    hrefs = page.evaluate(DRAWN_PANELS)
    before = _drawn_pictures(page)
    for shown, expected in zip(before, library(drawn)):  # the library's pictures of the page's own draw
        np.testing.assert_array_equal(shown, expected)
    row, col = patch // gw, patch % gw
    box = (slice(row * ph, (row + 1) * ph), slice(col * pw, (col + 1) * pw))

    _click_patch(page, page.locator("[data-testid='stPlotlyChart']").first, row, col, gh, gw, panel=1)
    expect(count.first).to_contain_text(f"{hidden + 1} of {gh * gw}", timeout=30_000)
    wait_idle(page)
    wait_drawn_changed(page, hrefs)
    hidden_hrefs = page.evaluate(DRAWN_PANELS)
    hidden_once = _drawn_pictures(page)
    np.testing.assert_array_equal(hidden_once[0], before[0])  # the original is the same picture
    assert (hidden_once[1][box] == np.array(plots.HIDDEN_GREY)).all()  # the clicked patch is grey in the input
    assert not (before[1][box] == np.array(plots.HIDDEN_GREY)).all()
    assert not np.array_equal(hidden_once[2], before[2])  # the reconstruction changed
    for shown, expected in zip(hidden_once, library(clicked)):
        np.testing.assert_array_equal(shown, expected)

    _click_patch(page, page.locator("[data-testid='stPlotlyChart']").first, row, col, gh, gw, panel=1)
    expect(count.first).to_contain_text(f"{hidden} of {gh * gw}", timeout=30_000)
    wait_idle(page)
    wait_drawn_changed(page, hidden_hrefs)
    revealed = _drawn_pictures(page)
    for name, shown, first in zip(("original", "masked", "reconstruction", "composite"), revealed, before):
        np.testing.assert_array_equal(shown, first, err_msg=name)  # back to the draw's pictures, pixel for pixel
    assert_no_exception(page, "masked autoencoder after two clicks on one patch")
