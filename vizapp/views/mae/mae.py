"""Masked autoencoder (MAE, He et al. 2022, Figure 2): hide patches, see what the model
reconstructs, edit the mask patch by patch, the loss against the mask ratio over the bundled
samples, and the encoder's attention over the patches it was shown.

MAE models are not classifiers of the sidebar: the page picks its own masked autoencoder (the
bundled demo MAE, or a Hugging Face ``ViTMAEForPreTraining``) and uses the sidebar's image.
"""

from __future__ import annotations

import numpy as np
import streamlit as st

import analysis
from analysis import plots
from analysis.base.errors import MissingDecoderError
from analysis.mae import FIGURE_2_PANELS, draw_mask, figure_2_images, flip_patches, hidden_patch_loss
from analysis.mae.loading import MAE_WITH_DECODER
from vizapp import inputs
from vizapp.image_sets import over_image_set
from vizapp.messages import error_text, escape_markdown, toy_model_note
from vizapp.python_snippet import show_code
from vizapp.refs import ImageRef
from vizapp.state import current
from vizapp.ui import (
    PageRefused,
    clamp_state,
    download_npz,
    download_png,
    head_label,
    point_index,
    selected_point,
    show_chart,
)
from vizapp.views.mae import compute
from vizapp.views.mae.recipe import mae_code

SOURCES = {"demo": "the bundled demo MAE", "hf": "a Hugging Face ViTMAEForPreTraining (hf:org/name or a folder)"}
SET_RATIOS = (0.1, 0.25, 0.5, 0.75, 0.9)
FLIPPED = "mae_flipped"  # session key: the patches the user's clicks switched (hidden <-> visible), sorted
FLIPPED_GRID = "mae_flipped_grid"  # the grid those indices belong to
QUERY = "mae_query"  # session key: the attention's query patch (None: the class token)
SIDEBAR_SEEN = "_mae_sidebar_seen"  # session key: the sidebar model the page saw last
# session keys: clicks so far on the Figure 2 panels and on the attention map (each chart's key changes with
# every click, so plotly's selection starts empty and a second click on the same patch counts)
CLICKS = "mae_clicks"
QUERY_CLICKS = "mae_query_clicks"

cur = current()
st.header("Masked autoencoder", divider="gray")
st.caption(
    "MAE (He et al. 2022) hides most patches, encodes only the visible ones and reconstructs the rest. "
    "Original, masked input, reconstruction, and the reconstruction with the visible patches pasted back "
    "(the paper's Figure 2); click patches to hide or reveal them yourself, e.g. hide the whole object."
)

sidebar_source = cur.model.source  # an MAE in the sidebar (a timm .mae encoder, an hf: MAE) is offered too
sources = dict(SOURCES)
if "mae" in sidebar_source.lower():
    sources = {"sidebar": f"the sidebar's model ({escape_markdown(cur.model.label)})", **SOURCES}
    if st.session_state.get(SIDEBAR_SEEN) != sidebar_source:  # a new MAE in the sidebar: show it first
        st.session_state["mae_source"] = "sidebar"
st.session_state[SIDEBAR_SEEN] = sidebar_source
clamp_state("mae_source", list(sources), "demo")
choice = st.radio(
    "Masked autoencoder",
    list(sources),
    format_func=sources.get,
    key="mae_source",
    horizontal=True,
    help="The page has its own model: MAEs reconstruct, they do not classify. The image is the sidebar's.",
)
source = "demo_mae"
if choice == "sidebar":
    source = sidebar_source
elif choice == "hf":
    source = st.text_input(
        "ViTMAEForPreTraining",
        key="mae_other",
        placeholder=MAE_WITH_DECODER,
        help="hf:org/name (local cache, else the hub) or a save_pretrained folder on the server. "
        "A timm .mae model is an encoder alone: it has no decoder.",
    ).strip()
    if not source:
        st.info(f"Type a Hugging Face ViTMAEForPreTraining, e.g. `{MAE_WITH_DECODER}`, or pick the demo MAE.")
        raise PageRefused("no MAE named")
