"""Features: a sparse autoencoder's features on the current image (which fire on a patch, where one
fires), a feature over the demo scenes (its top scenes, its activation histogram, the classes its
decoder direction pushes) and what zeroing or scaling it inside the forward pass changes.

The analyses are :mod:`analysis.sae`'s; the page caches and draws them (:mod:`vizapp.sae_resources`).
"""

from __future__ import annotations

import numpy as np
import streamlit as st

from analysis import plots
from analysis.model.loading.loaded import class_label, top_classes
from analysis.sae import DEMO_SAE_POINT, SAEError
from vizapp import resources, sae_resources
from vizapp.messages import error_text, escape_markdown
from vizapp.python_snippet import show_code
from vizapp.state import current
from vizapp.ui import (
    PageRefused,
    clamp_state,
    download_csv,
    download_npz,
    point_index,
    selected_point,
    show_chart,
)
from vizapp.views.features.recipe import features_code

SOURCES = {"demo": "the bundled demo SAE", "folder": "an SAE folder on the server (SAELens format)"}
TOP_FEATURES = 8  # features listed for the chosen patch
TOP_SCENES = 8  # top-activating demo scenes of the chosen feature
PATCH = "feat_patch"  # session key: the chosen patch (row-major index)
FEATURE = "feat_feature"  # session key: the studied feature
CHANGES = {"scale": "scale it", "clamp": "set it to a value (clamp)"}

cur = current()
spec = cur.spec
st.header("Features", divider="gray")
st.caption(
    "A sparse autoencoder (SAE) rewrites one layer's tokens as a sparse sum of learned directions, its "
    "features (Bricken et al. 2023; TopK: Gao et al. 2024). Click a patch to list the features that fire on it, "
    "pick one to see where it fires, on which demo scenes it fires most, which classes its direction pushes, "
    "and what removing or amplifying it inside the forward pass changes."
)

# --------------------------------------------------------------------------- which SAE
is_demo = cur.model.source == "demo"
clamp_state("feat_source", list(SOURCES), "demo" if is_demo else "folder")
st.session_state.setdefault("feat_source", "demo" if is_demo else "folder")
source = st.radio("SAE", list(SOURCES), format_func=SOURCES.get, key="feat_source", horizontal=True)
if source == "demo":
    if not is_demo:
        st.info(
            f"An SAE is needed for **{escape_markdown(cur.model.label)}**: the bundled demo SAE reads the demo ViT's "
            f"`{DEMO_SAE_POINT}`. Train one for this model (`python -m analysis sae train --model ... --point "
            "blocks.6.resid_post --images ... --out my_sae`) and give its folder above, or pick the demo ViT "
            "in the sidebar.",
            icon=":material/info:",
        )
        raise PageRefused("no SAE for this model")
    sae_name = "demo"
else:
    sae_name = st.text_input(
        "SAE folder",
        key="feat_folder",
        placeholder="/path/to/sae (cfg.json + sae_weights.safetensors)",
        help="A folder written by python -m analysis sae train, analysis.sae.save_sae or SAELens's save_model.",
    ).strip()
    if not sae_name:
        st.info(
            "An SAE is needed: give the folder of an SAE trained on this model "
            "(`python -m analysis sae train --model ... --point ... --images ... --out my_sae`)"
            + (", or pick the bundled demo SAE." if is_demo else "."),
            icon=":material/info:",
        )
        raise PageRefused("no SAE folder")
try:
    sae = sae_resources.get_sae(sae_name)
    grid = sae_resources.patch_features(cur.model, sae_name, cur.image.digest, cur.image.data)  # (gh, gw, d_sae)
except SAEError as exc:  # no such folder, an unknown point, a width that does not match the layer
    st.info(error_text(exc), icon=":material/block:")
    raise PageRefused(str(exc)) from exc
config = sae.config
gh, gw = spec.grid_size
st.caption(
    f"{config.d_sae:,} features ({config.architecture}{f', k = {config.k}' if config.k else ''}) on "
    f"`{config.hook_name}` of {escape_markdown(config.model_name or 'its model')}, read on every patch token."
)

# --------------------------------------------------------------------------- this image: a patch's features
st.subheader("On this image")
clamp_state(PATCH, (0, gh * gw - 1), 0)
activity = grid.sum(-1).astype(np.float32)  # (gh, gw): Σ_i f_i, how strongly features fire on each patch
st.session_state.setdefault(PATCH, int(np.argmax(activity.ravel())))


def on_patch_click() -> None:
    point = selected_point("feat_activity")
    index = point_index(point) if point else None
    if index is not None and 0 <= index < gh * gw:
        st.session_state[PATCH] = int(index)


