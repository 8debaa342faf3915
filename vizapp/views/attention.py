"""Attention: one head's (or the mean) attention for one query, over the image."""

from __future__ import annotations

import numpy as np
import streamlit as st

from analysis import masked_image, top_mass_mask
from analysis.plots import UNIFORM_FLOOR, colour_range, layer_scaled
from vizapp import figures, limits, resources
from vizapp.attention_view import attention_view, follow_view, hold_for_first_paint, layer_bytes, sent_layers, served
from vizapp.python_snippet import Source, attention_code, show_code
from vizapp.state import current
from vizapp.ui import (
    clamp_state,
    describe_query,
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

# Settings kept across page switches (vizapp.page_keys; vizapp.state.keep_page_state).
KEPT_KEYS = ("layer", "opacity", "thumb_scale", "dino_show", "dino_mass")
# Widget keys deliberately not kept (a chart's selection, a one-shot control).
TRANSIENT_KEYS = ("attn_view",)

cur = current()
if not cur.spec.attends_globally:  # Swin, SAM: per-layer grids, windows and heads (vizapp.windowed_attention)
    from vizapp.windowed_attention import render

    render(cur)
else:  # a ViT: one grid for every layer
    spec = cur.spec
    L, H = spec.num_layers, spec.num_heads
    uniform = 1 / spec.num_tokens  # the attention every key gets under uniform attention
    OUTSIDE_MASK_BRIGHTNESS = 0.3  # top-mass panels: the image outside a head's mask, dimmed

    def on_tile_click() -> None:
        """A click on a thumbnail opens that (layer, head) large."""
        point = selected_point("attn_grid")
        index = point_index(point) if point else None
        if index is not None and 0 <= index < L * (H + 1):
            layer, column = divmod(index, H + 1)
            st.session_state["layer"] = layer
            st.session_state["head"] = "mean" if column == H else column

    st.header("Attention", divider="gray")
    st.caption(
        "Attention probabilities of one query token over the patch tokens, drawn over exactly the "
        "pixels the model saw ("
        + (
            "bilinearly upsampled from the patch centres; hover shows each patch's value"
            if cur.smooth
            else "one heatmap cell per patch"
        )
        + "). Click the image to query a patch."
    )

    left, right = st.columns([3, 2], gap="medium")
    with right:
        st.session_state.setdefault("layer", L - 1)
        clamp_state("layer", (0, L - 1), L - 1)
        if L > 1:
            layer = st.slider("Layer (block index)", 0, L - 1, step=1, key="layer")
        else:
            layer = 0
        head = head_control(spec)
        query = query_controls(spec)
        st.session_state.setdefault("opacity", 0.6)
        opacity = st.slider("Overlay opacity", 0.0, 1.0, step=0.05, key="opacity")

    maps = resources.attention_grid(*cur.args, query)  # (L, heads + 1, gh, gw); [:, heads] = mean
    column = H if head == "mean" else int(head)
    shown = maps[layer, column]
    query_text = describe_query(query, spec)
    outliers = cur.outliers  # the Tokens page's high-norm outlier tokens (any layer)
    lo, hi, range_text = colour_range(cur.map_range, cur.shown(shown), maps, uniform=uniform, left_out=outliers)

    with left:
        view_layers = sent_layers(spec, layer)
        held = hold_for_first_paint(view_layers is not None)  # a session's first open: the view draws first
        if held:  # ... from this layer's data alone (ViT-B/16: 1 of 12.5 MB); every layer follows with the charts
            view_layers = (layer,)
        if view_layers is not None:
            attention_view(
                data=served(*resources.attention_view_blob(*cur.args, view_layers), key="attn_view"),
                image_uri=resources.background_uri(*cur.args),
                spec=spec,
                layer=layer,
                head=head,
                query=query,
                colorscale=cur.colorscale,
                map_range=cur.map_range,
                opacity=opacity,
                key="attn_view",
                on_change=follow_view("attn_view", patches=spec.num_patches, layers=L, heads=H),
                report_drawn=held,
                note="" if held else None,
                left_out=outliers,
                hide_left_out=cur.hide_outliers,
            )
            st.caption(
                "Instant view: hover a patch to see its attention (drawn in the browser, one cell per patch, "
                "values to one 255th of each map's range); with the pointer over it, ←/→ step the head and ↑/↓ "
                "the layer (the page follows); click to make the patch the query. The same map as a chart, with "
                "hover values and downloads:"
            )
        else:
            st.caption(
                f"The instant hover view is off for this model: one layer's attention for every query is "
                f"{layer_bytes(spec) / 2**20:.0f} MiB, over the {limits.MAX_VIEW_BYTES / 2**20:.0f} MiB the page "
                "may hold (VIZAPP_VIEW_MB). Click the chart to pick a query."
            )
        outlier_notice(cur, shown, "this map")
        figure = figures.attention_overlay(
            resources.background_uri(*cur.args),
            spec.img_size,
            cur.shown(shown),
            spec.patch_size,
            opacity=opacity,
            colorscale=cur.colorscale,
            zmin=lo,
            zmax=hi,
            colorbar_title=f"attention probability ({range_text})",
            title=f"Layer {layer} · {head_label(head)} · query: {query_text}",
            query_patch=query if isinstance(query, int) else None,
            upsampled=cur.upsampled(cur.shown(shown)),
            chart_width=figures.column_width(3 / 5),
            uniform=uniform,
        )
        if held:
            st.caption("The chart follows as soon as the view above has drawn.")
        else:
            show_chart(
                figure,
                "attn_overlay",
                filename=f"attention_L{layer}_{head}",
                on_select=patch_click("attn_overlay", [spec.grid_size], spec.grid_size),
            )
        download_npz(
            "attn_overlay_data",
            f"attention_L{layer}_{head}",
            attention=shown,
            layer=layer,
            head=-1 if head == "mean" else int(head),
            query=str(query),
            patch_size=spec.patch_size,
            image_size_hw=spec.img_size,
        )
        if not held:
            show_code(attention_code(Source.of(cur), layer=layer, head=head, query=query))

    with right:
        if not held:
            predictions_panel(cur)

    pooling = resources.pooling_attention(*cur.args)  # (heads + 1, gh, gw) or None
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
        pool_lo, pool_hi, pool_range = colour_range(cur.map_range, pooling[pool_column], pooling, uniform=uniform)
        show_chart(
            figures.attention_overlay(
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
                uniform=uniform,
            ),
            "pool_overlay",
            filename="attention_pooling_head",
        )
        download_npz("pool_data", "attention_pooling_head", attention=pooling[:pool_heads], mean_over_heads=pooling[-1])

    st.subheader(f"All layers × heads · query: {query_text}")
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
    drawn_maps = cur.shown(maps)
    tiles = drawn_maps.reshape(L * (H + 1), *spec.grid_size)
    if scale == "layer":  # heads compare within a layer; a near-uniform layer stays pale
        tiles = layer_scaled(drawn_maps, uniform=uniform, robust=robust, left_out=outliers)[0].reshape(
            L * (H + 1), *spec.grid_size
        )
    thumbnail_titles = {
        "layer": f"attention / its layer's top (uniform 1/T = {uniform:.2g}{'; clipped at 1' if robust else ''})",
        "each": "attention / map max",
        "shared": "attention weight (probability)",
    }
    grid = figures.mosaic(
        tiles,
        H + 1,
        tile_names=[f"layer {lyr}, {head_label('mean' if h == H else h)}" for lyr in range(L) for h in range(H + 1)],
        colorscale=cur.colorscale,
        normalize_each=scale == "each",
        zmin=0.0 if scale == "layer" else None,
        zmax=1.0 if scale == "layer" else None,
        colorbar_title=thumbnail_titles[scale],
        x_title="head",
        y_title="layer",
        col_labels=[*map(str, range(H)), "mean"],
        row_labels=[str(i) for i in range(L)],
        highlight=layer * (H + 1) + column,
    )
    st.caption("Click a thumbnail to open it above. The last column is the mean over heads.")
    if not held:
        show_chart(grid, "attn_grid", filename="attention_layers_x_heads", on_select=on_tile_click)
    download_npz(
        "attn_grid_data",
        "attention_layers_x_heads",
        attention=maps[:, :H],
        mean_over_heads=maps[:, H],
        query=str(query),
        layers=list(range(L)),
    )

    st.subheader(f"Top attention mass per head · layer {layer} · query: {query_text}")
    if (
        st.toggle(
            "Show each head's top-mass patches (DINO)",
            key="dino_show",
            help="Per head, the fewest patches that hold a chosen share of the query's attention.",
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
            help="Per head, the fewest patches whose attention adds up to this fraction of the query's "
            "attention over the patches (DINO, Caron et al. 2021, keep 60%).",
        )
        head_maps = maps[layer, :H]  # (heads, gh, gw)
        masks = top_mass_mask(head_maps, float(mass)).numpy()  # (heads, gh, gw) bool
        kept = np.where(masks, head_maps, np.nan)  # outside the mask: the plain image
        counts = masks.reshape(H, -1).sum(1)
        n_patches = spec.num_patches
        mass_cols = min(H, 6)
        mass_lo, mass_hi, mass_range = colour_range(cur.map_range, head_maps, maps, uniform=uniform)
        input_image = resources.forward(*cur.args).input_image  # (H, W, 3) uint8, shared read-only
        dimmed = [masked_image(input_image, np.where(mask, 1.0, OUTSIDE_MASK_BRIGHTNESS), "nearest") for mask in masks]
        show_chart(
            figures.map_panels(
                dimmed,
                spec.img_size,
                list(kept),
                spec.patch_size,
                [f"head {h} · {counts[h]} of {n_patches} patches" for h in range(H)],
                ncols=mass_cols,
                opacity=min(1.0, opacity + 0.2),
                colorscale=cur.colorscale,
                zmin=mass_lo,
                zmax=mass_hi,
                colorbar_title=f"attention probability ({mass_range})",
                panel_height=240 if mass_cols >= 4 else 360,
                query_patches=[query if isinstance(query, int) else None] * H,
            ),
            "mass_panels",
            filename=f"attention_top_mass_L{layer}",
            on_select=patch_click("mass_panels", [spec.grid_size] * H, spec.grid_size),
        )
        st.caption(
            f"Coloured: the patches holding {mass:.0%} of each head's attention; outside them the image is dimmed "
            f"to {OUTSIDE_MASK_BRIGHTNESS:.0%} brightness. "
            "A head that needs few patches attends sharply."
        )
        download_npz(
            "mass_data",
            f"attention_top_mass_L{layer}",
            masks=masks,
            attention=head_maps,
            mass=float(mass),
            layer=layer,
            query=str(query),
            patches_kept=counts,
        )
