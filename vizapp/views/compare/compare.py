"""Compare layers: chosen layers side by side on one colour scale; optionally a second model, on the
same image, in its own rows, with the rollout (Figure 6) of both models on one colour scale of their own."""

from __future__ import annotations

import numpy as np
import streamlit as st

from analysis import AnalysisError, corresponding_layer, corresponding_query, masked_image, plots
from analysis.attention.rollout import rollout_uniform_level
from analysis.plots import MAP_RANGES, colour_range
from analysis.records.queries import query_for_layers
from vizapp import resources
from vizapp.attention_view import attention_view, follow_view, panel_layers, served
from vizapp.messages import error_text, escape_markdown
from vizapp.python_snippet import Source, show_code
from vizapp.refs import ModelRef
from vizapp.state import current, second_model_control
from vizapp.ui import (
    describe_query,
    download_npz,
    end_page,
    head_control,
    head_label,
    outlier_notice,
    patch_click,
    query_controls,
    show_chart,
    stride_of_map,
)
from vizapp.views.compare.recipe import compare_code

cur = current()
spec = cur.spec
L = spec.num_layers
# a windowed model's heads differ per stage: offer its most, and show the mean where a layer has fewer
H = max(spec.geometry(layer).num_heads for layer in range(L))


def layer_panels(args, model_spec, model_query, chosen_layers, head):
    """One model's maps of ``chosen_layers`` for ``head`` (the mean where a layer has fewer heads):
    ``(panels, strides, grids, query cells, each panel's uniform level, everything, fell back to the mean)``.

    Each layer on its own grid (``model_spec.geometry(layer)``: a ViT's patch grid, a windowed
    model's stage grid, zero outside the query's window), the query as every layer reads it
    (:func:`analysis.records.queries.query_for_layers`: a windowed model's patch becomes the pixel at its
    centre), so a query means the same image position in every layer and in both models."""
    all_maps = resources.layer_attention_grids(*args, query_for_layers(model_spec, model_query))
    panels_, strides, grids_, cells, levels = [], [], [], [], []
    fell_back = False
    for layer in chosen_layers:
        geometry = model_spec.geometry(layer)
        heads = geometry.num_heads
        fell_back |= head != "mean" and int(head) >= heads
        panels_.append(all_maps[layer][heads if head == "mean" or int(head) >= heads else int(head)])
        strides.append(geometry.stride)
        grids_.append(geometry.grid_size)
        cells.append(None if isinstance(model_query, str) else model_spec.layer_cell(layer, model_query))
        levels.append(geometry.uniform_attention(mean_query=isinstance(model_query, str) and model_query == "mean"))
    everything_ = np.concatenate([m.ravel() for m in all_maps])
    return panels_, strides, grids_, cells, levels, everything_, fell_back


def stacked(name: str, chosen_layers, panels_) -> dict[str, np.ndarray]:
    """For the download: ``{name: (layers, gh, gw)}`` when every panel shares a grid, else one
    ``name_layer<l>`` array per layer (a windowed model's stages differ in grid)."""
    if len({p.shape for p in panels_}) == 1:
        return {name: np.stack(panels_)}
    return {f"{name}_layer{layer}": panel for layer, panel in zip(chosen_layers, panels_)}


st.header("Compare layers", divider="gray")
st.caption(
    "One to four layers (or all of them) side by side, same head and query, on one colour scale; "
    "optionally a second model on the same image. Click any panel to query that patch."
)