patch = int(st.session_state[PATCH])
left, right = st.columns([3, 2], gap="medium")
with left:
    show_chart(
        plots.attention_overlay(
            resources.background_uri(*cur.args),
            spec.img_size,
            activity,
            spec.patch_size,
            colorscale=cur.colorscale,
            zmin=0.0,
            title="Total feature activation on each patch (click a patch)",
            colorbar_title="Σ activations",
            query_patch=patch,
            chart_width=plots.column_width(3 / 5),
        ),
        "feat_activity",
        filename="sae_activation_per_patch",
        on_select=on_patch_click,
    )
with right:
    st.number_input("Patch (row-major)", 0, gh * gw - 1, step=1, key=PATCH)
    row, col = divmod(patch, gw)
    values = grid[row, col]  # (d_sae,)
    order = [i for i in top_classes(values, TOP_FEATURES) if values[i] > 0]  # the one ranking rule
    if not order:
        st.info("No feature fires on this patch.")
    else:
        st.markdown(f"**Features firing on patch {patch}** (row {row}, col {col})")
        labels = {i: f"feature {i} · {values[i]:.3f}" for i in order}
        clamp_state("feat_pick", order, order[0])

        def on_pick() -> None:
            st.session_state[FEATURE] = int(st.session_state["feat_pick"])

        st.radio(
            "Features on this patch", order, format_func=labels.get, key="feat_pick", on_change=on_pick,
            label_visibility="collapsed",
        )  # fmt: skip
        download_csv(
            "feat_patch_csv", f"sae_features_patch_{patch}", ["feature", "activation"],
            [(i, float(values[i])) for i in order],
        )  # fmt: skip
    clamp_state(FEATURE, (0, config.d_sae - 1), order[0] if order else 0)
    st.session_state.setdefault(FEATURE, order[0] if order else 0)
    st.number_input(
        "Feature to study", 0, config.d_sae - 1, step=1, key=FEATURE, help="Any feature; the list above sets it too."
    )
feature = int(st.session_state[FEATURE])
feature_map = grid[..., feature]  # (gh, gw)
show_chart(
    plots.attention_overlay(
        resources.background_uri(*cur.args),
        spec.img_size,
        feature_map,
        spec.patch_size,
        colorscale=cur.colorscale,
        zmin=0.0,
        zmax=max(float(feature_map.max()), 1e-6),
        title=f"Feature {feature} on this image",
        colorbar_title="activation",
        height=420,
    ),
    "feat_map",
    filename=f"sae_feature_{feature}_map",
)
download_npz("feat_image_data", f"sae_feature_{feature}_image", feature_map=feature_map, activation_per_patch=activity)

# --------------------------------------------------------------------------- the feature over the demo scenes
st.subheader(f"Feature {feature} over {sae_resources.INDEX_SCENES} demo scenes")
bar = st.progress(0.0, text="Indexing the demo scenes…")


def index_progress(done: int, total: int | None) -> None:
    bar.progress(done / max(1, total or 1), text=f"Indexing: {done} / {total} scenes")


try:
    index = sae_resources.feature_index(cur.model, sae_name, index_progress)
finally:
    bar.empty()
scenes, peaks = index.top_images(feature, TOP_SCENES)
if len(scenes):
    pictures, maps = sae_resources.scene_maps(cur.model, sae_name, feature, tuple(int(i) for i in scenes))
    show_chart(
        plots.map_panels(
            list(pictures),
            spec.img_size,
            list(maps),
            spec.patch_size,
            [f"scene {int(i)} · peak {float(p):.2f}" for i, p in zip(scenes, peaks)],
            ncols=4,
            colorscale=cur.colorscale,
            zmin=0.0,
            zmax=max(float(maps.max()), 1e-6),
            colorbar_title="activation",
            panel_height=180,
        ),
        "feat_top_scenes",
        filename=f"sae_feature_{feature}_top_scenes",
    )
else:
    st.info(f"Feature {feature} fires on none of these scenes (a dead feature here).")
hist_column, class_column = st.columns(2, gap="medium")
values_over_set = index.activations(feature).numpy()
with hist_column:
    st.markdown("**Activation histogram** (patch tokens where it fires)")
    show_chart(
        plots.activation_histogram(values_over_set, index.tokens - len(values_over_set)),
        "feat_histogram",
        filename=f"sae_feature_{feature}_histogram",
    )
effect = None
with class_column:
    st.markdown("**Classes its direction pushes** (decoder row through the final norm and the head)")
    try:
        effect = sae_resources.class_effect(cur.model, sae_name, feature)
        names = [class_label(cur.vit.class_names, c) for c in range(len(effect))]
        show_chart(plots.class_effect_bars(names, effect), "feat_classes", filename=f"sae_feature_{feature}_classes")
    except SAEError as exc:  # no linear class head
        st.info(error_text(exc), icon=":material/block:")
