"""The Attention page for windowed models (Swin v1/v2, SAM).

Each layer's map is drawn on that layer's own grid (cells of its stride in input pixels),
with the query's window outlined: a query attends only inside its window, and the map is 0
everywhere else (:func:`analysis.attention_map`). A stage picker chooses among grids when
layers differ (Swin's patch merging), the layer slider then moves within the stage, and the
layers × heads thumbnails come one mosaic per stage (heads differ per stage).

The query is a cell of the finest grid, handed to the library as the pixel at its centre
(:mod:`vizapp.windowed`), so one click means the same place in the image on every stage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import streamlit as st

from analysis import masked_image, top_mass_mask
from analysis.plots import UNIFORM_FLOOR, colour_range, layer_scaled
from analysis.records.queries import query_for_layers
from analysis.views.attention_view import windowed_view_bytes
from vizapp import figures, limits, resources, ui
from vizapp.attention_view import follow_view, served, windowed_attention_view
from vizapp.python_snippet import Source, attention_code, show_code
from vizapp.ui import clamp_state, head_label, point_index, query_controls, selected_point, show_chart
from vizapp.windowed import (
    layer_cell_to_query_patch,
    stage_label,
    stage_layers,
    window_members,
    window_rectangles,
    window_shapes,
)

# Settings kept across page switches (vizapp.page_keys; vizapp.state.keep_page_state).
KEPT_KEYS = ("layer", "attn_stage", "head", "opacity", "thumb_scale", "dino_show", "dino_mass")

if TYPE_CHECKING:  # for an annotation only
    from vizapp.state import Current

__all__ = ["render"]

OUTSIDE_MASK_BRIGHTNESS = 0.3


def _layer_controls(spec) -> tuple[int, int]:
    """The stage picker (when layers differ in grid) and the layer slider within the stage:
    ``(stage, layer)``. Keys ``attn_stage`` and ``layer`` (a model layer index)."""
    stages = stage_layers(spec)
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
        st.caption(f"Layer {layer} (the only layer of this stage).")
    return stage, int(layer)


def _head_control(heads: int) -> str | int:
    options = ["mean", *range(heads)]
    clamp_state("head", options, "mean")
    return st.selectbox(
        "Head",
        options,
        format_func=head_label,
        key="head",
        help="Heads differ per stage: the choice is reset to the mean when a stage has fewer.",
    )


def _tile_click(chart_key: str, layers: list[int], heads: int):
    """A click on a stage's thumbnail opens that (layer, head) large."""

    def on_click() -> None:
        point = selected_point(chart_key)
        index = point_index(point) if point else None
        if index is None or not 0 <= index < len(layers) * (heads + 1):
            return
        row, column = divmod(index, heads + 1)
        st.session_state["layer"] = layers[row]
        st.session_state["attn_stage"] = st.session_state.get("_attn_stage_of", {}).get(layers[row], 0)
        st.session_state["head"] = "mean" if column == heads else column

    return on_click


def _overlay_click(chart_key: str, spec, geometry):
    """A click on the map: the clicked cell of this layer's grid becomes the query."""

    def on_click() -> None:
        point = selected_point(chart_key)
        index = point_index(point) if point else None
        gh, gw = geometry.grid_size
        if index is None or not 0 <= index < gh * gw:
            return
        st.session_state["query_mode"] = "patch"
        st.session_state["query_patch"] = layer_cell_to_query_patch(spec, geometry, index)

    return on_click


def _describe(query: str | int, spec, geometry) -> str:
    if isinstance(query, str):
        return "mean over all cells"
    y, x = spec.patch_centre(query)
    r, c = divmod(geometry.cell_of_pixel(y, x), geometry.grid_size[1])
    return f"pixel (y {y}, x {x}) · cell (row {r}, col {c})"


