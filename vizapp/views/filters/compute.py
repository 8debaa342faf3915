"""The Patch-embedding filters page's cached computations (``st.cache_data`` / ``st.cache_resource``): what only this page
computes, beside it. The shared ones (a model, a captured forward pass) are :mod:`vizapp.resources`'."""

from __future__ import annotations

import numpy as np
import streamlit as st

import analysis
from analysis import (
    patch_embedding_components,
)
from vizapp import resources  # looked up at each call: a test may replace one
from vizapp.refs import ModelRef

__all__ = ["patch_components", "patch_filters"]


@st.cache_data(show_spinner="Computing the filters' principal components…", max_entries=16)
def patch_components(ref: ModelRef, n_components: int) -> tuple[np.ndarray, np.ndarray]:
    """Principal components of the patch-embedding filters: ``(k, C, ph, pw)``, ``(k,)``."""
    components, ratio = patch_embedding_components(resources.get_model(ref), n_components=n_components)
    return components.numpy(), ratio.numpy()


@st.cache_data(show_spinner=False, max_entries=16)
def patch_filters(ref: ModelRef) -> np.ndarray:
    """The raw patch-embedding filters ``(D, C, ph, pw)`` float32."""
    return analysis.patch_embedding_filters(resources.get_model(ref)).numpy()


# --------------------------------------------------------------------------- explanations
