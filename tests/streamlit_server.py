"""Start ``python -m streamlit run vizapp/app.py`` on a free loopback port, for browser tests."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
DEMO_PRESENT = (REPO / "assets" / "demo_vit" / "config.json").is_file()
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def streamlit_server(log_path: Path, extra_env: dict | None = None, repo: Path = REPO, launcher: str = "streamlit"):
    """Yield ``(url, process)`` of a running app server; stop it afterwards.

    ``repo``: the checkout to serve (another version's, for a benchmark). ``launcher``:
    ``"streamlit"`` (``python -m streamlit run vizapp/app.py``) or ``"cli"`` (the ``vit-explorer``
    command, ``python -m vizapp.cli``, which also loads the default model as the server starts)."""
    port = free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", **(extra_env or {}))
    if not DEMO_PRESENT:
        env.setdefault("VIZAPP_DEFAULT_MODEL", "random:vit_tiny_patch16_224")
    with open(log_path, "w") as log:
        start = (
            [sys.executable, "-m", "vizapp.cli"]
            if launcher == "cli"
            else [sys.executable, "-m", "streamlit", "run", "vizapp/app.py"]
        )
        process = subprocess.Popen(
            [
                *start,
                "--server.headless",
                "true",
                "--server.port",
                str(port),
                "--server.address",
                "127.0.0.1",
                "--browser.gatherUsageStats",
                "false",
                "--server.fileWatcherType",
                "none",
            ],
            cwd=repo,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                        if response.status == 200:
                            break
                except OSError:
                    pass
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"streamlit did not start: {log_path.read_text()[-2000:]}")
                time.sleep(0.3)
            yield url, process
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


def rss_mib(pid: int) -> float:
    """Resident memory of a process (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")
