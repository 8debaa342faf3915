"""ViT explorer: ``streamlit run vizapp/app.py`` from the repository root.

The entrypoint only routes: it draws the shared sidebar (model, image) and runs the
chosen page. Pages live in ``vizapp/views/<name>/``, one folder each (:mod:`vizapp.views`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import cast

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # streamlit puts only vizapp/ on sys.path
    sys.path.insert(0, str(REPO_ROOT))

from vizapp import preload  # noqa: E402 - the standard library only

preload.import_libraries()  # sessions opened together on a fresh server: one imports, the others wait

import streamlit as st  # noqa: E402
from streamlit.errors import StreamlitAPIException  # noqa: E402

from analysis.base.assets import asset_path  # noqa: E402
from analysis.plots import COLORSCALES, MAP_RANGES  # noqa: E402
from vizapp import inputs, url_state, views  # noqa: E402
from vizapp.first_result import SlowSectionsHeld  # noqa: E402
from vizapp.resources import memory_note  # noqa: E402
from vizapp.state import CURATED_MODELS, MAP_CELLS, keep_page_state, kept_key, render_sidebar  # noqa: E402
from vizapp.ui import QUERY_LABELS, PageRefused  # noqa: E402

started = time.perf_counter()
FAVICON = asset_path("favicon.png")  # shipped: a Material icon would come from a font CDN
st.set_page_config(page_title="ViT explorer", page_icon=str(FAVICON) if FAVICON.is_file() else None, layout="wide")
# Streamlit's SessionStateProxy is a mapping in all but its declared type
session = cast(MutableMapping[str, object], st.session_state)

folders = views.pages()  # one folder each in vizapp/views/, in their declared order; the first is the default, at "/"
pages = [
    st.Page(page.script, title=page.info.title, icon=page.info.icon, url_path=page.name, default=i == 0)
    for i, page in enumerate(folders)
]
page = st.navigation(pages)
page_keys = url_state.page_url_keys(next(f for f in folders if f.info.title == page.title).info.kept_keys)
url_state.restore(
    session,
    st.query_params,
    CURATED_MODELS,
    options={
        "image_sample": [p.name for p in inputs.sample_paths()],
        "colorscale": COLORSCALES,
        "map_range": list(MAP_RANGES),
        "map_cells": list(MAP_CELLS),
        "query_mode": list(QUERY_LABELS),
    },
    page_keys=page_keys,
)
keep_page_state(page.url_path)
current = render_sidebar()
uploaded = st.session_state.get("image_upload") is not None
url_state.publish(st.query_params, session, current.model, uploaded, page_keys)
timing = st.sidebar.empty()
try:
    page.run()
except PageRefused:  # the page showed why the library refused it (ui.refuse_page)
    url_state.settle_linked_settings(session)
except SlowSectionsHeld:  # a first open drew its first result; the rest follows once it is on screen
    pass
except (StreamlitAPIException, ValueError, TypeError):
    # a link's page setting that parses but does not fit its widget (a slider value out of range):
    # open the page with its defaults instead; any other failure is raised as it is
    if url_state.drop_linked_settings(session, kept_key):
        st.rerun()
    raise
else:  # the page drew whole with the link's settings: from now on they are the page's own
    url_state.settle_linked_settings(session)
# again: a page may have adjusted a setting while it ran (a clamp to a smaller model, a click)
url_state.publish(st.query_params, session, current.model, uploaded, page_keys)
elapsed_ms = (time.perf_counter() - started) * 1000
st.session_state["last_run_ms"] = elapsed_ms
timing.caption(f"Server time for this view: {elapsed_ms:.0f} ms")
memory = memory_note()
if memory:
    st.sidebar.caption(memory)
