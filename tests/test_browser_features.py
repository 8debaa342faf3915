"""The Features page in a real browser (Chromium via Playwright, the fixtures of
``tests/test_browser.py``): a click on a patch makes it the chosen patch, and the list of the
features firing on it is the library's (``analysis.sae.patch_feature_grid``), most active first."""

from __future__ import annotations

import re

import pytest

from streamlit_server import CHROMIUM, REPO
from test_browser import _click_patch, artifacts, assert_no_exception, chromium, page, server, wait_idle  # noqa: F401 - fixtures

pytestmark = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian Chromium not installed at /usr/bin/chromium"),
    pytest.mark.skipif(
        not (REPO / "assets" / "demo_sae" / "cfg.json").is_file(), reason="needs the bundled demo SAE (assets/demo_sae)"
    ),
]


def test_a_click_on_a_patch_lists_the_features_that_fire_on_it(page, server, artifacts):
    from playwright.sync_api import expect

    import analysis
    from analysis.sae import load_demo_sae, patch_feature_grid
    from test_app import first_sample

    vit = analysis.load_vit("demo")
    grid = patch_feature_grid(vit, load_demo_sae(), vit.preprocess(analysis.load_image(first_sample())))[0]
    gh, gw = vit.spec.grid_size
    row, col = 2, 5
    patch = row * gw + col
    values = grid[row, col]
    top = int(values.argmax())
    page.goto(server + "/features")
    wait_idle(page)
    expect(page.locator("h2", has_text="Features").first).to_be_visible()
    chart = page.locator("[data-testid='stPlotlyChart']").first
    _click_patch(page, chart, row, col, gh, gw)
    wait_idle(page)
    expect(page.get_by_label(re.compile(r"Patch \(row-major"))).to_have_value(str(patch), timeout=30_000)
    expect(page.get_by_text(f"Features firing on patch {patch}")).to_be_visible(timeout=30_000)
    options = page.locator("[data-testid='stRadio']", has=page.get_by_role("radiogroup", name="Features on this patch"))
    expect(options).to_contain_text(f"feature {top} · {float(values[top]):.3f}")
    firing = int((values > 0).sum())
    expect(options.locator("label", has_text=re.compile(r"^feature \d+ · "))).to_have_count(min(8, firing))
    page.screenshot(path=str(artifacts / "features_after_click.png"), full_page=True)
    assert_no_exception(page, "features after a click")
