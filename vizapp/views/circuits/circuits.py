"""Circuits: what the prediction needs, by editing activations in flight (analysis.circuits)."""

from __future__ import annotations

import numpy as np
import streamlit as st

from analysis import class_label, plots, top_classes
from analysis.base.errors import AnalysisError
from analysis.circuits import ABLATIONS, PATCH_POINTS, heads_by_effect
from analysis.model.windowed_support import refuse_windowed
from analysis.plots import colour_range
from vizapp import first_result, inputs, resources, url_state
from vizapp.messages import error_text
from vizapp.python_snippet import Source, show_code
from vizapp.state import current, reset_for_new_input
from vizapp.ui import clamp_state, download_npz, point_customdata, refuse_page, selected_point, show_chart
from vizapp.views.circuits import results as circuit_results
from vizapp.views.circuits.recipe import circuits_code

cur = current()
spec = cur.spec
L, H = spec.num_layers, spec.num_heads
prefix = spec.num_prefix_tokens
AUTO_PASSES = 64  # sections that need more forward passes than this wait for a click

st.header("Circuits", divider="gray")
st.caption(
    "Causal questions, answered on the real modules by editing activations during the forward pass: "
    "**direct logit attribution** (what each head and MLP writes along the target class's direction), "
    "**head ablation** (what the target logit loses when one head's output is removed) and "
    "**activation patching** (how much of the clean answer comes back into a corrupted run when one "
    "activation is copied from the clean one)."
)
try:
    refuse_windowed(cur.vit, "The Circuits page (head ablation, activation patching, direct logit attribution)")
    if not spec.has_classifier:
        head = "no head" if spec.head == "none" else f"a {spec.head} head"
        raise AnalysisError(
            f"The Circuits page measures a class logit; this model has {head} (no classes). Load a classifier."
        )
except AnalysisError as exc:
    refuse_page(exc)

probabilities = resources.forward(*cur.args).probabilities
names = cur.vit.class_names
order = top_classes(probabilities, 5)
label = lambda c: f"{class_label(names, c)} ({probabilities[c]:.1%})"  # noqa: E731
reset_for_new_input("circuits", {"circ_target": order[0]})  # a new image: its prediction is measured
clamp_state("circ_target", order, order[0])
target = st.selectbox(
    "Target class (the logit measured)",
    order,
    format_func=label,
    key="circ_target",
    help="The five most probable classes of this image; the first is the prediction.",
)
st.session_state.setdefault("circ_layer", L - 1)
st.session_state.setdefault("circ_head", 0)
clamp_state("circ_layer", (0, L - 1), L - 1)  # a head picked on a bigger model
clamp_state("circ_head", (0, H - 1), 0)


def pick_head(chart_key: str):
    """A heatmap's ``on_select``: the clicked (layer, head) becomes the selected head."""

    def on_click() -> None:
        point = selected_point(chart_key)
        custom = point_customdata(point) if point else None  # a list, or Streamlit's {"0": …, "1": …}
        if custom is not None and len(custom) >= 2:
            st.session_state["circ_layer"], st.session_state["circ_head"] = int(custom[0]), int(custom[1])

    return on_click


def auto_toggle(key: str, passes: int) -> None:
    """Sections of at most AUTO_PASSES forward passes run without a click: decided again for
    each model (and setting) the section is drawn for, not once per session; a link's own choice
    stands for the page's first draw."""
    decided_for = f"_{key}_decided_for"
    signature = (cur.model, passes)
    if st.session_state.get(decided_for) != signature:
        st.session_state[decided_for] = signature
        if not url_state.set_by_link(st.session_state, key):
            st.session_state[key] = passes <= AUTO_PASSES


selected = (int(st.session_state["circ_layer"]), int(st.session_state["circ_head"]))

