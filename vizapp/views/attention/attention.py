"""Attention: one head's (or the mean) attention for one query, over the image, for every family.

Each layer's map is drawn on that layer's own grid (``spec.geometry(layer)``: cells of its stride in
input pixels). A ViT's layers share the patch grid and attend globally; a Swin's or SAM's attend
inside windows, so a query's map is exactly 0 outside its window, which the page outlines (with
Swin's cyclic shift a window wraps around the image border and is drawn in pieces). A stage picker
appears when layers differ in grid (Swin's patch merging); the layer slider then moves within the
stage, and the layers × heads thumbnails come one mosaic per stage (heads differ per stage).

The query is a patch of the finest grid (``spec.grid_size``), a prefix token or the mean, handed to
the library by :func:`analysis.records.queries.query_for_layers` (a patch of a windowed model becomes
the pixel at its centre, so one click means the same place in the image on every stage).
"""

from __future__ import annotations

import numpy as np
import streamlit as st

from analysis import masked_image, plots, top_mass_mask
from analysis.plots import UNIFORM_FLOOR, colour_range, layer_scaled
from analysis.records.queries import query_for_layers
from vizapp import figures, resources, ui
from vizapp.attention_view import page_view
from vizapp.layer_grids import (
    layer_cell_to_query_patch,
    stage_label,
    stage_layers,
    window_members,
    window_rectangles,
    window_shapes,
)
from vizapp.python_snippet import Source, show_code
from vizapp.state import current
from vizapp.ui import (
    clamp_state,
    download_npz,
    head_control,
    head_label,
    outlier_notice,
    patch_click,
    point_index,
    predictions_panel,
    query_controls,
    selected_point,
    show_chart,
)
from vizapp.views.attention import compute
from vizapp.views.attention.recipe import attention_code

OUTSIDE_MASK_BRIGHTNESS = 0.3  # top-mass panels: the image outside a head's mask, dimmed


def layer_controls(spec, stages: dict[int, list[int]]) -> tuple[int, int]:
    """The stage picker (when layers differ in grid) and the layer slider within the stage:
    ``(stage, layer)``. Keys ``attn_stage`` and ``layer`` (a model layer index)."""
    last = spec.num_layers - 1
    st.session_state.setdefault("layer", last)
    clamp_state("layer", (0, last), last, widget=False)  # a layer of this model, before its stage's slider
    stage_of = {layer: stage for stage, layers in stages.items() for layer in layers}
    if len(stages) > 1:
        st.session_state.setdefault("attn_stage", stage_of[int(st.session_state["layer"])])
        clamp_state("attn_stage", list(stages), stage_of[int(st.session_state["layer"])])
        stage = st.radio(
            "Stage",
            list(stages),
            format_func=lambda s: stage_label(spec, s),
            key="attn_stage",
            help="Layers of one stage share a grid; patch merging halves the grid between stages.",
        )
        assert stage is not None, "a widget with options and no index=None always has a value"
    else:
        stage = next(iter(stages))
    layers = stages[stage]
    clamp_state("layer", (layers[0], layers[-1]), layers[-1])
    if len(layers) > 1:
        layer = st.slider("Layer (block index)", layers[0], layers[-1], step=1, key="layer")
    else:
        st.session_state["layer"] = layers[0]
        layer = layers[0]
        st.caption(f"Layer {layer} (the only layer of {'this stage' if len(stages) > 1 else 'this model'}).")
    return stage, int(layer)


def tile_click(chart_key: str, layers: list[int], heads: int, stage_of: dict[int, int]):
    """A click on a stage's thumbnail opens that (layer, head) large."""

    def on_click() -> None:
        point = selected_point(chart_key)
        index = point_index(point) if point else None
        if index is None or not 0 <= index < len(layers) * (heads + 1):
            return
        row, column = divmod(index, heads + 1)
        st.session_state["layer"] = layers[row]
        if len(set(stage_of.values())) > 1:
            st.session_state["attn_stage"] = stage_of[layers[row]]
        st.session_state["head"] = "mean" if column == heads else column

    return on_click


def overlay_click(chart_key: str, spec, geometry):
    """A click on the map: the clicked cell of this layer's grid becomes the query (the patch
    of the finest grid under its centre: on a ViT, the clicked patch itself)."""

    def on_click() -> None:
        point = selected_point(chart_key)
        index = point_index(point) if point else None
        gh, gw = geometry.grid_size
        if index is None or not 0 <= index < gh * gw:
            return
        st.session_state["query_mode"] = "patch"
        st.session_state["query_patch"] = layer_cell_to_query_patch(spec, geometry, index)

    return on_click


