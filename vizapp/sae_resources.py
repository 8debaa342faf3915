"""The Features page's cached loaders and analyses (:mod:`analysis.sae`), apart from
:mod:`vizapp.resources` so the page's caches sit in one place.

An SAE is named by a string: ``"demo"`` (the bundled demo SAE) or a folder on the server. The
models and SAEs are shared resources; the per-image arrays are ``st.cache_data`` (each caller
gets a copy), keyed by the image's digest with its bytes unhashed, as in :mod:`vizapp.resources`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import streamlit as st
import torch
from PIL import Image

from analysis import load_image
from analysis.demo.data import render_sample
from analysis.sae import (
    FeatureIndex,
    SparseAutoencoder,
    build_feature_index,
    feature_class_effect,
    intervene,
    load_demo_sae,
    load_sae,
    patch_feature_grid,
)
from analysis.sae.demo import SAE_HELD_OUT_SEED
from vizapp.access import check_source
from vizapp.limits import MAX_RESULTS
from vizapp.records import RecordStore
from vizapp.refs import ModelRef
from vizapp.resources import get_model

#: the demo scenes the page's feature index reads (held-out scenes of the demo SAE's stream).
INDEX_SCENES = 256
INDEX_SEED = SAE_HELD_OUT_SEED


@st.cache_resource(show_spinner="Loading the SAE…", max_entries=4)
def get_sae(name: str) -> SparseAutoencoder:
    """``"demo"``: the bundled demo SAE; else the SAE folder ``name`` (SAELens format).
    Raises SAEFolderError with what to do (:class:`~vizapp.access.SourceRefusedError` where a shared
    server refuses the folder)."""
    check_source(name)
    return load_demo_sae() if name == "demo" else load_sae(name)


def _pixels(ref: ModelRef, image_bytes: bytes) -> torch.Tensor:
    vit = get_model(ref)
    return vit.preprocess(load_image(image_bytes))


@st.cache_data(show_spinner="Reading the features of every patch…", max_entries=MAX_RESULTS)
def patch_features(ref: ModelRef, sae_name: str, digest: str, _image_bytes: bytes) -> np.ndarray:
    """``(gh, gw, d_sae)`` the SAE's features of each patch of the image. Raises the SAE's typed
    errors (an unknown point, a width that does not match)."""
    vit, sae = get_model(ref), get_sae(sae_name)
    return patch_feature_grid(vit, sae, _pixels(ref, _image_bytes))[0].numpy()


def index_scene(index: int, size: int) -> Image.Image:
    """Scene ``index`` of the index's stream, at ``size`` px."""
    return Image.fromarray(render_sample(INDEX_SEED, int(index), int(size))[0])


def _index_bytes(index: FeatureIndex) -> int:
    return sum(t.element_size() * t.numel() for t in (index.peaks, index.token_features, index.token_values))


#: the feature indexes built so far, shared by every session: each (model, SAE) built once, even when
#: several sessions ask at the same moment. Not an ``st.cache_resource`` of the builder: it draws a
#: progress bar made outside it, which Streamlit's caches cannot replay.
_INDEXES: RecordStore[FeatureIndex] = RecordStore(max_entries=4, max_bytes=256 * 2**20, size=_index_bytes)


def feature_index(
    ref: ModelRef, sae_name: str, progress: Callable[[int, int | None], None] | None = None
) -> FeatureIndex:
    """The :class:`~analysis.sae.FeatureIndex` of :data:`INDEX_SCENES` demo scenes, built once per
    model and SAE for every session (``progress(done, total)`` while it is built)."""

    def build() -> FeatureIndex:
        vit, sae = get_model(ref), get_sae(sae_name)
        size = vit.spec.img_size[0]
        scenes = [index_scene(i, size) for i in range(INDEX_SCENES)]
        return build_feature_index(vit, sae, scenes, batch_size=32, progress=progress)

    return _INDEXES.get((ref, sae_name), build)


@st.cache_data(show_spinner="Drawing where it fires on its top scenes…", max_entries=MAX_RESULTS)
def scene_maps(ref: ModelRef, sae_name: str, feature: int, scenes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """``(pictures (k, H, W, 3) uint8, maps (k, gh, gw))`` of ``feature`` on the index's ``scenes``."""
    vit, sae = get_model(ref), get_sae(sae_name)
    size = vit.spec.img_size[0]
    images = [index_scene(i, size) for i in scenes]
    pixels = torch.cat([vit.preprocess(image) for image in images])
    maps = patch_feature_grid(vit, sae, pixels)[..., int(feature)].numpy()
    pictures = np.stack([np.asarray(vit.model_input_image(image)) for image in images])
    return pictures, maps


@st.cache_data(show_spinner=False, max_entries=MAX_RESULTS)
def class_effect(ref: ModelRef, sae_name: str, feature: int) -> np.ndarray:
    """``(C,)`` the feature's decoder direction through the readout (:func:`~analysis.sae.feature_class_effect`)."""
    return feature_class_effect(get_model(ref), get_sae(sae_name), int(feature)).numpy()


@st.cache_data(show_spinner="Running the model with the feature changed…", max_entries=MAX_RESULTS)
def intervention(
    ref: ModelRef, sae_name: str, digest: str, _image_bytes: bytes, feature: int, factor: float, mode: str = "scale"
) -> dict[str, np.ndarray]:
    """The :class:`~analysis.sae.Intervention` of ``feature`` scaled by ``factor`` (``mode="scale"``) or
    set to ``factor`` at every token (``mode="clamp"``), as arrays."""
    vit = get_model(ref)
    change = {"scale" if mode == "scale" else "clamp": {int(feature): float(factor)}}
    result = intervene(vit, get_sae(sae_name), _pixels(ref, _image_bytes), **change)
    return {
        "clean_probabilities": vit.probabilities(result.clean_logits).numpy(),  # (C,) by the model's own rule
        "steered_probabilities": vit.probabilities(result.steered_logits).numpy(),
        "clean_class_map": result.clean_class_map.numpy(),
        "steered_class_map": result.steered_class_map.numpy(),
        "change_map": result.change_map.numpy(),
    }
