"""A page's first result before its slow analyses.

The browser and the analyses share the CPU: on a 2-core machine, a page that sends its first chart
and then starts seconds of forward passes (deletion curves, head ablation, curves over an image
set) leaves the browser too little of it to load plotly (4.7 MB of JavaScript) and draw that chart,
so nothing shows until the analyses are done. So the first time a session opens such a page, the
page draws its cheap part (the prediction, a first map) and ends its run there
(:func:`hold_slow_sections`); a zero-height component (``vizapp/first_result_page``) watches the
page and reports once a result is on screen, and the page then runs in full, its slow sections
below the first result with their progress. At most :data:`HOLD_LIMIT_S` (the watcher reports by
then, result or not), and never without a browser (AppTest, a script), so the numbers never change.

The limit is kept in the browser, never by a rerun the server asks for (a fragment timer once did):
Streamlit folds the rerun requests that arrive during a run into one, and the newest names the page,
so a rerun of the held page that came after a visitor's click took the visitor back to it (a click
storm of eight visitors lost last clicks that way; ``tests/bench_click_storm.py``).
"""

from __future__ import annotations

import time
from pathlib import Path

import streamlit as st
import streamlit.components.v1 as components

__all__ = [
    "HOLD_LIMIT_S",
    "PAGE_DIR",
    "SlowSectionsHeld",
    "hold_slow_sections",
    "holding",
]

PAGE_DIR = Path(__file__).resolve().parent / "first_result_page"
_watcher = components.declare_component("first_result", path=str(PAGE_DIR))
HOLD_LIMIT_S = 8.0  # the slow sections come after this long even if no result is seen on screen


class SlowSectionsHeld(Exception):
    """The page's run ends after its first result (:func:`hold_slow_sections`); ``app.py`` catches it."""


def _drawn_key(page: str) -> str:
    return f"_first_result_drawn_{page}"


def holding(page: str) -> bool:
    """Whether this run of ``page`` draws only its first result: the first time this session opens
    the page in a browser (no request headers, as in AppTest: never), until the browser has drawn
    that result or :data:`HOLD_LIMIT_S` has passed since the page was first held."""
    drawn = _drawn_key(page)
    if st.session_state.get(drawn) or not st.context.headers:
        return False
    since = st.session_state.setdefault(f"_first_result_held_since_{page}", time.monotonic())
    if time.monotonic() - since >= HOLD_LIMIT_S:
        st.session_state[drawn] = True
        return False
    return True


def hold_slow_sections(page: str, follows: str, *, held: bool | None = None) -> None:
    """End this run of ``page`` here when it is ``held`` (default: :func:`holding`; a page that
    drew less because it was held passes what it decided): say what ``follows``, watch for the
    first result on screen and rerun the page in full once it is (or once the rest of
    :data:`HOLD_LIMIT_S` has passed, by the watcher's timer in the browser; should the watcher's
    page itself never load, the page's next run is in full). Call it after the page's first
    result; otherwise it returns and the page goes on."""
    if not (holding(page) if held is None else held):
        return
    drawn = _drawn_key(page)
    since = st.session_state[f"_first_result_held_since_{page}"]
    key = f"first_result_{page}"

    def on_change() -> None:
        value = st.session_state.get(key)
        if isinstance(value, dict) and value.get("event") == "drawn":
            st.session_state[drawn] = True

    st.caption(f":material/hourglass_top: {follows}")
    left_s = max(0.0, HOLD_LIMIT_S - (time.monotonic() - since))
    _watcher(key=key, default=None, on_change=on_change, limit_ms=round(1000 * left_s))
    raise SlowSectionsHeld
