"""Every cached loader and cached analysis of the app, in one place.

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

import warnings
from dataclasses import dataclass, field

import numpy as np
import streamlit as st
import torch
from PIL import Image

import analysis
from analysis import (
    ModelLoadError,
    attention_map,
    capture_attention,
    load_image,
    load_vit,
    position_embedding_similarity,
    upsample_map,
)
from analysis.attention.rollout import patch_grid_rollout
from analysis.explanations import CLASS_SPECIFIC
from analysis.records.windowed import WindowedAttentionRecord
from analysis.robustness import LoadedCNN, drop_pixels, load_cnn, probe, robustness_curve
from analysis.tokens import WindowedTokens, stage_high_norm_tokens
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


def _load_model(ref: ModelRef) -> analysis.LoadedViT:
    check_source(ref.source, pretrained=ref.pretrained)
    kwargs = {"img_size": ref.img_size} if ref.img_size else {}
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

    record: attention ``(L, 1, heads, T, T)`` and logits of the pass; for a windowed model
        (Swin, SAM) a :class:`~analysis.records.windowed.WindowedAttentionRecord`, one
        ``(1, windows, heads, Wt, Wt)`` tensor per layer in ``record.windows``.
    input_image: ``(H, W, 3)`` uint8, exactly the pixels the model saw.
    probabilities: ``(classes,)`` softmax of the logits; empty unless the model has a
        classification head (embedding towers and headless models have no classes).
    """

    record: analysis.AttentionRecord | WindowedAttentionRecord
    input_image: np.ndarray
    probabilities: np.ndarray
    notes: tuple[str, ...] = ()  # e.g. "out of GPU memory: ran on the CPU", shown to the user

    @property
    def nbytes(self) -> int:
        """Memory held: the attention record (maps, pooling maps, logits) and the input image."""
        record = self.record
        maps = list(record.windows) if isinstance(record, WindowedAttentionRecord) else [record.attentions]
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


@st.cache_resource(show_spinner=False, max_entries=MAX_FORWARDS)
def windowed_view_blob(ref: ModelRef, digest: str, _image_bytes: bytes, layer: int) -> tuple[bytes, dict]:
    """One windowed layer's attention, every window's every query, quantised for the browser view
    (:func:`analysis.views.attention_view.windowed_view_blob`, from the one windowed record)."""
    from analysis.views.attention_view import windowed_view_blob as blob

    return blob(forward(ref, digest, _image_bytes).record, layer)


@st.cache_resource(show_spinner=False, max_entries=MAX_FORWARDS)  # up to 12 MiB each (VIZAPP_VIEW_MB)
def attention_view_blob(ref: ModelRef, digest: str, _image_bytes: bytes, layers: tuple[int, ...]) -> tuple[bytes, dict]:
    """Every query's attention in ``layers``, quantised for the browser view, as the one file
    the page fetches (:func:`analysis.views.attention_view.view_blob`; shared read-only: bytes)."""
    from analysis.views.attention_view import view_blob

    return view_blob(forward(ref, digest, _image_bytes).record, layers)


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


@st.cache_data(show_spinner=False, max_entries=16)
def uniform_distance_reference(ref: ModelRef, digest: str, _image_bytes: bytes) -> analysis.UniformDistanceReference:
    """The mean attention distance under uniform attention, px, for this image's spec
    (:func:`analysis.uniform_distance_reference`): one value for every layer of a ViT, or
    each layer's own window on its stage grid for a windowed model."""
    return analysis.uniform_distance_reference(forward(ref, digest, _image_bytes).record.spec)


# --------------------------------------------------------------------------- model-only analyses


@st.cache_data(show_spinner="Comparing position embeddings…", max_entries=16)
def position_similarity(ref: ModelRef, grid_size: tuple[int, int] | None = None, kind: str | None = None) -> np.ndarray:
    """Cosine similarity of patch position encodings (learned table or rotary features),
    ``(gh, gw, gh, gw)`` float32."""
    return position_embedding_similarity(get_model(ref), grid_size=grid_size, kind=kind).numpy()


