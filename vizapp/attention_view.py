"""The instant attention view: one layer's attention for every query, held in the browser.

A bundled Streamlit component (``vizapp/components/attention_view/index.html``, plain
JavaScript, no build step, no network) receives the image and, for the current layer, every
query's attention over every patch key, per head and for their mean, quantised to one byte
per value (:func:`analysis.plots.quantise_maps`: one ``[min, max]`` per map, every value back
within half a step). Hovering a patch redraws its map in the next animation frame with no
server round trip; a click pins the query and reports it here (the page and URL follow).

Only the current layer travels (a new layer is a rerun); all layers on the client is later work.

The layer's data, ``layer_data(record, layer)``:

* ``rows``: ``(heads + 1, T + 1, N)`` codes: row ``q < T`` is token ``q``'s attention over the
  patch keys (:func:`analysis.attention_rows`), row ``T`` the mean over the patch queries
  (``query="mean"``); head index ``heads`` is the mean over heads.
* ``cols``: ``(heads + 1, N, N)`` codes: entry ``[h, k, i]`` is patch query ``i``'s attention
  to patch key ``k``, i.e. "who looks at patch k", quantised per column (its own range).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import streamlit.components.v1 as components

from vizapp import limits

from analysis import attention_rows
from analysis.queries import parse_prefix_query
from analysis.plots import UNIFORM_FLOOR, colour_lut, quantise_maps

__all__ = ["COMPONENT_DIR", "attention_view", "layer_bytes", "layer_data", "query_row", "view_fits"]

COMPONENT_DIR = Path(__file__).resolve().parent / "components" / "attention_view"
_component = components.declare_component("attention_view", path=str(COMPONENT_DIR))


def layer_bytes(spec) -> int:
    """Bytes of one layer's codes (before base64, which adds a third): rows and columns."""
    heads, tokens, patches = spec.num_heads, spec.num_tokens, spec.num_patches
    return (heads + 1) * ((tokens + 1) * patches + patches * patches)


def view_fits(spec) -> bool:
    """Whether one layer fits :data:`vizapp.limits.MAX_VIEW_BYTES` (``VIZAPP_VIEW_MB``): the
    data travels with every rerun, so large grids keep the chart only (ViT-B/16: 1 MiB, ViT-L/16 at
    384 px: 11 MiB, DINOv2-S/14 at 518 px: 25 MiB)."""
    return layer_bytes(spec) <= limits.MAX_VIEW_BYTES


def layer_data(record, layer: int) -> dict[str, str]:
    """One layer's quantised maps as base64 text (the module docstring's layout), with
    ``data_id`` (a digest: the browser decodes only new data)."""
    spec = record.spec
    prefix, patches = spec.num_prefix_tokens, spec.num_patches
    rows = attention_rows(record, layer)[0].numpy()  # (heads + 1, T, N)
    mean_query = rows[:, prefix : prefix + patches].mean(axis=1, keepdims=True)  # (heads + 1, 1, N)
    rows = np.concatenate([rows, mean_query], axis=1)  # (heads + 1, T + 1, N)
    cols = rows[:, prefix : prefix + patches].transpose(0, 2, 1)  # (heads + 1, N keys, N queries)
    row_codes, row_ranges = quantise_maps(rows).as_base64()
    col_codes, col_ranges = quantise_maps(cols).as_base64()
    digest = hashlib.sha1(f"{layer}:{row_codes}:{row_ranges}".encode()).hexdigest()[:16]
    return {"rows": row_codes, "row_ranges": row_ranges, "cols": col_codes, "col_ranges": col_ranges,
            "data_id": digest}


def query_row(query, spec) -> int:
    """The row of ``rows`` that holds the app's query (``"cls"``, ``"prefix:<i>"``, a patch
    index, ``"mean"``)."""
    token = parse_prefix_query(query)
    if token is not None:
        return token
    if query == "cls":
        return 0
    if query == "mean":
        return spec.num_tokens
    return spec.num_prefix_tokens + int(query)


def attention_view(*, data: dict[str, str], image_uri: str, spec, layer: int, head: str | int, query,
                   colorscale: str, map_range: str, opacity: float, key: str, on_click=None,
                   max_height: int = 520):
    """Draw the view; returns its value (``{"patch", "head", "clicks"}`` after a click, else
    None). ``on_click``: a callback (Streamlit ``on_change``) that reads ``st.session_state[key]``."""
    return _component(
        key=key, default=None, on_change=on_click,
        image=image_uri, img_size=list(spec.img_size), grid=list(spec.grid_size), patch_size=list(spec.patch_size),
        prefix=spec.num_prefix_tokens, tokens=spec.num_tokens, heads=spec.num_heads,
        token_names=list(spec.token_names), layer=int(layer),
        head=spec.num_heads if head == "mean" else int(head),
        query_row=query_row(query, spec), query_patch=int(query) if isinstance(query, int) else None,
        range_mode=map_range, uniform=1 / spec.num_tokens, uniform_floor=UNIFORM_FLOOR,
        lut=colour_lut(colorscale).ravel().tolist(), value_name="attention probability",
        opacity=float(opacity), max_height=int(max_height), **data,
    )
