"""Why this class? Class-specific explanations side by side, with their deletion and
insertion curves against a random map."""

from __future__ import annotations

import numpy as np
import streamlit as st

from analysis import AnalysisError, plots, scale_by_peak, top_classes
from analysis.explanations import BASELINES, CLASS_SPECIFIC, EXPLANATION_METHODS, explanation_grid, methods_for
from analysis.faithfulness import area_under_curve
from analysis.plots import robust_scaled
from vizapp import first_result, inputs, resources
from vizapp.layer_grids import stage_label, stage_layers
from vizapp.messages import demo_scope_note, error_text
from vizapp.python_snippet import Source, show_code
from vizapp.state import current, reset_for_new_input
from vizapp.ui import clamp_state, download_csv, download_npz, end_page, outlier_notice, refuse_page, show_chart
from vizapp.views.explain import compute
from vizapp.views.explain.recipe import explain_code

METHOD_LABELS = {
    "attention": "attention (last layer)",
    "rollout": "rollout",
    "chefer": "Chefer et al. 2021",
    "gradcam": "Grad-CAM",
    "input_x_gradient": "input × gradient",
    "integrated_gradients": "integrated gradients",
    "attnlrp": "AttnLRP (Achtibat et al. 2024)",
}
DEFAULT_METHODS = ["chefer", "rollout", "gradcam"]
# The methods by their cost on a CPU, cheapest first: a session's first open draws the cheapest chosen
# one at once, and the others with the deletion and insertion curves once it is on screen.
CHEAPEST_FIRST = ["attention", "rollout", "gradcam", "input_x_gradient", "attnlrp", "chefer", "integrated_gradients"]

cur = current()
spec = cur.spec

st.header("Why this class?", divider="gray")
st.caption(
    "Which patches make the model score a class. Chefer et al.'s relevance, Grad-CAM, input × gradient, "
    "integrated gradients and AttnLRP's layer-wise relevance are class-specific; attention and rollout show where the model looks, "
    "whatever the class. Below, deletion and insertion curves measure each map on this image, next to a random map."
)

class_specific = spec.has_classifier
if class_specific:
    probabilities = resources.forward(*cur.args).probabilities  # (classes,)
    names = cur.vit.class_names or [f"class {i}" for i in range(len(probabilities))]
    ranked = top_classes(probabilities)  # most probable first: the top-k lead the list
    methods_offered = list(methods_for(cur.vit))  # a windowed model (Swin, SAM): no class-token methods
else:
    probabilities, names, ranked = np.zeros(0), [], []
    methods_offered = [m for m in methods_for(cur.vit) if m not in CLASS_SPECIFIC]
    st.info(
        "This model has no class scores (an embedding tower or a headless backbone), so there is no "
        "class to explain: only the class-agnostic attention and rollout are shown.",
        icon=":material/info:",
    )


not_defined = [m for m in EXPLANATION_METHODS if m not in methods_for(cur.vit)]
for method in not_defined:  # the library's own reason (a typed AnalysisError), e.g. chefer on a Swin
    try:
        explanation_grid(cur.vit, method)
    except AnalysisError as exc:
        st.info(f"**{METHOD_LABELS[method]}** is not offered: {error_text(exc)}", icon=":material/block:")


def class_label(index: int) -> str:
    return f"{names[index]} · {probabilities[index]:.1%}"


if class_specific:  # a new image (or model): its own prediction is explained, not the last image's class
    reset_for_new_input(
        "explain", {"explain_target": ranked[0], **({"explain_target2": ranked[1]} if len(ranked) > 1 else {})}
    )

