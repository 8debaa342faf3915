"""The app's shared caches: the model store and the cached results that several pages use.

A computation that only one page uses belongs beside that page, in ``vizapp/views/<page>/compute.py``
(which may import this module; this module never imports a page). Here: the models and captured
passes (:func:`get_model`, :func:`forward`, :func:`memory_store`), the comparison CNN
(:func:`get_cnn`: Attention distance and Robustness), and the derived results pages share (a
pass's predictions, attention maps and views, rollout, tokens and their outliers, the decoding of
a piece of an image set).

Data flow: image bytes -> RGB image -> model input -> one captured forward pass
(:func:`forward`, cached per model, image and resolution) -> analyses -> figures.

* :func:`memory_store` holds models and captured passes, once per process (:mod:`vizapp.records`):
  one shared instance per :class:`ModelRef` and per (model, image) for all sessions, the same
  read-only object for every session and rerun, never pickled or copied; least recently used
  first beyond a count of each kind (``VIZAPP_MAX_MODELS``, ``VIZAPP_MAX_FORWARDS``) and one byte
  budget both share (``VIZAPP_MEMORY_MB``). Sessions hold keys, never the objects, so an evicted
  model or pass is freed. ``analysis`` captures attention with per-call, per-thread hooks, so
  sharing a model between browser sessions is safe.
* ``st.cache_data`` holds small derived results (numpy arrays, small dataclasses): every
  caller gets its own copy. Image bytes are passed as ``_image_bytes`` (not hashed) next to their
  SHA-1 ``digest`` (hashed), so a rerun never re-hashes megabytes.

Changing a layer, head, query, fusion or opacity therefore never reruns the model: the
forward pass is cached, and so are the small per-query arrays derived from it.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass

import numpy as np
import streamlit as st
import torch

import analysis
from analysis import (
    ModelLoadError,
    attention_map,
    capture_attention,
    load_image,
    load_vit,
)
from analysis.robustness import LoadedCNN, load_cnn
from vizapp.access import check_source
from vizapp.limits import FLOAT16_RECORD_BYTES, MAX_FORWARDS, MAX_MODELS, MAX_RESULTS, MEMORY_BUDGET_BYTES
from vizapp.memory import release_on_free
from vizapp.records import RecordStore
from vizapp.refs import ModelRef

SET_CHUNK = 8  # images per cached piece of an image-set average (the progress bar's step)

# --------------------------------------------------------------------------- the model


def get_model(ref: ModelRef) -> analysis.LoadedViT:
    """The loaded model, shared by every session (:func:`memory_store`, kind ``"model"``). Raises
    ModelLoadError with a message for people (:class:`~vizapp.access.SourceRefusedError` where a
    shared server refuses the source, :class:`MemoryBudgetError` for a model the budget cannot hold)."""
    return memory_store().get(("model", ref), lambda: _load_model(ref))


#: one model built at a time, whatever the number of sessions: the store bounds what is kept, but a
#: model being built is not in it yet, so eight visitors opening eight ViT-B at once held eight models
#: beside the budget (tests/bench_server_memory.py: +2.9 GiB at the peak under a 2 GiB budget)
_BUILDING = threading.Lock()


def _load_model(ref: ModelRef) -> analysis.LoadedViT:
    check_source(ref.source, pretrained=ref.pretrained)
    kwargs = {"img_size": ref.img_size} if ref.img_size else {}
    with _BUILDING:
        vit = load_vit(ref.source, pretrained=ref.pretrained, arch=ref.arch or None, **kwargs)
    held = model_bytes(vit)
    if held > MEMORY_BUDGET_BYTES:
        raise MemoryBudgetError(
            f"{ref.label} holds {held / 2**30:,.2f} GiB of weights, more than this server keeps for all models and "
            f"captured passes ({MEMORY_BUDGET_BYTES / 2**30:,.2f} GiB, VIZAPP_MEMORY_MB). Choose a smaller model."
        )
    release_on_free(vit)  # once evicted (sessions hold keys, not models): memory back to the system
    return vit


def model_bytes(vit) -> int:
    """The bytes a loaded model holds: its parameters and buffers, each storage counted once (tied
    weights share one)."""
    seen: dict[int, int] = {}
    for tensor in [*vit.model.parameters(), *vit.model.buffers()]:
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


class MemoryBudgetError(ModelLoadError):
    """A model, or a model with one image's attention record, would hold more than the server's
    memory budget (:data:`~vizapp.limits.MEMORY_BUDGET_BYTES`, ``VIZAPP_MEMORY_MB``); nothing was
    kept or run."""


# --------------------------------------------------------------------------- the forward pass


@dataclass(frozen=True)
class Forward:
    """One captured forward pass of one image through one model.

    record: the attention and logits of the pass (:func:`analysis.capture_attention`), each layer's
        maps ``record.layer_maps(l)`` on its own geometry: a ViT's ``(1, heads, T, T)``, a windowed
        model's (Swin, SAM) ``(1, windows, heads, Wt, Wt)``.
    input_image: ``(H, W, 3)`` uint8, exactly the pixels the model saw.
    probabilities: ``(classes,)`` softmax of the logits; empty unless the model has a
        classification head (embedding towers and headless models have no classes).
    """

    record: analysis.AttentionRecord  # what capture_attention returns for every family
    input_image: np.ndarray
    probabilities: np.ndarray
    notes: tuple[str, ...] = ()  # e.g. "out of GPU memory: ran on the CPU", shown to the user

    @property
    def nbytes(self) -> int:
        """Memory held: the attention record (maps, pooling maps, logits) and the input image."""
        record = self.record
        maps = [record.layer_maps(layer) for layer in record.layers]  # views: each layer's bytes once
        tensors = [*maps, record.logits] + ([record.pool_attention] if record.pool_attention is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors) + self.input_image.nbytes + self.probabilities.nbytes


def _record_entries(spec: analysis.ViTSpec) -> int:
    # one (windows, heads, Wt, Wt) tensor per layer; a ViT's layer is one window of all T tokens
    return sum(g.num_windows * g.num_heads * g.window_tokens**2 for g in spec.geometries())


def record_dtype(spec: analysis.ViTSpec) -> torch.dtype:
    """float32, or float16 when one image's float32 record would exceed
    :data:`~vizapp.limits.FLOAT16_RECORD_BYTES` (the probabilities are still computed in float32)."""
    return torch.float16 if _record_entries(spec) * 4 > FLOAT16_RECORD_BYTES else torch.float32


def record_bytes(spec: analysis.ViTSpec) -> int:
    """The bytes of one image's attention record at :func:`record_dtype`: Σ over layers of
    ``windows · heads · Wt²`` entries (a ViT: one window of all ``T`` tokens), 4 or 2 bytes each."""
    return _record_entries(spec) * (2 if record_dtype(spec) == torch.float16 else 4)


def check_record_fits(ref: ModelRef, vit: analysis.LoadedViT) -> None:
    """Refuse, before the forward pass, a model and resolution whose weights and one image's record
    together exceed the budget every model and record shares (``VIZAPP_MEMORY_MB``): the store keeps
    its newest value whatever its size, so one link could otherwise hold gigabytes; and a pair that
    fits is never pushed out by itself (the model and its pass stay together).

    Raises
    ------
    MemoryBudgetError
        With the sizes, the budget and what to do.
    """
    record, weights = record_bytes(vit.spec), model_bytes(vit)
    if record + weights > MEMORY_BUDGET_BYTES:
        side = "×".join(str(s) for s in vit.spec.img_size)
        raise MemoryBudgetError(
            f"At {side} px, one image's attention record of {ref.label} would take {record / 2**30:,.2f} GiB; with "
            f"the model's {weights / 2**30:,.2f} GiB that is more than this server keeps for all models and "
            f"captured passes ({MEMORY_BUDGET_BYTES / 2**30:,.2f} GiB, VIZAPP_MEMORY_MB). Choose a lower resolution."
        )


def _held_bytes(value) -> int:
    """What a value of :func:`memory_store` holds: a pass's record and image, a model's weights."""
    return value.nbytes if isinstance(value, Forward) else model_bytes(value)


@st.cache_resource(show_spinner=False)
def memory_store() -> RecordStore:
    """The process's loaded models (keys ``("model", ref)``) and captured forward passes (keys
    ``("forward", ref, digest)``), shared by every session: LRU by each kind's count and by the
    bytes they hold together (:data:`~vizapp.limits.MEMORY_BUDGET_BYTES`)."""
    return RecordStore(
        {"model": MAX_MODELS, "forward": MAX_FORWARDS}, MEMORY_BUDGET_BYTES, size=_held_bytes, kind=lambda key: key[0]
    )


def memory_note() -> str | None:
    """The sidebar's line on the server's memory budget, when it bites: once the budget has pushed a
    model or pass out (it will be loaded or computed again when asked for), or at 90% of it; else
    ``None``."""
    store = memory_store()
    held = store.usage()
    used = sum(size for _, size in held.values())
    if not store.evicted_for_bytes and used < 0.9 * store.max_bytes:
        return None
    models, passes = held.get("model", (0, 0))[0], held.get("forward", (0, 0))[0]
    return (
        f"Server memory: {used / 2**30:,.2f} of {store.max_bytes / 2**30:,.2f} GiB held by {models} model(s) and "
        f"{passes} captured pass(es), shared by every visitor (VIZAPP_MEMORY_MB); the least recently used "
        "are loaded or computed again when needed."
    )


def forward(ref: ModelRef, digest: str, _image_bytes: bytes) -> Forward:
    """The single forward pass for (model, image, resolution): everything else derives from it.

    Kept once per process in :func:`memory_store` and returned as the same object to every
    caller: treat it as read-only. A rerun reads slices of it; nothing is copied or unpickled.
    """

    def run() -> Forward:
        with st.spinner("Running the model…", show_time=True):
            return _capture_forward(ref, _image_bytes)

    return memory_store().get(("forward", ref, digest), run)


def preload_forward(ref: ModelRef, digest: str, image_bytes: bytes) -> Forward:
    """:func:`forward` outside a script run (no spinner to draw): the server's start-up preload
    (:mod:`vizapp.preload`) puts the pass where the first page looks for it."""
    return memory_store().get(("forward", ref, digest), lambda: _capture_forward(ref, image_bytes))


def _capture_forward(ref: ModelRef, _image_bytes: bytes) -> Forward:
    vit = get_model(ref)
    check_record_fits(ref, vit)
    image = load_image(_image_bytes)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        record = capture_attention(vit, vit.preprocess(image), dtype=record_dtype(vit.spec))
    logits = record.logits[0]
    probabilities = vit.probabilities(logits).numpy() if vit.spec.has_classifier else np.zeros(0, np.float32)
    input_image = np.asarray(vit.model_input_image(image), dtype=np.uint8)
    input_image.flags.writeable = False
    captured = Forward(
        record=record,
        input_image=input_image,
        probabilities=probabilities.astype(np.float32),
        notes=tuple(str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)),
    )
    release_on_free(captured)  # once the record store evicts it: its memory back to the system
    return captured


@st.cache_data(show_spinner=False, max_entries=16)
def background_uri(ref: ModelRef, digest: str, _image_bytes: bytes) -> str:
    """The model-input image as a data URI, for figure backgrounds."""
    from analysis.plots import image_data_uri

    return image_data_uri(forward(ref, digest, _image_bytes).input_image)


@st.cache_data(show_spinner="Ranking the classes…", max_entries=32)
def top_predictions(ref: ModelRef, digest: str, _image_bytes: bytes, k: int = 5) -> tuple[list[str], np.ndarray]:
    """The k most probable classes: (names, probabilities)."""
    probs = forward(ref, digest, _image_bytes).probabilities
    if probs.size == 0:
        return [], np.zeros(0, np.float32)
    names = get_model(ref).class_names
    order = analysis.top_classes(probs, k)
    labels = [analysis.class_label(names, i) for i in order]
    return labels, probs[order]


def attention_grid(ref: ModelRef, digest: str, _image_bytes: bytes, query: str | int) -> np.ndarray:
    """Every layer's attention maps for one query of a model whose layers share one grid (a ViT):
    ``(L, heads + 1, gh, gw)`` float32, index ``h < heads`` head h, index ``heads`` the mean over
    heads. The layers of :func:`layer_attention_grids` stacked, so the Attention and Compare pages
    share one cached computation."""
    return np.stack(layer_attention_grids(ref, digest, _image_bytes, query))


@st.cache_resource(show_spinner=False, max_entries=MAX_FORWARDS)  # up to 12 MiB each (VIZAPP_VIEW_MB)
def attention_view_blob(ref: ModelRef, digest: str, _image_bytes: bytes, layers: tuple[int, ...]) -> tuple[bytes, dict]:
    """Every query's attention in ``layers`` (a ViT's held layers, a windowed model's one layer),
    quantised for the browser view, as the one file the page fetches
    (:func:`analysis.views.attention_view.attention_view_blob`; shared read-only: bytes)."""
    from analysis.views.attention_view import attention_view_blob as blob

    return blob(forward(ref, digest, _image_bytes).record, layers)


@st.cache_data(show_spinner="Gathering the attention maps…", max_entries=MAX_RESULTS)
def layer_attention_grids(
    ref: ModelRef, digest: str, _image_bytes: bytes, query: str | int | tuple[int, int]
) -> tuple[np.ndarray, ...]:
    """Every layer's maps for one query as :func:`analysis.records.queries.query_for_layers` gives it (a
    ViT: ``"cls"``, ``"mean"``, ``"prefix:<i>"`` or a patch; a windowed model: ``"mean"`` or an input
    pixel ``(y, x)``): per layer ``(heads_l + 1, gh_l, gw_l)`` float32 on that layer's own grid
    (``spec.geometry(layer)``; a windowed model's zero outside the query's window). Index
    ``h < heads_l`` is head h, the last the mean over heads (both from :func:`analysis.attention_map`;
    a ViT's, stacked, are :func:`attention_grid`)."""
    record = forward(ref, digest, _image_bytes).record
    spec = record.spec
    maps = []
    for layer in range(spec.num_layers):
        heads = spec.geometry(layer).num_heads
        per_head = [attention_map(record, layer, head=head, query=query)[0] for head in [*range(heads), None]]
        maps.append(torch.stack(per_head).numpy().astype(np.float32))
    return tuple(maps)


@st.cache_data(show_spinner="Computing attention rollout…", max_entries=MAX_RESULTS)
def rollout_by_layer(
    ref: ModelRef,
    digest: str,
    _image_bytes: bytes,
    head_fusion: str,
    discard_ratio: float,
    start_layer: int,
    query: str | int | tuple[int, int],
    stage: int | None = None,
    merge: str | None = None,
) -> np.ndarray:
    """The rollout after each layer ``start_layer..L-1``: ``(L - start_layer, gh, gw)`` float32.

    A windowed model (Swin, SAM; ``query`` a pixel ``(y, x)`` or ``"mean"``): ``stage`` rolls
    out that stage's layers only (exact; ``start_layer`` then unused), one map per layer of it;
    every map lies on the first layer's grid. ``merge="mean_2x2"`` crosses Swin's patch merging
    as an approximation (the page states ``analysis.attention.rollout.MERGE_WARNING``; the
    library's RuntimeWarning is not repeated); without it such a range is refused (AnalysisError)."""
    record = forward(ref, digest, _image_bytes).record
    span = {"stage": stage} if stage is not None else {"start_layer": start_layer}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*merge='mean_2x2'", category=RuntimeWarning)
        strip = analysis.attention_rollout_by_layer(
            record, head_fusion=head_fusion, discard_ratio=discard_ratio, query=query, merge=merge, **span
        )  # (steps, 1, gh, gw): all partial products in one pass
    return strip[:, 0].numpy().astype(np.float32)


# --------------------------------------------------------------------------- tokens


@st.cache_resource(show_spinner="Capturing the tokens…", max_entries=MAX_FORWARDS)
def tokens(ref: ModelRef, digest: str, _image_bytes: bytes, kind: str) -> analysis.TokenRecord:
    """``analysis.capture_tokens`` of one image (``kind``: token, query, key, value), shared by every
    session and never copied on a rerun: read it, do not write to it. Each layer ``(1, T_l, D_l)``
    on its own grid (``record.geometry(l)``); the library refuses other kinds than ``token`` on a
    windowed model."""
    vit = get_model(ref)
    return analysis.capture_tokens(vit, vit.preprocess(load_image(_image_bytes)), kind=kind)


def layer_tokens(ref: ModelRef, digest: str, _image_bytes: bytes, kind: str, layer: int) -> torch.Tensor:
    """``(1, T_l, D_l)``: one layer of :func:`tokens` (a small copy the caller owns), on the layer's
    own grid."""
    return tokens(ref, digest, _image_bytes, kind).layer_tokens(layer).clone()


@st.cache_data(show_spinner=False, max_entries=MAX_RESULTS)
def outlier_patches(ref: ModelRef, digest: str, _image_bytes: bytes) -> tuple[int, ...]:
    """This image's outlier tokens as maps see them (:func:`analysis.outlier_patches` of
    :func:`analysis.high_norm_tokens` of the block outputs: high-norm in any layer), row-major patch indices; ``()`` for a model
    without one patch grid for every layer (``spec.outlier_grid is None``: a windowed model)."""
    if get_model(ref).spec.outlier_grid is None:
        return ()
    found = analysis.high_norm_tokens(tokens(ref, digest, _image_bytes, "token"))  # the Tokens page's rule
    return tuple(analysis.outlier_patches(found))


# --------------------------------------------------------------------------- the comparison CNN, image sets


@st.cache_resource(show_spinner="Loading the comparison CNN…", max_entries=2)
def get_cnn(source: str, pretrained: bool = True) -> LoadedCNN:
    """The comparison CNN (``analysis.robustness.load_cnn``), shared by every session."""
    check_source(source, pretrained=pretrained)
    return load_cnn(source, pretrained=pretrained)


def decoded_images(_images: tuple[bytes, ...]) -> tuple[list, list[tuple[int, str]]]:
    """``([(index, PIL image)], [(index, reason)])`` of a piece of an image set (the Robustness page's
    pieces, the Text prompts page's head descriptions)."""
    images, skipped = [], []
    for index, data in enumerate(_images):
        try:
            images.append((index, load_image(data)))
        except analysis.ImageLoadError as exc:
            skipped.append((index, str(exc)))
    return images, skipped