try:
    mae = compute.get_mae(source)
except MissingDecoderError as exc:  # an encoder alone: the library says where to get the decoder
    st.info(error_text(exc), icon=":material/block:")
    if choice == "sidebar":
        st.caption(
            "It still opens on the other pages as a headless ViT (its attention). Pick the demo MAE above to "
            "see a reconstruction offline."
        )
    raise PageRefused(str(exc)) from exc
except Exception as exc:  # noqa: BLE001 - any load failure is shown; the rest of the app keeps working
    st.error(f"Could not load **{escape_markdown(source)}**: {error_text(exc)}", icon=":material/error:")
    raise PageRefused(str(exc)) from exc

if source == "demo_mae" and not inputs.is_demo_scene(cur.image):
    st.warning(
        toy_model_note(
            "MAE", f"For a real one choose *a Hugging Face ViTMAEForPreTraining* above, e.g. `{MAE_WITH_DECODER}`."
        ),
        icon=":material/warning:",
    )
spec = mae.spec
grid = tuple(spec.grid_size)
num_patches = spec.num_patches
if tuple(st.session_state.get(FLIPPED_GRID) or grid) != grid:  # another model: the clicks meant other patches
    st.session_state[FLIPPED] = []
st.session_state[FLIPPED_GRID] = grid
flipped = sorted(int(i) for i in st.session_state.get(FLIPPED, []) if 0 <= int(i) < num_patches)


def reset_clicks() -> None:
    st.session_state[FLIPPED] = []


ratio_column, seed_column, reset_column = st.columns([3, 1, 1], vertical_alignment="bottom")
with ratio_column:
    st.session_state.setdefault("mae_ratio", 0.75)
    ratio = st.slider(
        "Mask ratio (share of patches hidden by MAE's random draw)",
        0.0,
        0.95,
        step=0.05,
        key="mae_ratio",
        help=f"The model was trained at {mae.config_mask_ratio:g}. MAE keeps the "
        "first int(N·(1 − ratio)) patches of a seeded random order.",
    )
with seed_column:
    seed = int(
        st.number_input(
            "Seed",
            0,
            2**31 - 1,
            step=1,
            key="mae_seed",
            help="The random order of the patches (the same seed hides a superset at a higher ratio).",
        )
    )
with reset_column:
    st.button(
        "Reset my clicks", key="mae_reset", on_click=reset_clicks, disabled=not flipped, icon=":material/restart_alt:"
    )

drawn = draw_mask(1, num_patches, float(ratio), seed)[0]  # (N,) True = hidden
mask = flip_patches(drawn, flipped)  # (N,)
try:
    result = compute.mae_pass(source, cur.image.digest, cur.image.data, tuple(bool(v) for v in mask.tolist()))
except analysis.AnalysisError as exc:  # e.g. every patch hidden: what a reconstruction needs
    st.error(error_text(exc) + " Reveal a patch (click it) or reset your clicks.", icon=":material/error:")
    raise PageRefused(str(exc)) from exc

preprocessing = mae.preprocessing
pictures = figure_2_images(result, preprocessing)  # name -> (H, W, 3) float32, image units
hidden = result.mask[0].numpy()  # (N,)
hidden_count = int(hidden.sum())


def clicked_patch(chart_key: str) -> int | None:
    """The patch under a chart's click (its click targets are row-major: the point index is the
    patch, also in ``customdata[0]``), or None."""
    point = selected_point(chart_key)
    patch = point_index(point) if point else None
    return patch if patch is not None and 0 <= patch < num_patches else None


def toggle_patch(chart_key: str) -> None:
    """A click on a Figure 2 panel: switch that patch between hidden and visible."""
    patch = clicked_patch(chart_key)
    if patch is None:
        return
    clicked = set(st.session_state.get(FLIPPED, []))
    clicked ^= {patch}
    st.session_state[FLIPPED] = sorted(clicked)
    st.session_state[CLICKS] = st.session_state.get(CLICKS, 0) + 1


