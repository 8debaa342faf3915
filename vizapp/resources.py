"""Every cached loader and cached analysis of the app, in one place.

Data flow: image bytes -> RGB image -> model input -> one captured forward pass
(:func:`forward`, cached per model, image and resolution) -> analyses -> figures.

* ``st.cache_resource`` holds models: one shared instance per :class:`ModelRef` for all
  sessions. ``analysis`` captures attention with per-call, per-thread hooks, so sharing
  a model between browser sessions is safe.
* ``st.cache_data`` holds results (numpy arrays, small dataclasses): every caller gets
  its own copy. Image bytes are passed as ``_image_bytes`` (not hashed) next to their
  SHA-1 ``digest`` (hashed), so a rerun never re-hashes megabytes.

Changing a layer, head, query, fusion or opacity therefore never reruns the model: the
forward pass is cached, and so are the small per-query arrays derived from it.
"""

from __future__ import annotations

import hashlib
import io
import os
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import streamlit as st
import torch

import analysis
from analysis import (
    AnalysisError,
    ImageLoadError,
    attention_map,
    capture_attention,
    load_image,
    load_vit,
    mean_attention_distance,
    patch_embedding_components,
    position_embedding_similarity,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
SAMPLES_DIR = REPO_ROOT / "assets" / "samples"
DEMO_DIR = REPO_ROOT / "assets" / "demo_vit"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif")
FALLBACK_SOURCE = "vit_tiny_patch16_224"  # random weights: used when the demo is missing
MAX_DATASET_IMAGES = 256


def _limit(name: str, default: int) -> int:
    """A positive integer from the environment (documented in the README), else ``default``."""
    try:
        return max(1, int(os.environ.get(name, default)))
    except ValueError:
        return default


# Memory bounds for one server shared by many sessions: least-recently-used entries are evicted.
MAX_MODELS = _limit("VIZAPP_MAX_MODELS", 4)  # loaded models kept (cache_resource)
MAX_FORWARDS = _limit("VIZAPP_MAX_FORWARDS", 8)  # captured forward passes (full attention records)
MAX_RESULTS = _limit("VIZAPP_MAX_RESULTS", 64)  # small derived arrays per analysis


# --------------------------------------------------------------------------- model identity


class ModelRef(NamedTuple):
    """Everything that identifies a loaded model: the cache key of :func:`get_model`.

    ``source`` is whatever :func:`analysis.load_vit` accepts ("demo", a timm name,
    "hf-hub:...", a folder or a file); ``arch`` is needed for a bare weights file;
    ``img_size`` overrides the input resolution (``None``: the model's own).
    """

    source: str
    pretrained: bool = True
    arch: str | None = None
    img_size: int | None = None

    @property
    def label(self) -> str:
        text = self.source if self.pretrained else f"{self.source} (random weights)"
        if self.arch:
            text += f" [{self.arch}]"
        if self.img_size:
            text += f" @ {self.img_size}px"
        return text

    def with_img_size(self, img_size: int | None) -> "ModelRef":
        return self._replace(img_size=img_size or None)


def parse_model_ref(text: str) -> ModelRef:
    """``"demo"``, ``"random:<timm name>"`` (random weights), ``"<timm name>"`` or a path."""
    text = text.strip()
    if text.startswith("random:"):
        return ModelRef(text.removeprefix("random:"), pretrained=False)
    return ModelRef(text)


def default_model_ref() -> ModelRef:
    """The model the app opens on: ``$VIZAPP_DEFAULT_MODEL`` if set, else the bundled demo."""
    return parse_model_ref(os.environ.get("VIZAPP_DEFAULT_MODEL", "demo") or "demo")


def fallback_model_ref() -> ModelRef:
    """A model that always loads offline (random weights), for when the default cannot."""
    return ModelRef(FALLBACK_SOURCE, pretrained=False)


@st.cache_resource(show_spinner=False, max_entries=MAX_MODELS)
def get_model(ref: ModelRef) -> analysis.LoadedViT:
    """The loaded model (shared by every session). Raises ModelLoadError with a message for people."""
    kwargs = {"img_size": ref.img_size} if ref.img_size else {}
    return load_vit(ref.source, pretrained=ref.pretrained, arch=ref.arch or None, **kwargs)


# --------------------------------------------------------------------------- images


@dataclass(frozen=True)
class ImageRef:
    """An input image: its name, bytes and the SHA-1 of the bytes (the cache key)."""

    name: str
    data: bytes
    digest: str

    @classmethod
    def from_bytes(cls, name: str, data: bytes) -> "ImageRef":
        return cls(name=name, data=data, digest=hashlib.sha1(data).hexdigest())


def sample_paths() -> list[Path]:
    """The bundled sample images, demo scenes first."""
    if not SAMPLES_DIR.is_dir():
        return []
    files = [p for p in SAMPLES_DIR.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES]
    return sorted(files, key=lambda p: (not p.name.startswith("scene_"), p.name))


@st.cache_data(show_spinner=False, max_entries=MAX_RESULTS)
def read_sample(name: str) -> bytes:
    return (SAMPLES_DIR / name).read_bytes()


@st.cache_data(show_spinner=False, max_entries=MAX_RESULTS)
def decode_image(digest: str, _image_bytes: bytes) -> tuple[int, int]:
    """Decode once to validate; returns (width, height). Raises ImageLoadError."""
    image = load_image(_image_bytes)
    return image.size


def images_from_uploads(files) -> tuple[list[ImageRef], list[str]]:
    """Images (and images inside .zip archives) from uploaded files; returns (images, problems)."""
    images: list[ImageRef] = []
    problems: list[str] = []
    for file in files or []:
        data = file.getvalue()
        if file.name.lower().endswith(".zip"):
            try:
                with zipfile.ZipFile(io.BytesIO(data)) as archive:
                    for info in archive.infolist():
                        name = info.filename
                        if info.is_dir() or not name.lower().endswith(IMAGE_SUFFIXES) or "__MACOSX" in name:
                            continue
                        if info.file_size > 50_000_000:
                            problems.append(f"{name}: larger than 50 MB, skipped.")
                            continue
                        images.append(ImageRef.from_bytes(f"{file.name}/{name}", archive.read(info)))
            except zipfile.BadZipFile:
                problems.append(f"{file.name} is not a readable zip archive.")
        else:
            images.append(ImageRef.from_bytes(file.name, data))
    if len(images) > MAX_DATASET_IMAGES:
        problems.append(f"Only the first {MAX_DATASET_IMAGES} of {len(images)} images are used.")
        images = images[:MAX_DATASET_IMAGES]
    return images, problems


# --------------------------------------------------------------------------- the forward pass


@dataclass(frozen=True)
class Forward:
    """One captured forward pass of one image through one model.

    record: attention ``(L, 1, heads, T, T)`` and logits of the pass.
    input_image: ``(H, W, 3)`` uint8, exactly the pixels the model saw.
    probabilities: ``(classes,)`` softmax of the logits; empty unless the model has a
        classification head (embedding towers and headless models have no classes).
    """

    record: analysis.AttentionRecord
    input_image: np.ndarray
    probabilities: np.ndarray
    notes: tuple[str, ...] = ()  # e.g. "out of GPU memory: ran on the CPU", shown to the user


@st.cache_data(show_spinner="Running the model…", max_entries=MAX_FORWARDS)
def forward(ref: ModelRef, digest: str, _image_bytes: bytes) -> Forward:
    """The single forward pass for (model, image, resolution): everything else derives from it."""
    vit = get_model(ref)
    image = load_image(_image_bytes)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        record = capture_attention(vit, vit.preprocess(image))
    logits = record.logits[0]
    probabilities = logits.softmax(-1).numpy() if vit.spec.has_classifier else np.zeros(0, np.float32)
    return Forward(
        record=record,
        input_image=np.asarray(vit.model_input_image(image), dtype=np.uint8),
        probabilities=probabilities.astype(np.float32),
        notes=tuple(str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)),
    )