c1, c2, c3 = st.columns([2, 1, 2], gap="medium")
with c1:
    every = st.checkbox("All layers", key="cmp_all")
    if "cmp_layers" not in st.session_state:
        st.session_state["cmp_layers"] = sorted({0, L // 3, (2 * L) // 3, L - 1})[:4]
    elif any(not 0 <= x < L for x in st.session_state["cmp_layers"]):  # a model with fewer layers
        st.session_state["cmp_layers"] = [x for x in st.session_state["cmp_layers"] if 0 <= x < L]
    chosen = st.multiselect(
        "Layers (1–4)",
        list(range(L)),
        key="cmp_layers",
        max_selections=4,
        disabled=every,
        format_func=lambda x: f"layer {x}",
    )
with c2:
    head = head_control(spec, heads=H)
    st.session_state.setdefault("opacity", 0.6)
    opacity = st.slider("Overlay opacity", 0.0, 1.0, step=0.05, key="opacity")
with c3:
    query = query_controls(spec)

layers = list(range(L)) if every else sorted(chosen)
if not layers:
    st.info("Choose at least one layer.")
    end_page()

NCOLS = min(len(layers), 4)  # wrap into rows of at most 4 panels
name1 = cur.model.source.split("/")[-1].split(".")[0]
panels, patches, grids, queries, levels1, maps, _ = layer_panels(cur.args, spec, query, layers, head)
uniform1 = max(levels1)  # one scale over levels that differ: the larger level, so that neither saturates
titles = [f"{name1} · layer {layer}" for layer in layers]
backgrounds = [resources.background_uri(*cur.args)] * len(layers)
sizes = [spec.img_size] * len(layers)
slots = list(range(len(layers)))
groups = [0] * len(layers)

loaded = second_model_control(
    "cmp_model2",
    "Second model on the same image (optional)",
    cur.model,
    help="Shown in its own rows at the same relative depth, with the same head (or the mean) and the "
    "query at the same image position.",
)
extra_rows = {}
panels2: list[np.ndarray] = []
if loaded is not None:
    ref2, vit2 = loaded
    try:
        args2 = (ref2, cur.image.digest, cur.image.data)
        spec2 = vit2.spec
        name2 = ref2.source.split("/")[-1].split(".")[0]
        query2 = corresponding_query(
            query, spec.grid_size, spec2.grid_size, spec2.has_class_token, from_has_class_token=spec.has_class_token
        )
        layers2 = [corresponding_layer(layer, L, spec2.num_layers) for layer in layers]
        panels2, patches2, grids2, queries2, levels2, maps2, fell_back = layer_panels(
            args2, spec2, query2, layers2, head
        )
        uniform2 = max(levels2)
        first_slot = -(-len(layers) // NCOLS) * NCOLS  # the second model starts on a new row
        for i, layer2 in enumerate(layers2):
            titles.append(f"{name2} · layer {layer2}")
            slots.append(first_slot + i)
        groups += [1] * len(layers2)
        backgrounds += [resources.background_uri(*args2)] * len(layers2)
        sizes += [spec2.img_size] * len(layers2)
        patches += patches2
        grids += grids2
        queries += queries2
        extra_rows = {**stacked("second_model_attention", layers2, panels2), "second_model_layers": layers2}
        if fell_back:
            st.caption(
                f"{escape_markdown(ref2.label)} has fewer heads in some of these layers: showing its mean "
                "over heads there."
            )
    except Exception as exc:  # noqa: BLE001 - the first model's panels still show
        st.error(f"**{escape_markdown(ref2.label)}** could not process this image: {error_text(exc)}")
        panels2 = []
        del titles[len(layers) :], slots[len(layers) :], groups[len(layers) :], backgrounds[len(layers) :]
        del sizes[len(layers) :], patches[len(layers) :], grids[len(layers) :], queries[len(layers) :]

separate = False
if panels2:
    separate = st.toggle(
        "One colour scale per model",
        key="cmp_separate",
        help="Models differ in sequence length, so their probabilities differ in scale.",
    )
if separate:
    lo1, hi1, text1 = colour_range(cur.map_range, np.concatenate([p.ravel() for p in panels]), maps, uniform=uniform1)
    lo2, hi2, text2 = colour_range(cur.map_range, np.concatenate([p.ravel() for p in panels2]), maps2, uniform=uniform2)
    group_ranges = [(lo1, hi1, f"{name1} ({text1})"), (lo2, hi2, f"{name2} ({text2})")]
    scale_text = "one colour scale per model"
elif not panels2 and len(set(levels1)) > 1:  # a windowed model's stages: windows of different sizes
    stage_levels = list(dict.fromkeys(levels1))  # in layer order
    groups = [stage_levels.index(level) for level in levels1]
    slots, next_slot = [], 0  # each stage from a new row: its colour bar stands beside its own rows
    for i, group in enumerate(groups):
        if i and group != groups[i - 1]:
            next_slot = -(-next_slot // NCOLS) * NCOLS
        slots.append(next_slot)
        next_slot += 1
    group_ranges = []
    for level in stage_levels:
        members = [p for p, lv in zip(panels, levels1) if lv == level]
        names = ", ".join(str(layer) for layer, lv in zip(layers, levels1) if lv == level)
        lo_g, hi_g, text_g = colour_range(
            cur.map_range, np.concatenate([p.ravel() for p in members]), maps, uniform=level
        )
        group_ranges.append((lo_g, hi_g, f"layer{'s' if ',' in names else ''} {names} ({text_g})"))
    scale_text = (
        "one colour scale per stage (their windows differ in size, so one stage's probabilities are not on "
        "another's scale)"
    )
else:
    everything = np.concatenate([maps.ravel(), *([maps2.ravel()] if panels2 else [])])
    uniform = max([uniform1] + ([uniform2] if panels2 else []))  # the larger level: neither saturates
    one_grid = not panels2 and len({p.shape for p in panels}) == 1  # one model's panels on one grid:
    shown_panels = np.stack(panels) if one_grid else np.concatenate([p.ravel() for p in panels + panels2])
    lo, hi, range_text = colour_range(
        cur.map_range, shown_panels, everything, uniform=uniform, left_out=cur.left_out(panels[0]) if one_grid else ()
    )  # ... its outliers known
    group_ranges = [(lo, hi, f"attention probability ({range_text})")]
    groups = [0] * len(groups)
    scale_text = "one colour scale over all panels"
figure = plots.map_panels(
    backgrounds,
    sizes,
    [cur.shown(p) for p in panels] + panels2,
    patches,
    titles,
    ncols=NCOLS,
    opacity=opacity,
    colorscale=cur.colorscale,
    query_patches=queries,
    slots=slots,
    color_groups=groups,
    group_ranges=group_ranges,
    panel_height=300 if NCOLS >= 3 else 420,
    upsampled=[cur.upsampled(p, size) for p, size in zip(panels + panels2, sizes, strict=True)] if cur.smooth else None,
)
st.caption(
    f"{head_label(head)} · query: {describe_query(query, spec)} · {scale_text}, "
    + MAP_RANGES[cur.map_range].replace("the map's", "the panels'").replace("the map", "the panels")
)
held = panel_layers(spec, layers)  # None: no instant view (over the budget, or one layer's windows at a time)
if held is not None:  # the instant view of the first model's panels (a ViT)
    attention_view(
        data=served(*resources.attention_view_blob(*cur.args, held), key="cmp_view"),
        image_uri=resources.background_uri(*cur.args),
        spec=spec,
        layer=layers[0],
        head=head,
        query=query,
        colorscale=cur.colorscale,
        map_range=cur.map_range,
        opacity=opacity,
        key="cmp_view",
        on_change=follow_view("cmp_view", patches=spec.num_patches, heads=H),
        panels=layers,
        report_layer=False,
        note="",
        shared_name="0–max of these layers' heads",
        max_height=300 if NCOLS >= 3 else 420,
        left_out=cur.outliers,
        hide_left_out=cur.hide_outliers,
    )
    st.caption(
        f"Instant view of {escape_markdown(name1)}: hover any panel and every layer shows that patch's attention "
        "(drawn in the browser, one colour scale over these panels, values to one 255th of each map's range); "
        "with the pointer over it, ←/→ step the head (the Head box follows); click to make the patch the query."
        + (" The second model is in the chart below." if panels2 else "")
        + " The chart, with hover values and downloads:"
    )
for layer, panel in zip(layers, panels):  # the first panel the image's outlier tokens dominate, if any
    if outlier_notice(cur, panel, f"layer {layer}'s map"):
        break
show_chart(figure, "cmp_panels", filename="compare_layers", on_select=patch_click("cmp_panels", grids, spec.grid_size))
download_npz(
    "cmp_data",
    "compare_layers",
    **stacked("attention", layers, panels),
    layers=layers,
    head=-1 if head == "mean" else int(head),
    query=str(query),
    **extra_rows,
)
show_code(
    compare_code(
        Source.of(cur),
        layers=layers,
        head=head,
        query=query_for_layers(spec, query),
        second=Source.of_model(cur, ref2, spec2) if panels2 else None,
        second_query=query_for_layers(spec2, query2) if panels2 else None,
    )
)


def rollout_of(args: tuple[ModelRef, str, bytes], model_spec, model_query) -> np.ndarray:
    """The model's rollout through every layer for its query (:func:`analysis.attention_rollout_by_layer`,
    mean over heads, nothing discarded, from layer 0: the Rollout page's defaults), ``(gh, gw)`` on
    layer 0's grid. Raises AnalysisError where it is not defined from layer 0 (a Swin across stages)."""
    ref, digest, image_bytes = args
    return resources.rollout_by_layer(
        ref, digest, image_bytes, "mean", 0.0, 0, query_for_layers(model_spec, model_query)
    )[-1]


if panels2:  # both models' rollout (Figure 6), side by side on one colour scale of their own
    st.subheader("Rollout of both models (Figure 6)")
    shown_models = [(cur.args, spec, query, name1), (args2, spec2, query2, name2)]
    rollouts, rollout_names, rollout_levels, rollout_models = [], [], [], []
    for model_args, model_spec, model_query, model_name in shown_models:
        try:
            rollouts.append(rollout_of(model_args, model_spec, model_query))
        except AnalysisError as exc:  # e.g. a Swin's rollout across patch merging: the Rollout page's opt-in
            st.info(f"{escape_markdown(model_name)}: {error_text(exc)}", icon=":material/block:")
            continue
        rollout_names.append(model_name)
        rollout_levels.append(rollout_uniform_level(model_spec, 0))
        rollout_models.append((model_args, model_spec))
    if rollouts:
        rollout_uniform = max(rollout_levels)  # the larger level: neither model's map saturates
        r_lo, r_hi, r_text = colour_range(
            cur.map_range, np.concatenate([r.ravel() for r in rollouts]), uniform=rollout_uniform
        )
        show_chart(
            plots.map_panels(
                [resources.background_uri(*model_args) for model_args, _ in rollout_models],
                [model_spec.img_size for _, model_spec in rollout_models],
                rollouts,
                [stride_of_map(model_spec.img_size, r.shape) for (_, model_spec), r in zip(rollout_models, rollouts)],
                [
                    f"{name} · rollout through layer {model_spec.num_layers - 1}"
                    for name, (_, model_spec) in zip(rollout_names, rollout_models)
                ],
                ncols=2,
                opacity=opacity,
                colorscale=cur.colorscale,
                zmin=r_lo,
                zmax=r_hi,
                colorbar_title=f"rollout ({r_text})",
                panel_height=420,
            ),
            "cmp_rollout",
            filename="compare_models_rollout",
        )
        st.caption(
            "Rollout (Abnar & Zuidema 2020) through every layer, mean over heads, from layer 0, for the query at "
            "the same image position in both models; one colour scale over both maps (each model's uniform level "
            "differs with its number of tokens: the larger one sets the floor). The Rollout page has the other "
            "settings and the Figure 6 view of one model; the Attention distance page draws both models' "
            "distance against depth (Figure 7 right) and their linear CKA over an image set."
        )
        pictures = [
            masked_image(resources.forward(*model_args).input_image, r, "bilinear", top=r_hi)
            for (model_args, _), r in zip(rollout_models, rollouts)
        ]
        columns = st.columns(len(pictures))
        for column, picture, name in zip(columns, pictures, rollout_names):
            column.image(picture, caption=f"{name}: the input times its rollout (Figure 6)", width=320)
        download_npz(
            "cmp_rollout_data",
            "compare_models_rollout",
            models=np.array(rollout_names),
            **{f"rollout_{i}": r for i, r in enumerate(rollouts)},
        )