# --------------------------------------------------------------------------- direct logit attribution
st.subheader("Direct logit attribution")
st.caption(
    "The target logit written as a sum over the embeddings, every head, every projection bias and every MLP, "
    "through the final norms **with their scale frozen at this image's value** (exact only with that scale "
    "frozen: it says what each part writes along the class's direction, not what removing it would do)."
)
try:
    dla = circuit_results.attribution(*cur.args, target)
except AnalysisError as exc:
    st.info(error_text(exc), icon=":material/block:")
    dla = None
if dla is not None:
    per_head = dla["heads"].sum(-1)  # (L, H)
    per_layer = np.stack([dla["heads"].sum((1, 2)) + dla["head_bias"].sum(-1), dla["mlps"].sum(-1)], axis=1)
    left, right = st.columns([3, 2], gap="medium")
    with left:
        show_chart(
            plots.head_heatmap(
                per_head,
                title="Each head's direct contribution to the target logit",
                colorbar_title="logit",
                selected=selected,
            ),
            "circ_dla",
            filename="direct_logit_attribution",
            on_select=pick_head("circ_dla"),
        )
    with right:
        show_chart(
            plots.layer_contributions(per_layer, title="Per layer"),
            "circ_dla_layers",
            filename="direct_logit_attribution_per_layer",
        )
        total = (
            dla["embedding"].sum() + dla["heads"].sum() + dla["head_bias"].sum() + dla["mlps"].sum() + dla["constant"]
        )
        st.caption(
            f"Embeddings {dla['embedding'].sum():+.3f}, norms' shifts and head bias {float(dla['constant']):+.3f}; "
            f"all terms sum to {float(total):.4f}, the logit is {float(dla['target_logit']):.4f}."
        )
    download_npz(
        "circ_dla_data",
        "direct_logit_attribution",
        heads=dla["heads"],
        head_bias=dla["head_bias"],
        mlps=dla["mlps"],
        embedding=dla["embedding"],
        constant=dla["constant"],
        target_logit=dla["target_logit"],
        target=target,
    )
    first_result.hold_slow_sections(
        "circuits",
        "Head ablation, the selected head and activation patching follow as soon as these charts are on screen.",
    )

# --------------------------------------------------------------------------- head ablation
st.subheader("Head ablation")
samples = [p.name for p in inputs.sample_paths()]
METHOD_LABELS = {"zero": "zero", "mean": "mean over the bundled samples", "resample": "resample from a sample"}
a1, a2 = st.columns([2, 3])
method = a1.radio(
    "Replace the head's output by", ABLATIONS, format_func=METHOD_LABELS.get, horizontal=True, key="circ_method"
)
reference = None
if method == "resample":
    # another image than the analysed one: resampling a head from the image itself changes nothing
    others = [name for name in samples if name != cur.image.name] or samples
    clamp_state("circ_reference", others, others[-1])
    reference = a2.selectbox("Sample", others, key="circ_reference")
passes = L * H
auto_toggle("circ_ablate", passes)
run_ablation = st.toggle(f"Ablate every head ({passes} forward passes)", key="circ_ablate")
delta = None
if run_ablation:
    bar = st.progress(0.0, text="Ablating heads…")
    rows = []
    for layer in range(L):
        rows.append(circuit_results.ablation_layer(*cur.args, target, method, reference, layer))
        bar.progress((layer + 1) / L, text=f"Ablating heads… layer {layer + 1} of {L}")
    bar.empty()
    delta = np.stack([row["delta_logit"] for row in rows])  # (L, H)
    delta_probability = np.stack([row["delta_probability"] for row in rows])
    left, right = st.columns([3, 2], gap="medium")
    with left:
        show_chart(
            plots.head_heatmap(
                delta,
                title=f"Change of the target logit when one head is removed ({method})",
                colorbar_title="Δ logit",
                selected=selected,
            ),
            "circ_ablation",
            filename="head_ablation",
            on_select=pick_head("circ_ablation"),
        )
    with right:
        worst = heads_by_effect(delta)[: min(12, passes)]
        if st.toggle("Remove the most important heads one after another", key="circ_cumulative"):
            curve = circuit_results.ablation_curve(*cur.args, target, method, reference, tuple(worst))
            show_chart(
                plots.ablation_curve(
                    curve,
                    [f"L{layer} H{h}" for layer, h in worst],
                    title="Cumulative ablation",
                    clean=float(rows[0]["clean_logit"][0]),
                ),
                "circ_curve",
                filename="cumulative_ablation",
            )
        else:
            st.caption(
                "Most important heads (largest drop first): "
                + ", ".join(f"L{layer} H{h} ({delta[layer, h]:+.3f})" for layer, h in worst[:6])
            )
    download_npz(
        "circ_ablation_data",
        "head_ablation",
        delta_logit=delta,
        delta_probability=delta_probability,
        method=method,
        reference=str(reference),
        target=target,
    )

