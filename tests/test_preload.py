"""``vit-explorer`` loads the default model while the server starts (vizapp/preload.py), so the first
page opened does not wait for it (measured by tests/bench_first_result.py)."""

from __future__ import annotations

import re
import time

from streamlit_server import streamlit_server
from vizapp import preload


def test_vit_explorer_loads_the_default_model_and_its_pass_while_the_server_starts(tmp_path):
    log = tmp_path / "server.log"
    with streamlit_server(log, launcher="cli"):  # nothing opens a page
        deadline = time.monotonic() + 240
        while "loaded in" not in log.read_text() and "could not preload" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.5)
    assert re.search(r"vit-explorer: .+ loaded in [\d.]+ s", log.read_text()), log.read_text()[-2000:]


def test_vizapp_preload_0_turns_it_off(monkeypatch):
    monkeypatch.setenv("VIZAPP_PRELOAD", "0")
    assert not preload.enabled() and preload.start() is None
    monkeypatch.setenv("VIZAPP_PRELOAD", "1")
    assert preload.enabled()


def test_vit_explorer_imports_the_pages_libraries_before_the_server_takes_a_session():
    """The libraries every page needs are imported in the main thread before Streamlit starts (several
    sessions' first runs importing pandas through plotly at once met a half-initialised module): in a
    fresh interpreter, what is imported when ``vit-explorer`` hands over to Streamlit."""
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "from streamlit.web import cli as streamlit_cli\n"
        "from vizapp import cli, preload\n"
        "wanted = ('pandas', 'plotly.graph_objects', 'analysis', 'vizapp.figures')\n"
        "before = [name for name in wanted if name in sys.modules]\n"
        "preload.start = lambda: None\n"
        "streamlit_cli.main = lambda: print(before, [name for name in wanted if name in sys.modules]) or 0\n"
        "cli.main(['--server.headless=true'])\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    before, after = result.stdout.strip().splitlines()[-1].split("] [")
    assert "pandas" not in before and "analysis" not in before, result.stdout  # not imported by Streamlit itself
    assert after == "'pandas', 'plotly.graph_objects', 'analysis', 'vizapp.figures']", result.stdout
