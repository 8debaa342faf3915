"""The Text prompts page's cached computations (``st.cache_data`` / ``st.cache_resource``): what only this page
computes, beside it. The shared ones (a model, a captured forward pass) are :mod:`vizapp.resources`'."""

from __future__ import annotations

import numpy as np
import streamlit as st
import torch

import analysis
from analysis import (
    load_image,
)
from vizapp import resources  # looked up at each call: a test may replace one
from vizapp.access import check_source
from vizapp.limits import MAX_RESULTS
from vizapp.records import RecordStore

__all__ = [
    "DEMO_CLIP",
    "HEAD_TEXT_RESULTS",
    "clip_background_uri",
    "clip_pixels",
    "compute_head_texts",
    "get_clip",
    "stored_head_texts",
    "text_curves",
    "text_decomposition",
    "text_map",
    "text_zero_shot",
]


DEMO_CLIP = "demo_clip"  # the bundled demo CLIP (analysis.load_clip)


@st.cache_resource(show_spinner="Loading the image–text model…", max_entries=2)
def get_clip(source: str):
    """The :class:`~analysis.LoadedCLIP` of ``source`` (``"demo_clip"``, ``hf:org/name`` or a
    CLIP / SigLIP folder), shared by every session. Raises NoTextTowerError for an image-only model."""
    check_source(source)
    return analysis.load_clip(source)


def clip_pixels(source: str, _image_bytes: bytes) -> torch.Tensor:
    """``(1, 3, H, W)``: the image through the two-tower model's own preprocessing."""
    return get_clip(source).preprocess(load_image(_image_bytes))


@st.cache_data(show_spinner="Explaining the prompt (a forward and a backward pass)…", max_entries=4 * MAX_RESULTS)
def text_map(source: str, digest: str, _image_bytes: bytes, prompt: str, method: str) -> tuple[np.ndarray, float, str]:
    """``(map (gh, gw) float32, score, readout)`` of :func:`analysis.text.explain_text`; ``method``
    ``"random"``: the faithfulness benchmark's seeded random map (seed 0)."""
    from analysis.faithfulness.benchmark import RANDOM, method_maps
    from analysis.text import explain_text

    clip, pixels = get_clip(source), clip_pixels(source, _image_bytes)
    if method == RANDOM:
        return method_maps(clip.image, pixels, RANDOM, 0, index=0).numpy().astype(np.float32), float("nan"), "random"
    explanation = explain_text(clip, pixels, prompt, method=method)
    return explanation.maps[0].numpy().astype(np.float32), float(explanation.scores[0]), explanation.readout


@st.cache_data(show_spinner="Decomposing the score over layers and heads…", max_entries=MAX_RESULTS)
def text_decomposition(source: str, digest: str, _image_bytes: bytes, prompt: str) -> dict:
    """:func:`analysis.text.text_decomposition` of the image's score with ``prompt``: ``heads``
    ``(L, heads)``, ``head_maps`` ``(L, heads, gh, gw)``, ``remainder`` (name -> float), ``score``
    and ``total`` (the sum of every term)."""
    from analysis.text import text_decomposition as decompose

    result = decompose(get_clip(source), clip_pixels(source, _image_bytes), prompt)
    return {
        "heads": result.heads()[0].numpy(),
        "head_maps": result.head_maps()[0].numpy(),
        "remainder": {name: float(value[0]) for name, value in result.remainder().items()},
        "score": float(result.score[0]),
        "total": float(result.total()[0]),
    }


@st.cache_data(show_spinner=False, max_entries=16)
def clip_background_uri(source: str, digest: str, _image_bytes: bytes) -> str:
    """The image as the image tower sees it (resized, cropped), as a data URI for map backgrounds."""
    from analysis.plots import image_data_uri

    image = get_clip(source).image.model_input_image(load_image(_image_bytes))
    return image_data_uri(np.asarray(image))


@st.cache_data(show_spinner="Scoring the prompts…", max_entries=MAX_RESULTS)
def text_zero_shot(source: str, digest: str, _image_bytes: bytes, prompts: tuple[str, ...]):
    """:func:`analysis.text.zero_shot` of the image with ``prompts`` (a :class:`~analysis.text.ZeroShot`).
    Raises TextPromptError for an empty prompt."""
    from analysis.text import zero_shot

    return zero_shot(get_clip(source), clip_pixels(source, _image_bytes), list(prompts))


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

    clip, pixels = get_clip(source), clip_pixels(source, _image_bytes)
    saliency = torch.from_numpy(text_map(source, digest, _image_bytes, prompt, method)[0])
    value = score_value(clip, one_prompt(clip, prompt).embeddings)
    fractions, deletion = perturbation_curve(clip.image, pixels, saliency, 0, mode="deletion", steps=steps, value=value)
    _, insertion = perturbation_curve(clip.image, pixels, saliency, 0, mode="insertion", steps=steps, value=value)
    return {"fractions": fractions, "deletion": deletion, "insertion": insertion}


HEAD_TEXT_RESULTS = 8  # descriptions kept (the least recently used is dropped first)


@st.cache_resource(show_spinner=False)
def _head_text_results() -> RecordStore:
    """Head descriptions computed so far, process-wide and locked (sessions share them):
    key -> ``(HeadTexts, skipped)``; each key computed once even when sessions ask at once."""
    return RecordStore(HEAD_TEXT_RESULTS, 2**62, size=lambda value: 0)


def stored_head_texts(source: str, digests: tuple[str, ...], texts_per_head: int):
    """The head descriptions of this model over these images, if computed already, else None."""
    return _head_text_results().peek((source, digests, texts_per_head))


def compute_head_texts(
    source: str, digests: tuple[str, ...], _images: tuple[bytes, ...], texts_per_head: int, progress=None
):
    """:func:`analysis.text.head_texts` of every head over the readable images (the bundled
    vocabulary), kept for later runs: ``(HeadTexts, ((index, reason), ...) skipped)``.
    ``progress(done, total)``: after each batch of images (of the session that computes them)."""
    return _head_text_results().get(
        (source, digests, texts_per_head), lambda: _head_texts(source, _images, texts_per_head, progress)
    )


def _head_texts(source: str, _images: tuple[bytes, ...], texts_per_head: int, progress):
    from analysis.text import head_texts

    decoded, skipped = resources.decoded_images(_images)
    images = [image for _, image in decoded]
    if len(images) < 2:
        raise analysis.AnalysisError(
            f"Head descriptions need at least 2 readable images (a variance over images); {len(images)} could be read."
        )
    result = head_texts(
        get_clip(source), images, texts_per_head=texts_per_head, batch_size=resources.SET_CHUNK, progress=progress
    )
    return result, tuple(skipped)