download_npz(
    "feat_set_data",
    f"sae_feature_{feature}_demo_scenes",
    top_scenes=scenes.numpy(),
    top_peaks=peaks.numpy(),
    activations=values_over_set,
    tokens=np.int64(index.tokens),
    scene_seed=np.int64(sae_resources.INDEX_SEED),
    **({"class_effect": effect} if effect is not None else {}),
)

# --------------------------------------------------------------------------- interventions
st.subheader(f"Change feature {feature} inside the forward pass")
st.caption(
    "The SAE is spliced in at its layer with its reconstruction error kept, so only the feature's change reaches "
    "the rest of the model. Scaled: 0 removes the feature, 1 changes nothing, above 1 amplifies it. Clamped: the "
    "feature takes the value at every token the SAE reads, so a feature that is silent on this image can be "
    "switched on (steering; scaling a zero leaves it zero)."
)
clamp_state("feat_mode", list(CHANGES), "scale")
mode = st.radio("Change the feature", list(CHANGES), format_func=CHANGES.get, horizontal=True, key="feat_mode")
assert mode is not None, "a radio with options and no index=None always has a value"
if mode == "clamp":
    peak = float(values_over_set.max()) if values_over_set.size else 1.0  # its largest activation over the scenes
    st.session_state.setdefault("feat_clamp", round(peak, 3))
    factor = st.number_input(
        "Set the feature to",
        min_value=0.0,
        step=max(round(peak / 10, 3), 0.001),
        format="%.3f",
        key="feat_clamp",
        help=f"Its largest activation over the {sae_resources.INDEX_SCENES} demo scenes is {peak:.3g}.",
    )
    change_label = f"feature = {factor:g}"
else:
    st.session_state.setdefault("feat_scale", 0.0)
    factor = st.slider("Scale the feature by", 0.0, 10.0, step=0.5, key="feat_scale")
    change_label = f"feature × {factor:g}"
file_part = f"x{factor:g}" if mode == "scale" else f"set{factor:g}"
if effect is not None:
    changed = sae_resources.intervention(
        cur.model, sae_name, cur.image.digest, cur.image.data, feature, float(factor), mode
    )
    clean, steered = changed["clean_probabilities"], changed["steered_probabilities"]
    shown = sorted(set(top_classes(clean, 5)) | set(top_classes(steered, 5)), key=lambda c: -clean[c])
    names = [class_label(cur.vit.class_names, c) for c in shown]
    bars_column, maps_column = st.columns([2, 3], gap="medium")
    with bars_column:
        top_clean, top_steered = int(np.argmax(clean)), int(np.argmax(steered))
        st.markdown(
            f"**Prediction**: {escape_markdown(class_label(cur.vit.class_names, top_clean))} "
            f"({100 * clean[top_clean]:.1f} %) → {escape_markdown(class_label(cur.vit.class_names, top_steered))} "
            f"({100 * steered[top_steered]:.1f} %)"
        )
        show_chart(
            plots.grouped_bars(
                names,
                [("clean", clean[shown].tolist()), (change_label, steered[shown].tolist())],
                y_title="probability",
            ),
            "feat_prediction_change",
            filename=f"sae_feature_{feature}_{file_part}_predictions",
        )
    with maps_column:
        classes = len(clean)
        show_chart(
            plots.map_panels(
                resources.background_uri(*cur.args),
                spec.img_size,
                [changed["clean_class_map"].astype(np.float32), changed["steered_class_map"].astype(np.float32)],
                spec.patch_size,
                ["class map, clean", f"class map, {change_label}"],
                ncols=2,
                colorscale=cur.colorscale,
                zmin=0.0,
                zmax=float(max(1, classes - 1)),
                colorbar_title="class index",
                panel_height=220,
            ),
            "feat_class_maps",
            filename=f"sae_feature_{feature}_{file_part}_class_maps",
        )
        st.caption(
            "Class map: each patch token after the last block read by the final norm and the head (its top class). "
            + ", ".join(
                f"{c} = {escape_markdown(class_label(cur.vit.class_names, c))}" for c in range(min(classes, 12))
            )
        )
    change = changed["change_map"]
    show_chart(
        plots.attention_overlay(
            resources.background_uri(*cur.args),
            spec.img_size,
            change,
            spec.patch_size,
            colorscale=cur.colorscale,
            zmin=0.0,
            zmax=max(float(change.max()), 1e-6),
            title="Where the last block's tokens moved",
            colorbar_title="‖Δ token‖",
            height=360,
        ),
        "feat_change_map",
        filename=f"sae_feature_{feature}_{file_part}_change",
    )
    download_npz("feat_intervention_data", f"sae_feature_{feature}_{file_part}", feature=np.int64(feature),
                 factor=np.float64(factor), mode=mode, **changed)  # fmt: skip
show_code(features_code(cur, sae_name, feature=feature, factor=float(factor), patch=patch, mode=mode))
