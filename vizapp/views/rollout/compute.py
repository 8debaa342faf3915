"""The Rollout page's cached computations (``st.cache_data`` / ``st.cache_resource``): what only this page
computes, beside it. The shared ones (a model, a captured forward pass) are :mod:`vizapp.resources`'."""

from __future__ import annotations

import streamlit as st

from vizapp import resources  # looked up at each call: a test may replace one
from vizapp.limits import MAX_FORWARDS
from vizapp.refs import ModelRef

__all__ = ["rollout_view_blob"]


@st.cache_resource(show_spinner=False, max_entries=MAX_FORWARDS)
def rollout_view_blob(
    ref: ModelRef, digest: str, _image_bytes: bytes, head_fusion: str, discard_ratio: float, start_layer: int
) -> tuple[bytes, dict]:
    """Every query's rollout after each layer ``start_layer..L-1`` (a ViT), quantised for the
    browser view (:func:`analysis.views.attention_view.rollout_view_rows`, as one served file)."""
    from analysis.views.attention_view import rollout_view_rows, view_blob

    record = resources.forward(ref, digest, _image_bytes).record
    ends, rows = rollout_view_rows(
        record, head_fusion=head_fusion, discard_ratio=discard_ratio, start_layer=start_layer
    )
    return view_blob(record, ends, rows)
