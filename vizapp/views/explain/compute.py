"""The Explain page's cached computations (``st.cache_data`` / ``st.cache_resource``): what only this page
computes, beside it. The shared ones (a model, a captured forward pass) are :mod:`vizapp.resources`'."""

from __future__ import annotations

import numpy as np
import streamlit as st
import torch

import analysis
from analysis import (
    load_image,
)
from analysis.explanations import CLASS_SPECIFIC
from vizapp import resources  # looked up at each call: a test may replace one
from vizapp.limits import MAX_RESULTS
from vizapp.refs import ModelRef

__all__ = ["explanation", "perturbation_curves"]


def _explain_pixels(ref: ModelRef, _image_bytes: bytes) -> tuple[analysis.LoadedViT, torch.Tensor]:
    vit = resources.get_model(ref)
    return vit, vit.preprocess(load_image(_image_bytes))


@st.cache_data(show_spinner="Explaining the class (one forward and backward pass)…", max_entries=MAX_RESULTS)
def explanation(
    ref: ModelRef, digest: str, _image_bytes: bytes, method: str, target: int | None, options: tuple = ()
) -> np.ndarray:
    """``(gh, gw)`` float32 map of ``method`` for class ``target`` (``analysis.explain``;
    ``"random"``: the faithfulness benchmark's seeded random map). ``options``: (name, value) pairs."""
    from analysis.faithfulness.benchmark import RANDOM, method_maps

    vit, pixels = _explain_pixels(ref, _image_bytes)
    if method == RANDOM:
        return method_maps(vit, pixels, RANDOM, 0, index=0).numpy().astype(np.float32)
    return analysis.explain(vit, pixels, target=target, method=method, **dict(options))[0].numpy().astype(np.float32)


@st.cache_data(show_spinner="Deleting and inserting patches…", max_entries=MAX_RESULTS)
def perturbation_curves(
    ref: ModelRef, digest: str, _image_bytes: bytes, method: str, target: int, options: tuple = (), steps: int = 16
) -> dict[str, np.ndarray]:
    """Deletion and insertion curves of one map: ``{"fractions", "deletion", "insertion"}``
    ``(steps + 1,)`` each: the target's probability as its top-ranked patches are removed /
    restored (the mean colour stands in for removed patches)."""
    from analysis.faithfulness import perturbation_curve

    vit, pixels = _explain_pixels(ref, _image_bytes)
    class_target = target if method in CLASS_SPECIFIC else None
    saliency = torch.from_numpy(explanation(ref, digest, _image_bytes, method, class_target, options))
    fractions, deletion = perturbation_curve(vit, pixels, saliency, target, mode="deletion", steps=steps)
    _, insertion = perturbation_curve(vit, pixels, saliency, target, mode="insertion", steps=steps)
    return {"fractions": fractions, "deletion": deletion, "insertion": insertion}
