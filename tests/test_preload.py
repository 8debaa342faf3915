"""``vit-explorer`` loads the default model while the server starts (vizapp/preload.py), so the first
page opened does not wait for it (measured by tests/bench_first_result.py)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

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


def test_sessions_opened_together_import_the_pages_libraries_one_at_a_time():
    """``streamlit run`` has no start-up hook: the app's script imports through
    :func:`preload.import_libraries`, which lets one thread import while the others wait (several
    first runs importing at once met half-made modules). In a fresh interpreter, with each import
    slowed down, six threads never import at the same time and each returns with the modules whole."""
    import subprocess
    import sys

    probe = (
        "import importlib, threading, time, traceback\n"
        "from vizapp import preload\n"
        "real, inside, most = importlib.import_module, {}, [0]\n"
        "guard = threading.Lock()\n"
        "def slow(name, *args, **kwargs):\n"
        "    if name not in ('pandas', 'plotly.graph_objects', 'analysis', 'vizapp.figures'):\n"
        "        return real(name, *args, **kwargs)\n"
        "    me = threading.get_ident()\n"
        "    with guard:\n"
        "        inside[me] = inside.get(me, 0) + 1\n"
        "        most[0] = max(most[0], sum(1 for n in inside.values() if n))\n"
        "    time.sleep(0.05)\n"
        "    try: return real(name, *args, **kwargs)\n"
        "    finally:\n"
        "        with guard: inside[me] -= 1\n"
        "importlib.import_module = slow\n"
        "whole = []\n"
        "def session():\n"
        "    try:\n"
        "        preload.import_libraries()\n"
        "        import sys\n"
        "        whole.append(hasattr(sys.modules['pandas'], 'Series') and hasattr(sys.modules['vizapp.figures'], 'position_similarity_mosaic'))\n"
        "    except Exception:\n"
        "        traceback.print_exc()\n"
        "threads = [threading.Thread(target=session) for _ in range(6)]\n"
        "[t.start() for t in threads]; [t.join() for t in threads]\n"
        "print(most[0], whole)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=180, check=True)
    most, whole = result.stdout.strip().splitlines()[-1].split(" ", 1)
    assert most == "1" and whole == str([True] * 6), result.stdout + result.stderr[-2000:]


def test_the_apps_script_imports_the_libraries_before_anything_else():
    """The entrypoint itself (what ``streamlit run`` executes) goes through the one-at-a-time import
    before it imports ``analysis`` or the app's modules: run in a fresh interpreter with AppTest."""
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "from streamlit.testing.v1 import AppTest\n"
        "from vizapp import preload\n"
        "seen = []\n"
        "real = preload.import_libraries\n"
        "preload.import_libraries = lambda: seen.append('analysis' in sys.modules) or real()\n"
        "at = AppTest.from_file(sys.argv[1], default_timeout=120).run()\n"
        "print(seen, not at.exception)\n"
    )
    app = str(Path(__file__).resolve().parent.parent / "vizapp" / "app.py")
    result = subprocess.run(
        [sys.executable, "-c", probe, app],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    # the first call (a held first result reruns the script, which calls it again: a no-op by then)
    assert result.stdout.strip().splitlines()[-1].startswith("[False"), result.stdout + result.stderr[-2000:]
    assert result.stdout.strip().endswith("True"), result.stdout + result.stderr[-2000:]