clicks = st.session_state.get(CLICKS, 0)
panels_key = f"mae_panels_{clicks}"
show_chart(
    plots.mae_panels(
        [pictures[name] for name in FIGURE_2_PANELS],
        list(FIGURE_2_PANELS.values()),
        grid,
        spec.patch_size,
        hidden,
        outline=flipped,
    ),
    panels_key,
    filename="mae_figure_2",
    on_select=lambda: toggle_patch(panels_key),
)
loss_units = (
    "each patch normalised by its own mean and variance (norm_pix_loss)"
    if result.norm_pix_loss
    else "the model's normalised input units, (x − mean) / std"
)
clipped = plots.clipped_fraction(pictures["reconstruction"])
st.markdown(
    f"**{hidden_count} of {num_patches}** patches hidden ({hidden_count / num_patches:.0%}; the draw hides "
    f"{int(drawn.sum())}, your clicks switched {len(flipped)}, outlined) · "
    + (
        f"reconstruction loss **{float(result.loss):.4g}** (mean squared error over the hidden patches, in "
        f"{loss_units})"
        if hidden_count
        else "nothing hidden, so no loss: raise the ratio or click patches to hide them"
    )
)
st.caption(
    "All four pictures on one scale: RGB in 0..1, the model's normalisation undone (x·std + mean), drawn as "
    f"round(255·x); values outside 0..1 are clipped ({clipped:.1%} of the reconstruction's values). Hidden patches "
    "are grey in the masked input; the composite is the reconstruction with the visible patches pasted back. "
    "Click any panel to hide or reveal the patch under the cursor."
)
with st.container(horizontal=True):
    for name, title in FIGURE_2_PANELS.items():
        download_png(f"mae_png_{name}", f"mae_{name}", plots.unit_to_uint8(pictures[name]), label=f"{title} (.png)")

error_column, attention_column = st.columns(2, gap="medium")
with error_column:
    st.subheader("Per-patch error")
    error = hidden_patch_loss(result)  # (gh, gw), NaN on visible patches
    top = float(np.nanmax(error)) if np.isfinite(error).any() else 1.0
    show_chart(
        plots.mae_patch_map(
            pictures["composite"],
            error,
            spec.patch_size,
            hidden,
            zmin=0.0,
            zmax=top,
            colorscale=cur.colorscale,
            colorbar_title=f"squared error (0 to max {top:.3g})",
            chart_width=plots.column_width(1 / 2),
        ),
        "mae_error",
        filename="mae_patch_error",
    )
    st.caption(
        f"Each hidden patch's mean squared error against the target (0 to the largest, {top:.3g}; in "
        f"{loss_units}), over the composite; visible patches are blank (they are not in the loss)."
    )

with attention_column:
    st.subheader("Attention over the visible patches")
    record = result.attention
    last = spec.num_layers - 1
    clamp_state("mae_layer", (0, last), last)
    st.session_state.setdefault("mae_layer", last)
    layer = int(st.slider("Encoder layer", 0, last, key="mae_layer")) if last > 0 else 0
    heads = ["mean", *range(spec.num_heads)]
    clamp_state("mae_head", heads, "mean")
    head = st.selectbox("Head", heads, format_func=head_label, key="mae_head")
    query = st.session_state.get(QUERY)
    note = None
    if query is not None and (not 0 <= int(query) < num_patches or hidden[int(query)]):
        note = f"patch {query} is hidden now, so it is no query: showing the class token's attention."
        query = None
    attention = record.key_grid(
        layer, None if query is None else int(query), head=None if head == "mean" else int(head)
    ).numpy()  # (gh, gw), NaN hidden
    peak = float(np.nanmax(attention))

    attention_key = f"mae_attention_{st.session_state.get(QUERY_CLICKS, 0)}"  # new per click: a fresh selection

    def choose_query() -> None:
        patch = clicked_patch(attention_key)
        if patch is not None:
            st.session_state[QUERY] = patch
            st.session_state[QUERY_CLICKS] = st.session_state.get(QUERY_CLICKS, 0) + 1

    def class_token_query() -> None:
        st.session_state[QUERY] = None
        st.session_state[QUERY_CLICKS] = st.session_state.get(QUERY_CLICKS, 0) + 1

    who = "the class token" if query is None else f"patch {query} (row {query // grid[1]}, col {query % grid[1]})"
    show_chart(
        plots.mae_patch_map(
            pictures["masked"],
            attention,
            spec.patch_size,
            hidden,
            zmin=0.0,
            zmax=peak,
            colorscale=cur.colorscale,
            colorbar_title=f"attention probability (0 to max {peak:.3g})",
            outline=query,
            click_hint="click a visible patch: make it the query",
            title=f"query: {who}",
            chart_width=plots.column_width(1 / 2),
        ),
        attention_key,
        filename="mae_visible_attention",
        on_select=choose_query,
    )
    if note:
        st.caption(note)
    st.button("Class token as the query", key="mae_cls_query", disabled=query is None, on_click=class_token_query)
    st.caption(
        f"Layer {layer}, {head_label(head)}: the attention of {who} over the {len(record.visible_patches[0])} "
        f"visible patches (0 to its largest, {peak:.3g}; attention to the class token not drawn). The encoder "
        "never saw the hidden patches: they are grey and empty."
    )