@st.cache_data(show_spinner="Reading the relative-position bias…", max_entries=32)
def relative_position_bias(ref: ModelRef, layer: int) -> np.ndarray:
    """A Swin layer's relative-position bias per head, ``(heads, 2·wh − 1, 2·ww − 1)`` float32
    (:func:`analysis.relative_position_bias`; v2: computed from ``cpb_mlp``)."""
    return analysis.relative_position_bias(get_model(ref), layer).cpu().numpy()


@st.cache_data(show_spinner="Reading the decomposed position tables…", max_entries=32)
def decomposed_position(ref: ModelRef, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """SAM's decomposed tables of one layer: rows ``(2h − 1, head_dim)``, cols ``(2w − 1, head_dim)``
    float32 (:func:`analysis.decomposed_relative_position`)."""
    tables = analysis.decomposed_relative_position(get_model(ref), layer)
    return tables.rows.cpu().numpy(), tables.cols.cpu().numpy()


def _explain_pixels(ref: ModelRef, _image_bytes: bytes) -> tuple[analysis.LoadedViT, torch.Tensor]:
    vit = get_model(ref)
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


# --------------------------------------------------------------------------- tokens


@st.cache_resource(show_spinner="Capturing the tokens…", max_entries=MAX_FORWARDS)
def tokens(ref: ModelRef, digest: str, _image_bytes: bytes, kind: str) -> np.ndarray | WindowedTokens:
    """``(L, T, D)`` float32, read-only and shared (never copied on a rerun):
    ``analysis.capture_tokens`` of one image (``kind``: token, query, key, value). A windowed
    model (Swin, SAM): its :class:`~analysis.tokens.stages.WindowedTokens` (one ``(1, gh·gw, C)``
    tensor per layer, each on its stage grid); the library refuses other kinds than ``token``."""
    vit = get_model(ref)
    features = analysis.capture_tokens(vit, vit.preprocess(load_image(_image_bytes)), kind=kind)
    if isinstance(features, WindowedTokens):
        return features
    features = features.tokens[:, 0].numpy()  # every layer, in order
    features.flags.writeable = False
    return features


def layer_tokens(ref: ModelRef, digest: str, _image_bytes: bytes, kind: str, layer: int) -> torch.Tensor:
    """``(1, T, D)``: one layer of :func:`tokens` (a small copy the caller owns); a windowed
    model's ``(1, gh·gw, C)`` on the layer's own grid."""
    features = tokens(ref, digest, _image_bytes, kind)
    if isinstance(features, WindowedTokens):
        return features.layer_tokens(layer).clone()
    return torch.from_numpy(np.array(features[layer : layer + 1]))


@dataclass(frozen=True)
class TokenNorms:
    """Block-output norms and the high-norm outliers found in them (patch tokens).

    A ViT: ``norms (L, T)``, ``mask (L, N)``. A windowed model: one ``(gh·gw,)`` norm and mask
    array per layer (tuples: stage grids differ), no prefix tokens; read them per layer with
    :meth:`patch_norms` / :meth:`outliers`. ``arrays``: what the page's download holds (a ViT's
    stacked arrays; a windowed model's per layer, on its grid); ``grid_note`` and ``mass_note``: what
    the page says about the grids and about a missing attention mass."""

    norms: np.ndarray | tuple[np.ndarray, ...]
    thresholds: np.ndarray  # (L,), inf where none
    mask: np.ndarray | tuple[np.ndarray, ...]  # (L, N) bool
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
    """Norms, outliers (``analysis.high_norm_tokens``; a windowed model:
    ``analysis.tokens.stage_high_norm_tokens``, each layer on its stage grid) and attention
    masses (``analysis.attention_mass``; not for a windowed model: no prefix tokens, and its
    attention is per window)."""
    features = tokens(ref, digest, _image_bytes, "token")
    if isinstance(features, WindowedTokens):
        found = stage_high_norm_tokens(features)
        norms = tuple(analysis.token_norms(t)[0].numpy() for t in features.tokens)  # (gh·gw,) per layer
        masks = tuple(m[0].numpy() for m in found.mask)
        grids = [features.geometry(layer).grid_size for layer in features.layers]
        return TokenNorms(
            norms=norms,
            thresholds=found.thresholds.numpy(),
            mask=masks,
            fraction=found.fraction.numpy(),
            first_layer=found.first_layer,
            prefix_mass=None,
            outlier_mass=None,
            arrays={
                "thresholds": found.thresholds.numpy(),
                **{f"norms_layer{i}": n.reshape(grid) for i, (n, grid) in enumerate(zip(norms, grids))},
                **{f"outlier_mask_layer{i}": m.reshape(grid) for i, (m, grid) in enumerate(zip(masks, grids))},
            },
            grid_note=" A windowed model: each layer's cells on its own stage grid.",
            mass_note=(
                f"Not defined for this {features.spec.family}: it has no prefix tokens, and its cells attend only "
                "inside their windows, so the mass to the outliers of a layer is not one number per head over the "
                "whole image."
            ),
        )
    record = forward(ref, digest, _image_bytes).record
    spec = record.spec
    prefix = spec.num_prefix_tokens
    norms = analysis.token_norms(torch.from_numpy(np.array(features)))[:, None]
    found = analysis.high_norm_tokens(norms, prefix)  # mask (L, 1, N)
    prefix_mass = analysis.attention_mass(record, list(range(prefix)))[:, 0].numpy() if prefix else None
    outlier_mass = None
    if found.mask.any():
        outlier_mass = np.stack(
            [
                analysis.attention_mass(
                    record.select_layers([layer]),
                    torch.cat([torch.zeros(1, prefix, dtype=torch.bool), found.mask[layer]], dim=1),
                )[0, 0].numpy()
                for layer in range(spec.num_layers)
            ]
        )
    stacked = {"norms": norms[:, 0].numpy(), "thresholds": found.thresholds.numpy(), "mask": found.mask[:, 0].numpy()}
    return TokenNorms(
        norms=stacked["norms"],
        thresholds=stacked["thresholds"],
        mask=stacked["mask"],
        fraction=found.fraction.numpy(),
        first_layer=found.first_layer,
        prefix_mass=prefix_mass,
        outlier_mass=outlier_mass,
        prefix=prefix,
        arrays={"norms": stacked["norms"], "thresholds": stacked["thresholds"], "outlier_mask": stacked["mask"]},
    )


@st.cache_data(show_spinner=False, max_entries=MAX_RESULTS)
def outlier_patches(ref: ModelRef, digest: str, _image_bytes: bytes) -> tuple[int, ...]:
    """This image's outlier tokens as maps see them (:func:`analysis.outlier_patches` of
    :func:`token_norms`: high-norm in any layer), row-major patch indices; ``()`` for a model
    without one patch grid for every layer (``spec.outlier_grid is None``: a windowed model)."""
    if get_model(ref).spec.outlier_grid is None:
        return ()
    features = tokens(ref, digest, _image_bytes, "token")  # (L, T, D), shared with the Tokens page
    norms = analysis.token_norms(torch.from_numpy(np.array(features)))[
        :, None
    ]  # (L, 1, T); a copy: the shared array is read-only
    found = analysis.high_norm_tokens(norms, get_model(ref).spec.num_prefix_tokens)  # the Tokens page's rule
    return tuple(analysis.outlier_patches(found))


@st.cache_resource(show_spinner="Loading the comparison CNN…", max_entries=2)
def get_cnn(source: str, pretrained: bool = True) -> LoadedCNN:
    """The comparison CNN (``analysis.robustness.load_cnn``), shared by every session."""
    check_source(source, pretrained=pretrained)
    return load_cnn(source, pretrained=pretrained)


@dataclass(frozen=True)
class ProbeView:
    """One model on one image at one perturbation level (``analysis.robustness.probe``).

    input_image: ``(H, W, 3)`` uint8 as the model saw it (token drop: dropped patches shown
    as the mean colour, though the model never saw them); probabilities ``(classes,)``;
    saliency: ``(gh, gw)`` rollout (NaN where a token was dropped), ``(h, w)`` Grad-CAM, or a
    windowed model's last-layer attention on that layer's grid; saliency_name: which (a value of
    ``analysis.robustness.SALIENCY_NAMES``); dropped: the removed patch indices, or None.
    """

    input_image: np.ndarray
    probabilities: np.ndarray
    saliency: np.ndarray
    dropped: np.ndarray | None
    saliency_name: str = ""


def _probe_view(
    model,
    pixels: torch.Tensor,
    perturbation: str,
    level: float,
    selection: str,
    seed: int,
    clean_saliency: np.ndarray | None,
    target: int | None = None,
) -> ProbeView:
    result = probe(
        model, pixels, perturbation, level, seed=seed, selection=selection, saliency=clean_saliency, target=target
    )
    shown = result.pixels
    if perturbation == "token_drop":
        shown = drop_pixels(result.pixels, model.spec, result.dropped)
    return ProbeView(
        input_image=model.preprocessing.to_image(shown[0]),
        probabilities=model.probabilities(result.logits[0:1])[0].numpy().astype(np.float32),
        saliency=result.saliency.numpy().astype(np.float32),
        dropped=None if result.dropped is None else result.dropped.numpy(),
        saliency_name=result.saliency_name,
    )


@st.cache_data(show_spinner="Perturbing the input and running the ViT…", max_entries=MAX_RESULTS)
def vit_probe(
    ref: ModelRef, digest: str, _image_bytes: bytes, perturbation: str, level: float, selection: str, seed: int
) -> ProbeView:
    """The ViT under one perturbation; salient drops rank patches by the clean class-token rollout
    (a windowed model: the rollout of its first stage for the mean cell, exact and on the stem's
    patch grid, the grid the drops use)."""
    vit = get_model(ref)
    saliency = None
    if selection != "random":  # the clean rollout, from the shared captured pass (no second forward)
        record = forward(ref, digest, _image_bytes).record
        saliency = patch_grid_rollout(record)[0].numpy()
    return _probe_view(vit, vit.preprocess(load_image(_image_bytes)), perturbation, level, selection, seed, saliency)


@st.cache_data(show_spinner="Perturbing the input and running the CNN…", max_entries=MAX_RESULTS)
def cnn_probe(
    source: str,
    pretrained: bool,
    digest: str,
    _image_bytes: bytes,
    perturbation: str,
    level: float,
    selection: str,
    seed: int,
) -> ProbeView:
    """The comparison CNN under one perturbation (token drop becomes pixel drop: a CNN has no
    tokens). Grad-CAM explains the clean prediction before and after; salient drops rank the
    CNN's drop grid by its clean Grad-CAM, bilinearly resized to that grid."""
    cnn = get_cnn(source, pretrained)
    pixels = cnn.preprocess(load_image(_image_bytes))
    clean = _probe_view(cnn, pixels, "pixel_drop", 0.0, "random", 0, None)
    target = int(np.argmax(clean.probabilities))
    saliency = None
    if selection != "random":
        saliency = upsample_map(clean.saliency, cnn.spec.grid_size, "bilinear")  # resized to the drop grid
    kind = "pixel_drop" if perturbation == "token_drop" else perturbation
    return _probe_view(cnn, pixels, kind, level, selection, seed, saliency, target)


@st.cache_data(show_spinner=False, max_entries=4 * MAX_RESULTS)
def robustness_chunk(
    model_key: tuple,
    digests: tuple[str, ...],
    _images: tuple[bytes, ...],
    perturbation: str,
    levels: tuple[float, ...],
    seed: int,
) -> tuple[np.ndarray, np.ndarray, int, tuple[tuple[int, str], ...]]:
    """Agreement with the clean prediction, summed over one piece of an image set, per level
    (``analysis.robustness.robustness_curve``; image ``i`` of the piece uses seed ``seed + i``).
    ``model_key``: ``("vit", ModelRef)`` or ``("cnn", source, pretrained)``. Returns the summed
    agreement and probability ``(levels,)``, the images used, and ``(index, reason)`` per skipped image."""
    model = loaded_model(model_key)
    images, skipped = _decoded(_images)
    score, probability = np.zeros(len(levels)), np.zeros(len(levels))
    for index, image in images:  # one image at a time, each with its own seed
        curve = robustness_curve(model, [image], perturbation, levels, seed=seed + index, attention=False)
        score += curve.score
        probability += curve.probability
    return score, probability, len(images), tuple(skipped)


def loaded_model(model_key: tuple):
    """The model of a page's ``model_key``: ``("vit", ModelRef)`` or ``("cnn", source, pretrained)``."""
    return get_model(model_key[1]) if model_key[0] == "vit" else get_cnn(*model_key[1:])


def _decoded(_images: tuple[bytes, ...]) -> tuple[list, list[tuple[int, str]]]:
    """``([(index, PIL image)], [(index, reason)])`` of a piece of an image set."""
    images, skipped = [], []
    for index, data in enumerate(_images):
        try:
            images.append((index, load_image(data)))
        except analysis.ImageLoadError as exc:
            skipped.append((index, str(exc)))
    return images, skipped


@dataclass(frozen=True)
class AttackView:
    """One model attacked on one image against its own clean prediction (``analysis.robustness.attack``).

    clean_probabilities, adversarial_probabilities: ``(classes,)``; adversarial_image: ``(H, W, 3)`` uint8
    as the model saw it; perturbation: ``(H, W, 3)`` float, adversarial − clean in 0–255 pixel units."""

    clean_probabilities: np.ndarray
    adversarial_probabilities: np.ndarray
    adversarial_image: np.ndarray
    perturbation: np.ndarray


@st.cache_data(show_spinner="Attacking the image…", max_entries=MAX_RESULTS)
def attack_view(
    model_key: tuple, digest: str, _image_bytes: bytes, attack_name: str, epsilon: float, steps: int, seed: int
) -> AttackView:
    """FGSM or PGD of ε (0–255 units) on this image, untargeted, against the model's clean prediction."""
    from analysis.robustness import attack

    model = loaded_model(model_key)
    pixels = model.preprocess(load_image(_image_bytes)).to(model.device)  # (1, 3, H, W)
    with torch.no_grad():
        clean_logits = model.model(pixels).float()
    target = clean_logits.argmax(-1)
    adversarial = attack(attack_name, model, pixels, target, epsilon=epsilon, steps=steps, seed=seed)
    with torch.no_grad():
        adversarial_logits = model.model(adversarial.to(model.device)).float()
    to_unit = model.preprocessing.unnormalise
    clean_unit = to_unit(pixels).clamp(0, 1)[0].permute(1, 2, 0).cpu().numpy()  # (H, W, 3) in [0, 1]
    unit = to_unit(adversarial.to(model.device)).clamp(0, 1)[0].permute(1, 2, 0).cpu().numpy()
    return AttackView(
        model.probabilities(clean_logits)[0].cpu().numpy(),  # the model's own rule
        model.probabilities(adversarial_logits)[0].cpu().numpy(),
        np.round(unit * 255).astype(np.uint8),
        (unit - clean_unit) * 255.0,
    )


@st.cache_data(show_spinner=False, max_entries=4 * MAX_RESULTS)
def attack_chunk(
    model_key: tuple,
    digests: tuple[str, ...],
    _images: tuple[bytes, ...],
    attack_name: str,
    epsilons: tuple[float, ...],
    steps: int,
    seed: int,
) -> tuple[np.ndarray, int, tuple[tuple[int, str], ...]]:
    """``analysis.robustness.attack_curve`` on one piece of an image set, each image scored against the
    model's own clean prediction: the summed agreement ``(epsilons,)``, the images used, the skipped."""
    from analysis.robustness import attack_curve

    model = loaded_model(model_key)
    images, skipped = _decoded(_images)
    if not images:
        return np.zeros(len(epsilons)), 0, tuple(skipped)
    pictures = [image for _, image in images]
    curve = attack_curve(
        {"model": model},
        pictures,
        model.top1(pictures).tolist(),
        epsilons=epsilons,
        attack_name=attack_name,
        steps=steps,
        seed=seed,
    )
    return curve.accuracy["model"] * len(pictures), len(pictures), tuple(skipped)


@st.cache_data(show_spinner=False, max_entries=4 * MAX_RESULTS)
def transfer_chunk(
    model_keys: tuple[tuple, ...],
    digests: tuple[str, ...],
    _images: tuple[bytes, ...],
    attack_name: str,
    epsilon: float,
    steps: int,
    seed: int,
) -> tuple[np.ndarray, int, tuple[tuple[int, str], ...]]:
    """``analysis.robustness.transfer_matrix`` on the images of one piece where every model predicts the
    same clean class (that class is the label): the summed ``(models, models)`` accuracy, the images used,
    the skipped (unreadable, or the models disagree on the clean image)."""
    from analysis.robustness import transfer_matrix

    models = {str(i): loaded_model(key) for i, key in enumerate(model_keys)}
    images, skipped = _decoded(_images)
    agreed, labels = [], []
    for index, image in images:
        classes = {int(model.top1([image])[0]) for model in models.values()}
        if len(classes) == 1:
            agreed.append(image)
            labels.append(classes.pop())
        else:
            skipped.append((index, "the models disagree on the clean image (left out of the transfer)"))
    if not agreed:
        return np.zeros((len(models), len(models))), 0, tuple(skipped)
    _, matrix = transfer_matrix(
        models, agreed, labels, epsilon=epsilon, attack_name=attack_name, steps=steps, seed=seed
    )
    return matrix * len(agreed), len(agreed), tuple(skipped)


@st.cache_data(show_spinner="Corrupting the image…", max_entries=MAX_RESULTS)
def corruption_view(
    model_key: tuple, digest: str, _image_bytes: bytes, corruption: str, severity: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(corrupted image (H, W, 3) uint8, probabilities (classes,))``: the model's input crop corrupted
    (``analysis.robustness.model_corruption`` with seed 0, ImageNet-C's protocol), as the image-set
    curves corrupt it."""
    from analysis.robustness import model_corruption

    model = loaded_model(model_key)
    corrupted = model_corruption(model, load_image(_image_bytes), corruption, severity, seed=0)
    with torch.no_grad():
        logits = model.model(model.preprocess(Image.fromarray(corrupted), cropped=True).to(model.device)).float()
    return corrupted, model.probabilities(logits)[0].cpu().numpy()


@st.cache_data(show_spinner=False, max_entries=4 * MAX_RESULTS)
def corruption_chunk(
    model_keys: tuple[tuple, ...],
    digests: tuple[str, ...],
    _images: tuple[bytes, ...],
    corruptions: tuple[str, ...],
    severities: tuple[int, ...],
    seed: int,
) -> tuple[np.ndarray, int, tuple[tuple[int, str], ...]]:
    """``analysis.robustness.corruption_curve`` on one piece, each model scored against its own clean
    prediction (image ``i`` of the piece: seed ``seed + i``): the summed agreement ``(models, corruptions,
    severities)``, the images used, the skipped."""
    from analysis.robustness import corruption_curve

    models = {str(i): loaded_model(key) for i, key in enumerate(model_keys)}
    images, skipped = _decoded(_images)
    if not images:
        return np.zeros((len(models), len(corruptions), len(severities))), 0, tuple(skipped)
    curve = corruption_curve(
        models,
        [image for _, image in images],
        None,
        corruptions=corruptions,
        severities=severities,
        image_seeds=[seed + index for index, _ in images],
    )
    return np.stack([curve.accuracy[name] for name in models]) * len(images), len(images), tuple(skipped)


@st.cache_data(show_spinner="Taking the texture away…", max_entries=MAX_RESULTS)
def texture_view(model_key: tuple, digest: str, _image_bytes: bytes, probe: str) -> tuple[np.ndarray, np.ndarray]:
    """``(the probed image (H, W, 3) uint8 at the image's own size, probabilities (classes,))``
    (``analysis.robustness.remove_texture``; a probe that needs no mask)."""
    from analysis.robustness import remove_texture

    model = loaded_model(model_key)
    probed = remove_texture(load_image(_image_bytes), probe).convert("RGB")
    with torch.no_grad():
        logits = model.model(model.preprocess(probed).to(model.device)).float()
    return np.asarray(probed), model.probabilities(logits)[0].cpu().numpy()


@st.cache_data(show_spinner=False, max_entries=4 * MAX_RESULTS)
def texture_chunk(
    model_keys: tuple[tuple, ...], digests: tuple[str, ...], _images: tuple[bytes, ...], probes: tuple[str, ...]
) -> tuple[np.ndarray, int, tuple[tuple[int, str], ...]]:
    """``analysis.robustness.texture_curve`` on one piece of an image set, each model scored against its
    own clean prediction: the summed agreement ``(models, probes)``, the images used, the skipped."""
    from analysis.robustness import texture_curve

    images, skipped = _decoded(_images)
    if not images:
        return np.zeros((len(model_keys), len(probes))), 0, tuple(skipped)
    pictures = [image for _, image in images]
    sums = []
    for key in model_keys:
        model = loaded_model(key)
        curve = texture_curve({"model": model}, pictures, model.top1(pictures).tolist(), probes=probes)
        sums.append(curve.accuracy["model"] * len(pictures))
    return np.stack(sums), len(pictures), tuple(skipped)


@st.cache_data(show_spinner="Showing the models cue-conflict scenes…", max_entries=8)
def shape_bias_counts(model_keys: tuple[tuple, ...], scenes: int, seed: int) -> np.ndarray:
    """``(models, 3)`` int: each model's shape, texture and neither decisions over ``scenes`` cue-conflict
    scenes of stream ``seed`` (``analysis.robustness.shape_bias_of``; the models predict the demo classes)."""
    from analysis.demo.cue_conflict import cue_conflict_scenes
    from analysis.robustness import shape_bias_of

    models = {str(i): loaded_model(key) for i, key in enumerate(model_keys)}
    biases = shape_bias_of(models, cue_conflict_scenes(scenes, seed))
    return np.array([[b.shape, b.texture, b.neither] for b in biases.values()], dtype=np.int64)


# --------------------------------------------------------------------------- masked autoencoders


@st.cache_resource(show_spinner="Loading the masked autoencoder…", max_entries=2)
def get_mae(source: str):
    """The :class:`~analysis.mae.LoadedMAE` of ``source`` (``"demo_mae"``, ``hf:org/name`` or a
    folder), shared by every session. Raises MissingDecoderError for an encoder alone."""
    from analysis.mae import load_mae

    check_source(source)
    return load_mae(source)


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


@st.cache_data(show_spinner="Pasting the patch…", max_entries=MAX_RESULTS)
def patch_on_image(model_key: tuple, digest: str, _image_bytes: bytes, patch: np.ndarray) -> dict:
    """``patch`` ``(C, s, s)`` in [0, 1] pasted at the centre of the image as the model sees it: the patched
    picture ``(H, W, 3)`` uint8, the clean and patched probabilities ``(classes,)`` and, for a
    global-attention ViT, the class token's attention share on the patch's tokens per layer
    (:func:`analysis.robustness.patch_attention_share`: ``layers``, ``clean_share``, ``patched_share``)."""
    from analysis.robustness import (
        measures_patch_attention,
        model_input,
        paste_patch,
        patch_attention_share,
        unit_images,
    )

    model = loaded_model(model_key)
    image = load_image(_image_bytes)
    unit = unit_images(model, [image])  # (1, C, H, W) in [0, 1]
    side = int(patch.shape[-1])
    position = ((int(unit.shape[-2]) - side) // 2, (int(unit.shape[-1]) - side) // 2)
    patched = paste_patch(unit, torch.as_tensor(patch), position)
    result: dict = {"picture": np.round(patched[0].permute(1, 2, 0).cpu().numpy() * 255).astype(np.uint8)}
    if measures_patch_attention(model):
        # one forward per picture: the share's attention records hold the logits of the same passes
        share = patch_attention_share(model, [image], torch.as_tensor(patch), position)
        logits = torch.cat([share.clean.logits, share.patched.logits]).float()
        result.update(
            layers=np.array(share.layers), clean_share=share.clean_share[:, 0], patched_share=share.patched_share[:, 0]
        )
    else:
        with torch.no_grad():
            logits = model.model(model_input(model, torch.cat([unit, patched]))).float()
    probabilities = model.probabilities(logits).cpu().numpy()
    result.update(clean=probabilities[0], patched=probabilities[1])
    return result


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

    decoded, skipped = _decoded(_images)
    images = [image for _, image in decoded]
    if len(images) < 2:
        raise analysis.AnalysisError(
            f"Head descriptions need at least 2 readable images (a variance over images); {len(images)} could be read."
        )
    result = head_texts(
        get_clip(source), images, texts_per_head=texts_per_head, batch_size=SET_CHUNK, progress=progress
    )
    return result, tuple(skipped)