controls, second = st.columns([3, 2], gap="medium")
with controls:
    st.session_state.setdefault("explain_methods", [m for m in DEFAULT_METHODS if m in methods_offered])
    if any(m not in methods_offered for m in st.session_state["explain_methods"]):  # another model
        st.session_state["explain_methods"] = [m for m in st.session_state["explain_methods"] if m in methods_offered]
    methods = st.multiselect(
        "Methods",
        methods_offered,
        format_func=lambda m: str(METHOD_LABELS.get(m)),
        key="explain_methods",
        max_selections=4,
        help="Up to four, side by side; each map is scaled to its own maximum.",
    )
    target = None
    if class_specific:
        clamp_state("explain_target", ranked, ranked[0])
        target = st.selectbox(
            "Class to explain (type to search)",
            ranked,
            format_func=class_label,
            key="explain_target",
            help="The classes in order of probability: the prediction first.",
        )
        scope = demo_scope_note(cur.model.source, cur.vit.class_names, inputs.is_demo_scene(cur.image))
        if scope:
            st.caption(scope)
with second:
    target2 = None
    if class_specific and len(ranked) > 1:
        if st.toggle("Compare with a second class", key="explain_compare"):
            clamp_state("explain_target2", ranked, ranked[1])
            st.session_state.setdefault("explain_target2", ranked[1])
            target2 = st.selectbox("Second class", ranked, format_func=class_label, key="explain_target2")
    options: dict[str, tuple] = {m: () for m in EXPLANATION_METHODS}
    if "integrated_gradients" in methods:
        st.session_state.setdefault("ig_steps", 32)
        steps = st.slider("Integrated-gradients steps", 4, 128, step=4, key="ig_steps")
        baseline = st.radio("Integrated-gradients baseline", BASELINES, horizontal=True, key="ig_baseline")
        options["integrated_gradients"] = (("steps", int(steps)), ("baseline", baseline))
    stages = stage_layers(spec)
    if "rollout" in methods and len(stages) > 1:  # Swin: rollout is exact within one stage, on its grid
        clamp_state("explain_rollout_stage", list(stages), 0)
        rollout_stage = st.selectbox(
            "Rollout stage",
            list(stages),
            format_func=lambda s: stage_label(spec, s),
            key="explain_rollout_stage",
            help="Rollout multiplies attention over one token set: exact within a stage "
            "(the Rollout page also offers an approximation across stages).",
        )
        assert rollout_stage is not None, "a widget with options and no index=None always has a value"
        options["rollout"] = (("stage", int(rollout_stage)),)

if not methods:
    st.info("Choose at least one method.", icon=":material/info:")
    end_page()

targets = [target] + ([target2] if target2 is not None else [])
held = first_result.holding("explain")
if held:  # a session's first open: the cheapest chosen map now, the rest once it is on screen
    methods = sorted(methods, key=CHEAPEST_FIRST.index)
refused: dict[str, str] = {}  # method -> why the library refused it for this model (typed AnalysisError)
for method in methods:
    try:
        compute.explanation(*cur.args, method, targets[0] if method in CLASS_SPECIFIC else None, options[method])
    except AnalysisError as exc:
        refused[method] = error_text(exc)
        continue
    if held:
        break
for method, reason in refused.items():
    st.info(f"**{METHOD_LABELS[method]}**: {reason}", icon=":material/block:")
methods = [m for m in methods if m not in refused][: 1 if held else None]
if not methods:
    refuse_page(AnalysisError("None of the chosen methods is defined for this model (reasons above): choose another."))
maps, titles, raw = [], [], {}
robust = cur.map_range == "robust"  # the sidebar's map colour range; the other modes: each map by its peak
for class_index in targets:
    for method in methods:
        explained = class_index if method in CLASS_SPECIFIC else None
        grid_map = compute.explanation(*cur.args, method, explained, options[method])  # (gh, gw)
        if robust:  # the default: one artifact cell cannot set the top and leave the map dark
            maps.append(robust_scaled(grid_map, left_out=cur.left_out(grid_map))[0])
        else:
            maps.append(scale_by_peak(grid_map, negative="zero"))
        label = METHOD_LABELS[method]
        titles.append(
            f"{label} · {names[class_index]}" if class_index is not None and method in CLASS_SPECIFIC else label
        )
        raw[f"{method}_class{class_index}" if class_index is not None else method] = grid_map