@st.cache_data(show_spinner=False, max_entries=16)
def background_uri(ref: ModelRef, digest: str, _image_bytes: bytes) -> str:
    """The model-input image as a data URI, for figure backgrounds."""
    from vizapp.figures import image_data_uri

    return image_data_uri(forward(ref, digest, _image_bytes).input_image)


@st.cache_data(show_spinner=False, max_entries=32)
def top_predictions(ref: ModelRef, digest: str, _image_bytes: bytes, k: int = 5) -> tuple[list[str], np.ndarray]:
    """The k most probable classes: (names, probabilities)."""
    probs = forward(ref, digest, _image_bytes).probabilities
    if probs.size == 0:
        return [], np.zeros(0, np.float32)
    names = get_model(ref).class_names
    order = np.argsort(-probs)[:k]
    labels = [names[i] if names else f"class {i}" for i in order]
    return labels, probs[order]


@st.cache_data(show_spinner=False, max_entries=MAX_RESULTS)
def attention_grid(ref: ModelRef, digest: str, _image_bytes: bytes, query: str | int) -> np.ndarray:
    """Every layer's attention maps for one query: ``(L, heads + 1, gh, gw)`` float32.

    Index ``h < heads`` is head h, index ``heads`` is the mean over heads (both straight
    from :func:`analysis.attention_map`).
    """
    record = forward(ref, digest, _image_bytes).record
    spec = record.spec
    maps = np.empty((spec.num_layers, spec.num_heads + 1, *spec.grid_size), np.float32)
    for layer in range(spec.num_layers):
        for head in range(spec.num_heads):
            maps[layer, head] = attention_map(record, layer, head=head, query=query)[0].numpy()
        maps[layer, spec.num_heads] = attention_map(record, layer, head=None, query=query)[0].numpy()
    return maps


