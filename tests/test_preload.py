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
