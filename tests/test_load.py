"""Load test on loopback: one app server, 8 concurrent browser sessions.

One ``streamlit run`` server; eight browser tabs at once (eight Streamlit sessions: one per
connection), each choosing one of two
models (folders written here, so the test can recompute their answers; in the first wave typed in
the sidebar, in the second named by a link) and uploading a different image. Each session reads its
attention map back from the drawn plotly figure and it must equal what the analysis API gives for
that model and image: no cross-talk between sessions, no hang, no exception on screen. (Visitors
clicking a page a second: ``tests/bench_click_storm.py``.) A second wave of sessions must not grow the server's memory beyond a
bound, since models and attention records sit in LRU caches (``VIZAPP_MAX_*``).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

import analysis
from streamlit_server import CHROMIUM, CHROMIUM_ARGS, rss_mib, streamlit_server

SESSIONS = 8
pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="Debian Chromium not installed at /usr/bin/chromium (apt-get install -y chromium)"
)


def _write_model(folder: Path, seed: int, depth: int) -> Path:
    torch.manual_seed(seed)
    vit = analysis.load_vit("vit_tiny_patch16_224", pretrained=False, img_size=64, depth=depth, num_classes=5)
    folder.mkdir()
    config = {
        "architecture": "vit_tiny_patch16_224",
        "num_classes": 5,
        "model_args": {"img_size": 64, "depth": depth},
        "pretrained_cfg": {"mean": [0.5] * 3, "std": [0.5] * 3, "input_size": [3, 64, 64], "crop_pct": 1.0},
        "label_names": [f"class {seed}-{i}" for i in range(5)],
    }
    (folder / "config.json").write_text(json.dumps(config))
    save_file(vit.model.state_dict(), str(folder / "model.safetensors"))
    return folder


def _write_image(path: Path, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 255, (6, 8, 3), dtype=np.uint8)
    Image.fromarray(small).resize((160, 120), Image.Resampling.BICUBIC).save(path)
    return path


def _expected_map(model: Path, image: Path) -> np.ndarray:
    vit = analysis.load_vit(str(model))
    record = analysis.capture_attention(vit, vit.preprocess(analysis.load_image(image)))
    return analysis.attention_map(record, vit.spec.num_layers - 1, query="cls")[0].numpy()


async def _wait_idle(page) -> None:
    await page.wait_for_selector("[data-testid='stPlotlyChart'] .main-svg", state="attached")
    await page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", polling=200, timeout=120_000
    )
    await page.wait_for_timeout(300)


READ_OVERLAY = """() => {
    const plot = document.querySelector("[data-testid='stPlotlyChart'] .js-plotly-plot");
    const heatmap = plot && plot._fullData && plot._fullData.find(t => t.type === "heatmap");
    return heatmap ? Array.from(heatmap.z, row => Array.from(row)) : null;
}"""


async def _shown_map(page, expected: np.ndarray, seconds: float = 45.0) -> np.ndarray:
    """The attention map drawn in this session, once it is the one for the current model and
    image. Streamlit keeps the previous run's elements on screen until the new run replaces
    them, so an early read can show this session's previous state; a wrong map that persists
    (cross-talk from another session) is returned after the timeout and fails the test."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        z = await page.evaluate(READ_OVERLAY)
        shown = np.asarray(z if z is not None else [], dtype=np.float64)
        if shown.shape == expected.shape and np.allclose(shown, expected, rtol=1e-5, atol=1e-7):
            return shown
        if loop.time() > deadline:
            return shown
        await page.wait_for_timeout(250)


