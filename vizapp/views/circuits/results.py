"""The Circuits page's cached results (:mod:`analysis.circuits`), one layer at a time where the
work is ``L × heads`` or ``L × tokens`` forward passes, so the page can show its progress.

Every function takes the page's usual ``(model, digest, image bytes)`` and returns small numpy
arrays (kept per process by ``st.cache_data``).
"""

from __future__ import annotations

import numpy as np
import streamlit as st
import torch

from analysis import load_image
from analysis.base.image_ops import gaussian_blur, gaussian_noise
from analysis.circuits import activation_patching, cumulative_head_ablation, direct_logit_attribution, head_ablation
from vizapp import inputs
from vizapp.limits import MAX_RESULTS
from vizapp.refs import ModelRef
from vizapp.resources import get_model

__all__ = [
    "CORRUPTIONS",
    "attribution",
    "ablation_layer",
    "ablation_curve",
    "patching_layer",
    "corrupted_pixels",
    "reference_pixels",
]

#: How the Patching section corrupts the image: name -> what the level means.
CORRUPTIONS = {
    "noise": "Gaussian noise σ (normalised pixels)",
    "blur": "Gaussian blur σ (input px)",
    "sample": "another bundled sample image",
}


def _pixels(ref: ModelRef, image_bytes: bytes) -> torch.Tensor:
    vit = get_model(ref)
    return vit.preprocess(load_image(image_bytes))


@st.cache_resource(show_spinner=False, max_entries=8)
def reference_pixels(ref: ModelRef, name: str | None) -> torch.Tensor:
    """The mean-ablation reference (``None``: every bundled sample) or one sample by name,
    preprocessed once per model (each layer's ablation reads it; treat it as read-only)."""
    vit = get_model(ref)
    paths = [p for p in inputs.sample_paths() if name is None or p.name == name]
    return torch.cat([vit.preprocess(load_image(p)) for p in paths])


def corrupted_pixels(
    ref: ModelRef, image_bytes: bytes, corruption: str, level: float, sample: str | None
) -> torch.Tensor:
    """The corrupted input of the Patching section: ``(1, 3, H, W)``."""
    clean = _pixels(ref, image_bytes)
    if corruption == "noise":
        return gaussian_noise(clean, level, seed=0)
    if corruption == "blur":
        return gaussian_blur(clean, level)
    return reference_pixels(ref, sample)[:1]


@st.cache_data(show_spinner="Attributing the logit to every head and MLP…", max_entries=MAX_RESULTS)
def attribution(ref: ModelRef, digest: str, _image_bytes: bytes, target: int) -> dict[str, np.ndarray]:
    """:func:`analysis.circuits.direct_logit_attribution` of class ``target``: ``heads (L, H, T)``,
    ``head_bias (L, T)``, ``mlps (L, T)``, ``embedding (T,)``, ``constant``, ``target_logit``."""
    result = direct_logit_attribution(get_model(ref), _pixels(ref, _image_bytes), target=target)
    return {
        name: getattr(result, name)[0].numpy()
        for name in ("heads", "head_bias", "mlps", "embedding", "constant", "target_logit")
    }


@st.cache_data(show_spinner=False, max_entries=4 * MAX_RESULTS)
def ablation_layer(
    ref: ModelRef, digest: str, _image_bytes: bytes, target: int, method: str, reference: str | None, layer: int
) -> dict[str, np.ndarray]:
    """One layer's row of :func:`analysis.circuits.head_ablation`: ``delta_logit``, ``delta_probability`` (heads,)."""
    references = None if method == "zero" else reference_pixels(ref, reference)
    result = head_ablation(
        get_model(ref), _pixels(ref, _image_bytes), target=target, method=method, reference=references, layers=[layer]
    )
    return {
        "delta_logit": result.delta_logit[0, 0].numpy(),
        "delta_probability": result.delta_probability[0, 0].numpy(),
        "clean_logit": result.clean_logit.numpy(),
    }


@st.cache_data(show_spinner="Removing heads one by one…", max_entries=MAX_RESULTS)
def ablation_curve(
    ref: ModelRef,
    digest: str,
    _image_bytes: bytes,
    target: int,
    method: str,
    reference: str | None,
    heads: tuple[tuple[int, int], ...],
) -> np.ndarray:
    """:func:`analysis.circuits.cumulative_head_ablation`: ``(K + 1,)`` target logits."""
    references = None if method == "zero" else reference_pixels(ref, reference)
    curve = cumulative_head_ablation(
        get_model(ref), _pixels(ref, _image_bytes), list(heads), target=target, method=method, reference=references
    )
    return curve[:, 0].numpy()


@st.cache_data(show_spinner=False, max_entries=4 * MAX_RESULTS)
def patching_layer(
    ref: ModelRef,
    digest: str,
    _image_bytes: bytes,
    target: int,
    corruption: str,
    level: float,
    sample: str | None,
    point: str,
    layer: int,
) -> dict[str, np.ndarray]:
    """One layer's row of :func:`analysis.circuits.activation_patching`: ``effect`` and ``patched``
    (tokens or heads,), and the ``clean`` and ``corrupted`` metrics."""
    vit = get_model(ref)
    result = activation_patching(
        vit,
        _pixels(ref, _image_bytes),
        corrupted_pixels(ref, _image_bytes, corruption, level, sample),
        point=point,
        target=target,
        layers=[layer],
        batch_size=32,
    )
    return {
        "effect": result.effect[0].numpy(),
        "patched": result.patched[0].numpy(),
        "clean": np.float64(result.clean),
        "corrupted": np.float64(result.corrupted),
    }
