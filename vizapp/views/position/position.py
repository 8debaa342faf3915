"""Position embeddings: cosine similarity of every patch's embedding to all others
(ViT paper, Figure 7 centre)."""

from __future__ import annotations

import numpy as np
import streamlit as st

import analysis
from analysis import plots, similarity_distance_bins
from analysis.plots.mosaics import ZOOM_HINT
from vizapp import figures
from vizapp.messages import error_text
from vizapp.python_snippet import show_code
from vizapp.state import current
from vizapp.ui import clamp_state, download_csv, download_npz, end_page, point_index, selected_point, show_chart
from vizapp.views.position import compute
from vizapp.views.position.recipe import position_code
from vizapp.views.position.relative_position import render as render_relative_bias

cur = current()

st.header("Position embeddings", divider="gray")
KIND_LABELS = {
    "table": "learned position table (Figure 7)",
    "rope": "rotary features [sin θp, cos θp] (RoPE)",
}
kinds = analysis.position_encoding_kinds(cur.vit)
if any(compute.relative_position_layers(cur.model)):  # Swin, SAM
    render_relative_bias(cur)
    if kinds:  # and an absolute table as well: drawn below as a ViT's
        st.subheader("Absolute position table")
if not kinds:
    st.info(
        f"{cur.model.label} encodes positions as {cur.spec.position_embedding}: "
        + (
            "a bias on the attention scores that depends only on the displacement between two patches, so "
            "there is no per-position embedding to compare."
            if "relative" in cur.spec.position_embedding
            else "it has no position embedding at all."
        )
    )
    end_page()
kind = kinds[0]
if len(kinds) > 1:
    picked = st.radio("Position encoding", kinds, format_func=KIND_LABELS.get, horizontal=True, key="pos_kind")
    assert picked is not None, "a widget with options and no index=None always has a value"
    kind = picked
try:
    similarity = compute.position_similarity(cur.model, None, kind)  # (gh, gw, gh, gw)
except ValueError as exc:  # AnalysisError: e.g. a table that is all zero before training
    st.info(error_text(exc))
    end_page()
gh, gw = similarity.shape[:2]
if kind == "rope":
    st.caption(
        "This model has no learned position table: it rotates queries and keys by rotary embeddings (RoPE). "
        "The well-defined analogue is shown: tile (row i, col j) is the cosine similarity between the rotary "
        "feature vector [sin θp, cos θp] of patch (i, j) (all frequencies θ, as the model passes it to its "
        "attention) and those of all patches. It equals the mean over frequencies of cos(θ·(p − p′)), so it "
        f"depends only on the displacement. Click a tile to enlarge it. {ZOOM_HINT}"
    )
else:
    st.caption(
        "Tile (row i, col j) shows the cosine similarity between the position embedding of patch "
        f"(i, j) and those of all patches. Click a tile to enlarge it. {ZOOM_HINT}"
    )


def on_tile_click() -> None:
    point = selected_point("pos_mosaic")
    index = point_index(point) if point else None
    if index is not None and 0 <= index < gh * gw:
        st.session_state["pos_row"], st.session_state["pos_col"] = divmod(index, gw)


def tile_figure(sim: np.ndarray, highlight: int | None):
    """The whole mosaic, the page's width: on a 14×14 grid each tile's cells are about 4 px (3/5 of the
    page drew them at 1.5 px)."""
    return figures.position_similarity_mosaic(
        sim, colorscale=cur.colorscale, highlight=highlight, chart_width=plots.column_width(1.0)
    )


