"""Compare layers: chosen layers side by side on one colour scale; optionally a second model."""

from __future__ import annotations

import numpy as np
import streamlit as st

from vizapp import figures, resources
from vizapp.derive import MAP_RANGES, colour_range, map_layer, map_query
from vizapp.messages import error_text, escape_markdown
from vizapp.state import current, second_model_control
from vizapp.ui import describe_query, download_npz, head_control, head_label, query_controls, show_chart

cur = current()
spec = cur.spec
L, H = spec.num_layers, spec.num_heads


st.header("Compare layers", divider="gray")
st.caption("Two to four layers (or all of them) side by side, same head and query, one shared colour scale.")

c1, c2, c3 = st.columns([2, 1, 2], gap="medium")
with c1:
    every = st.checkbox("All layers", key="cmp_all")
    defaults = sorted({0, L // 3, (2 * L) // 3, L - 1})[:4]
    if "cmp_layers" in st.session_state:
        st.session_state["cmp_layers"] = [x for x in st.session_state["cmp_layers"] if 0 <= x < L][:4] or defaults
    else:
        st.session_state["cmp_layers"] = defaults
    chosen = st.multiselect(
        "Layers (2–4)", list(range(L)), key="cmp_layers", max_selections=4, disabled=every,
        format_func=lambda x: f"layer {x}",
    )
with c2:
    head = head_control(spec)
    st.session_state.setdefault("opacity", 0.6)
    opacity = st.slider("Overlay opacity", 0.0, 1.0, step=0.05, key="opacity")
with c3:
    query = query_controls(spec)

layers = list(range(L)) if every else sorted(chosen)
if not layers:
    st.info("Choose at least one layer.")
    st.stop()

maps = resources.attention_grid(*cur.args, query)
column = H if head == "mean" else int(head)
panels = [maps[layer, column] for layer in layers]
titles = [f"layer {layer}" for layer in layers]
backgrounds = [resources.background_uri(*cur.args)] * len(layers)
sizes = [spec.img_size] * len(layers)
patches = [spec.patch_size] * len(layers)

loaded = second_model_control(
    "cmp_model2", "Second model on the same image (optional)", cur.model,
    help="Shown in a second row at the same relative depth, with the same head (or the mean) and the "
    "query at the same image position.",
)
extra_rows = {}
if loaded is not None:
    ref2, vit2 = loaded
    try:
        args2 = (ref2, cur.image.digest, cur.image.data)
        spec2 = vit2.spec
        query2 = map_query(query, spec.grid_size, spec2.grid_size, spec2.has_class_token)
        maps2 = resources.attention_grid(*args2, query2)
        column2 = spec2.num_heads if head == "mean" or int(head) >= spec2.num_heads else int(head)
        layers2 = [map_layer(layer, L, spec2.num_layers) for layer in layers]
        for layer2 in layers2:
            panels.append(maps2[layer2, column2])
            titles.append(f"{ref2.source.split('.')[0]} · layer {layer2}")
        backgrounds += [resources.background_uri(*args2)] * len(layers2)
        sizes += [spec2.img_size] * len(layers2)
        patches += [spec2.patch_size] * len(layers2)
        extra_rows = {"second_model_attention": maps2[layers2, column2], "second_model_layers": layers2}
        if column2 != column:
            st.caption(f"{ref2.label} has {spec2.num_heads} heads: showing its mean over heads.")
    except Exception as exc:  # noqa: BLE001 - the first model's panels still show
        st.error(f"**{escape_markdown(ref2.label)}** could not process this image: {error_text(exc)}")

ncols = len(layers) if len(layers) <= 4 else 6
all_panels = np.concatenate([p.ravel() for p in panels])
lo, hi, range_text = colour_range(cur.map_range, all_panels, maps)
figure = figures.map_panels(
    backgrounds, sizes, panels, patches, titles, ncols=ncols, opacity=opacity, colorscale=cur.colorscale,
    zmin=lo, zmax=hi, colorbar_title=f"attention probability ({range_text})",
)
st.caption(
    f"{head_label(head)} · query: {describe_query(query, spec)} · one colour scale over all panels, "
    f"{MAP_RANGES[cur.map_range].replace('the map', 'the panels')}"
)
show_chart(figure, "cmp_panels", filename="compare_layers")
download_npz(
    "cmp_data", "compare_layers", attention=maps[layers, column], layers=layers,
    head=-1 if head == "mean" else int(head), query=str(query), **extra_rows,
)
