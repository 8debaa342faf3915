"""Inside the tokens: feature PCA as RGB, patch similarity (also into another image), token
norms with high-norm outliers, attention mass to prefix tokens and outliers, the logit lens."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from analysis import AnalysisError, ViTSpec, patch_similarity, plots, top_classes
from analysis.tokens import TOKEN_KINDS, capture_limits, logit_lens_layers
from analysis.tokens.stages import check_logit_lens_layer
from analysis.views.attention_view import view_layout
from vizapp import inputs, resources
from vizapp.attention_view import attention_view, follow_view, served
from vizapp.messages import error_text, escape_markdown
from vizapp.python_snippet import Source, show_code
from vizapp.refs import ImageRef
from vizapp.state import current
from vizapp.ui import clamp_state, describe_query, download_npz, patch_click, query_controls, refuse_page, show_chart
from vizapp.views.tokens import compute
from vizapp.views.tokens.recipe import tokens_code

UPLOAD = "__upload__"  # the correspondence picker's "upload an image" choice
KIND_LABELS = {"token": "block output", "query": "query", "key": "key", "value": "value"}

cur = current()
spec: ViTSpec = cur.spec
L = spec.num_layers

st.header("Tokens", divider="gray")
limits = capture_limits(spec)  # what this model's tokens lack, "" when nothing
st.caption(
    "What the tokens carry. Queries, keys and values are what each block's attention really compared "
    "(after q/k norm and, for RoPE models, after the rotation); the block output is the residual stream."
    + (f" {limits}" if limits else "")
)

left, right = st.columns([3, 2], gap="medium")
with right:
    st.session_state.setdefault("layer", L - 1)
    clamp_state("layer", (0, L - 1), L - 1)
    layer = st.slider("Layer (block index)", 0, L - 1, step=1, key="layer") if L > 1 else 0
    kind = st.radio("Features", TOKEN_KINDS, format_func=KIND_LABELS.get, horizontal=True, key="tok_kind")
    foreground = st.toggle(
        "Fit the PCA on the foreground only (DINOv2)",
        key="tok_foreground",
        help="A first PCA's first component splits the patches; the smaller side is refitted, the rest drawn black.",
    )
    query = query_controls(spec)

try:
    layer_tokens = resources.layer_tokens(*cur.args, kind, layer)  # (1, T, D)
    rgb, fitted = compute.token_pca(*cur.args, kind, layer, foreground)  # (gh, gw, 3), (gh, gw)
except AnalysisError as exc:  # e.g. not yet defined for windowed models (Swin, SAM): say why
    refuse_page(exc)
# the layer's own grid: a windowed model's stage grid (cells of its stride), a ViT's patch grid
layout = spec.geometry(layer)  # what feature_pca / patch_similarity read this layer's tokens with
grid = tuple(layout.grid_size)
(gh, gw), (ph, pw) = grid, tuple(layout.stride)
# the query patch (of spec.grid_size) is the layer's cell under that patch's centre (on a ViT, the patch)
layer_query = spec.layer_cell(layer, query) if isinstance(query, int) else query

with left:
    st.subheader(f"PCA of the {KIND_LABELS[kind]}s · layer {layer}")
    index = np.arange(gh * gw)
    xs, ys = plots.patch_centres(grid, (ph, pw))
    pca_figure = go.Figure(
        data=[
            dict(
                type="image",
                z=np.round(rgb * 255).astype(np.uint8),
                x0=pw / 2,
                dx=pw,
                y0=ph / 2,
                dy=ph,
                hoverinfo="skip",
                name="PCA",
            ),
            dict(
                type="scatter",
                x=xs,
                y=ys,
                mode="markers",
                marker=dict(color="rgba(0,0,0,0)", size=8),
                customdata=np.stack([index, np.zeros_like(index)], axis=1),
                showlegend=False,
                name="patches",
                hovertemplate="patch %{customdata[0]:.0f}<extra>click: similarity to this patch</extra>",
            ),
        ],
        layout=plots.styled_layout(
            height=420,
            margin=dict(l=10, r=10, t=10, b=10),
            hovermode="closest",
            hoverdistance=-1,
            clickmode="event+select",
            dragmode="pan",
            shapes=[
                dict(
                    type="rect",
                    x0=(layer_query % gw) * pw,
                    y0=(layer_query // gw) * ph,
                    x1=(layer_query % gw + 1) * pw,
                    y1=(layer_query // gw + 1) * ph,
                    line=dict(color=plots.HIGHLIGHT, width=2.5),
                )
            ]
            if isinstance(layer_query, int)
            else [],
            xaxis=dict(
                range=[0, spec.img_size[1]], constrain="domain", showgrid=False, title=dict(text="x (input px)")
            ),
            yaxis=dict(
                range=[spec.img_size[0], 0],
                scaleanchor="x",
                constrain="domain",
                showgrid=False,
                title=dict(text="y (input px)"),
            ),
        ),
    )
    show_chart(
        pca_figure, "tok_pca", filename=f"pca_{kind}_L{layer}", on_select=patch_click("tok_pca", [grid], spec.grid_size)
    )
    st.caption(
        "Red, green, blue: the first three principal components of this layer's patch features, each "
        "scaled to 0–1 over the fitted patches. Click a patch to see what resembles it."
    )
    download_npz("tok_pca_data", f"pca_{kind}_L{layer}", rgb=rgb, fitted=fitted, layer=layer)

# --------------------------------------------------------------------------- similarity
query_text = describe_query(query, spec)
similarity_query = layer_query if not (query == "cls" and not spec.has_class_token) else "mean"
similarity = patch_similarity(layer_tokens, layout, similarity_query).numpy()  # (gh, gw) on the layer's grid
st.subheader(f"Cosine similarity to the {query_text} · {KIND_LABELS[kind]}s, layer {layer}")
sim_left, sim_right = st.columns(2, gap="medium")
with sim_left:
    if (
        view_layout(spec) == "tokens"
    ):  # the instant view of one token grid: every token's similarity map, held in the page
        attention_view(
            data=served(*compute.similarity_view_blob(*cur.args, kind, layer), key="tok_view"),
            image_uri=resources.background_uri(*cur.args),
            spec=spec,
            layer=layer,
            head=0,
            query=similarity_query,
            colorscale=cur.colorscale,
            map_range=cur.map_range,
            opacity=0.7,
            key="tok_view",
            on_change=follow_view("tok_view", patches=spec.num_patches),
            heads=0,
            head_names=[f"{KIND_LABELS[kind]}s"],
            value_name="cosine similarity",
            report_layer=False,
            fixed_range=(-1.0, 1.0),
            columns=False,
            note="",
            max_height=420,
        )
        st.caption(
            "Instant view: hover a patch to see its similarity to every patch (drawn in the browser, "
            "−1 to 1, values to one 255th of each map's range); click to make it the query. The chart:"
        )
    show_chart(
        plots.attention_overlay(
            resources.background_uri(*cur.args),
            spec.img_size,
            similarity,
            (ph, pw),
            opacity=0.7,
            colorscale=cur.colorscale,
            zmin=-1.0,
            zmax=1.0,
            colorbar_title="cosine similarity (−1 to 1)",
            title="This image",
            query_patch=layer_query if isinstance(layer_query, int) else None,
            height=420,
            upsampled=cur.upsampled(similarity),
            chart_width=plots.column_width(1 / 2),
        ),
        "tok_similarity",
        filename=f"similarity_{kind}_L{layer}",
        on_select=patch_click("tok_similarity", [grid], spec.grid_size),
    )
with sim_right:
    samples = [p.name for p in inputs.sample_paths() if p.name != cur.image.name]
    other_name = st.selectbox(
        "Another image (correspondence)",
        ["none", UPLOAD, *samples],
        key="tok_other",
        format_func=lambda name: "upload an image…" if name == UPLOAD else name,
    )
    other_similarity = None
    other = None
    if other_name == UPLOAD:
        upload = st.file_uploader(
            "Second image", type=["jpg", "jpeg", "png", "webp", "bmp", "gif"], key="tok_other_upload"
        )
        if upload is not None:
            other = ImageRef.from_bytes(upload.name, upload.getvalue())
            try:
                inputs.decode_image(other.digest, other.data)
            except Exception as exc:  # noqa: BLE001 - ImageLoadError or anything PIL raised: shown, page goes on
                st.error(f"Could not read **{escape_markdown(upload.name)}**: {error_text(exc)}")
                other = None
    elif other_name != "none":
        other = ImageRef.from_bytes(other_name, inputs.read_sample(other_name))
    if other is not None:
        other_name = other.name
        other_args = (cur.model, other.digest, other.data)
        other_tokens = resources.layer_tokens(*other_args, kind, layer)
        other_similarity = patch_similarity(layer_tokens, layout, similarity_query, other=other_tokens).numpy()
        show_chart(
            plots.attention_overlay(
                resources.background_uri(*other_args),
                spec.img_size,
                other_similarity,
                (ph, pw),
                opacity=0.7,
                colorscale=cur.colorscale,
                zmin=-1.0,
                zmax=1.0,
                colorbar_title="cosine similarity (−1 to 1)",
                title=f"{other_name}: similarity to this image's {query_text}",
                height=420,
                upsampled=cur.upsampled(other_similarity),
                chart_width=plots.column_width(1 / 2),
            ),
            "tok_other_similarity",
            filename=f"correspondence_{kind}_L{layer}",
        )
download_npz(
    "tok_similarity_data",
    f"similarity_{kind}_L{layer}",
    similarity=similarity,
    **({"other_image_similarity": other_similarity} if other_similarity is not None else {}),
    query=str(similarity_query),
    layer=layer,
)

# --------------------------------------------------------------------------- norms and outliers
st.subheader("Token norms and high-norm outliers")


# The charts below do not depend on the query: built once per (model, image, layer, colours)
# and shared (cache_resource), so a click re-renders only the PCA outline and the similarity.
@st.cache_resource(show_spinner=False, max_entries=64)
def norm_figures(
    ref, digest: str, _image_bytes: bytes, layer: int, colorscale: str
) -> tuple[go.Figure, go.Figure, list[int]]:
    summary = compute.token_norms(ref, digest, _image_bytes)
    layer_norms = summary.patch_norms(layer)  # (N,) on the layer's grid
    found = summary.outliers(layer)
    overlay = plots.attention_overlay(
        resources.background_uri(ref, digest, _image_bytes),
        spec.img_size,
        layer_norms.reshape(gh, gw),
        (ph, pw),
        opacity=0.75,
        colorscale=colorscale,
        zmin=0.0,
        zmax=float(layer_norms.max()),
        colorbar_title="‖block output‖₂ (0–max)",
        title=f"Layer {layer}: {len(found)} outlier patch(es)",
        height=420,
        chart_width=plots.column_width(1 / 2),
    )
    for patch in found:
        r, c = divmod(patch, gw)
        overlay.add_shape(
            type="rect",
            x0=c * pw,
            y0=r * ph,
            x1=(c + 1) * pw,
            y1=(r + 1) * ph,
            line=dict(color="#00e5ff", width=2.5, dash="dot"),
        )
    histogram = go.Figure(
        data=[dict(type="histogram", x=layer_norms, nbinsx=40, marker=dict(color="#3b528b"), name="patch tokens")],
        layout=plots.styled_layout(
            height=420,
            margin=dict(l=10, r=10, t=40, b=10),
            bargap=0.05,
            title=dict(text=f"Patch-token norms, layer {layer}", font=dict(size=14)),
            xaxis=dict(title=dict(text="‖block output‖₂")),
            yaxis=dict(title=dict(text="patches")),
        ),
    )
    threshold = float(summary.thresholds[layer])
    if np.isfinite(threshold):
        histogram.add_vline(
            x=threshold,
            line=dict(color="#e16462", dash="dash"),
            annotation_text=f"threshold {threshold:.3g}",
            annotation_position="top right",
        )
    return overlay, histogram, found


@st.cache_resource(show_spinner=False, max_entries=64)
def mass_figure(ref, digest: str, _image_bytes: bytes, name: str, colorscale: str) -> go.Figure:
    summary = compute.token_norms(ref, digest, _image_bytes)
    value = summary.prefix_mass if name == "prefix tokens" else summary.outlier_mass
    return go.Figure(
        data=[
            dict(
                type="heatmap",
                z=value,
                zmin=0,
                zmax=1,
                colorscale=plots.colour_stops(colorscale),
                colorbar=dict(title=dict(text="mass (0–1)", side="right")),
                hovertemplate="layer %{y}, head %{x}<br>mass %{z:.3f}<extra></extra>",
            )
        ],
        layout=plots.styled_layout(
            height=360,
            margin=dict(l=10, r=10, t=40, b=10),
            title=dict(text=f"To the {name}", font=dict(size=14)),
            xaxis=dict(title=dict(text="head"), dtick=1),
            yaxis=dict(title=dict(text="layer"), dtick=1),
        ),
    )


@st.cache_resource(show_spinner=False, max_entries=64)
def lens_figures(ref, digest: str, _image_bytes: bytes, layer: int) -> tuple[go.Figure, go.Figure]:
    lens = compute.logit_lens_probabilities(ref, digest, _image_bytes)  # (L', classes): rows of lens_layers
    names = get_names(lens.shape[1])
    final = int(lens[-1].argmax())
    curve = go.Figure(
        data=[
            dict(
                type="scatter",
                x=list(lens_layers),
                y=lens[:, final],
                mode="lines+markers",
                line=dict(color="#21918c"),
                name=names[final],
                hovertemplate="layer %{x}<br>p = %{y:.3f}<extra></extra>",
            )
        ],
        layout=plots.styled_layout(
            height=340,
            margin=dict(l=10, r=10, t=40, b=10),
            title=dict(text=f"Probability of the final class ({names[final]}) per layer", font=dict(size=14)),
            xaxis=dict(title=dict(text="layer"), dtick=1),
            yaxis=dict(title=dict(text="probability"), range=[0, 1.02]),
        ),
    )
    if layer not in lens_layers:
        return curve, None
    row = lens_layers.index(layer)
    order = top_classes(lens[row], 5)
    return curve, plots.predictions_bar([names[i] for i in order], lens[row, order])


lens_layers = list(logit_lens_layers(spec))  # every layer of a ViT; a windowed model's last stage


def get_names(classes: int) -> list[str]:
    return cur.vit.class_names or [f"class {i}" for i in range(classes)]


summary = compute.token_norms(*cur.args)
norm_overlay, histogram, found = norm_figures(*cur.args, layer, cur.colorscale)
norm_left, norm_right = st.columns(2, gap="medium")
with norm_left:
    show_chart(norm_overlay, "tok_norms", filename=f"token_norms_L{layer}")
with norm_right:
    show_chart(histogram, "tok_norm_hist", filename=f"token_norm_histogram_L{layer}")
first = summary.first_layer
st.caption(
    "Outliers: per layer, the largest gap in log-norm among the top 10% of patch tokens, when the norms across "
    f"it differ at least 2× (no fixed threshold). First layer with outliers: {first if first is not None else 'none'}; "
    f"fraction per layer: {', '.join(f'{f:.1%}' for f in summary.fraction.tolist())}." + summary.grid_note
)
download_npz("tok_norm_data", "token_norms", **summary.arrays)  # stacked, or one array per layer's grid

st.subheader("Attention mass to prefix tokens and to outliers")
panels = [
    (name, value)
    for name, value in (("prefix tokens", summary.prefix_mass), ("outlier patches", summary.outlier_mass))
    if value is not None
]
if panels:
    columns = st.columns(len(panels), gap="medium")
    for column, (name, _value) in zip(columns, panels):
        with column:
            show_chart(
                mass_figure(*cur.args, name, cur.colorscale),
                f"tok_mass_{name.split()[0]}",
                filename=f"attention_mass_{name.replace(' ', '_')}",
            )
    st.caption("Mean over the patch queries of the attention they give to these keys (1 = all of it).")
    download_npz("tok_mass_data", "attention_mass", **{name.replace(" ", "_"): value for name, value in panels})
else:
    st.caption(summary.mass_note)

# --------------------------------------------------------------------------- logit lens
st.subheader("Logit lens")
if not spec.has_classifier:
    st.caption("No class head: the logit lens reads each layer through the classifier, which this model lacks.")
else:
    try:
        curve, top5 = lens_figures(*cur.args, layer)
    except AnalysisError as exc:  # a readout the library does not know: its reason, and the page goes on
        st.info(error_text(exc), icon=":material/block:")
        curve = top5 = None
if spec.has_classifier and curve is not None:
    lens_left, lens_right = st.columns(2, gap="medium")
    with lens_left:
        show_chart(curve, "tok_lens", filename="logit_lens")
    with lens_right:
        if top5 is None:  # a windowed model's earlier stage: the library's reason
            try:
                check_logit_lens_layer(spec, layer)
            except AnalysisError as exc:
                st.info(error_text(exc), icon=":material/block:")
        else:
            show_chart(top5, "tok_lens_top5", filename=f"logit_lens_top5_L{layer}")
            st.caption(f"Top-5 when layer {layer}'s output is read by the model's own final norm and head.")
    lens = compute.logit_lens_probabilities(*cur.args)
    download_npz(
        "tok_lens_data",
        "logit_lens",
        probabilities=lens,
        layers=np.array(lens_layers),
        class_names=np.array(get_names(lens.shape[1])),
    )
show_code(
    tokens_code(
        Source.of(cur),
        kind=kind,
        layer=layer,
        foreground=foreground,
        query=similarity_query,
        other=other,
    )
)