def describe_query(query, library_query, spec, geometry) -> str:
    """The query in words: a token query as the pages name it; a pixel (a windowed model's patch,
    :func:`analysis.records.queries.query_for_layers`) with the cell of this layer's grid that holds it."""
    if not isinstance(library_query, tuple):
        return ui.describe_query(query, spec)
    y, x = library_query
    lr, lc = divmod(geometry.cell_of_pixel(y, x), geometry.grid_size[1])
    return f"pixel (y {y}, x {x}) · cell (row {lr}, col {lc})"


def window_of(geometry, query_cell: int | None) -> np.ndarray | None:
    """``(gh, gw)`` bool: the cells of the query's window on this layer (the only cells a windowed
    map draws and a robust range counts); ``None`` for the mean query or a layer with one window."""
    if query_cell is None or geometry.is_global:
        return None
    inside = np.zeros(geometry.grid_size, bool)
    inside.flat[window_members(geometry, query_cell)] = True
    return inside


cur = current()
spec = cur.spec
stages = stage_layers(spec)
stage_of = {layer: stage for stage, layers in stages.items() for layer in layers}

st.header("Attention", divider="gray")
st.caption(
    "Attention probabilities of one query over the tokens of a layer's grid, drawn over exactly the pixels the "
    "model saw ("
    + (
        "bilinearly upsampled from the cell centres; hover shows each cell's value"
        if cur.smooth
        else "one cell a token"
    )
    + "). Where a layer attends inside windows (Swin, SAM), the map is exactly 0 outside the query's window, "
    "which is outlined (Swin's shifted windows wrap around the border and are drawn in pieces). Click the image "
    "to query the patch under the cursor."
)

left, right = st.columns([3, 2], gap="medium")
with right:
    stage, layer = layer_controls(spec, stages)
    geometry = spec.geometry(layer)
    heads = geometry.num_heads
    head = head_control(spec, heads=heads)
    query = query_controls(spec)
    st.session_state.setdefault("opacity", 0.6)
    opacity = st.slider("Overlay opacity", 0.0, 1.0, step=0.05, key="opacity")

library_query = query_for_layers(spec, query)  # a windowed model's patch: the pixel at its centre
maps = resources.layer_attention_grids(*cur.args, library_query)  # per layer (heads_l + 1, gh_l, gw_l)
column = heads if head == "mean" else int(head)
shown = maps[layer][column]
mean_query = query == "mean"
uniform = geometry.uniform_attention(mean_query=mean_query)  # what each key cell gets under uniform attention
everything = np.concatenate([m.ravel() for m in maps])
query_text = describe_query(query, library_query, spec, geometry)
query_cell = None if isinstance(query, str) else geometry.cell_of_pixel(*spec.patch_centre(query))
inside = window_of(geometry, query_cell)
lo, hi, range_text = colour_range(
    cur.map_range, cur.shown(shown), everything, uniform=uniform, left_out=cur.left_out(shown), inside=inside
)
stage_text = f" (stage {stage})" if len(stages) > 1 else ""

with left:
    held = page_view(cur, layer=layer, head=head, query=query, query_cell=query_cell, opacity=opacity, key="attn_view")
    outlier_notice(cur, shown, "this map")
    figure = plots.attention_overlay(
        resources.background_uri(*cur.args),
        spec.img_size,
        cur.shown(shown),
        geometry.stride,
        opacity=opacity,
        colorscale=cur.colorscale,
        zmin=lo,
        zmax=hi,
        colorbar_title=f"attention probability ({range_text})",
        title=f"Layer {layer}{stage_text} · {head_label(head)} · query: {query_text}",
        query_patch=query_cell,
        upsampled=cur.upsampled(cur.shown(shown)),
        chart_width=plots.column_width(3 / 5),
        uniform=uniform,
    )
    if inside is not None and query_cell is not None:
        for shape in window_shapes(window_rectangles(geometry, query_cell)):
            figure.add_shape(**shape)
    if held:
        st.caption("The chart follows as soon as the view above has drawn.")
    else:
        show_chart(
            figure,
            "attn_overlay",
            filename=f"attention_L{layer}_{head}",
            on_select=overlay_click("attn_overlay", spec, geometry),
        )
    (gh, gw), (sy, sx), (wh, ww) = geometry.grid_size, geometry.stride, geometry.window_size
    st.caption(
        f"Layer {layer}: {gw}×{gh} cells of {sx}×{sy} px, "
        + (
            f"one window of all {geometry.window_tokens} tokens"
            if geometry.is_global
            else f"{geometry.num_windows} windows of {ww}×{wh} cells, shift {geometry.shift[1]}×{geometry.shift[0]}"
        )
        + (
            f"; under uniform attention the mean over every query gives each of the {gh * gw} cells {uniform:.2g}."
            if mean_query and not geometry.is_global
            else f"; uniform attention gives each of the {geometry.window_tokens} keys a query sees {uniform:.2g}."
        )
    )
    download_npz(
        "attn_overlay_data",
        f"attention_L{layer}_{head}",
        attention=shown,
        layer=layer,
        head=-1 if head == "mean" else int(head),
        query=str(library_query),
        stride=geometry.stride,
        image_size_hw=spec.img_size,
    )
    if not held:
        widget = not isinstance(library_query, tuple)  # the notebook widget takes a token or cell, not a pixel
        show_code(attention_code(Source.of(cur), layer=layer, head=head, query=library_query, view=widget))

