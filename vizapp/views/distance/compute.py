"""The Attention distance page's cached computations (``st.cache_data`` / ``st.cache_resource``): what only this page
computes, beside it. The shared ones (a model, a captured forward pass) are :mod:`vizapp.resources`'."""

from __future__ import annotations

import numpy as np
import streamlit as st
import torch

import analysis
from analysis import (
    dataset_attention_distance,
    mean_attention_distance,
)
from analysis.similarity import CKAAccumulator, accumulate_similarity
from vizapp import resources  # looked up at each call: a test may replace one
from vizapp.limits import MAX_RESULTS
from vizapp.refs import ModelRef

__all__ = ["image_attention_distance", "set_chunk_distances", "similarity_chunk", "uniform_distance_reference"]


@st.cache_data(show_spinner="Measuring attention distances…", max_entries=MAX_RESULTS)
def image_attention_distance(ref: ModelRef, digest: str, _image_bytes: bytes) -> np.ndarray:
    """Mean attention distance of the current image, ``(L, heads)`` pixels (from the cached pass)."""
    record = resources.forward(ref, digest, _image_bytes).record  # a ViT's or a windowed model's: one rule reads both
    return mean_attention_distance(record).numpy()


@st.cache_data(show_spinner=False, max_entries=4 * MAX_RESULTS)
def similarity_chunk(
    ref_a: ModelRef,
    ref_b: ModelRef | None,
    digests: tuple[str, ...],
    _images: tuple[bytes, ...],
    cnn_b: tuple[str, bool] | None = None,
) -> tuple[tuple[CKAAccumulator, tuple[str, ...], tuple[str, ...]], tuple[tuple[int, str], ...]]:
    """Linear CKA's minibatch sums over one piece of an image set (one minibatch of up to
    :data:`SET_CHUNK` images; a piece of fewer than 4 is not counted), layer by layer of
    ``ref_a`` against ``ref_b``, or against the CNN ``cnn_b`` (``(source, pretrained)``, as
    :func:`get_cnn` takes it; each stage's output), or against ``ref_a`` itself when both are
    ``None``; and ``(index, reason)`` of each image that could not be decoded.
    :meth:`analysis.similarity.CKAAccumulator.merged` adds the pieces up."""
    decoded, skipped = [], []
    for index, data in enumerate(_images):
        try:
            decoded.append(analysis.load_image(data))
        except analysis.ImageLoadError as exc:
            skipped.append((index, str(exc)))
    model_b = resources.get_cnn(*cnn_b) if cnn_b is not None else None if ref_b is None else resources.get_model(ref_b)
    return accumulate_similarity(resources.get_model(ref_a), [decoded] if decoded else [], model_b), tuple(skipped)


@st.cache_data(show_spinner=False, max_entries=4 * MAX_RESULTS)
def set_chunk_distances(
    ref: ModelRef, digests: tuple[str, ...], _images: tuple[bytes, ...]
) -> tuple[np.ndarray, tuple[tuple[int, str], ...]]:
    """Mean attention distance of each image of one piece of an image set, through
    :func:`analysis.dataset_attention_distance` (streamed: no attention map is kept).

    Returns ``(n_used, L, heads)`` pixels and ``(index in the piece, reason)`` for every image
    that could not be decoded. The app calls this per :data:`SET_CHUNK` images, so a progress
    bar can advance between pieces and a grown image set reuses the pieces already computed.
    """
    vit = resources.get_model(ref)
    skipped: list[analysis.SkippedImage] = []
    spec = vit.spec
    try:
        per_image = dataset_attention_distance(
            vit, list(_images), batch_size=len(_images), on_error="skip", skipped=skipped, per_image=True, workers=1
        )
    except analysis.AnalysisError:
        if len(skipped) != len(_images):
            raise
        per_image = torch.zeros(0, spec.num_layers, spec.num_heads)
    return per_image.numpy(), tuple((item.index, item.reason) for item in skipped)


@st.cache_data(show_spinner=False, max_entries=16)
def uniform_distance_reference(ref: ModelRef, digest: str, _image_bytes: bytes) -> analysis.UniformDistanceReference:
    """The mean attention distance under uniform attention, px, for this image's spec
    (:func:`analysis.uniform_distance_reference`): one value for every layer of a ViT, or
    each layer's own window on its stage grid for a windowed model."""
    return analysis.uniform_distance_reference(resources.forward(ref, digest, _image_bytes).record.spec)