mosaic_area = st.container()  # the mosaic on top, drawn after the tile pickers below have their values
left, right = st.columns([2, 3], gap="medium", vertical_alignment="center")
clamp_state("pos_row", (0, gh - 1), gh // 2)
clamp_state("pos_col", (0, gw - 1), gw // 2)
st.session_state.setdefault("pos_row", gh // 2)
st.session_state.setdefault("pos_col", gw // 2)
with left:
    st.markdown("**The enlarged tile**: click a tile of the mosaic above, or pick it here.")
    r_col, c_col = st.columns(2)
    row = r_col.number_input("Tile row", 0, gh - 1, step=1, key="pos_row")
    col = c_col.number_input("Tile column", 0, gw - 1, step=1, key="pos_col")
with right:
    show_chart(
        plots.similarity_tile(
            similarity[row, col], (row, col), colorscale=cur.colorscale, chart_width=plots.column_width(3 / 5)
        ),
        "pos_tile",
        filename=f"position_similarity_r{row}_c{col}",
    )
with mosaic_area:
    st.markdown(f"**{gh}×{gw} grid** ({cur.model.label})")
    show_chart(
        tile_figure(similarity, row * gw + col), "pos_mosaic", filename="position_similarity", on_select=on_tile_click
    )

st.subheader("Resample to another grid")
resample = st.checkbox(
    "Resample the position embedding (bicubic, as when fine-tuning at a higher resolution)"
    if kind == "table"
    else "Rotary features on another grid (needs a model that takes other input sizes)",
    key="pos_resample",
)
curves = [(f"{gh}×{gw} (model)", similarity_distance_bins(similarity))]
arrays = {"similarity": similarity}
if resample:
    st.session_state.setdefault("pos_grid_h", max(2, round(gh * 1.5)))
    st.session_state.setdefault("pos_grid_w", max(2, round(gw * 1.5)))
    g1, g2, _ = st.columns([1, 1, 3])
    new_h = g1.number_input("Rows", 2, 64, step=1, key="pos_grid_h")
    new_w = g2.number_input("Columns", 2, 64, step=1, key="pos_grid_w")
    try:
        resampled = compute.position_similarity(cur.model, (int(new_h), int(new_w)), kind)
    except ValueError as exc:
        st.error(error_text(exc))
    else:
        arrays["resampled_similarity"] = resampled
        # express distances in patches of the model's grid so both curves share an axis
        unit = float(np.sqrt((gh / new_h) * (gw / new_w)))
        # bins at least one step of the resampled grid wide: a coarser grid has too few distances per patch
        width = max(1.0, unit)
        curves.append(
            (
                f"{new_h}×{new_w} (resampled" + (f", bins of {width:.2g} patches)" if width > 1 else ")"),
                similarity_distance_bins(resampled, unit, width),
            )
        )
        clamp_state("pos_rs_row", (0, new_h - 1), new_h // 2)
        clamp_state("pos_rs_col", (0, new_w - 1), new_w // 2)
        st.session_state.setdefault("pos_rs_row", new_h // 2)
        st.session_state.setdefault("pos_rs_col", new_w // 2)

        def on_resampled_click(n_w=int(new_w), n=int(new_h) * int(new_w)) -> None:
            point = selected_point("pos_mosaic_resampled")
            index = point_index(point) if point else None
            if index is not None and 0 <= index < n:
                st.session_state["pos_rs_row"], st.session_state["pos_rs_col"] = divmod(index, n_w)

        a, b = st.columns([3, 2], gap="medium")
        with b:
            rr, rc = st.columns(2)
            rs_row = rr.number_input("Tile row", 0, int(new_h) - 1, step=1, key="pos_rs_row")
            rs_col = rc.number_input("Tile column", 0, int(new_w) - 1, step=1, key="pos_rs_col")
            show_chart(
                plots.similarity_tile(
                    resampled[rs_row, rs_col],
                    (rs_row, rs_col),
                    colorscale=cur.colorscale,
                    chart_width=plots.column_width(2 / 5),
                ),
                "pos_rs_tile",
                filename=f"position_similarity_{new_h}x{new_w}_r{rs_row}_c{rs_col}",
            )
        with a:
            st.markdown(f"**Resampled {new_h}×{new_w}** (the model's {gh}×{gw} grid is above)")
            with st.spinner("Drawing the resampled grid…"):
                show_chart(
                    tile_figure(resampled, rs_row * int(new_w) + rs_col),
                    "pos_mosaic_resampled",
                    filename=f"position_similarity_{new_h}x{new_w}",
                    on_select=on_resampled_click,
                )

st.subheader("Similarity against distance")
st.caption(
    "Every pair of patches, pooled by the distance between their centres in bins one patch (of the model's grid) "
    "wide, [1, 2), [2, 3), … (a coarser resampled grid: one of its own steps); distance 0 (each patch with itself) "
    "is its own point. The line is each bin's mean "
    "cosine similarity at the bin's mean distance, the band ± one standard deviation; hover for the bin and its "
    "number of pairs (each pair counted in both directions)."
)
show_chart(plots.similarity_vs_distance(curves), "pos_curve", filename="position_similarity_vs_distance")
d1, d2, _ = st.columns([1, 1, 4])
with d1:
    download_npz("pos_data", "position_similarity", **arrays)
with d2:
    download_csv(
        "pos_curve_data",
        "position_similarity_vs_distance",
        [
            "grid",
            "bin_lower_patches",
            "bin_upper_patches",
            "mean_distance_patches",
            "mean_cosine",
            "std_cosine",
            "pairs",
        ],
        [
            (name, float(lo), float(hi), float(d), float(m), float(sd), int(n))
            for name, bins in curves
            for lo, hi, d, m, sd, n in zip(*bins, strict=True)
        ],
    )
show_code(
    position_code(
        cur.model, kind=kind, resampled_grid=(int(new_h), int(new_w)) if "resampled_similarity" in arrays else None
    )
)