async def _session(
    context, url: str, model: Path, image: Path, expected: np.ndarray, downloads: Path, index: int, via_link: bool
):
    """One visitor: opens the app in a tab of its own (its own Streamlit session: one per
    connection), chooses ``model`` (typed in the sidebar's path box, or named by a link,
    ``?model=PATH``, when ``via_link``), uploads ``image`` and reads the map drawn."""
    page = await context.new_page()
    page.set_default_timeout(180_000)
    try:
        sidebar = page.locator("section[data-testid='stSidebar']")
        if via_link:
            await page.goto(f"{url}/?model={quote(str(model))}")
        else:
            await page.goto(url)
            await _wait_idle(page)
            await sidebar.get_by_text("Local folder or checkpoint").click()
            path_box = sidebar.get_by_role("textbox", name="Folder or checkpoint path (on the server)")
            await path_box.fill(str(model))
            await path_box.press("Enter")
        await page.wait_for_function(
            "path => { const s = document.querySelector('section[data-testid=\"stSidebar\"]');"
            " return s !== null && s.innerText.includes(path); }",
            arg=str(model),
        )
        await _wait_idle(page)
        await sidebar.locator("input[type='file']").set_input_files(str(image))
        # the app's own summary line (not the uploader's file chip) names the image in use
        await page.wait_for_function(
            "args => { const t = document.querySelector('section[data-testid=\"stSidebar\"]').innerText;"
            " return t.includes('image ' + args[0]) && t.includes(args[1]); }",
            arg=[image.name, str(model)],
        )
        await _wait_idle(page)
        exceptions = await page.locator("[data-testid='stException']").count()
        assert exceptions == 0, f"session {index}: exception on screen"
        sidebar_text = await sidebar.inner_text()
        assert model.name in sidebar_text or str(model) in sidebar_text, f"session {index} shows another model"
        shown = await _shown_map(page, expected)
        assert await page.locator("[data-testid='stException']").count() == 0, f"session {index}: exception"
        await page.screenshot(path=str(downloads / f"session_{index}.png"))
        return shown
    finally:
        await page.close()


async def _waves(url: str, waves, downloads: Path, between) -> list[np.ndarray]:
    """Run each wave's sessions, one per (model, image, expected map) job, all at once; a wave is
    ``(jobs, via_link)``, and ``between()`` runs after each. The tabs share one browser context,
    so its cache holds the app's scripts after the first page (as one visitor's browser would):
    what is measured is the server's answers, not eight downloads of the same bundle."""
    from playwright.async_api import async_playwright

    results: list[np.ndarray] = []
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            context = await browser.new_context(viewport={"width": 1280, "height": 1000})
            for wave, (jobs, via_link) in enumerate(waves):
                results += await asyncio.wait_for(
                    asyncio.gather(
                        *(
                            _session(context, url, *job, downloads, wave * len(jobs) + i, via_link)
                            for i, job in enumerate(jobs)
                        )
                    ),
                    timeout=480,
                )
                between()
        finally:
            await browser.close()
    return results


def test_eight_concurrent_browser_sessions_get_their_own_results(tmp_path):
    models = [_write_model(tmp_path / "model_a", seed=1, depth=2), _write_model(tmp_path / "model_b", seed=2, depth=3)]
    images = [_write_image(tmp_path / f"image_{i}.png", seed=i) for i in range(2 * SESSIONS)]
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    artifacts = Path(os.environ.get("VIZAPP_ARTIFACTS", Path(__file__).resolve().parent.parent / "artifacts"))
    artifacts.mkdir(parents=True, exist_ok=True)
    expected = [_expected_map(models[i % 2], image) for i, image in enumerate(images)]
    limits = {"VIZAPP_MAX_FORWARDS": "4", "VIZAPP_MAX_RESULTS": "16"}
    with streamlit_server(artifacts / "load_test_streamlit.log", limits) as (url, process):
        first = [(models[i % 2], images[i], expected[i]) for i in range(SESSIONS)]
        second = [(models[i % 2], images[SESSIONS + i], expected[SESSIONS + i]) for i in range(SESSIONS)]
        memory: list[float] = []  # the server's RSS after each wave
        waves = [(first, False), (second, True)]  # the second wave names the model by a link
        results = asyncio.run(_waves(url, waves, downloads, lambda: memory.append(rss_mib(process.pid))))
        after_first, after_second = memory
        assert process.poll() is None, "the server died"
    for (model, image, want), got in zip(first + second, results):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, err_msg=f"{model.name} {image.name}")
    assert not np.allclose(results[0], results[2])  # different images really differ: cross-talk would show
    growth = after_second - after_first
    print(f"server RSS after wave 1: {after_first:.0f} MiB, after wave 2: {after_second:.0f} MiB")
    assert growth < 250, f"server memory grew {growth:.0f} MiB over a second wave of {SESSIONS} sessions"
