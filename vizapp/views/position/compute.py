"""The Position embeddings page's cached computations (``st.cache_data`` / ``st.cache_resource``): what only this page
computes, beside it. The shared ones (a model, a captured forward pass) are :mod:`vizapp.resources`'."""

from __future__ import annotations

import streamlit as st

from vizapp import resources  # looked up at each call: a test may replace one
from vizapp.limits import MAX_RESULTS
from vizapp.refs import ModelRef

__all__ = ["relative_position_layers"]


@st.cache_data(show_spinner=False, max_entries=MAX_RESULTS)
def relative_position_layers(ref: ModelRef) -> tuple[str | None, ...]:
    """Each layer's reading of relative positions (:func:`analysis.embedding.relative_position.relative_position_kind`:
    ``"bias"``, ``"decomposed"`` or ``None``), once per model: reading a Swin v2's bias runs its
    position MLP over the table, which the Position page would otherwise redo on every rerun."""
    from analysis.embedding.relative_position import relative_position_kind

    vit = resources.get_model(ref)
    return tuple(relative_position_kind(vit, layer) for layer in range(vit.spec.num_layers))