ncols = min(len(methods), 2)  # panels about 430 px wide (three in a row drew them at 210 px)
figure = plots.map_panels(
    resources.background_uri(*cur.args),
    spec.img_size,
    maps,
    # each map on the grid the library names for its method (windowed: a stage grid or the stem's)
    [explanation_grid(cur.vit, method, **dict(options[method]))[1] for _ in targets for method in methods],
    titles,
    ncols=ncols,
    opacity=0.65,
    colorscale=cur.colorscale,
    zmin=0.0,
    zmax=1.0,
    colorbar_title="map / its 99th percentile (negative → 0)" if robust else "map / its max |value| (negative → 0)",
    panel_height=360 if ncols <= 2 else 280,
    slots=list(range(len(maps))),
    upsampled=[cur.upsampled(m) for m in maps] if cur.smooth else None,
)
st.caption(
    (
        "Each map is divided by the 99th percentile of its positive cells (the outlier tokens left out; its peak "
        "where that is 0), so all share one 0–1 colour scale and a few extreme cells cannot darken the rest: "
        "cells above it are drawn at the top colour and outlined. "
        if robust
        else "Each map is divided by its largest absolute value, so all share one 0–1 colour scale. "
    )
    + "Negative evidence (input × gradient, integrated gradients, AttnLRP) is drawn as 0 and kept, signed, "
    "in the download."
)
for title, grid_map in zip(titles, raw.values()):  # the first map the image's outlier tokens dominate, if any
    if outlier_notice(cur, np.clip(np.nan_to_num(grid_map), 0, None), f"the {title} map"):  # its positive evidence
        break
show_chart(figure, "explain_panels", filename="explanations")
first_result.hold_slow_sections(
    "explain",
    "The other maps and the deletion and insertion curves follow as soon as this map is on screen.",
    held=held,
)
download_npz("explain_data", "explanations", classes=np.array([t for t in targets if t is not None]), **raw)
show_code(
    explain_code(Source.of(cur), methods=methods, targets=targets, class_specific=CLASS_SPECIFIC, options=options)
)

if class_specific:
    assert target is not None, "a widget with options and no index=None always has a value"
    st.subheader(f"Deletion and insertion · {names[target]}")
    curves: list = []
    rows: list = []
    measured = ["random", *methods]
    bar = st.progress(0.0, text="Deleting and inserting patches…")
    for done, method in enumerate(measured):
        bar.progress(done / len(measured), text=f"Deleting and inserting patches… map {done + 1} of {len(measured)}")
        try:
            result = compute.perturbation_curves(*cur.args, method, target, options.get(method, ()))
        except AnalysisError as exc:  # not yet defined for this model: say so, keep the other curves
            st.info(
                f"No deletion / insertion curve for **{METHOD_LABELS.get(method, method)}**: {error_text(exc)}",
                icon=":material/block:",
            )
            continue
        fractions, deletion, insertion = result["fractions"], result["deletion"], result["insertion"]
        deletion_auc, insertion_auc = area_under_curve(fractions, deletion), area_under_curve(fractions, insertion)
        label = "random" if method == "random" else METHOD_LABELS[method]
        curves.append((label, fractions, deletion, insertion, deletion_auc, insertion_auc))
        rows.extend([label, float(f), float(d), float(i)] for f, d, i in zip(fractions, deletion, insertion))
    bar.empty()
    show_chart(plots.perturbation_curves(curves), "explain_curves", filename="deletion_insertion")
    st.caption(
        "The class's probability as the patches a map ranks first are replaced by the mean colour "
        "(deletion) or restored onto a mean-colour image (insertion). A faithful map beats the random one "
        "(dashed): lower deletion AUC, higher insertion AUC. The whole benchmark: `python -m analysis.faithfulness`."
    )
    download_csv("explain_curves_data", "deletion_insertion", ["method", "fraction", "deletion_p", "insertion_p"], rows)