def render(cur: Current) -> None:
    spec = cur.spec
    stages = stage_layers(spec)
    st.session_state["_attn_stage_of"] = {layer: stage for stage, layers in stages.items() for layer in layers}

    st.header("Attention", divider="gray")
    st.caption(
        f"A windowed model ({spec.family}): each layer attends inside windows of its stage's grid, so a query's "
        "map lives on that layer's grid (cells of its stride in input pixels) and is exactly 0 outside the "
        "query's window (dashed outline; with Swin's cyclic shift a window wraps around the image border and is "
        "drawn in pieces, and pairs from different sides of the wrap are masked to 0). Click the image to query "
        "the cell under the cursor."
    )
    left, right = st.columns([3, 2], gap="medium")
    with right:
        stage, layer = _layer_controls(spec)
        geometry = spec.geometry(layer)
        heads = geometry.num_heads
        head = _head_control(heads)
        query = query_controls(spec)
        st.session_state.setdefault("opacity", 0.6)
        opacity = st.slider("Overlay opacity", 0.0, 1.0, step=0.05, key="opacity")

    library_query = query_for_layers(spec, query)
    maps = resources.layer_attention_grids(*cur.args, library_query)  # per layer (heads_l + 1, gh_l, gw_l)
    column = heads if head == "mean" else int(head)
    shown = maps[layer][column]
    uniform = geometry.uniform_attention(mean_query=isinstance(query, str))  # a windowed model's str: the mean
    everything = np.concatenate([m.ravel() for m in maps])
    query_text = _describe(query, spec, geometry)
    query_cell = None if isinstance(query, str) else geometry.cell_of_pixel(*spec.patch_centre(query))
    inside = None  # the query's window: the only cells drawn, and the only ones a robust range counts
    if query_cell is not None:
        inside = np.zeros(geometry.grid_size, bool)
        inside.flat[window_members(geometry, query_cell)] = True
    lo, hi, range_text = colour_range(cur.map_range, shown, everything, uniform=uniform, inside=inside)

    with left:
        if windowed_view_bytes(geometry) <= limits.MAX_VIEW_BYTES:
            windowed_attention_view(
                data=served(*resources.windowed_view_blob(*cur.args, layer), key="attn_view"),
                image_uri=resources.background_uri(*cur.args),
                spec=spec,
                layer=layer,
                head=head,
                query_cell=query_cell,
                colorscale=cur.colorscale,
                map_range=cur.map_range,
                opacity=opacity,
                key="attn_view",
                on_change=follow_view(
                    "attn_view",
                    patches=geometry.grid_size[0] * geometry.grid_size[1],
                    heads=heads,
                    to_query=lambda cell: layer_cell_to_query_patch(spec, geometry, cell),
                ),
            )
            st.caption(
                "Instant view: hover a cell to see its attention inside its window (drawn in the browser; "
                "outside the window nothing is drawn: the attention there is 0); with the pointer over it, "
                "←/→ step the head (the Head box follows); click to make the cell the query. The same map as "
                "a chart, with hover values and downloads:"
            )
        else:
            st.caption(
                f"The instant hover view is off for this layer: its windows' attention is "
                f"{windowed_view_bytes(geometry) / 2**20:.0f} MiB, over the {limits.MAX_VIEW_BYTES / 2**20:.0f} MiB "
                "the page may hold (VIZAPP_VIEW_MB). Click the chart to pick a query."
            )
        figure = figures.attention_overlay(
            resources.background_uri(*cur.args),
            spec.img_size,
            shown,
            geometry.stride,
            opacity=opacity,
            colorscale=cur.colorscale,
            zmin=lo,
            zmax=hi,
            colorbar_title=f"attention probability ({range_text})",
            title=f"Layer {layer} (stage {stage}) · {head_label(head)} · query: {query_text}",
            query_patch=query_cell,
            upsampled=cur.upsampled(shown),
            chart_width=figures.column_width(3 / 5),
            uniform=uniform,
        )
        if query_cell is not None:
            for shape in window_shapes(window_rectangles(geometry, query_cell)):
                figure.add_shape(**shape)
        show_chart(
            figure,
            "attn_overlay",
            filename=f"attention_L{layer}_{head}",
            on_select=_overlay_click("attn_overlay", spec, geometry),
        )
        (gh, gw), (sy, sx), (wh, ww) = geometry.grid_size, geometry.stride, geometry.window_size
        st.caption(
            f"Layer {layer}: {gw}×{gh} cells of {sx}×{sy} px, "
            + (
                "one global window"
                if geometry.is_global
                else f"{geometry.num_windows} windows of {ww}×{wh} cells, shift {geometry.shift[1]}×{geometry.shift[0]}"
            )
            + (
                f"; under uniform attention the mean over every query gives each of the {gh * gw} cells {uniform:.2g} "
                f"(each is a key of its own window's {geometry.window_tokens} queries only)."
                if isinstance(query, str)
                else f"; uniform attention inside a window gives each of its {geometry.window_tokens} slots "
                f"{uniform:.2g}."
            )
        )
        ui.download_npz(
            "attn_overlay_data",
            f"attention_L{layer}_{head}",
            attention=shown,
            layer=layer,
            head=-1 if head == "mean" else int(head),
            query=str(library_query),
            stride=geometry.stride,
            image_size_hw=spec.img_size,
        )
        show_code(attention_code(Source.of(cur), layer=layer, head=head, query=library_query, view=False))

    with right:
        ui.predictions_panel(cur)

    _thumbnails(cur, maps, stages, layer, column, query_text, mean_query=isinstance(query, str))
    _top_mass(cur, maps[layer][:heads], geometry, layer, query_cell, opacity, everything, uniform, query_text)


THUMBNAIL_SCALES = {
    "layer": f"one scale per layer (its maximum, at least {UNIFORM_FLOOR:g}× uniform)",
    "each": "each map to its own maximum",
    "shared": "one shared scale",
}


