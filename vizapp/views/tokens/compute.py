"""The Tokens page's cached computations (``st.cache_data`` / ``st.cache_resource``): what only this page
computes, beside it. The shared ones (a model, a captured forward pass) are :mod:`vizapp.resources`'."""

from __future__ import annotations

import numpy as np
import streamlit as st

import analysis
from analysis import (
    load_image,
)
from vizapp import resources  # looked up at each call: a test may replace one
from vizapp.limits import MAX_FORWARDS, MAX_RESULTS
from vizapp.refs import ModelRef

__all__ = ["logit_lens_probabilities", "similarity_view_blob", "token_pca"]


@st.cache_resource(show_spinner=False, max_entries=MAX_FORWARDS)
def similarity_view_blob(ref: ModelRef, digest: str, _image_bytes: bytes, kind: str, layer: int) -> tuple[bytes, dict]:
    """Every token's cosine similarity to the patch tokens of one layer (a ViT), quantised for the
    browser view (:func:`analysis.views.attention_view.similarity_view_rows`, as one served file)."""
    from analysis.views.attention_view import similarity_view_rows, view_blob

    record = resources.forward(ref, digest, _image_bytes).record
    return view_blob(
        record,
        [layer],
        similarity_view_rows(resources.layer_tokens(ref, digest, _image_bytes, kind, layer), record.spec),
    )


@st.cache_data(show_spinner="Fitting the PCA…", max_entries=MAX_RESULTS)
def token_pca(
    ref: ModelRef, digest: str, _image_bytes: bytes, kind: str, layer: int, foreground: bool
) -> tuple[np.ndarray, np.ndarray]:
    """``(rgb (gh, gw, 3), fitted (gh, gw))`` of ``analysis.feature_pca`` on one layer (a
    windowed model: on that layer's stage grid)."""
    spec = resources.get_model(ref).spec  # preprocess resizes every image to the model's own input size
    rgb, fitted = analysis.feature_pca(
        resources.layer_tokens(ref, digest, _image_bytes, kind, layer), spec.geometry(layer), foreground=foreground
    )
    return rgb[0].numpy(), fitted[0].numpy()


@st.cache_data(show_spinner="Reading every layer through the head…", max_entries=MAX_RESULTS)
def logit_lens_probabilities(ref: ModelRef, digest: str, _image_bytes: bytes) -> np.ndarray:
    """``(L', classes)`` softmax of ``analysis.logit_lens``: one row per layer of
    ``analysis.tokens.logit_lens_layers`` (every layer of a ViT; a windowed model's last stage)."""
    vit = resources.get_model(ref)
    return vit.probabilities(analysis.logit_lens(vit, vit.preprocess(load_image(_image_bytes)))[:, 0]).numpy()


# --------------------------------------------------------------------------- robustness
