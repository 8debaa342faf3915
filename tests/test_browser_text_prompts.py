"""The Text prompts page in a real browser (Chromium via Playwright, the fixtures of
``tests/test_browser.py``): typing a prompt redraws its map, the values the browser holds are
the library's map of that prompt, the drawn pixels change; a click on a head of the
decomposition shows that head's map."""

from __future__ import annotations

import io

import numpy as np
import pytest

from streamlit_server import CHROMIUM, REPO
from test_browser import _click_patch, artifacts, assert_no_exception, chromium, page, server, wait_idle  # noqa: F401 - fixtures

pytestmark = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian Chromium not installed at /usr/bin/chromium"),
    pytest.mark.skipif(
        not (REPO / "assets" / "demo_clip" / "config.json").is_file(),
        reason="needs the bundled demo CLIP (assets/demo_clip)",
    ),
]

#: the maps chart (the page's second chart): its panel titles and the first panel's values as plotly drew them.
MAPS = """() => {
    const plot = document.querySelectorAll('[data-testid="stPlotlyChart"] .js-plotly-plot')[1];
    if (!plot || !plot._fullData) return null;
    const heatmap = plot._fullData.find(t => t.type === 'heatmap');  // as plotly decoded it: rows of floats
    if (!heatmap) return null;  // mid-rerun: another chart in this place
    const rows = Array.from(heatmap.z, r => Array.from(r));
    return {titles: (plot.layout.annotations || []).map(a => a.text.replace(/<br>/g, ' ')), z: rows};  // titles wrap
}"""


def _pixels(chart) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(chart.screenshot())).convert("RGB")).astype(np.int16)


def test_typing_a_prompt_draws_its_map(page, server, artifacts):
    from playwright.sync_api import expect

    import analysis
    from analysis.text import explain_text, text_decomposition
    from vizapp.inputs import sample_paths

    page.goto(server + "/text_prompts")
    wait_idle(page)
    expect(page.locator("h2", has_text="Text prompts").first).to_be_visible()
    before = page.evaluate(MAPS)
    assert before and before["titles"][0].startswith("Chefer et al. 2021b · "), before
    maps_chart = page.locator("[data-testid='stPlotlyChart']").nth(1)
    before_pixels = _pixels(maps_chart)
    prompt = "a red star on the left"
    box = page.get_by_role("textbox", name="Prompts (one a line)")
    box.fill(prompt)
    box.press("Control+Enter")  # a text area sends its value on Ctrl+Enter (or on leaving it)
    page.wait_for_function(
        f"() => {{ const m = ({MAPS})(); return m && m.titles[0].includes({prompt!r}); }}", timeout=60_000
    )
    wait_idle(page)
    after = page.evaluate(MAPS)
    assert len(after["titles"]) == 3 and all(prompt in title for title in after["titles"])  # one prompt, 3 methods
    clip = analysis.load_clip("demo_clip", device="cpu")
    pixels = clip.preprocess(analysis.load_image(sample_paths()[0]))  # the sidebar's first sample
    expected = analysis.scale_by_peak(
        explain_text(clip, pixels, prompt, method="chefer").maps[0].numpy(), negative="zero"
    )
    np.testing.assert_allclose(np.asarray(after["z"], dtype=np.float64), expected, atol=1e-3)
    after_pixels = _pixels(maps_chart)
    assert after_pixels.shape != before_pixels.shape or np.abs(after_pixels - before_pixels).mean() > 1
    page.screenshot(path=str(artifacts / "text_prompts_typed.png"), full_page=True)
    # a click on a head of the decomposition heatmap shows that head's own map
    heads = text_decomposition(clip, pixels, prompt).heads()[0].numpy()
    layers, count = heads.shape
    head_title = page.locator("[data-testid='stPlotlyChart']").nth(3).locator(".annotation-text").first
    shown = head_title.text_content()  # the head chosen so far (kept across prompts)
    target = (0, 1) if shown.strip() != "layer 0, head 1" else (1, 0)
    _click_patch(page, page.locator("[data-testid='stPlotlyChart']").nth(2), target[0], target[1], layers, count)
    expect(page.locator("[data-testid='stPlotlyChart']").nth(3).locator(".annotation-text").first).to_contain_text(
        f"layer {target[0]}, head {target[1]}", timeout=30_000
    )
    assert_no_exception(page, "text prompts after typing a prompt and clicking a head")
