"""Attention distance: mean distance between a query patch and the patches it attends to,
per head and layer (ViT paper, Figure 7 right)."""

from __future__ import annotations

import numpy as np
import streamlit as st

import analysis
from analysis import plots
from analysis.model.loading import DEMO_MODELS
from analysis.similarity import CKAAccumulator
from vizapp import first_result, inputs, resources
from vizapp.image_sets import over_image_set
from vizapp.messages import error_text, escape_markdown
from vizapp.python_snippet import Source, show_code
from vizapp.refs import ModelRef
from vizapp.state import current, second_model_control
from vizapp.ui import clamp_state, download_csv, download_npz, show_chart
from vizapp.views.distance import compute
from vizapp.views.distance.recipe import distance_code

cur = current()
SETS = {"samples": "bundled sample images", "mine": "my images (files or a .zip)"}

st.header("Attention distance", divider="gray")
st.caption(
    "For each head: Σ_k a_qk·‖c_q − c_k‖ over patch keys (attention renormalised over patches), "
    "averaged over all patch queries. Each dashed line is a model's value under uniform attention "
    "on its grid. Patch units (√(ph·pw) px) and fractions of the image side (√(H·W) px) compare "
    "models with other patch sizes or input resolutions. A windowed model (Swin, SAM) attends inside windows "
    "of each stage's grid: its dashed steps are each layer's uniform attention inside its window, so a Swin "
    "beside a ViT in pixels shows where locality comes from, the window or the learning."
)
UNITS = {"px": "input pixels", "patches": "patches", "image": "fraction of image side"}

c1, c2 = st.columns([2, 3], gap="medium")
with c1:
    which = st.radio("Image set to average over", list(SETS), format_func=SETS.get, key="dist_set")
    assert which is not None, "a widget with options and no index=None always has a value"
    scenes = cur.model.source in DEMO_MODELS  # any other model: the bundled photos, not the synthetic scenes
    images, problems = inputs.image_set(which, "dist_files", scenes=scenes)
with c2:
    loaded = second_model_control("dist_model2", "Overlay a second model (optional)", cur.model)
    # one patch side exists only where every layer has one cell size (not across Swin's patch merging)
    units = [u for u in UNITS if u != "patches" or len({g.stride for g in cur.spec.layer_geometry}) <= 1]
    clamp_state("dist_unit", units, "px")
    unit = st.radio("Units", units, format_func=UNITS.get, key="dist_unit", horizontal=True)
    assert unit is not None, "a widget with options and no index=None always has a value"


