"""The Position page's section for models with relative positions (Swin, SAM): what they
learned about position, drawn from :mod:`analysis.embedding.relative_position`.

This is the analogue of the ViT paper's Figure 7 (centre). A Swin has no absolute
table to compare patch by patch; each layer adds a bias to every attention score that depends
only on the offset between the query's and the key's cell, one value per head and offset
(v2: computed from its continuous-position MLP). Drawn over all offsets a window allows, it
is a ``(2M − 1) × (2M − 1)`` image per head. SAM decomposes the bias into two tables (rows and
columns, a head-dimension vector per offset) that act through the query, so it shows the tables.
"""

from __future__ import annotations

import numpy as np
import streamlit as st

from analysis import AnalysisError
from vizapp import figures, ui
from vizapp.layer_grids import stage_label, stage_layers
from vizapp.messages import error_text
from vizapp.ui import clamp_state, show_chart
from vizapp.views.position import compute

__all__ = ["render"]


def _layer_picker(spec) -> int:
    last = spec.num_layers - 1
    st.session_state.setdefault("pos_bias_layer", 0)
    clamp_state("pos_bias_layer", list(range(spec.num_layers)), 0)
    stage_of = {layer: stage for stage, layers in stage_layers(spec).items() for layer in layers}
    layer = st.selectbox(
        "Layer",
        list(range(last + 1)),
        key="pos_bias_layer",
        format_func=lambda layer: f"layer {layer} · {stage_label(spec, stage_of[layer])}",
        help="Each layer has its own bias (v1: a learned table; v2: from its own MLP).",
    )
    assert layer is not None, "a selectbox with options and no index=None always has a value"
    return int(layer)


def _all_zero(what: str) -> str:
    return (
        f"{what} {'are' if 'tables' in what else 'is'} all zero, as before training: these weights have "
        "learned nothing about position yet, so there is nothing to draw. Load trained weights to see it."
    )


def render(cur) -> None:
    """Draw the relative-position section (the Position page calls it for a model whose layers have
    a relative-position bias that :func:`analysis.embedding.relative_position.relative_position_kind`
    reads)."""
    spec = cur.spec
    st.subheader("Relative-position bias (the analogue of Figure 7, centre)")
    layer = _layer_picker(spec)
    geometry = spec.geometry(layer)
    wh, ww = geometry.window_size
    try:
        bias = compute.relative_position_bias(cur.model, layer)  # (heads, 2wh − 1, 2ww − 1)
    except AnalysisError:
        bias = None
    if bias is not None and not np.any(bias):
        st.info(_all_zero(f"Layer {layer}'s relative-position bias"))
        return
    if bias is not None:
        lo, hi = float(bias.min()), float(bias.max())
        st.caption(
            f"The ViT paper's Figure 7 (centre) compares learned absolute position embeddings. A windowed model "
            f"has none to compare: each layer adds a bias to the attention score of a query cell and a key cell "
            f"of one window that depends only on their offset Δ = query − key. Tile h is head h's bias over all "
            f"{2 * wh - 1}×{2 * ww - 1} offsets of the {ww}×{wh} window (centre: the query's own cell; right / down: "
            f"keys to the left / above). One colour scale over the layer's heads: {lo:.3g} to {hi:.3g} (score "
            "units, added before the softmax)."
        )
        heads = bias.shape[0]
        show_chart(
            figures.mosaic(
                bias,
                min(heads, 6),
                tile_names=[f"head {h}" for h in range(heads)],
                colorscale=cur.colorscale,
                zmin=lo,
                zmax=hi if hi > lo else lo + 1e-12,
                colorbar_title="bias added to the score",
                col_labels=None,
                title=f"Layer {layer}: relative-position bias per head",
            ),
            "pos_bias",
            filename=f"relative_position_bias_L{layer}",
        )
        ui.download_npz(
            "pos_bias_data",
            f"relative_position_bias_L{layer}",
            bias=bias,
            layer=layer,
            window_size=geometry.window_size,
        )
        return
    try:
        rows, cols = compute.decomposed_position(cur.model, layer)  # (2h − 1, C), (2w − 1, C)
    except AnalysisError as exc:
        st.info(error_text(exc))
        return
    values = np.concatenate([rows.ravel(), cols.ravel()])
    if not np.any(values):
        st.info(_all_zero(f"Layer {layer}'s two relative-position tables (rows and columns)"))
        return
    lo, hi = float(values.min()), float(values.max())
    st.caption(
        "SAM decomposes its relative positions into two learned tables, one row per offset along each axis "
        "(a head-dimension vector): the bias of a query at (i, j) and a key at (k, l) is "
        "q·R_rows[i − k] + q·R_cols[j − l], so it depends on the query's content and there is no fixed per-head "
        f"image; these tables are what the model learned (shared by its heads). {'Global block' if geometry.is_global else 'Window'}: "
        f"{ww}×{wh} cells; one colour scale for both tables: {lo:.3g} to {hi:.3g}."
    )
    for name, table in (("rows (offset Δy)", rows), ("columns (offset Δx)", cols)):
        show_chart(
            figures.mosaic(
                table.T[None],
                1,
                tile_names=[name],
                colorscale=cur.colorscale,
                zmin=lo,
                zmax=hi if hi > lo else lo + 1e-12,
                colorbar_title="table value",
                x_title=f"offset + {table.shape[0] // 2}",
                y_title="channel",
                title=f"Layer {layer}: {name}",
                height=520,  # one table, not a thumbnail: the column's width
            ),
            f"pos_table_{name.split()[0]}",
            filename=f"decomposed_position_{name.split()[0]}_L{layer}",
        )
    ui.download_npz("pos_tables_data", f"decomposed_position_L{layer}", rows=rows, cols=cols, layer=layer)
