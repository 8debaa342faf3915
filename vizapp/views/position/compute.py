"""The Position embeddings page's cached computations (``st.cache_data`` / ``st.cache_resource``): what only this page
computes, beside it. The shared ones (a model, a captured forward pass) are :mod:`vizapp.resources`'."""

from __future__ import annotations

import numpy as np
import streamlit as st

import analysis
from analysis import (
    position_embedding_similarity,
)
from vizapp import resources  # looked up at each call: a test may replace one
from vizapp.limits import MAX_RESULTS
from vizapp.refs import ModelRef

__all__ = ["decomposed_position", "position_similarity", "relative_position_bias", "relative_position_layers"]


@st.cache_data(show_spinner=False, max_entries=MAX_RESULTS)
def relative_position_layers(ref: ModelRef) -> tuple[str | None, ...]:
    """Each layer's reading of relative positions (:func:`analysis.embedding.relative_position.relative_position_kind`:
    ``"bias"``, ``"decomposed"`` or ``None``), once per model: reading a Swin v2's bias runs its
    position MLP over the table, which the Position page would otherwise redo on every rerun."""
    from analysis.embedding.relative_position import relative_position_kind

    vit = resources.get_model(ref)
    return tuple(relative_position_kind(vit, layer) for layer in range(vit.spec.num_layers))


@st.cache_data(show_spinner="Comparing position embeddings…", max_entries=16)
def position_similarity(ref: ModelRef, grid_size: tuple[int, int] | None = None, kind: str | None = None) -> np.ndarray:
    """Cosine similarity of patch position encodings (learned table or rotary features),
    ``(gh, gw, gh, gw)`` float32."""
    return position_embedding_similarity(resources.get_model(ref), grid_size=grid_size, kind=kind).numpy()


@st.cache_data(show_spinner="Reading the relative-position bias…", max_entries=32)
def relative_position_bias(ref: ModelRef, layer: int) -> np.ndarray:
    """A Swin layer's relative-position bias per head, ``(heads, 2·wh − 1, 2·ww − 1)`` float32
    (:func:`analysis.relative_position_bias`; v2: computed from ``cpb_mlp``)."""
    return analysis.relative_position_bias(resources.get_model(ref), layer).cpu().numpy()


@st.cache_data(show_spinner="Reading the decomposed position tables…", max_entries=32)
def decomposed_position(ref: ModelRef, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """SAM's decomposed tables of one layer: rows ``(2h − 1, head_dim)``, cols ``(2w − 1, head_dim)``
    float32 (:func:`analysis.decomposed_relative_position`)."""
    tables = analysis.decomposed_relative_position(resources.get_model(ref), layer)
    return tables.rows.cpu().numpy(), tables.cols.cpu().numpy()
