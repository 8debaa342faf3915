"""The sidebar (model and image choice) and the per-session "current" selection.

The sidebar runs on every page. It resolves what the user asked for into a working
(model, image) pair: a model that fails to load or an image that fails to decode is
reported with ``st.error`` and the last pair that worked stays in use.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import streamlit as st

import analysis
from analysis.model.loading.hub import hub_reachable, pretrained_weights_cached
from analysis.plots import COLORSCALES, MAP_RANGES, UNIFORM_FLOOR
from vizapp import inputs, refs, resources
from vizapp.messages import error_text, escape_markdown
from vizapp.refs import ImageRef, ModelRef
from vizapp.ui import clamp_state
from vizapp.views import persistent_keys

__all__ = ["Current", "current", "render_sidebar", "keep_page_state", "CURATED_MODELS", "layout_summary"]

# How a patch map is drawn on the image (the sidebar's "Map cells"): values of
# ``analysis.upsample_map``'s modes.
MAP_CELLS = {
    "nearest": "exact patch cells",
    "bilinear": "smooth (bilinear)",
}

# Well-known timm ViTs: label -> ModelRef. Weights are downloaded on first use.
CURATED_MODELS: dict[str, ModelRef] = {
    "ViT-B/16 AugReg (IN-21k → IN-1k)": ModelRef("vit_base_patch16_224.augreg2_in21k_ft_in1k"),
    "ViT-L/16 AugReg (IN-21k → IN-1k)": ModelRef("vit_large_patch16_224.augreg_in21k_ft_in1k"),
    "DeiT-S/16 distilled": ModelRef("deit_small_distilled_patch16_224.fb_in1k"),
    "DeiT-B/16 distilled": ModelRef("deit_base_distilled_patch16_224.fb_in1k"),
    "DINO ViT-S/16": ModelRef("vit_small_patch16_224.dino"),
    "DINO ViT-B/16": ModelRef("vit_base_patch16_224.dino"),
    "DINOv2 ViT-S/14 + 4 registers (at 224 px)": ModelRef("vit_small_patch14_reg4_dinov2.lvd142m", img_size=224),
    "CLIP ViT-B/16 (OpenAI, IN-1k fine-tuned)": ModelRef("vit_base_patch16_clip_224.openai_ft_in1k"),
    "ViT-M/16 global-average-pool, no class token": ModelRef("vit_medium_patch16_gap_256.sw_in12k_ft_in1k"),
}

DEMO_SWIN = ModelRef("demo_swin")  # the bundled windowed comparison model (analysis.model.loading.DEMO_MODELS)
#: the bundled demo ViT and Swin fine-tuned on textured scenes too (analysis.model.loading.DEMO_MODELS): choice -> label
DEMO_TEXTURED = {
    "demo_textured": "the bundled demo ViT trained on textured scenes too (reads texture)",
    "demo_swin_textured": "the bundled demo Swin trained on textured scenes too (reads texture)",
}

MODEL_SOURCES = {
    "default": "Bundled demo model",
    "curated": "Well-known timm ViT",
    "timm": "Model name (timm, hf:, torchvision:)",
    "local": "Local folder or checkpoint",
}

# Page widgets whose values survive page switches (streamlit drops the state of widgets
# that a run does not draw; re-assigning it keeps it).
PERSISTENT_KEYS = persistent_keys()  # each page declares its own (PageInfo.kept_keys; vizapp.views)


@dataclass(frozen=True)
class Current:
    """What every page works on: the model that loaded and the image that decoded.

    A session holds the model's key, never the model: :attr:`vit` looks it up in the cache every
    session shares (:func:`vizapp.resources.get_model`), so the cache's eviction frees a model
    however many open sessions chose it (reloaded on their next run; random weights are seeded)."""

    model: ModelRef
    image: ImageRef
    colorscale: str
    map_range: str = "robust"  # a key of analysis.plots.MAP_RANGES
    map_cells: str = "nearest"  # a key of MAP_CELLS (an analysis.upsample_map mode)
    hide_outliers: bool = False  # leave the outlier tokens out of the maps (drawn blank)

    @property
    def smooth(self) -> bool:
        """Draw maps bilinearly upsampled rather than as exact patch cells."""
        return self.map_cells != "nearest"

    def upsampled(self, grid_map, image_size: tuple[int, int] | None = None):
        """``(gh, gw)`` map -> ``(H, W)`` map at the input pixels when maps are drawn smooth
        (``analysis.upsample_map``), else None (the figure draws exact patch cells)."""
        if not self.smooth:
            return None
        height, width = image_size or self.spec.img_size
        return analysis.upsample_map(grid_map, (height, width), self.map_cells)

    @property
    def vit(self) -> analysis.LoadedViT:
        """The model, from the shared cache (loaded again if another session's choice evicted it)."""
        return resources.get_model(self.model)

    @property
    def spec(self) -> analysis.ViTSpec:
        return self.vit.spec

    @property
    def args(self) -> tuple[ModelRef, str, bytes]:
        """``(model, digest, image bytes)``: the arguments of the cached image analyses."""
        return self.model, self.image.digest, self.image.data

    @property
    def outliers(self) -> tuple[int, ...]:
        """Row-major patch indices of this image's outlier tokens (``analysis.outlier_patches``,
        the Tokens page's rule) on ``spec.outlier_grid``; empty for a model without one (a
        windowed model: its grids differ by stage)."""
        return resources.outlier_patches(*self.args)

    def left_out(self, grid_map) -> tuple[int, ...]:
        """The cells that never set a robust colour range's top: the outlier tokens, when the map
        lies on the grid they are indices of (``spec.outlier_grid``; a stage grid's cells are not
        tokens of that grid, and a windowed model has no such grid)."""
        shape = tuple(getattr(grid_map, "shape", ())[-2:])
        grid = self.spec.outlier_grid
        return self.outliers if grid is not None and shape == tuple(grid) else ()

    def shown(self, grid_map):
        """The map as drawn: with the outlier tokens' cells NaN (not drawn, no colour) when the
        user leaves them out of the maps, else the map itself. Downloads keep the values."""
        cells = self.left_out(grid_map) if self.hide_outliers else ()
        if not cells:
            return grid_map
        drawn = np.array(grid_map, dtype=np.float32, copy=True)
        flat = drawn.reshape(*drawn.shape[:-2], -1)
        flat[..., list(cells)] = np.nan
        return drawn


def current() -> Current:
    return st.session_state["current"]


def reset_for_new_input(page: str, defaults: dict[str, object]) -> None:
    """Reset the choices that belong to one image when the model or the image changed since
    ``page`` last drew; call before the page's widgets.

    A class chosen on one image means nothing on the next: after a new upload, *Why this
    class?* explains the new image's prediction, not the previous image's class at a
    probability near 0. ``defaults`` (setting -> value for this input) are written into the
    widget keys and their permanent copies (:func:`keep_page_state`), so that the browser is
    sent the new value. The first draw of a page keeps what it was given (a shared link's
    settings)."""
    cur = current()
    seen_key, now = f"_input_seen_by_{page}", (cur.model, cur.image.digest)
    changed = st.session_state.get(seen_key, now) != now
    st.session_state[seen_key] = now
    if changed:
        for key, value in defaults.items():
            st.session_state[key] = value
            if kept_key(key) in st.session_state:
                st.session_state[kept_key(key)] = value


KEPT_PREFIX = "_kept_"  # session key prefix of a setting's permanent copy
KEPT_PAGE = "_kept_page"  # session key: the page the previous run drew


def kept_key(key: str) -> str:
    """The session key that holds the setting ``key`` whether or not its widget is drawn."""
    return KEPT_PREFIX + key


def keep_page_state(page: str) -> None:
    """Keep every page setting across page switches; call before any page widget is drawn.

    Each setting in ``PERSISTENT_KEYS`` lives in two session keys: the widget's own key, which
    Streamlit drops after a run that does not draw that widget, and a permanent copy
    (:func:`kept_key`) that nothing drops. Each run, before the page draws:

    - a widget key that holds a value (the browser's latest, or one set in code) is copied
      to the permanent key;
    - on a switch to another ``page``, and for every key Streamlit dropped, the permanent
      value is written back into the widget key.

    The write-back on a switch is what keeps the browser in step: a widget's id includes its
    page, so after a switch every widget is new to the browser, and Streamlit sends a value
    to a new widget only when the script set it this run. Without it the browser shows the
    widget's own default (a slider's minimum: layer 0, opacity 0.00) while the server draws
    the kept value, and the browser's default wins on the next rerun. Within one page a live
    widget key is never re-assigned (that once lost fast slider key presses).
    """
    switched = st.session_state.get(KEPT_PAGE) != page
    st.session_state[KEPT_PAGE] = page
    for key in PERSISTENT_KEYS:
        kept = kept_key(key)
        if key in st.session_state:
            st.session_state[kept] = st.session_state[key]
            if switched or not browser_holds(key):
                st.session_state[key] = st.session_state[kept]
        elif kept in st.session_state:
            st.session_state[key] = st.session_state[kept]


BROWSER_WIDGETS = "_browser_widgets"  # session key: the widget ids the browser has sent a value for


def browser_holds(key: str) -> bool:
    """Whether the browser holds the widget last drawn under ``key``: it sent a value for it, with
    this run's request or an earlier one (True, too, when no widget was drawn under it yet, or
    where Streamlit's session state is not ours to read). A run the script asked for
    (``st.rerun``) carries no values at all, though the browser holds every widget it drew.

    A value set in code reaches the browser only with the run that set it. When another run
    starts before the browser has drawn that widget (a quick second run at a session's start,
    on a loaded machine), the later run's element carries no value, and the browser mounts the
    widget at its own default (a slider's minimum) and sends that back on the next rerun:
    eight concurrent sessions showed layer 0, not the last layer (tests/test_load.py).
    :func:`keep_page_state` sets such a key again until the browser holds it. A widget the
    browser holds is never re-assigned (fast key presses on it would be lost)."""
    try:
        from streamlit.runtime.state import get_session_state

        state = get_session_state()._state
        widget = state._key_id_mapper.get_id_from_key(key, None)
        if widget is None:
            return True
        seen: set = st.session_state.setdefault(BROWSER_WIDGETS, set())
        if widget in state._new_widget_state:
            seen.add(widget)
        return widget in seen
    except (AttributeError, RuntimeError, TypeError):  # another Streamlit's internals: keep its own rule
        return True


def load_model(ref: ModelRef) -> tuple[analysis.LoadedViT | None, str | None]:
    """The model, or ``(None, reason)``. Failures are remembered per session (no retry
    storm on every rerun, e.g. an offline download) until the user presses Retry."""
    failures: dict = st.session_state.setdefault("_model_failures", {})
    if ref in failures:
        return None, failures[ref]
    try:
        with st.spinner(f"Loading {ref.label} (weights are downloaded on first use)…", show_time=True):
            return resources.get_model(ref), None
    except Exception as exc:  # noqa: BLE001 - any failure is shown; the previous model stays
        failures[ref] = error_text(exc)
        return None, failures[ref]


def second_model_choices(shown: ModelRef) -> dict[str, str]:
    """Choices for an optional comparison model: none, the default model, the curated ones
    (minus the model already shown) and "other" (any source the sidebar accepts).
    Maps choice -> label."""
    choices = {"none": "none"}
    if shown != refs.default_model_ref():
        choices["default"] = "the default model"
    if shown != DEMO_SWIN and DEMO_SWIN != refs.default_model_ref():
        choices["demo_swin"] = "the bundled demo Swin (windowed, same scenes)"
    choices.update({k: label for k, label in DEMO_TEXTURED.items() if ModelRef(k) != shown})
    choices.update({k: k for k, ref in CURATED_MODELS.items() if ref != shown})
    choices["other"] = "other: a model name, path or random:…"
    return choices


def second_model_control(key: str, label: str, shown: ModelRef, *, help: str | None = None):
    """A picker for an optional comparison model; returns ``(ref, vit)``, or ``None`` when
    none is picked or it cannot be loaded (then the reason is shown)."""
    choices = second_model_choices(shown)
    clamp_state(key, list(choices), "none")
    choice = st.selectbox(label, list(choices), format_func=lambda name: choices[name], key=key, help=help)
    assert choice is not None, "a selectbox with options and no index=None always has a value"
    if choice == "none":
        return None
    if choice == "other":
        text = st.text_input(
            "Second model",
            key=f"{key}_other",
            placeholder="random:vit_small_patch16_224",
            help="As the sidebar's model name: a timm name, hf:org/name, torchvision:vit_b_16, "
            "a folder or file on the server; prefix random: for random weights.",
        ).strip()
        if not text:
            return None
        return load_second_model(refs.parse_model_ref(text))
    fixed = {"default": refs.default_model_ref(), "demo_swin": DEMO_SWIN, **{k: ModelRef(k) for k in DEMO_TEXTURED}}
    return load_second_model(fixed[choice] if choice in fixed else CURATED_MODELS[choice])


def load_second_model(ref: ModelRef) -> tuple[ModelRef, analysis.LoadedViT] | None:
    """The comparison model, or ``None`` (after showing why) when it cannot be loaded."""
    vit, error = load_model(ref)
    if vit is None:
        st.error(f"Could not load **{escape_markdown(ref.label)}**: {error}")
        return None
    if not ref.pretrained:
        st.warning(
            f"**{escape_markdown(ref.label)}** has random weights: its maps mean nothing.", icon=":material/casino:"
        )
    return ref, vit


@st.cache_data(ttl=300, show_spinner="Checking whether model weights can be downloaded…")
def curated_offline_note() -> str | None:
    """One note for the whole curated list when the hub cannot be reached (checked at most
    every 5 minutes): these models need a download, and which of them are cached already."""
    if hub_reachable():
        return None
    cached = [label for label, ref in CURATED_MODELS.items() if pretrained_weights_cached(ref.source)]
    note = (
        "**Offline:** the well-known ViTs below are downloaded on first use, and the model hub cannot "
        "be reached from this machine (or `HF_HUB_OFFLINE` is set). "
    )
    if cached:
        return note + "Cached here, so they work: " + ", ".join(f"*{escape_markdown(c)}*" for c in cached) + "."
    return note + (
        "None of them is cached here: use the bundled demo model, a local folder, or `random:` with a model name."
    )


def _requested_model() -> ModelRef | None:
    source = st.sidebar.radio(
        "Model",
        list(MODEL_SOURCES),
        format_func=MODEL_SOURCES.get,
        key="model_source",
    )
    ref: ModelRef | None
    if source == "default":
        ref = refs.default_model_ref()
        if ref.source != "demo":
            st.sidebar.caption(f"Default set by VIZAPP_DEFAULT_MODEL: `{ref.label}`")
    elif source == "curated":
        offline_note = curated_offline_note()
        if offline_note:
            st.sidebar.warning(offline_note, icon=":material/cloud_off:")
        label = st.sidebar.selectbox("Well-known ViT", list(CURATED_MODELS), key="model_curated")
        assert label is not None, "a selectbox with options and no index=None always has a value"
        ref = CURATED_MODELS[label]
        st.sidebar.caption(f"timm: `{ref.source}`")
    elif source == "timm":
        name = st.sidebar.text_input(
            "Model name",
            key="model_timm",
            placeholder="vit_small_patch16_224.augreg_in21k_ft_in1k",
            help="A timm ViT name (optionally with a pretrained tag) or hf-hub:org/name (timm weights); "
            "hf:org/name for a Hugging Face transformers model (ViT, DeiT, DINOv2, CLIP, SigLIP); "
            "torchvision:vit_b_16 and the other torchvision ViTs. "
            "Prefix with random: for random weights.",
        ).strip()
        ref = refs.parse_model_ref(name) if name else None
    else:
        path = st.sidebar.text_input(
            "Folder or checkpoint path (on the server)",
            key="model_path",
            help="A folder in timm's hub layout (config.json + model.safetensors), a transformers "
            "save_pretrained folder, or a single .safetensors/.pth/.npz file.",
        ).strip()
        arch = st.sidebar.text_input(
            "Architecture (for a single file)",
            key="model_arch",
            placeholder="vit_base_patch16_224",
            help="The file's architecture: a timm name, or torchvision:vit_b_16 for a torchvision state dict.",
        ).strip()
        ref = ModelRef(path, arch=arch or None) if path else None
    if RESOLUTION_PENDING in st.session_state:  # the value from before a step change (see render_sidebar)
        st.session_state["resolution"] = st.session_state.pop(RESOLUTION_PENDING)
    step = int(st.session_state.get(RESOLUTION_STEP, 16))  # the last loaded model's patch side
    resolution = st.sidebar.number_input(
        "Input resolution (px, 0 = the model's own)",
        min_value=0,
        max_value=1024,
        step=step,
        key="resolution",
        help=f"Feed the model another square input size (timm resamples the position embedding). "
        f"Steps by the patch size ({step} px) so the grid stays whole.",
    )
    if ref is not None and resolution:
        ref = ref.with_img_size(int(resolution))
    return ref


def _choose_model() -> tuple[ModelRef, analysis.LoadedViT]:
    requested = _requested_model()
    if requested is not None:
        vit, error = load_model(requested)
        if vit is not None:
            st.session_state["_good_model"] = requested
            return requested, vit
        st.error(f"Could not load **{escape_markdown(requested.label)}**: {error}", icon=":material/error:")

        def retry(ref=requested):
            st.session_state.get("_model_failures", {}).pop(ref, None)

        st.sidebar.button("Retry loading", key="retry_model", on_click=retry)
    candidates = [st.session_state.get("_good_model"), refs.default_model_ref(), refs.fallback_model_ref()]
    for ref in candidates:
        if ref is None or ref == requested:
            continue
        vit, error = load_model(ref)
        if vit is not None:
            if requested is not None or ref == refs.fallback_model_ref():
                st.sidebar.info(f"Showing **{ref.label}** instead.")
            st.session_state["_good_model"] = ref
            return ref, vit
        if ref == refs.default_model_ref() and ref != requested:
            st.error(f"The default model could not be loaded either: {error}")
    st.error("No model could be loaded, not even a random-weight one; see the messages in the sidebar.")
    st.stop()


def _requested_image() -> ImageRef | None:
    samples = inputs.sample_paths()
    names = [p.name for p in samples]
    upload = st.sidebar.file_uploader(
        "Upload an image",
        type=["jpg", "jpeg", "png", "webp", "bmp", "gif"],
        key="image_upload",
        help="JPEG, PNG, WebP, BMP or GIF (first frame). Remove it to use a sample again.",
    )
    sample = (
        st.sidebar.selectbox(
            "…or a bundled sample",
            names,
            key="image_sample",
            disabled=upload is not None,
            help="Photos are CC0/public domain (see assets/README.md); scene_* are synthetic demo scenes.",
        )
        if names
        else None
    )
    if upload is not None:
        return ImageRef.from_bytes(upload.name, upload.getvalue())
    if sample is not None:
        return ImageRef.from_bytes(sample, inputs.read_sample(sample))
    return None


def _choose_image() -> ImageRef:
    """The image this run shows: the upload, else the chosen sample; an image that cannot be
    read shows its error and the last image that could.

    Replacing one upload by another reaches the app as two runs: the old file removed (the
    sample shows for a moment), then the new file. So a sample shown in the run right after an
    upload is provisional: if the next run brings an unreadable upload, the image kept is that
    earlier upload, not the sample the user never chose."""
    requested = _requested_image()
    uploaded = st.session_state.get("image_upload") is not None
    after_upload = st.session_state.get("_last_run_uploaded", False)
    st.session_state["_last_run_uploaded"] = uploaded
    if requested is not None:
        try:
            inputs.decode_image(requested.digest, requested.data)
            previous = st.session_state.get("_good_image")
            st.session_state["_image_before_removal"] = previous if after_upload and not uploaded else None
            st.session_state["_good_image"] = requested
            return requested
        except Exception as exc:  # noqa: BLE001 - ImageLoadError, or anything PIL raised
            st.error(
                f"Could not read **{escape_markdown(requested.name)}**: {error_text(exc)}",
                icon=":material/broken_image:",
            )
    good = st.session_state.get("_image_before_removal") or st.session_state.get("_good_image")
    if good is not None:
        st.sidebar.info(f"Showing **{good.name}** instead.")
        return good
    samples = inputs.sample_paths()
    if samples:
        return ImageRef.from_bytes(samples[0].name, inputs.read_sample(samples[0].name))
    st.error("No image: upload one in the sidebar.")
    st.stop()


def _check_forward(model: ModelRef, vit, image: ImageRef) -> tuple[ModelRef, analysis.LoadedViT, ImageRef]:
    """Run (or fetch) the cached forward pass; if it fails, go back to the last working pair."""
    try:
        for note in resources.forward(model, image.digest, image.data).notes:
            st.warning(escape_markdown(note), icon=":material/memory:")
        st.session_state["_good_pair"] = (model, image)
        return model, vit, image
    except Exception as exc:  # noqa: BLE001 - shown, then the last working pair is used
        st.error(
            f"**{escape_markdown(model.label)}** could not process **{escape_markdown(image.name)}**: {error_text(exc)}"
        )
        if isinstance(exc, analysis.ImageLoadError):
            st.session_state.pop("_good_image", None)
            st.session_state.pop("_image_before_removal", None)
        else:
            st.session_state.setdefault("_model_failures", {})[model] = error_text(exc)
            st.session_state.pop("_good_model", None)
    pair = st.session_state.get("_good_pair")
    if pair is None:
        st.stop()
    good_model, good_image = pair
    vit, _ = load_model(good_model)
    if vit is None:
        st.stop()
    st.info(f"Showing **{escape_markdown(good_model.label)}** on **{escape_markdown(good_image.name)}** instead.")
    return good_model, vit, good_image


RESOLUTION_STEP = "_resolution_step"  # session key: the loaded model's patch side, the stepper's step
RESOLUTION_PENDING = "_resolution_pending"  # the stepper's value across a step change
RANDOM_WEIGHTS_BANNER = (
    "**Random weights.** This model was not trained: its attention, rollout, distances, position "
    "embeddings and filters show an initialisation, not what a trained ViT does. Use them to check "
    "shapes and plumbing only."
)


def layout_summary(spec: analysis.ViTSpec) -> tuple[str, str]:
    """Two lines that describe the model's token layout, as the sidebar shows them.

    A ViT: ``("patch 16×16 px · grid 14×14", "12 layers × 3 heads · 1 prefix token")`` (with
    ``", no class token"`` when it has none). A windowed model: ``("patch 4×4 px · stage grids
    56×56 → 28×28", "4 layers · heads per stage 2/4 · windowed attention (SwinTransformer)")``:
    each distinct (stage, grid, heads) once, in stage order. Sizes are written width×height."""
    (ph, pw), (gh, gw) = spec.patch_size, spec.grid_size
    geometries = spec.geometries()
    if not all(g.is_global for g in geometries):  # layers attending inside windows: per-stage grids and heads
        stages = sorted({(g.stage, g.grid_size, g.num_heads) for g in geometries})
        grids = " → ".join(f"{w}×{h}" for _, (h, w), _ in stages)
        heads = "/".join(str(n) for _, _, n in stages)
        return (
            f"patch {pw}×{ph} px · stage grids {grids}",
            f"{spec.num_layers} layers · heads per stage {heads} · windowed attention ({spec.family})",
        )
    prefix = spec.num_prefix_tokens
    prefix_text = f"{prefix} prefix token{'s' if prefix != 1 else ''}"
    if not spec.has_class_token:
        prefix_text += ", no class token"
    return (
        f"patch {pw}×{ph} px · grid {gw}×{gh}",
        f"{spec.num_layers} layers × {spec.num_heads} heads · {prefix_text}",
    )


def render_sidebar() -> Current:
    """Draw the sidebar, resolve the (model, image) pair and store it as ``current()``."""
    st.sidebar.header("ViT explorer")
    model, vit = _choose_model()
    image = _choose_image()
    model, vit, image = _check_forward(model, vit, image)
    spec = vit.spec
    step = spec.resolution_step  # a square input of whole cells on every layer's grid
    if st.session_state.get(RESOLUTION_STEP, 16) != step:
        st.session_state[RESOLUTION_STEP] = step
        # a new step is a new widget for some Streamlit versions (1.52 resets its value): carry it over
        st.session_state[RESOLUTION_PENDING] = st.session_state.get("resolution", 0)
        st.rerun()  # redraw the resolution stepper with this model's step (models are cached)
    layout = "  \n".join(layout_summary(spec))  # patch and grid(s), then layers, heads and tokens
    st.sidebar.markdown(
        f"**{escape_markdown(model.label)}**  \n"
        f"input **{spec.img_size[1]}×{spec.img_size[0]} px** · {layout}  \n"
        f"device **{vit.device.type}** · image *{escape_markdown(image.name)}*"
    )
    if not model.pretrained:
        st.warning(RANDOM_WEIGHTS_BANNER, icon=":material/casino:")
    small_note = vit.small_input_note(*inputs.decode_image(image.digest, image.data))
    if small_note:
        st.warning(small_note, icon=":material/photo_size_select_small:")
    colorscale = st.sidebar.selectbox(
        "Colour scale", COLORSCALES, key="colorscale", help="Perceptually uniform colour scales."
    )
    map_range = st.sidebar.radio(
        "Map colour range",
        list(MAP_RANGES),
        format_func=MAP_RANGES.get,
        key="map_range",
        help="Attention maps are probabilities. The default tops out at the 99th percentile of the map's cells, "
        "computed without the outlier tokens (high-norm tokens, see the Tokens page), so that a few outliers "
        "cannot wash out the rest: cells above the top get the top colour and a dotted outline, and the colour "
        f"bar says how many and how high. Every range from 0 reaches at least {UNIFORM_FLOOR:g}× the uniform "
        "level 1/T, so a near-uniform map stays pale. Min to max stretches every map to full contrast; shared "
        "makes layers and heads comparable.",
    )
    hide_outliers = st.sidebar.checkbox(
        "Leave outlier tokens out of the maps",
        key="hide_outliers",
        help="The high-norm outlier tokens that the Tokens page finds (in any layer) are drawn blank in the "
        "attention and rollout maps; downloads keep their values.",
    )
    map_cells = st.sidebar.radio(
        "Map cells",
        list(MAP_CELLS),
        format_func=MAP_CELLS.get,
        key="map_cells",
        horizontal=True,
        help="Exact: one cell per patch, the values the model computed. Smooth: the same values at "
        "patch centres, interpolated bilinearly between them (as in the paper's Figure 6); "
        "hover and downloads keep the patch values.",
    )
    assert colorscale is not None and map_range is not None and map_cells is not None, (
        "widgets with options have values"
    )
    selection = Current(
        model=model,
        image=image,
        colorscale=colorscale,
        map_range=map_range,
        map_cells=map_cells,
        hide_outliers=bool(hide_outliers),
    )
    st.session_state["current"] = selection
    return selection