def set_average(ref: ModelRef, label: str) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Mean over the image set, ``(L, heads)``, and the per-image stack ``(N, L, heads)``.

    :func:`analysis.dataset_attention_distance` runs per piece of ``SET_CHUNK`` images (each
    piece cached), so the progress bar advances; undecodable images are skipped and named.
    """
    if not images or held:  # a session's first open: this image's distances first, the set once drawn
        return None, None
    pieces = over_image_set(
        images,
        label,
        lambda chunk, _start: compute.set_chunk_distances(
            ref, tuple(i.digest for i in chunk), tuple(i.data for i in chunk)
        ),
        problems,
    )
    stack = np.concatenate(pieces)
    if not len(stack):
        return None, None
    return stack.mean(axis=0), stack


series: list[tuple[str, np.ndarray]] = []  # (name, (L, heads) in `unit`)
references: list[tuple[str, float]] = []  # (label, value in `unit`)
layer_references: list[tuple[str, np.ndarray]] = []  # windowed models: (label, (L,) in `unit`), one per layer
references_by_model: list[analysis.UniformDistanceReference] = []  # each added model's, in order
set_refused: list[str] = []  # prefixes of the models whose image-set average the library refused
arrays: dict[str, np.ndarray] = {}


def add_model(ref: ModelRef, name: str, prefix: str) -> None:
    """The current image's and the set's distances of one model, and its uniform reference line,
    converted from pixels into ``unit`` with this model's own patch and input size."""
    args = (ref, cur.image.digest, cur.image.data)
    spec = resources.forward(*args).record.spec
    to_unit = 1.0 / analysis.distance_unit_length(spec, unit)
    current_image = compute.image_attention_distance(*args) * to_unit
    series.append((f"{name} · {cur.image.name}", current_image))
    arrays[f"{prefix}current_image"] = current_image
    try:
        mean, stack = set_average(ref, name)
    except analysis.AnalysisError as exc:  # e.g. the streamed average is not yet defined for windowed models
        st.info(f"No image-set average for **{escape_markdown(name)}**: {error_text(exc)}", icon=":material/block:")
        set_refused.append(prefix)
        mean = stack = None
    if mean is not None and stack is not None:  # both or neither
        series.append((f"{name} · mean over {len(stack)} images", mean * to_unit))
        arrays[f"{prefix}set_mean"], arrays[f"{prefix}set_per_image"] = mean * to_unit, stack * to_unit
    reference = compute.uniform_distance_reference(*args)  # a ViT: one for every layer; windowed: each layer's
    references_by_model.append(reference)
    if reference.per_layer:  # each layer's window on its stage grid: a step per layer
        per_layer = reference.values.numpy() * to_unit
        arrays[f"{prefix}uniform_reference"] = per_layer
        layer_references.append((f"{name} uniform in each layer's window", per_layer))
        return
    gh, gw = spec.grid_size
    uniform = reference.value * to_unit
    arrays[f"{prefix}uniform_reference"] = np.array(uniform)
    for i, (label, value) in enumerate(references):  # the same line for both models: one label
        if abs(value - uniform) <= 1e-9 * max(1.0, abs(value)):
            references[i] = (label.replace(" uniform", f" and {name} uniform", 1), value)
            return
    references.append((f"{name} uniform ({gh}×{gw} grid)", uniform))


held = first_result.holding("distance")
name1 = cur.model.source.split("/")[-1]
name2 = loaded[0].source.split("/")[-1] if loaded is not None else None
if name2 == name1:  # e.g. the same architecture with and without weights
    name1, name2 = f"{name1} (1)", f"{name2} (2)"
add_model(cur.model, name1, "")
if loaded is not None:
    ref2, _ = loaded
    assert name2 is not None, "named above when a second model is loaded"
    try:
        add_model(ref2, name2, "second_")
    except analysis.AnalysisError as exc:  # e.g. no one patch side for a Swin: the reason, as information
        st.info(f"**{escape_markdown(ref2.label)}** is not shown: {error_text(exc)}", icon=":material/block:")
    except Exception as exc:  # noqa: BLE001 - the first model's series still show
        st.error(f"**{escape_markdown(ref2.label)}** could not process the images: {error_text(exc)}")

for problem in problems:
    st.warning(escape_markdown(problem))
if which == "mine" and not images:
    st.info("Upload images (or a .zip of images) to average over them.")

distance_chart = plots.attention_distance_scatter(
    series, references=references, layer_references=layer_references, unit=unit
)
show_chart(distance_chart, "dist_scatter", filename=f"mean_attention_distance_{unit}")
first_result.hold_slow_sections(
    "distance",
    "The image set's average (one forward pass per image) follows as soon as this chart is on screen.",
    held=held and bool(images),
)
d1, d2, _ = st.columns([1, 1, 4])
with d1:
    download_npz("dist_data", f"mean_attention_distance_{unit}", **arrays, unit=np.array(unit))
with d2:
    rows = [
        (name, layer, head, float(values[layer, head]))
        for name, values in series
        for layer in range(values.shape[0])
        for head in range(values.shape[1])
        if np.isfinite(values[layer, head])  # a windowed model's layers have fewer heads than its widest (NaN)
    ]
    download_csv("dist_csv", f"mean_attention_distance_{unit}", ["series", "layer", "head", f"distance_{unit}"], rows)