with right:
    if not held:
        predictions_panel(cur)

pooling = compute.pooling_attention(*cur.args)  # (heads + 1, gh, gw) or None
if pooling is not None and not held:
    st.subheader("Attention-pooling head")
    st.caption(
        "Not a block: the model pools its output tokens with a learned probe query (``map`` pooling). "
        "This is that probe's attention over the patch tokens, for the head chosen above "
        "(its own heads; the mean if the choice exceeds them)."
    )
    pool_heads = pooling.shape[0] - 1
    pool_column = pool_heads if head == "mean" or int(head) >= pool_heads else int(head)
    pool_label = "mean over heads" if pool_column == pool_heads else f"head {pool_column}"
    pool_uniform = 1 / spec.num_tokens
    pool_lo, pool_hi, pool_range = colour_range(cur.map_range, pooling[pool_column], pooling, uniform=pool_uniform)
    show_chart(
        plots.attention_overlay(
            resources.background_uri(*cur.args),
            spec.img_size,
            pooling[pool_column],
            spec.patch_size,
            opacity=opacity,
            colorscale=cur.colorscale,
            title=f"Pooling probe · {pool_label}",
            zmin=pool_lo,
            zmax=pool_hi,
            colorbar_title=f"attention probability ({pool_range})",
            upsampled=cur.upsampled(pooling[pool_column]),
            uniform=pool_uniform,
        ),
        "pool_overlay",
        filename="attention_pooling_head",
    )
    download_npz("pool_data", "attention_pooling_head", attention=pooling[:pool_heads], mean_over_heads=pooling[-1])

# --------------------------------------------------------------------------- all layers × heads, per stage
st.subheader(f"All layers × heads{', per stage' if len(stages) > 1 else ''} · query: {query_text}")
robust = cur.map_range == "robust"
THUMBNAIL_SCALES = {
    "layer": (
        f"one scale per layer (its 99th percentile without outlier tokens, at least {UNIFORM_FLOOR:g}× "
        "uniform; higher cells at the top colour)"
        if robust
        else f"one scale per layer (its maximum, at least {UNIFORM_FLOOR:g}× uniform)"
    ),
    "each": "each map to its own maximum",
    "shared": "one shared scale",
}
clamp_state("thumb_scale", list(THUMBNAIL_SCALES), "layer")
scale = st.radio(
    "Thumbnail colour scale",
    list(THUMBNAIL_SCALES),
    horizontal=True,
    key="thumb_scale",
    format_func=THUMBNAIL_SCALES.get,
)
assert scale is not None, "a radio with options and no index=None always has a value"
shared_top = max(float(np.nanmax(cur.shown(m))) for m in maps)
thumbnail_titles = {
    "layer": f"attention / its layer's top{' (clipped at 1)' if robust else ''}",
    "each": "attention / map max",
    "shared": "attention weight (probability)",
}
for stage_index, layers in stages.items():
    first = spec.geometry(layers[0])
    stage_heads = first.num_heads
    stacked = np.stack([cur.shown(maps[lyr]) for lyr in layers])  # (layers, heads + 1, gh, gw)
    tiles = stacked
    if scale == "layer":  # heads compare within a layer; a near-uniform layer stays pale
        tiles = np.concatenate(
            [
                layer_scaled(
                    cur.shown(maps[lyr])[None],
                    uniform=spec.geometry(lyr).uniform_attention(mean_query=mean_query),
                    robust=robust,
                    left_out=cur.left_out(maps[lyr]),
                    inside=window_of(
                        spec.geometry(lyr),
                        None if query_cell is None else spec.geometry(lyr).cell_of_pixel(*spec.patch_centre(query)),
                    ),
                )[0]
                for lyr in layers
            ]
        )
    highlight = layers.index(layer) * (stage_heads + 1) + column if layer in layers else None
    key = "attn_grid" if len(stages) == 1 else f"attn_grid_s{stage_index}"
    grid = figures.mosaic(
        tiles.reshape(-1, *first.grid_size),
        stage_heads + 1,
        tile_names=[
            f"layer {lyr}, {head_label('mean' if h == stage_heads else h)}"
            for lyr in layers
            for h in range(stage_heads + 1)
        ],
        colorscale=cur.colorscale,
        normalize_each=scale == "each",
        zmin=None if scale == "each" else 0.0,
        zmax=1.0 if scale == "layer" else (shared_top if scale == "shared" else None),
        colorbar_title=thumbnail_titles[scale],
        x_title="head",
        y_title="layer",
        col_labels=[*map(str, range(stage_heads)), "mean"],
        row_labels=[str(lyr) for lyr in layers],
        highlight=highlight,
        title=stage_label(spec, stage_index) if len(stages) > 1 else None,
    )
    if not held:
        show_chart(
            grid,
            key,
            filename="attention_layers_x_heads" + (f"_stage{stage_index}" if len(stages) > 1 else ""),
            on_select=tile_click(key, layers, stage_heads, stage_of),
        )
    download_npz(
        "attn_grid_data" + (f"_s{stage_index}" if len(stages) > 1 else ""),
        "attention_layers_x_heads" + (f"_stage{stage_index}" if len(stages) > 1 else ""),
        attention=np.stack([maps[lyr] for lyr in layers])[:, :stage_heads],
        mean_over_heads=np.stack([maps[lyr] for lyr in layers])[:, stage_heads],
        query=str(library_query),
        layers=layers,
        stride=first.stride,
    )
