"""Load the default model while the server starts, so that the first page opened does not wait for it.

``vit-explorer`` (:mod:`vizapp.cli`) calls :func:`start` before it starts Streamlit: a background
thread imports the libraries (torch, timm, plotly), waits for Streamlit's runtime, then loads the
default model (:func:`vizapp.refs.default_model_ref`, ``$VIZAPP_DEFAULT_MODEL``) into the cache
every session shares (:func:`vizapp.resources.get_model`) and captures its pass on the image a page
opens on (the first bundled sample). ``streamlit run vizapp/app.py`` has no start-up hook, so there
the first open loads the model, and the app's script imports the libraries first, one session at a
time (:func:`import_libraries`). ``VIZAPP_PRELOAD=0`` turns the preload off. Nothing here draws: the thread
has no script run, so it calls the cached functions only.
"""

from __future__ import annotations

import os
import sys
import threading
import time

__all__ = ["RUNTIME_WAIT_S", "enabled", "import_libraries", "preload_default", "start"]

RUNTIME_WAIT_S = 120.0  # how long the thread waits for Streamlit's runtime before it gives up
_started: threading.Thread | None = None
_lock = threading.Lock()
_imports = threading.Lock()  # one thread imports the pages' libraries; the others wait for it


def enabled() -> bool:
    """Whether to preload: unless ``$VIZAPP_PRELOAD`` is ``0``, ``false`` or ``no``."""
    return os.environ.get("VIZAPP_PRELOAD", "1").strip().lower() not in ("0", "false", "no")


def _wait_for_runtime(limit_s: float) -> bool:
    from streamlit import runtime

    deadline = time.monotonic() + limit_s
    while not runtime.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def import_libraries() -> None:
    """Import what every page needs (torch and timm through :mod:`analysis`, plotly and the pandas
    it imports through :mod:`vizapp.figures`) in the calling thread, before the server takes a
    session: several sessions' first runs importing them at once met half-initialised modules (a
    page showed ``partially initialized module 'pandas' has no attribute 'Series'``).

    One thread at a time: ``streamlit run vizapp/app.py`` has no start-up hook, so the app's script
    calls this first, and the sessions opened together on a fresh server wait here for the first
    one's imports instead of meeting its half-made modules."""
    import importlib

    with _imports:
        for name in ("pandas", "plotly.graph_objects"):  # plotly, and the data frames its figures take
            importlib.import_module(name)
        importlib.import_module("analysis")  # torch and timm: most of a cold start
        importlib.import_module("vizapp.figures")


def preload_default() -> None:
    """Load the default model and capture its pass on the first sample (the libraries are imported
    already: :func:`import_libraries`). Runs in :func:`start`'s thread; a failure is printed (the
    page says it again when opened)."""
    started = time.perf_counter()
    try:
        # cached results made before the runtime exists would live in a store of their own
        if not _wait_for_runtime(RUNTIME_WAIT_S):
            return
        from vizapp import inputs, refs, resources

        ref = refs.default_model_ref()
        resources.get_model(ref)
        samples = inputs.sample_paths()
        if samples:
            image = refs.ImageRef.from_bytes(samples[0].name, inputs.read_sample(samples[0].name))
            resources.preload_forward(ref, image.digest, image.data)
        print(f"vit-explorer: {ref.label} loaded in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    except Exception as exc:  # noqa: BLE001 - a start-up convenience: the page loads (and explains) it again
        print(f"vit-explorer: could not preload the default model: {exc}", file=sys.stderr)


def start() -> threading.Thread | None:
    """Start :func:`preload_default` in a daemon thread, once per process (unless :func:`enabled` is false)."""
    global _started
    if not enabled():
        return None
    with _lock:
        if _started is None:
            _started = threading.Thread(target=preload_default, name="vizapp-preload", daemon=True)
            _started.start()
        return _started