# --------------------------------------------------------------------------- the selected head
layer, head = selected
st.subheader(f"Layer {layer}, head {head}")
query = "cls" if spec.has_class_token else "mean"
left, right = st.columns(2, gap="medium")
with left:
    grid = resources.attention_grid(*cur.args, query)[layer, head]
    lo, hi, range_text = colour_range(
        cur.map_range, cur.shown(grid), uniform=1 / spec.num_tokens, left_out=cur.left_out(grid)
    )
    show_chart(
        plots.attention_overlay(
            resources.background_uri(*cur.args),
            spec.img_size,
            cur.shown(grid),
            spec.patch_size,
            colorscale=cur.colorscale,
            zmin=lo,
            zmax=hi,
            title=f"Its attention ({'class token' if query == 'cls' else 'mean over queries'})",
            colorbar_title=f"attention probability ({range_text})",
            chart_width=plots.column_width(1 / 2),
        ),
        "circ_head_attention",
        filename=f"head_L{layer}_H{head}_attention",
    )
with right:
    on_patches = spec.split_prefix(dla["heads"][layer, head], 0)[1] if dla is not None else None
    if dla is not None and not np.any(on_patches):  # a class-token readout: only the class token is read
        st.markdown("**Its direct logit attribution**")
        st.caption(
            f"{dla['heads'][layer, head, 0]:+.4f} logit, all of it written at the class token: this model's head "
            "reads only the class token, so no patch position carries a direct term. Where the head gathers "
            "what it writes there is its class-token attention (left)."
        )
    elif dla is not None:
        per_patch = on_patches.reshape(spec.grid_size)
        limit = plots.symmetric_limit(per_patch)
        show_chart(
            plots.attention_overlay(
                resources.background_uri(*cur.args),
                spec.img_size,
                per_patch,
                spec.patch_size,
                colorscale=plots.DIVERGING,
                zmin=-limit,
                zmax=limit,
                opacity=0.75,
                title="Its direct logit attribution where it writes",
                colorbar_title=f"logit (±{limit:.3g})",
                chart_width=plots.column_width(1 / 2),
            ),
            "circ_head_dla",
            filename=f"head_L{layer}_H{head}_dla",
        )
        if prefix:
            st.caption(
                "On the prefix tokens: "
                + ", ".join(
                    f"{name} {value:+.3f}"
                    for name, value in zip(spec.token_names, spec.split_prefix(dla["heads"][layer, head], 0)[0])
                )
            )

# --------------------------------------------------------------------------- activation patching
st.subheader("Activation patching")
st.caption(
    "Run the corrupted image, copy one activation from the clean one, and measure "
    "(logit − corrupted) / (clean − corrupted) of the target: 1 restores the clean answer, 0 nothing."
)
p1, p2, p3 = st.columns(3)
corruption = p1.radio(
    "Corruption",
    list(circuit_results.CORRUPTIONS),
    key="circ_corruption",
    horizontal=True,
    format_func={"noise": "noise", "blur": "blur", "sample": "another image"}.get,
)
sample, level = None, 0.0
if corruption == "sample":
    others = [name for name in samples if name != cur.image.name] or samples
    clamp_state("circ_sample", others, others[0])
    sample = p2.selectbox("Image", others, key="circ_sample")