with_set = "" not in set_refused  # the script recomputes what the page shows: no set where it was refused
show_code(
    distance_code(
        Source.of(cur),
        unit=unit,
        image_set=inputs.bundled_set(scenes=scenes) if which == "samples" and with_set else None,
        image_set_names=[i.name for i in images] if with_set else (),
        windowed=references_by_model[0].per_layer,  # the first model's reference: one value per layer
    )
)

st.subheader("Representation similarity (linear CKA)")
st.caption(
    "How alike every layer's representation of the image set is to every other's: linear CKA (Kornblith et "
    "al. 2019) of each image's whole output after a block, the way Raghu et al. 2021 compare ViTs with "
    f"CNNs; Nguyen et al. 2021's estimator on minibatches of {resources.SET_CHUNK} images. The first model "
    "against the second, against a CNN (each stage's output: Raghu et al.'s ViT against ResNet), or against "
    "itself (a symmetric matrix, 1 on its diagonal). The command line is `python -m analysis similarity`."
)
against = {"self": f"{name1} itself", **({"second": f"the second model, {name2}"} if loaded else {}), "cnn": "a CNN"}
clamp_state("dist_cka_with", list(against), "second" if loaded else "self")
k1, k2 = st.columns([3, 2], gap="medium")
with k1:
    with_what = st.radio("Compare with", list(against), format_func=against.get, key="dist_cka_with", horizontal=True)
cnn_b: tuple[str, bool] | None = None
if with_what == "cnn":
    st.session_state.setdefault("dist_cka_cnn", "demo")
    with k2:
        cnn_text = st.text_input(
            "CNN",
            key="dist_cka_cnn",
            placeholder="demo, resnet50.a1_in1k or random:resnet18",
            help="The demo CNN, any timm CNN or a folder in timm's layout (weights from the local cache or the "
            "hub; random: for random weights). Its stages' outputs are compared with the transformer's blocks.",
        ).strip()
    cnn_b = (cnn_text.removeprefix("random:"), not cnn_text.startswith("random:")) if cnn_text else None
    if cnn_b is not None:
        try:
            resources.get_cnn(*cnn_b)
        except Exception as exc:  # noqa: BLE001 - shown; the page's other charts still stand
            st.error(f"Could not load the CNN **{escape_markdown(cnn_b[0])}**: {error_text(exc)}")
            cnn_b = None
st.session_state.setdefault("dist_cka", False)
if (
    images
    and (with_what != "cnn" or cnn_b is not None)
    and st.toggle("Compute linear CKA over the image set", key="dist_cka", help="One forward pass per image and model.")
):
    ref_b = loaded[0] if loaded is not None and with_what == "second" else None
    cka_problems: list[str] = []
    pieces = over_image_set(
        images,
        "Linear CKA",
        lambda chunk, _start: compute.similarity_chunk(
            cur.model, ref_b, tuple(i.digest for i in chunk), tuple(i.data for i in chunk), cnn_b
        ),
        cka_problems,
    )
    merged = CKAAccumulator.merged([accumulator for accumulator, _, _ in pieces])
    layers_a, layers_b = pieces[0][1], pieces[0][2]
    try:
        matrix = merged.matrix().numpy()
    except analysis.AnalysisError as exc:  # fewer than 4 usable images
        st.info(error_text(exc), icon=":material/block:")
    else:
        if cnn_b is not None:
            second_name = f"CNN {cnn_b[0]}"
        elif ref_b is not None and name2 is not None:
            second_name = name2
        else:
            second_name = name1
        show_chart(
            plots.cka_heatmap(
                matrix,
                layers_a,
                layers_b,
                model_a=name1,
                model_b=second_name,
                title=f"Linear CKA over {merged.images_used} images",
            ),
            "dist_cka_chart",
            filename="linear_cka",
        )
        download_npz(
            "dist_cka_data",
            "linear_cka",
            matrix=matrix,
            layers_a=np.array(layers_a),
            layers_b=np.array(layers_b),
            images=np.int64(merged.images_used),
        )
