"""Rollout: attention rolled out through the layers (Abnar & Zuidema, 2020)."""

from __future__ import annotations

import numpy as np
import streamlit as st

from analysis import AnalysisError, masked_image, plots
from analysis.attention.rollout import MERGE_WARNING, rollout_uniform_level
from analysis.attention.rollout_rules import POST_NORM_WARNING
from analysis.plots import colour_range, robust_top
from analysis.records.queries import query_for_layers
from analysis.views.attention_view import view_layout
from vizapp import figures, limits, resources
from vizapp.attention_view import attention_view, follow_view, layer_bytes, served
from vizapp.layer_grids import stage_label, stage_layers
from vizapp.python_snippet import Source, show_code
from vizapp.state import current
from vizapp.ui import (
    clamp_state,
    describe_query,
    download_npz,
    download_png,
    outlier_notice,
    patch_click,
    query_controls,
    refuse_page,
    show_chart,
    stride_of_map,
)
from vizapp.views.rollout import compute
from vizapp.views.rollout.recipe import rollout_code

cur = current()
spec = cur.spec
L = spec.num_layers
FUSIONS = ["mean", "max", "min"]
STRIP_COLUMNS = 6  # thumbnails per row of the per-layer strip
STAGES = stage_layers(spec)  # a ViT or SAM: one stage holding every layer
ACROSS = "across"  # the span choice "from a start layer, across stages" (a windowed model with several)

st.header("Attention rollout", divider="gray")
st.caption(
    "R = Â_end ⋯ Â_start with Â = ½·(fused heads) + ½·I, rows renormalised; "
    "the map is the query's row of R over the patch tokens."
)
if spec.residual_norm == "post":
    st.warning(POST_NORM_WARNING, icon=":material/warning:")

left, right = st.columns([3, 2], gap="medium")
with right:
    fusion = st.radio("Head fusion", FUSIONS, horizontal=True, key="fusion")
    assert fusion is not None, "a widget with options and no index=None always has a value"
    st.session_state.setdefault("discard_ratio", 0.0)
    discard = st.slider(
        "Discard ratio",
        0.0,
        0.95,
        step=0.05,
        key="discard_ratio",
        help="Fraction of the smallest off-diagonal fused attention weights set to zero in each layer.",
    )
    stage, merge = None, None
    if len(STAGES) > 1:  # Swin: exact within a stage; across patch merging only as an opted-in approximation
        spans = [*STAGES, ACROSS]
        clamp_state("rollout_span", spans, spans[0])
        span = st.radio(
            "Layers",
            spans,
            key="rollout_span",
            format_func=lambda s: "across stages, from a start layer" if s == ACROSS else stage_label(spec, s),
            help="Rollout multiplies attention matrices over one token set: exact within a stage. "
            "Patch merging changes the token set through a learned layer.",
        )
        assert span is not None, "a widget with options and no index=None always has a value"
        if span != ACROSS:
            stage = int(span)
    if stage is None:
        clamp_state("start_layer", (0, L - 1), 0)
        start = st.slider("Start layer", 0, L - 1, step=1, key="start_layer") if L > 1 else 0
        if len(STAGES) > 1 and st.checkbox(
            "Approximate across patch merging (merge='mean_2x2')",
            key="rollout_merge",
            help="Each merged token taken as the mean of its 2×2 parents: not what the model computes.",
        ):
            merge = "mean_2x2"
    else:
        start = STAGES[stage][0]
    query = query_controls(spec)
    st.session_state.setdefault("opacity", 0.6)
    opacity = st.slider("Overlay opacity", 0.0, 1.0, step=0.05, key="opacity")

# a windowed model's query is the pixel at the chosen cell's centre, valid on any stage grid; a ViT's is unchanged
library_query = query_for_layers(spec, query)
try:
    # (steps, gh, gw): after each layer of start..L-1 (or of the stage), every map on start's grid
    strip = resources.rollout_by_layer(*cur.args, fusion, float(discard), int(start), library_query, stage, merge)
except AnalysisError as exc:  # e.g. a range across Swin's patch merging without the opt-in: say why
    refuse_page(exc)
end_layers = STAGES[stage] if stage is not None else list(range(start, L))
end = end_layers[-1]
if merge is not None and any(spec.geometry(layer).stage != spec.geometry(start).stage for layer in end_layers):
    st.warning(f"**An approximation.** {MERGE_WARNING}", icon=":material/warning:")
final = strip[-1]
grid = tuple(final.shape)  # the result's own grid (a windowed model's may be a stage grid)
stride = stride_of_map(spec.img_size, grid)
query_text = describe_query(query, spec)
uniform = rollout_uniform_level(spec, int(start))  # 1/T for a ViT, 1/(cells of the start stage's grid) windowed
robust = cur.map_range == "robust"
lo, hi, range_text = colour_range(cur.map_range, cur.shown(final), strip, uniform=uniform, left_out=cur.left_out(final))


# the instant view of every query's rollout after each layer: where the library defines it (a ViT), within
# VIZAPP_VIEW_MB
has_view = view_layout(spec) == "tokens"  # every query's rollout is a row of one T × T product