else:
    st.session_state.setdefault("circ_level", 1.0 if corruption == "noise" else 4.0)
    level = float(p2.slider(circuit_results.CORRUPTIONS[corruption], 0.0, 8.0, step=0.25, key="circ_level"))
POINT_LABELS = {"resid_pre": "residual stream per token", "attn.z": "head outputs"}
point = p3.radio("Patch", PATCH_POINTS, format_func=POINT_LABELS.get, key="circ_point", horizontal=True)
width = spec.num_tokens if point == "resid_pre" else H
patch_passes = L * -(-width // 32)
auto_toggle("circ_patch", patch_passes)
if st.toggle(
    f"Patch every {'token' if point == 'resid_pre' else 'head'} of every layer ({patch_passes} batched forward passes)",
    key="circ_patch",
):
    bar = st.progress(0.0, text="Patching…")
    try:
        rows = []
        for index in range(L):
            rows.append(circuit_results.patching_layer(*cur.args, target, corruption, level, sample, point, index))
            bar.progress((index + 1) / L, text=f"Patching… layer {index + 1} of {L}")
    except AnalysisError as exc:
        rows = None
        st.info(error_text(exc), icon=":material/block:")
    bar.empty()
    if rows:
        effect = np.stack([row["effect"] for row in rows])  # (L, width)
        st.caption(f"Target logit: clean {float(rows[0]['clean']):.3f}, corrupted {float(rows[0]['corrupted']):.3f}.")
        if point == "attn.z":
            show_chart(
                plots.head_heatmap(
                    effect,
                    title="Restored share of the clean answer, per head",
                    colorbar_title="effect",
                    selected=selected,
                ),
                "circ_patch_heads",
                filename="patching_heads",
                on_select=pick_head("circ_patch_heads"),
            )
        else:
            labels = list(spec.token_names) + [
                f"patch {i} (row {i // spec.grid_size[1]}, col {i % spec.grid_size[1]})"
                for i in range(spec.num_patches)
            ]
            left, right = st.columns([3, 2], gap="medium")
            with left:
                show_chart(
                    plots.patching_heatmap(
                        effect, labels, title="Restored share of the clean answer, per layer and token"
                    ),
                    "circ_patch_tokens",
                    filename="patching_tokens",
                )
            with right:
                clamp_state("circ_patch_layer", (0, L - 1), 0)
                shown = st.slider("Layer drawn on the image", 0, L - 1, key="circ_patch_layer") if L > 1 else 0
                on_grid = spec.split_prefix(effect[shown], 0)[1].reshape(spec.grid_size)
                limit = plots.symmetric_limit(effect)
                show_chart(
                    plots.attention_overlay(
                        resources.background_uri(*cur.args),
                        spec.img_size,
                        on_grid,
                        spec.patch_size,
                        colorscale=plots.DIVERGING,
                        zmin=-limit,
                        zmax=limit,
                        opacity=0.75,
                        title=f"Layer {shown}: patching each patch token",
                        colorbar_title=f"effect (±{limit:.3g})",
                        chart_width=plots.column_width(2 / 5),
                    ),
                    "circ_patch_image",
                    filename=f"patching_layer_{shown}",
                )
        download_npz(
            "circ_patch_data",
            "activation_patching",
            effect=effect,
            patched=np.stack([row["patched"] for row in rows]),
            clean=rows[0]["clean"],
            corrupted=rows[0]["corrupted"],
            point=point,
            corruption=corruption,
            level=level,
            sample=str(sample),
            target=target,
        )

paths = {p.name: p for p in inputs.sample_paths()}
show_code(
    circuits_code(
        Source.of(cur),
        target=target,
        method=method,
        reference=list(paths.values()) if method == "mean" else [paths[reference]] if method == "resample" else [],
        corruption=corruption,
        level=level,
        corrupted_path=paths.get(sample),
        point=point,
    )
)
