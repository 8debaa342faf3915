"""The Tokens page's cached computations (``st.cache_data`` / ``st.cache_resource``): what only this page
computes, beside it. The shared ones (a model, a captured forward pass) are :mod:`vizapp.resources`'."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import streamlit as st
import torch

import analysis
from analysis import (
    AnalysisError,
    load_image,
)
from vizapp import resources  # looked up at each call: a test may replace one
from vizapp.limits import MAX_FORWARDS, MAX_RESULTS
from vizapp.refs import ModelRef

__all__ = ["TokenNorms", "logit_lens_probabilities", "similarity_view_blob", "token_norms", "token_pca"]


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


@dataclass(frozen=True)
class TokenNorms:
    """Block-output norms and the high-norm outliers found in them (patch tokens), layer by layer.

    ``norms``: one ``(T_l,)`` array per layer (prefix tokens first), ``mask``: one ``(N_l,)`` array of
    its patch (grid-cell) tokens; read them per layer with :meth:`patch_norms` / :meth:`outliers`.
    ``arrays``: what the page's download holds (stacked ``(L, …)`` arrays when every layer has one
    grid, else one array per layer on its grid); ``grid_note`` and ``mass_note``: what the page
    says about the grids and about a missing attention mass."""

    norms: tuple[np.ndarray, ...]
    thresholds: np.ndarray  # (L,), inf where none
    mask: tuple[np.ndarray, ...]  # (N_l,) bool per layer
    fraction: np.ndarray  # (L,)
    first_layer: int | None
    prefix_mass: np.ndarray | None  # (L, heads) attention of patch queries to the prefix tokens
    outlier_mass: np.ndarray | None  # (L, heads) ... to the outlier patches of each layer
    prefix: int = 0  # prefix tokens in front of each row of ``norms``
    arrays: dict = field(default_factory=dict)  # name -> array, the download
    grid_note: str = ""  # appended to the outlier caption
    mass_note: str = "No prefix tokens and no outliers in this model and image."  # when both masses are None

    def patch_norms(self, layer: int) -> np.ndarray:
        """``(N_l,)`` the patch (cell) tokens' norms of one layer, row-major on its grid."""
        return self.norms[layer][self.prefix :]

    def outliers(self, layer: int) -> list[int]:
        """Row-major indices of one layer's outlier patches (cells)."""
        return np.flatnonzero(self.mask[layer]).tolist()


@st.cache_data(show_spinner="Measuring token norms…", max_entries=MAX_RESULTS)
def token_norms(ref: ModelRef, digest: str, _image_bytes: bytes) -> TokenNorms:
    """Norms and outliers (``analysis.high_norm_tokens`` of the block outputs, each layer on its own
    grid) and the attention masses to the prefix tokens and to the outliers
    (``analysis.attention_mass``; where the library refuses it, the page says why)."""
    features = resources.tokens(ref, digest, _image_bytes, "token")  # one image, every layer
    found = analysis.high_norm_tokens(features)
    norms = tuple(analysis.token_norms(features.layer_tokens(layer))[0].numpy() for layer in features.layers)
    masks = tuple(mask[0].numpy() for mask in found.mask)  # (N_l,) per layer
    grids = [features.geometry(layer).grid_size for layer in features.layers]
    prefix = features.geometry(features.layers[0]).prefix_tokens
    thresholds = found.thresholds.numpy()
    if len(set(grids)) == 1:
        arrays = {"norms": np.stack(norms), "thresholds": thresholds, "outlier_mask": np.stack(masks)}
        grid_note = ""
    else:
        arrays = {
            "thresholds": thresholds,
            **{f"norms_layer{i}": n.reshape(grid) for i, (n, grid) in enumerate(zip(norms, grids))},
            **{f"outlier_mask_layer{i}": m.reshape(grid) for i, (m, grid) in enumerate(zip(masks, grids))},
        }
        grid_note = " Each layer's cells on its own grid."
    prefix_mass = outlier_mass = None
    mass_note = TokenNorms.mass_note
    try:
        prefix_mass, outlier_mass = _attention_masses(
            resources.forward(ref, digest, _image_bytes).record, masks, prefix
        )
    except AnalysisError as refusal:
        mass_note = str(refusal)[:1].upper() + str(refusal)[1:]  # the library's reason
    return TokenNorms(
        norms=norms,
        thresholds=thresholds,
        mask=masks,
        fraction=found.fraction.numpy(),
        first_layer=found.first_layer,
        prefix_mass=prefix_mass,
        outlier_mass=outlier_mass,
        prefix=prefix,
        arrays=arrays,
        grid_note=grid_note,
        mass_note=mass_note,
    )


def _attention_masses(
    record, masks: tuple[np.ndarray, ...], prefix: int
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``(to the prefix tokens, to each layer's outliers)``, each ``(L, heads)`` or ``None`` where there
    are none (``analysis.attention_mass`` of image 0)."""
    prefix_mass = analysis.attention_mass(record, list(range(prefix)))[:, 0].numpy() if prefix else None
    if not any(mask.any() for mask in masks):
        return prefix_mass, None
    outlier_mass = np.stack(
        [
            analysis.attention_mass(
                record.select_layers([layer]),
                torch.cat([torch.zeros(1, prefix, dtype=torch.bool), torch.from_numpy(mask)[None]], dim=1),
            )[0, 0].numpy()
            for layer, mask in enumerate(masks)
        ]
    )
    return prefix_mass, outlier_mass
