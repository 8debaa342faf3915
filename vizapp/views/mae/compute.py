"""The Masked autoencoder page's cached computations (``st.cache_data`` / ``st.cache_resource``): what only this page
computes, beside it. The shared ones (a model, a captured forward pass) are :mod:`vizapp.resources`'."""

from __future__ import annotations

import numpy as np
import streamlit as st
import torch

from analysis import (
    load_image,
)
from vizapp import resources  # looked up at each call: a test may replace one
from vizapp.access import check_source
from vizapp.limits import MAX_RESULTS

__all__ = ["get_mae", "mae_loss_chunk", "mae_pass"]


@st.cache_resource(show_spinner="Loading the masked autoencoder…", max_entries=2)
def get_mae(source: str):
    """The :class:`~analysis.mae.LoadedMAE` of ``source`` (``"demo_mae"``, ``hf:org/name`` or a
    folder), shared by every session. Raises MissingDecoderError for an encoder alone."""
    from analysis.mae import load_mae

    check_source(source)
    return load_mae(source)


@st.cache_resource(show_spinner="Hiding patches and reconstructing…", max_entries=MAX_RESULTS)
def mae_pass(source: str, digest: str, _image_bytes: bytes, hidden: tuple[bool, ...]):
    """One :func:`~analysis.mae.mae_reconstruct` of the image with exactly the ``hidden`` patches
    (row-major, True = hidden) hidden: the :class:`~analysis.mae.MAEReconstruction`, kept once per
    process and shared read-only (its attention is ``(L, 1, heads, 1 + V, 1 + V)``), never copied."""
    from analysis.mae import mae_reconstruct

    mae = get_mae(source)
    pixels = mae.preprocess(load_image(_image_bytes))  # (1, 3, H, W)
    return mae_reconstruct(mae, pixels, mask=torch.tensor(hidden, dtype=torch.bool).unsqueeze(0))


@st.cache_data(show_spinner=False, max_entries=4 * MAX_RESULTS)
def mae_loss_chunk(
    source: str, digests: tuple[str, ...], _images: tuple[bytes, ...], ratios: tuple[float, ...], seed: int, start: int
) -> tuple[np.ndarray, tuple[tuple[int, str], ...]]:
    """``(n, R)`` float64 reconstruction loss of each readable image of one piece of a set at each
    ratio (:func:`analysis.mae.dataset_mae_loss`; image ``i`` of the piece is item ``start + i`` of
    the set and masked from seed ``seed + start + i``, as ``python -m analysis mae`` does), and
    ``(index in the piece, reason)`` per image that could not be read."""
    from analysis.attention.streaming import SkippedImage
    from analysis.mae import dataset_mae_loss

    skipped: list[SkippedImage] = []
    losses = dataset_mae_loss(
        get_mae(source),
        list(_images),
        ratios,
        seed=seed,
        batch_size=resources.SET_CHUNK,
        workers=1,
        index_of=lambda j: start + j,
        skipped=skipped,
    )
    return losses.numpy(), tuple((item.index, item.reason) for item in skipped)


# --------------------------------------------------------------------------- text prompts