st.caption(
    "Click a thumbnail to open it above. The last column is the mean over heads; every map is on its own layer's grid."
)

# --------------------------------------------------------------------------- top attention mass (DINO)
st.subheader(f"Top attention mass per head · layer {layer} · query: {query_text}")
if (
    st.toggle(
        "Show each head's top-mass cells (DINO)",
        key="dino_show",
        help="Per head, the fewest cells that hold a chosen share of the query's attention.",
    )
    and not held
):
    st.session_state.setdefault("dino_mass", 0.6)
    mass = st.slider(
        "Attention mass kept",
        0.05,
        1.0,
        step=0.05,
        key="dino_mass",
        help="Per head, the fewest cells whose attention adds up to this fraction of the query's "
        "attention over the grid (DINO, Caron et al. 2021, keep 60%).",
    )
    head_maps = maps[layer][:heads]  # (heads, gh, gw)
    masks = top_mass_mask(head_maps, float(mass)).numpy()  # (heads, gh, gw) bool
    kept = np.where(masks, head_maps, np.nan)  # outside the mask: the plain image
    counts = masks.reshape(heads, -1).sum(1)
    cells = gh * gw
    unit = "patches" if tuple(geometry.grid_size) == tuple(spec.grid_size) else "cells"  # a stage grid's are cells
    mass_cols = min(heads, 6)
    mass_lo, mass_hi, mass_range = colour_range(cur.map_range, head_maps, everything, uniform=uniform, inside=inside)
    input_image = resources.forward(*cur.args).input_image  # (H, W, 3) uint8, shared read-only
    dimmed = [masked_image(input_image, np.where(mask, 1.0, OUTSIDE_MASK_BRIGHTNESS), "nearest") for mask in masks]
    show_chart(
        plots.map_panels(
            dimmed,
            spec.img_size,
            list(kept),
            geometry.stride,
            [f"head {h} · {counts[h]} of {cells} {unit}" for h in range(heads)],
            ncols=mass_cols,
            opacity=min(1.0, opacity + 0.2),
            colorscale=cur.colorscale,
            zmin=mass_lo,
            zmax=mass_hi,
            colorbar_title=f"attention probability ({mass_range})",
            panel_height=240 if mass_cols >= 4 else 360,
            query_patches=[query_cell] * heads,
        ),
        "mass_panels",
        filename=f"attention_top_mass_L{layer}",
        on_select=patch_click("mass_panels", [geometry.grid_size] * heads, spec.grid_size),
    )
    st.caption(
        f"Coloured: the cells holding {mass:.0%} of each head's attention (inside the query's window where the "
        f"layer has windows); outside them the image is dimmed to {OUTSIDE_MASK_BRIGHTNESS:.0%} brightness. "
        "A head that needs few cells attends sharply."
    )
    download_npz(
        "mass_data",
        f"attention_top_mass_L{layer}",
        masks=masks,
        attention=head_maps,
        mass=float(mass),
        layer=layer,
        query=str(library_query),
        cells_kept=counts,
    )
