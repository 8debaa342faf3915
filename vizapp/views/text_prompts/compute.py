"""The Text prompts page's cached computations (``st.cache_data`` / ``st.cache_resource``): what only this page
computes, beside it. The shared ones (a model, a captured forward pass) are :mod:`vizapp.resources`'."""

from __future__ import annotations

import numpy as np
import streamlit as st
import torch

from analysis import (
    load_image,
)
from vizapp import resources  # looked up at each call: a test may replace one
from vizapp.limits import MAX_RESULTS

__all__ = ["clip_background_uri", "text_curves", "text_zero_shot"]


@st.cache_data(show_spinner=False, max_entries=16)
def clip_background_uri(source: str, digest: str, _image_bytes: bytes) -> str:
    """The image as the image tower sees it (resized, cropped), as a data URI for map backgrounds."""
    from analysis.plots import image_data_uri

    image = resources.get_clip(source).image.model_input_image(load_image(_image_bytes))
    return image_data_uri(np.asarray(image))


@st.cache_data(show_spinner="Scoring the prompts…", max_entries=MAX_RESULTS)
def text_zero_shot(source: str, digest: str, _image_bytes: bytes, prompts: tuple[str, ...]):
    """:func:`analysis.text.zero_shot` of the image with ``prompts`` (a :class:`~analysis.text.ZeroShot`).
    Raises TextPromptError for an empty prompt."""
    from analysis.text import zero_shot

    return zero_shot(resources.get_clip(source), resources.clip_pixels(source, _image_bytes), list(prompts))


@st.cache_data(show_spinner="Deleting and inserting patches…", max_entries=MAX_RESULTS)
def text_curves(
    source: str, digest: str, _image_bytes: bytes, prompt: str, method: str, steps: int = 16
) -> dict[str, np.ndarray]:
    """Deletion and insertion curves of the image–text score for ``method``'s map of ``prompt``
    (:func:`analysis.faithfulness.perturbation_curve` with :func:`analysis.text.score_value`; the mean
    colour stands in for removed patches): ``{"fractions", "deletion", "insertion"}``, ``(steps + 1,)`` each."""
    from analysis.faithfulness import perturbation_curve
    from analysis.text import score_value
    from analysis.text.prompts import one_prompt

    clip, pixels = resources.get_clip(source), resources.clip_pixels(source, _image_bytes)
    saliency = torch.from_numpy(resources.text_map(source, digest, _image_bytes, prompt, method)[0])
    value = score_value(clip, one_prompt(clip, prompt).embeddings)
    fractions, deletion = perturbation_curve(clip.image, pixels, saliency, 0, mode="deletion", steps=steps, value=value)
    _, insertion = perturbation_curve(clip.image, pixels, saliency, 0, mode="insertion", steps=steps, value=value)
    return {"fractions": fractions, "deletion": deletion, "insertion": insertion}
