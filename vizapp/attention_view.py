"""The instant attention view in the app: :mod:`analysis.views.attention_view`'s page, declared as a
Streamlit custom component (the folder ``analysis/views/attention_view_page``, served by Streamlit; the
HTML report inlines the same file).

The data (:func:`analysis.views.attention_view.attention_view_blob`) is one binary file served by Streamlit's
media endpoint and fetched by the page once per image and model, so a rerun sends only the small
arguments. The page holds every layer when they fit :data:`vizapp.limits.MAX_VIEW_BYTES`
(``VIZAPP_VIEW_MB``): the layer (↑/↓) and head (←/→, ◀/▶) then
switch in the browser, and the steps report ``{"event": "step", "layer"?, "head"?}`` here once the
keys rest, so the page and URL follow without the rerun holding up the redraw. Otherwise only
the current layer travels (a layer step is then a rerun, and the view says so), or, over the
budget even for one layer, the page keeps its chart. A click reports
``{"event": "click", "patch", "head", "layer"}``. What each report changes on the page is one
rule, :func:`follow_view`. The keys work while the pointer is over the view (it takes the
keyboard focus then, without a click).

First paint (:func:`hold_for_first_paint`): the view's iframe shares the browser's main thread with
the page, and plotly's bundle (4.7 MB of JavaScript), its charts and the code highlighter (1.5 MB)
held it for 1.5–2 s on a 2-core machine before the view could draw. So the first time a session
opens the page, the page sends the view first and its other charts once the view reports
``{"event": "drawn"}``; the view reports anyway after :data:`HOLD_LIMIT_S` should no map come (its
data never arrived). The limit is kept by the browser, never by a rerun from the server: a rerun the
server asks for takes the place of a click the visitor made meanwhile (Streamlit's newest rerun
request names the page), which lost clicks under load.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import streamlit as st
import streamlit.components.v1 as components
from streamlit import runtime

from analysis.views.attention_view import (
    PAGE_DIR,
    attention_view_args,
    layer_bytes,
    layers_to_send,
    query_row,
    view_args,
    view_layer_bytes,
    view_layout,
)
from vizapp import limits, resources
from vizapp.first_result import HOLD_LIMIT_S
from vizapp.layer_grids import layer_cell_to_query_patch

if TYPE_CHECKING:  # for an annotation only
    from vizapp.state import Current

__all__ = [
    "COMPONENT_DIR",
    "attention_view",
    "fallback_note",
    "follow_view",
    "hold_for_first_paint",
    "layer_bytes",
    "note_drawn",
    "page_view",
    "panel_layers",
    "query_row",
    "sent_layers",
    "served",
]

COMPONENT_DIR = PAGE_DIR
_component = components.declare_component("attention_view", path=str(COMPONENT_DIR))

DRAWN = "_attention_view_drawn"  # session key: a view of this session has drawn its first map
HELD_SINCE = "_attention_view_held_since"  # session key: when the page first held its charts back (monotonic s)


def note_drawn(value) -> None:
    """Record a view's ``{"event": "drawn"}`` report (call it from the component's ``on_change``)."""
    if isinstance(value, dict) and value.get("event") == "drawn":
        st.session_state[DRAWN] = True


def hold_for_first_paint(shown: bool) -> bool:
    """Whether the page should send only the view now and its plotly charts and code block once
    the view has drawn: the first time this session shows a view (``shown``) in a browser. Without
    a browser (no request headers: AppTest, a script) nothing would report, so nothing is held.
    Holds at most :data:`HOLD_LIMIT_S`: the view reports by then, drawn or not, and any later run
    of the page releases the hold (should the view's page itself never load)."""
    if not shown or st.session_state.get(DRAWN) or not st.context.headers:
        return False
    since = st.session_state.setdefault(HELD_SINCE, time.monotonic())
    if time.monotonic() - since >= HOLD_LIMIT_S:
        st.session_state[DRAWN] = True
        return False
    return True


def sent_layers(spec, layer: int) -> tuple[int, ...] | None:
    """The layers the page gets under ``VIZAPP_VIEW_MB`` (:func:`analysis.views.attention_view.layers_to_send`)."""
    return layers_to_send(spec, layer, limits.MAX_VIEW_BYTES)


def panel_layers(spec, layers) -> tuple[int, ...] | None:
    """The layers the page gets to draw ``layers`` side by side (the Compare page): every layer when
    they fit ``VIZAPP_VIEW_MB`` (the same file as the Attention page's), else ``layers`` alone when
    they fit, else ``None`` (no view; also where the view draws one layer's windows at a time,
    :func:`~analysis.views.attention_view.view_layout`)."""
    if view_layout(spec) != "tokens":
        return None
    every = layers_to_send(spec, 0, limits.MAX_VIEW_BYTES)
    if every is not None and len(every) == spec.num_layers:
        return every
    return tuple(int(layer) for layer in layers) if layer_bytes(spec) * len(layers) <= limits.MAX_VIEW_BYTES else None


def follow_view(
    key: str,
    *,
    patches: int,
    to_query: Callable[[int], int] | None = None,
    layers: int | None = None,
    heads: int | None = None,
):
    """The ``on_change`` of the view ``key``: the one rule of what its reports change on its page.

    * ``{"event": "drawn"}``: the held-back charts follow (:func:`note_drawn`);
    * a step ``{"event": "step", "layer"?, "head"?}``: the page's ``layer`` (when the page has a
      layer control: ``layers``, how many) and ``head`` (when it has a Head box: ``heads``, how many;
      ``"mean"`` or an index below it). The query stays: a step never pins;
    * a click ``{"event": "click", "patch", "head", "layer"}``: the clicked patch (an index below
      ``patches``) becomes the page's query (``query_mode`` ``"patch"``, ``query_patch``:
      ``to_query(patch)``, by default the patch itself), and its head and layer as a step's.

    Values out of range change nothing. It runs as a callback, before the page draws its widgets,
    so it may set their keys."""

    def on_change() -> None:
        value = st.session_state.get(key)
        if not isinstance(value, dict):
            return
        note_drawn(value)
        if value.get("event") not in ("step", "click"):
            return
        layer, head, patch = value.get("layer"), value.get("head"), value.get("patch")
        if layers is not None and _index_below(layer, layers):
            st.session_state["layer"] = layer
        if heads is not None and (head == "mean" or _index_below(head, heads)):
            st.session_state["head"] = head
        if value["event"] == "click" and isinstance(patch, int) and _index_below(patch, patches):
            st.session_state["query_mode"] = "patch"
            st.session_state["query_patch"] = patch if to_query is None else to_query(patch)

    return on_change


def _index_below(value, count: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < count


def fallback_note(spec, layers) -> str:
    """What the view says when the budget left out layers it could otherwise hold (nothing when it
    holds all it ever holds: every layer of a ViT, one layer of a model whose layers lie on
    different grids)."""
    unbounded = layers_to_send(spec, int(layers[0]), sys.maxsize) or ()
    if len(layers) >= len(unbounded):
        return ""
    every = sum(view_layer_bytes(spec, layer) for layer in unbounded)
    return (
        f"Only this layer is in the page: all {len(unbounded)} layers are "
        f"{every / 2**20:.1f} MiB, over the {limits.MAX_VIEW_BYTES / 2**20:.0f} MiB "
        "of VIZAPP_VIEW_MB; a layer step (↑/↓) asks the server for the new layer."
    )


def served(blob: bytes, meta: dict, key: str) -> dict:
    """The page's data arguments for ``view_blob``'s ``(blob, meta)``: ``meta`` and ``data_url``,
    the file in Streamlit's media store (held while the element ``key`` shows it)."""
    url = runtime.get_instance().media_file_mgr.add(
        blob, "application/octet-stream", f"attention_view.{key}", file_name=f"attention_view_{meta['data_id']}.bin"
    )
    return {**meta, "data_url": url}


def attention_view(
    *,
    data: dict,
    image_uri: str,
    spec,
    layer: int,
    head: str | int,
    query,
    colorscale: str,
    map_range: str,
    opacity: float,
    key: str,
    on_change=None,
    max_height: int = 520,
    note: str | None = None,
    **labels,
):
    """Draw the view; returns its last value (a click or a layer step, see the module docstring),
    else None. ``data``: :func:`served`'s (or inline :func:`analysis.views.attention_view.view_data`).
    ``labels``: what other maps than attention's are (:func:`analysis.views.attention_view.view_args`). ``on_change``: a callback (Streamlit ``on_change``) that reads ``st.session_state[key]``."""
    args = view_args(
        data=data,
        image_uri=image_uri,
        spec=spec,
        layer=layer,
        head=head,
        query=query,
        colorscale=colorscale,
        map_range=map_range,
        opacity=opacity,
        max_height=max_height,
        note=fallback_note(spec, data["layers"]) if note is None else note,
        **labels,
    )
    return _component(key=key, default=None, on_change=on_change, **args)


def page_view(
    cur: Current, *, layer: int, head: str | int, query, query_cell: int | None, opacity: float, key: str
) -> bool:
    """The instant view of the Attention page for ``layer`` of the current model, with its caption.

    The view holds what fits :data:`vizapp.limits.MAX_VIEW_BYTES`
    (:func:`analysis.views.attention_view.layers_to_send`): every layer when they fit (the layer and
    head then step in the browser), else the shown layer, else nothing (a caption says why).
    ``query``: the app's query; ``query_cell``: its cell on this layer's grid (``None``: the mean).
    Returns whether the page holds its other charts back until the view has drawn
    (:func:`hold_for_first_paint`)."""
    spec, image_uri = cur.spec, resources.background_uri(*cur.args)
    geometry = spec.geometry(layer)
    view_layers = sent_layers(spec, layer)
    held = hold_for_first_paint(view_layers is not None)  # a session's first open: the view draws first ...
    if view_layers is None:
        st.caption(
            f"The instant hover view is off for this layer: its attention for every query is "
            f"{view_layer_bytes(spec, layer) / 2**20:.0f} MiB, over the {limits.MAX_VIEW_BYTES / 2**20:.0f} MiB "
            "the page may hold (VIZAPP_VIEW_MB). Click the chart to pick a query."
        )
        return held
    view_layers = (layer,) if held else view_layers  # ... from this layer's data alone, every layer after
    gh, gw = geometry.grid_size
    data = served(*resources.attention_view_blob(*cur.args, view_layers), key=key)
    args = attention_view_args(
        data=data,
        image_uri=image_uri,
        spec=spec,
        layer=layer,
        head=head,
        query=query,
        query_cell=query_cell,
        colorscale=cur.colorscale,
        map_range=cur.map_range,
        opacity=opacity,
        report_drawn=held,
        drawn_limit_s=HOLD_LIMIT_S,
        note="" if held else fallback_note(spec, data["layers"]),
        left_out=cur.outliers,
        hide_left_out=cur.hide_outliers,
    )
    _component(
        key=key,
        default=None,
        on_change=follow_view(
            key,
            patches=gh * gw,
            layers=spec.num_layers,
            heads=geometry.num_heads,
            to_query=lambda cell: layer_cell_to_query_patch(spec, geometry, cell),
        ),
        **args,
    )
    st.caption(
        "Instant view: hover a patch to see its attention (drawn in the browser, one cell per patch of the layer's "
        "grid, values to one 255th of each map's range; where a layer attends inside windows, nothing is drawn "
        "outside the hovered patch's window: the attention there is 0); with the pointer over it, ←/→ step the "
        "head and ↑/↓ the layer where the view holds every layer (the page follows); click to make the patch the "
        "query. The same map as a chart, with hover values and downloads:"
    )
    return held