def instant_view() -> None:
    """The instant rollout view, or why it is off (over VIZAPP_VIEW_MB)."""
    view_bytes = len(end_layers) * layer_bytes(spec, maps=1)
    if view_bytes <= limits.MAX_VIEW_BYTES:
        attention_view(
            data=served(*compute.rollout_view_blob(*cur.args, fusion, float(discard), int(start)), key="rollout_view"),
            image_uri=resources.background_uri(*cur.args),
            spec=spec,
            layer=end,
            head="mean",
            query=query,
            colorscale=cur.colorscale,
            map_range=cur.map_range,
            opacity=opacity,
            key="rollout_view",
            on_change=follow_view("rollout_view", patches=spec.num_patches),
            note="",
            heads=0,
            head_names=[f"{fusion} fusion, discard {discard:.2f}"],
            value_name="rollout weight",
            layer_label=f"Rollout layers {start} to",
            report_layer=False,
            shared_name="0–max of this map",
            left_out=cur.outliers,
            hide_left_out=cur.hide_outliers,
        )
        st.caption(
            "Instant view: hover a patch to see its rollout (drawn in the browser, one cell per patch, values to "
            "one 255th of each map's range); ↑/↓ step the last layer rolled out; click to make the patch the query. "
            "The same map as a chart, with hover values and downloads:"
        )
    else:
        st.caption(
            f"The instant hover view is off for this model: every query's rollout after each of these layers is "
            f"{view_bytes / 2**20:.0f} MiB, over the {limits.MAX_VIEW_BYTES / 2**20:.0f} MiB the page may hold "
            "(VIZAPP_VIEW_MB). Click the chart to pick a query."
        )


with left:
    if has_view:
        instant_view()
    outlier_notice(cur, final, "this rollout")
    figure = plots.attention_overlay(
        resources.background_uri(*cur.args),
        spec.img_size,
        cur.shown(final),
        stride,
        opacity=opacity,
        colorscale=cur.colorscale,
        colorbar_title=f"rollout weight ({range_text.replace('layers, heads', 'layers')})",
        zmin=lo,
        zmax=hi,
        title=f"Rollout layers {start}–{end} · {fusion} fusion · discard {discard:.2f} · query: {query_text}",
        query_patch=query if isinstance(query, int) and grid == tuple(spec.grid_size) else None,
        upsampled=cur.upsampled(cur.shown(final)),
        chart_width=plots.column_width(3 / 5),
        uniform=uniform,
    )
    show_chart(
        figure, "rollout_overlay", filename="rollout", on_select=patch_click("rollout_overlay", [grid], spec.grid_size)
    )
    download_npz(
        "rollout_data",
        "rollout",
        rollout=final,
        after_each_layer=strip,
        end_layers=end_layers,
        head_fusion=fusion,
        discard_ratio=discard,
        start_layer=start,
        query=str(library_query),
        **({"stage": stage} if stage is not None else {}),
        **({"merge": merge} if merge is not None else {}),
    )
    show_code(
        rollout_code(
            Source.of(cur),
            fusion=fusion,
            discard_ratio=discard,
            start_layer=start,
            query=library_query,
            stage=stage,
            merge=merge,
            windowed=not has_view,  # a windowed model: no instant view in the script either
        )
    )

with right:
    st.subheader("Figure 6 view")
    drawn = np.nan_to_num(cur.shown(final))  # outlier tokens left out: 0 (black)
    figure6 = masked_image(
        resources.forward(*cur.args).input_image, drawn, "bilinear", top=hi if robust else None
    )  # (H, W, 3) uint8
    st.image(
        figure6,
        width="stretch",
        output_format="PNG",
        caption="The input multiplied by the rollout, upsampled bilinearly to the pixels and divided by "
        + (
            f"the map colour range's top, {hi:.3g} ({range_text.split(':', 1)[0]}; brighter cells at full brightness)"
            if robust
            else "its maximum"
        )
        + " (black: no attention), as in the ViT paper's Figure 6"
        + (" (which divides by the maximum: choose the colour range 0–max for its rule)" if robust else "")
        + ".",
    )
    download_png("rollout_figure6_png", "rollout_figure6", figure6)

st.subheader("Rollout after each layer")
if len(strip) == 1:  # start layer = last layer: the strip would repeat the map above
    st.caption(f"One layer only (start layer {start} is the last): the map above is the whole strip.")
else:
    st.session_state.setdefault("rollout_norm", True)
    top_name = "99th percentile" if robust else "maximum"
    normalise = st.toggle(f"Scale each map to its own {top_name}", key="rollout_norm")
    drawn_strip = cur.shown(strip)
    if normalise and robust:  # each map by its own robust top: one outlier patch cannot blacken a map
        cells = cur.left_out(final)
        tops = np.array([robust_top(m, left_out=cells) for m in drawn_strip], np.float32)
        drawn_strip = drawn_strip / np.where(tops > 0, tops, 1.0)[:, None, None]
    per_row = min(len(strip), STRIP_COLUMNS)  # rows of thumbnails of at least 120 px, not one row of small ones
    strip_fig = figures.mosaic(
        drawn_strip,
        per_row,
        tile_names=[f"layers {start}–{last}" for last in end_layers],
        colorscale=cur.colorscale,
        normalize_each=normalise and not robust,
        zmin=0.0 if normalise and robust else None,
        zmax=1.0 if normalise and robust else None,
        colorbar_title=("rollout / its 99th percentile (clipped at 1)" if robust else "rollout / map max")
        if normalise
        else "rollout weight",
        col_labels=[str(last) for last in end_layers] if len(strip) <= per_row else None,
        row_labels=None
        if len(strip) <= per_row
        else [f"{end_layers[i]}–{end_layers[min(i + per_row, len(strip)) - 1]}" for i in range(0, len(strip), per_row)],
        x_title="after layer" if len(strip) <= per_row else None,
        y_title=None if len(strip) <= per_row else "after layers",
        highlight=len(strip) - 1,
    )
    show_chart(strip_fig, "rollout_strip", filename="rollout_after_each_layer")
