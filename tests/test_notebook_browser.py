"""The first example notebook in a real JupyterLab (localhost) in Chromium: the notebook runs, the
attention view widget draws, a hovered patch's map is attention_map's within one colour step (as
the app's browser test checks), and a click in the view reaches Python as ``view.query``."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from streamlit_server import CHROMIUM, CHROMIUM_ARGS, REPO, free_port
from test_browser import assert_within_one_colour_step, canvas_rgb

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="Debian Chromium not installed at /usr/bin/chromium (apt-get install -y chromium)"
)
pytest.importorskip("jupyterlab")
pytest.importorskip("anywidget")

NOTEBOOK = REPO / "examples" / "01_first_look.ipynb"
SAMPLE = REPO / "assets" / "samples" / "scene_1_star.png"


@contextlib.contextmanager
def jupyterlab(folder: Path, log_path: Path):
    """Yield the URL (with its token) of a JupyterLab serving ``folder`` on a free loopback port,
    the app object exposed to the page (``window.jupyterapp``); stop it afterwards."""
    port, token = free_port(), secrets.token_hex(16)
    env = dict(
        {k: v for k, v in os.environ.items() if k != "PYTHONPATH"},  # as a newcomer starts it: the install alone
        HF_HUB_OFFLINE="1",
        JUPYTER_CONFIG_DIR=str(folder / ".jupyter-config"),
        JUPYTER_RUNTIME_DIR=str(folder / ".jupyter-runtime"),
    )
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyterlab",
                "--no-browser",
                "--allow-root",
                "--LabApp.extension_manager=readonly",
                "--ip=127.0.0.1",
                f"--port={port}",
                f"--IdentityProvider.token={token}",
                f"--ServerApp.root_dir={folder}",
                "--LabApp.expose_app_in_browser=True",
                "--LabApp.news_url=",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            ],
            cwd=folder,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 90
            while True:
                try:
                    with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2) as response:
                        if response.status == 200:
                            break
                except OSError:
                    pass
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"jupyterlab did not start: {log_path.read_text()[-2000:]}")
                time.sleep(0.5)
            yield url, token
        finally:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()


def _python(page, code: str) -> str:
    """Run ``code`` in the open notebook's kernel; its printed output."""
    return page.evaluate(
        """async (code) => {
        const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
        let out = "";
        const future = kernel.requestExecute({code: code});
        future.onIOPub = (msg) => { if (msg.header.msg_type === "stream") out += msg.content.text; };
        await future.done;
        return out;
    }""",
        code,
    )


def _view_frame(page):
    """The widget's view page (the iframe's Frame), once it has drawn a map."""
    page.wait_for_selector("iframe.attention-view", timeout=120_000)
    handle = page.locator("iframe.attention-view").first.element_handle()
    frame = handle.content_frame()
    frame.wait_for_function("() => window.attentionView && window.attentionView.shown", timeout=120_000)
    return frame


def _patch_position(page, frame, patch: int, grid) -> tuple[float, float]:
    iframe = page.locator("iframe.attention-view").first
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


def test_the_first_notebook_in_jupyterlab_hovers_and_clicks(tmp_path):
    from playwright.sync_api import sync_playwright

    import analysis
    from analysis.plots import colour_range, quantise_maps

    shutil.copy(NOTEBOOK, tmp_path / NOTEBOOK.name)  # JupyterLab saves what it runs: never into the repository
    vit = analysis.load_vit("demo")
    record = analysis.capture_attention(vit, vit.preprocess(analysis.load_image(SAMPLE)))
    spec = record.spec
    grid, uniform = spec.grid_size, 1 / spec.num_tokens
    gh, gw = grid
    artifacts = Path(os.environ.get("VIZAPP_ARTIFACTS", REPO / "artifacts")) / "browser"
    artifacts.mkdir(parents=True, exist_ok=True)
    with jupyterlab(tmp_path, artifacts / "jupyterlab.log") as (url, token), sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            page.set_default_timeout(120_000)
            page.goto(f"{url}/lab/tree/{NOTEBOOK.name}?token={token}")
            page.wait_for_function(
                "() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
                " && window.jupyterapp.shell.currentWidget.sessionContext"
                " && window.jupyterapp.shell.currentWidget.sessionContext.session"
                " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"
            )
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
            frame = _view_frame(page)
            state = json.loads(_python(page, "import json; print(json.dumps([view.layer, view.head, view.query]))"))
            assert state == [1, "mean", "cls"], state  # the notebook set view.layer = 1 after showing it
            frame.wait_for_function("() => window.attentionView.layer === 1")
            layer = 1
            for patch in (0, gh * gw - gw // 2 - 2):
                page.mouse.move(*_patch_position(page, frame, patch, grid))
                frame.wait_for_function(
                    f"() => window.attentionView.shown?.patch === {patch}"
                    f" && window.attentionView.shown?.layer === {layer}"
                )
                exact = analysis.attention_map(record, layer, head=None, query=patch)[0].numpy()
                decoded = quantise_maps(exact.ravel()).decoded().reshape(grid)
                lo, hi, _ = colour_range("robust", decoded, uniform=uniform)
                assert_within_one_colour_step(
                    canvas_rgb(frame, grid), decoded, "Viridis", lo, hi, f"row of patch {patch}"
                )
            clicked = gw + 2
            page.mouse.click(*_patch_position(page, frame, clicked, grid))
            deadline = time.monotonic() + 30
            while (query := _python(page, "print(view.query)").strip()) != str(clicked) and time.monotonic() < deadline:
                page.wait_for_timeout(200)
            assert query == str(clicked)
            page.screenshot(path=str(artifacts / "jupyterlab_widget.png"))
        finally:
            browser.close()