download_npz(
    "mae_data",
    f"mae_{cur.image.name.rsplit('.', 1)[0]}",
    **pictures,
    mask=hidden.reshape(grid),
    drawn_mask=drawn.numpy().reshape(grid),
    flipped=np.asarray(flipped, dtype=np.int64),
    patch_loss_hidden=error,
    loss=np.array(float(result.loss)),
    mask_ratio=np.array(float(ratio)),
    seed=np.array(seed),
    attention=attention,
    attention_layer=np.array(layer),
    attention_query=np.array(-1 if query is None else int(query)),
    attention_head=np.array(str(head)),
    model=np.array(source),
)

st.subheader("Loss against mask ratio over the bundled samples")
sample_paths = inputs.sample_paths()
samples = [ImageRef.from_bytes(p.name, inputs.read_sample(p.name)) for p in sample_paths]
st.session_state.setdefault("mae_curves", True)
curve = bool(samples) and st.toggle(
    "Measure the curve", key="mae_curves", help="One reconstruction per image and ratio."
)
if curve:
    problems: list[str] = []

    def piece(chunk, start):
        losses, skipped = compute.mae_loss_chunk(
            source, tuple(i.digest for i in chunk), tuple(i.data for i in chunk), SET_RATIOS, seed, start
        )
        left_out = {index for index, _ in skipped}
        return (losses, [image.name for index, image in enumerate(chunk) if index not in left_out]), skipped

    pieces = over_image_set(samples, "Reconstructing", piece, problems)
    losses = np.concatenate([p[0] for p in pieces]) if pieces else np.zeros((0, len(SET_RATIOS)))
    names = [name for p in pieces for name in p[1]]
    show_chart(
        plots.mae_loss_by_ratio(
            SET_RATIOS,
            losses,
            names,
            y_title="reconstruction loss (MSE on hidden patches)",
            current_ratio=float(ratio),
        ),
        "mae_curve",
        filename="mae_loss_by_ratio",
    )
    st.caption(
        f"Grey: each of the {len(names)} images; colour: their mean. Image i of the sample list is masked "
        f"from seed {seed} + i with MAE's draw at every ratio (a higher ratio hides a superset); dotted: this "
        f"page's ratio. Loss: mean squared error over the hidden patches, in {loss_units}."
    )
    for problem in problems:
        st.warning(escape_markdown(problem))
    download_npz(
        "mae_curve_data",
        "mae_loss_by_ratio",
        ratios=np.asarray(SET_RATIOS),
        losses=losses,
        images=np.asarray(names),
        seed=np.array(seed),
        model=np.array(source),
    )

show_code(
    mae_code(
        source,
        cur.image,
        ratio=float(ratio),
        seed=seed,
        flipped=flipped,
        layer=layer,
        head=head,
        query=None if query is None else int(query),
        image_set=sample_paths if curve else None,
        set_ratios=SET_RATIOS,
    )
)