@st.cache_data(show_spinner=False, max_entries=MAX_RESULTS)
def pooling_attention(ref: ModelRef, digest: str, _image_bytes: bytes) -> np.ndarray | None:
    """The attention-pooling head's first probe over the patch tokens: ``(heads + 1, gh, gw)``
    float32 (index ``heads`` is the mean over heads), or ``None`` without such a head."""
    record = forward(ref, digest, _image_bytes).record
    if record.pool_attention is None:
        return None
    spec = record.spec
    probe = record.pool_attention[0, :, 0, spec.num_prefix_tokens :]  # (heads, N)
    maps = torch.cat([probe, probe.mean(0, keepdim=True)]).reshape(-1, *spec.grid_size)
    return maps.numpy().astype(np.float32)


@st.cache_data(show_spinner=False, max_entries=MAX_RESULTS)
def rollout_by_layer(
    ref: ModelRef,
    digest: str,
    _image_bytes: bytes,
    head_fusion: str,
    discard_ratio: float,
    start_layer: int,
    query: str | int,
) -> np.ndarray:
    """The rollout after each layer ``start_layer..L-1``: ``(L - start_layer, gh, gw)`` float32."""
    record = forward(ref, digest, _image_bytes).record
    strip = analysis.attention_rollout_by_layer(
        record, head_fusion=head_fusion, discard_ratio=discard_ratio, start_layer=start_layer, query=query
    )  # (L - start_layer, 1, gh, gw): all partial products in one pass
    return strip[:, 0].numpy().astype(np.float32)


@st.cache_data(show_spinner=False, max_entries=MAX_RESULTS)
def image_attention_distance(ref: ModelRef, digest: str, _image_bytes: bytes) -> np.ndarray:
    """Mean attention distance of the current image, ``(L, heads)`` pixels (from the cached pass)."""
    return mean_attention_distance(forward(ref, digest, _image_bytes).record).numpy()


@st.cache_data(show_spinner=False, max_entries=2048)
def attention_distance_of(ref: ModelRef, digest: str, _image_bytes: bytes) -> np.ndarray:
    """Mean attention distance of one image of an image set, ``(L, heads)`` pixels.

    Runs its own forward pass and keeps only the (small) result, so scanning an image
    set does not fill the cache with attention tensors.
    """
    vit = get_model(ref)
    with torch.inference_mode():
        record = capture_attention(vit, vit.preprocess(load_image(_image_bytes)))
    return mean_attention_distance(record).numpy()


@st.cache_data(show_spinner=False, max_entries=16)
def uniform_distance(ref: ModelRef, digest: str, _image_bytes: bytes) -> float:
    """Mean attention distance (px) if every patch attended uniformly to all patches."""
    return float(analysis.uniform_attention_distance(forward(ref, digest, _image_bytes).record.spec))


# --------------------------------------------------------------------------- model-only analyses


@st.cache_data(show_spinner=False, max_entries=16)
def position_similarity(ref: ModelRef, grid_size: tuple[int, int] | None = None, kind: str | None = None) -> np.ndarray:
    """Cosine similarity of patch position encodings (learned table or rotary features),
    ``(gh, gw, gh, gw)`` float32."""
    return position_embedding_similarity(get_model(ref), grid_size=grid_size, kind=kind).numpy()


@st.cache_data(show_spinner=False, max_entries=16)
def patch_components(ref: ModelRef, n_components: int) -> tuple[np.ndarray, np.ndarray]:
    """Principal components of the patch-embedding filters: ``(k, C, ph, pw)``, ``(k,)``."""
    components, ratio = patch_embedding_components(get_model(ref), n_components=n_components)
    return components.numpy(), ratio.numpy()


@st.cache_data(show_spinner=False, max_entries=16)
def patch_filters(ref: ModelRef) -> np.ndarray:
    """The raw patch-embedding filters ``(D, C, ph, pw)`` float32."""
    return analysis.patch_embedding_filters(get_model(ref)).numpy()


__all__ = [
    "AnalysisError",
    "Forward",
    "ImageLoadError",
    "ImageRef",
    "ModelRef",
    "attention_distance_of",
    "attention_grid",
    "background_uri",
    "decode_image",
    "default_model_ref",
    "fallback_model_ref",
    "forward",
    "get_model",
    "image_attention_distance",
    "images_from_uploads",
    "parse_model_ref",
    "patch_components",
    "patch_filters",
    "pooling_attention",
    "position_similarity",
    "read_sample",
    "rollout_by_layer",
    "sample_paths",
    "top_predictions",
    "uniform_distance",
]