def _thumbnails(cur, maps, stages, layer, column, query_text, *, mean_query: bool) -> None:
    spec = cur.spec
    st.subheader(f"All layers × heads, per stage · query: {query_text}")
    clamp_state("thumb_scale", list(THUMBNAIL_SCALES), "layer")
    scale = st.radio(
        "Thumbnail colour scale",
        list(THUMBNAIL_SCALES),
        horizontal=True,
        key="thumb_scale",
        format_func=THUMBNAIL_SCALES.get,
    )
    assert scale is not None, "a widget with options and no index=None always has a value"
    shared_top = max(float(np.nanmax(m)) for m in maps)
    for stage, layers in stages.items():
        geometry = spec.geometry(layers[0])
        heads = geometry.num_heads
        stacked = np.stack([maps[lyr] for lyr in layers])  # (layers, heads + 1, gh, gw)
        tiles = stacked.reshape(-1, *geometry.grid_size)
        if scale == "layer":  # each layer by its own top, at least UNIFORM_FLOOR× its own uniform level
            tiles = np.concatenate(
                [
                    layer_scaled(maps[lyr][None], uniform=spec.geometry(lyr).uniform_attention(mean_query=mean_query))[
                        0
                    ][0]
                    for lyr in layers
                ]
            ).reshape(-1, *geometry.grid_size)
        titles = {
            "layer": "attention / its layer's top",
            "each": "attention / map max",
            "shared": "attention weight (probability)",
        }
        highlight = layers.index(layer) * (heads + 1) + column if layer in layers else None
        grid = figures.mosaic(
            tiles,
            heads + 1,
            tile_names=[
                f"layer {lyr}, {head_label('mean' if h == heads else h)}" for lyr in layers for h in range(heads + 1)
            ],
            colorscale=cur.colorscale,
            normalize_each=scale == "each",
            zmin=0.0 if scale in ("layer", "shared") else None,
            zmax=1.0 if scale == "layer" else (shared_top if scale == "shared" else None),
            colorbar_title=titles[scale],
            x_title="head",
            y_title="layer",
            col_labels=[*map(str, range(heads)), "mean"],
            row_labels=[str(lyr) for lyr in layers],
            highlight=highlight,
            title=stage_label(spec, stage) if len(stages) > 1 else None,
        )
        key = f"attn_grid_s{stage}"
        show_chart(
            grid, key, filename=f"attention_layers_x_heads_stage{stage}", on_select=_tile_click(key, layers, heads)
        )
        ui.download_npz(
            f"attn_grid_data_s{stage}",
            f"attention_layers_x_heads_stage{stage}",
            attention=stacked[:, :heads],
            mean_over_heads=stacked[:, heads],
            layers=layers,
            stride=geometry.stride,
        )
    st.caption(
        "Click a thumbnail to open it above. The last column of each stage is the mean over heads; "
        "every map is on its own layer's grid."
    )


def _top_mass(cur, head_maps, geometry, layer, query_cell, opacity, everything, uniform, query_text) -> None:
    spec = cur.spec
    st.subheader(f"Top attention mass per head · layer {layer} · query: {query_text}")
    if not st.toggle(
        "Show each head's top-mass cells (DINO)",
        key="dino_show",
        help="Per head, the fewest cells that hold a chosen share of the query's attention.",
    ):
        return
    st.session_state.setdefault("dino_mass", 0.6)
    mass = st.slider("Attention mass kept", 0.05, 1.0, step=0.05, key="dino_mass")
    heads = head_maps.shape[0]
    masks = top_mass_mask(head_maps, float(mass)).numpy()  # (heads, gh, gw) bool
    kept = np.where(masks, head_maps, np.nan)
    counts = masks.reshape(heads, -1).sum(1)
    lo, hi, range_text = colour_range(cur.map_range, head_maps, everything, uniform=uniform)
    input_image = resources.forward(*cur.args).input_image
    dimmed = [masked_image(input_image, np.where(m, 1.0, OUTSIDE_MASK_BRIGHTNESS), "nearest") for m in masks]
    cells = geometry.grid_size[0] * geometry.grid_size[1]
    columns = min(heads, 6)
    show_chart(
        figures.map_panels(
            dimmed,
            spec.img_size,
            list(kept),
            geometry.stride,
            [f"head {h} · {counts[h]} of {cells} cells" for h in range(heads)],
            ncols=columns,
            opacity=min(1.0, opacity + 0.2),
            colorscale=cur.colorscale,
            zmin=lo,
            zmax=hi,
            colorbar_title=f"attention probability ({range_text})",
            panel_height=240 if columns >= 4 else 360,
            query_patches=[query_cell] * heads,
        ),
        "mass_panels",
        filename=f"attention_top_mass_L{layer}",
    )
    st.caption(f"Coloured: the cells holding {mass:.0%} of each head's attention (all inside the query's window).")
