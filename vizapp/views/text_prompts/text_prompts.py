"""Text prompts: where in the image does a text match, and why? Zero-shot scores of
typed prompts, one map per prompt and method, the score decomposed over layers and heads, the
deletion and insertion curves of the score, and what each head writes (TextSpan).

Two-tower models are not classifiers of the sidebar: the page picks its own image–text model (the
bundled demo CLIP, or a Hugging Face CLIP / SigLIP) and uses the sidebar's image. Every number is
:mod:`analysis.text`'s, on the model's own score ``s = exp(t)·cos(u, v) + b``.
"""

from __future__ import annotations

import numpy as np
import streamlit as st

import analysis
from analysis import AnalysisError, NoTextTowerError, plots, scale_by_peak
from analysis.demo.data import CLASS_NAMES
from analysis.faithfulness import area_under_curve
from analysis.model.loading.loaded import PROBABILITY_RULES
from analysis.plots.circuits import DIVERGING, symmetric_limit
from analysis.text import TEXT_METHODS, prompts_from_template
from vizapp import inputs
from vizapp.messages import error_text, escape_markdown, toy_model_note
from vizapp.python_snippet import show_code
from vizapp.state import current
from vizapp.ui import (
    PageRefused,
    clamp_state,
    download_csv,
    download_npz,
    point_customdata,
    selected_point,
    show_chart,
)
from vizapp.views.text_prompts import compute
from vizapp.views.text_prompts.recipe import text_prompts_code

SOURCES = {"demo": "the bundled demo CLIP", "other": "a Hugging Face CLIP or SigLIP (hf:org/name or a folder)"}
MODES = {"prompts": "prompts, one a line", "classes": "class names and a template"}
METHOD_LABELS = {
    "chefer": "Chefer et al. 2021b",
    "legrad": "LeGrad",
    "gradcam": "Grad-CAM of the score",
    "patch_text": "patch–text cosine",
    "decomposition": "decomposition (all heads)",
    "attnlrp": "AttnLRP (Achtibat et al. 2024)",
}
DEFAULT_METHODS = ["chefer", "legrad", "patch_text"]
MAX_MAPPED = 4  # prompts drawn as maps at once (rows of the grid)
STEPS = 16  # deletion / insertion steps
HEAD = "tp_head"  # session key: the decomposition's chosen head, "layer:head"
HEAD_CLICKS = "tp_head_clicks"  # clicks on the heatmap so far (its key changes per click: a fresh selection)
SETS = {"samples": "the bundled samples", "mine": "images I upload"}
REMAINDER_LABELS = {
    "embedding": "embeddings (patch, class and position; what reaches the output directly)",
    "mlps": "MLPs (every block's, directly)",
    "head_bias": "attention output biases",
    "constant": "the readout's shifts (final norms' β, projection bias)",
    "pool_mlp": "the pooling head's MLP branch (SigLIP; not split over the parts)",
    "logit_bias": "the logit bias b (SigLIP; 0 for CLIP)",
}

cur = current()
st.header("Text prompts", divider="gray")
st.caption(
    "Where in the image does a text match, and why? A two-tower image–text model (CLIP, SigLIP) scores the "
    "image against each prompt with its own rule, s = exp(t)·cos(u, v) + b (u the image embedding, v the "
    "prompt's, exp(t) the learned scale, b SigLIP's bias). Below: zero-shot probabilities, one map per prompt and "
    "method, the score written as a sum over layers and heads, its deletion and insertion curves, and what each "
    "head writes (TextSpan)."
)

clamp_state("tp_source", list(SOURCES), "demo")
choice = st.radio(
    "Image–text model",
    list(SOURCES),
    format_func=SOURCES.get,
    key="tp_source",
    horizontal=True,
    help="The page has its own model: a two-tower model scores images against text, which the "
    "sidebar's classifiers do not. The image is the sidebar's.",
)
source = compute.DEMO_CLIP
if choice == "other":
    source = st.text_input(
        "CLIP or SigLIP",
        key="tp_other",
        placeholder="hf:openai/clip-vit-base-patch32",
        help="hf:org/name (local cache, else the hub) or a save_pretrained folder of a "
        "CLIPModel or SiglipModel on the server (with its tokenizer).",
    ).strip()
    if not source:
        st.info("Type a Hugging Face CLIP or SigLIP, e.g. `hf:openai/clip-vit-base-patch32`, or pick the demo CLIP.")
        raise PageRefused("no image-text model named")
try:
    clip = compute.get_clip(source)
except NoTextTowerError as exc:  # an image-only model: the library says what to load instead
    st.error(error_text(exc), icon=":material/block:")
    st.caption(
        "It still opens on the other pages as an image model (pick it in the sidebar). Pick the demo CLIP "
        "above to try text prompts offline."
    )
    raise PageRefused(str(exc)) from exc
except Exception as exc:  # noqa: BLE001 - any load failure is shown; the rest of the app keeps working
    st.error(f"Could not load **{escape_markdown(source)}**: {error_text(exc)}", icon=":material/error:")
    raise PageRefused(str(exc)) from exc

spec = clip.spec
demo = source == compute.DEMO_CLIP
if demo and not inputs.is_demo_scene(cur.image):
    st.warning(
        toy_model_note(
            "CLIP",
            "For a real one choose *a Hugging Face CLIP or SigLIP* above, e.g. `hf:openai/clip-vit-base-patch32`.",
        ),
        icon=":material/warning:",
    )
image_args = (source, cur.image.digest, cur.image.data)
bias = "" if clip.logit_bias is None else f", b = {clip.logit_bias:.4g}"
st.caption(
    f"**{escape_markdown(clip.name)}**: input {spec.img_size[1]}×{spec.img_size[0]} px (the image through "
    f"the model's own preprocessing), patch grid {spec.grid_size[1]}×{spec.grid_size[0]}, {spec.num_layers} "
    f"layers × {spec.num_heads} heads; text tower reads at most {clip.context_length} tokens; "
    f"exp(t) = {clip.logit_scale:.4g}{bias}. Image: *{escape_markdown(cur.image.name)}*."
)

# --------------------------------------------------------------------------- prompts and zero-shot

st.session_state.setdefault(
    "tp_prompts", "\n".join(f"a {name}" for name in CLASS_NAMES) if demo else "a photo of a dog\na photo of a cat"
)
st.session_state.setdefault("tp_template", "a {}" if demo else "a photo of a {}")
st.session_state.setdefault("tp_classes", ", ".join(CLASS_NAMES) if demo else "dog, cat, car")
entry, scores_column = st.columns([2, 3], gap="medium")
with entry:
    clamp_state("tp_mode", list(MODES), "prompts")
    mode = st.radio("Prompts as", list(MODES), format_func=MODES.get, key="tp_mode", horizontal=True)
    prompts: list[str] = []
    try:
        if mode == "prompts":
            typed = st.text_area(
                "Prompts (one a line)",
                key="tp_prompts",
                height=170,
                help="Each line is one prompt; blank lines are skipped (and said so). Ctrl+Enter applies.",
            )
            lines = typed.splitlines()
            prompts = [line.strip() for line in lines if line.strip()]
            blank = sum(1 for line in lines if not line.strip())
            if blank and prompts:
                st.caption(f"{blank} blank line{'s' if blank != 1 else ''} skipped.")
            if not prompts:  # the library's own message for no prompt
                compute.text_zero_shot(*image_args, ())
        else:
            template = st.text_input(
                "Template", key="tp_template", help="One {} where each class name goes, e.g. 'a photo of a {}'."
            )
            classes = st.text_input("Class names (comma-separated)", key="tp_classes")
            prompts = prompts_from_template(template, classes.replace("\n", ",").split(","))
        zero_shot = compute.text_zero_shot(*image_args, tuple(prompts))
    except AnalysisError as exc:  # TextPromptError (an empty prompt, a bad template): typed, never silence
        st.error(error_text(exc), icon=":material/error:")
        raise PageRefused(str(exc)) from exc
    for notice in zero_shot.notices:  # a prompt over the text tower's length: truncated, and said so
        st.warning(escape_markdown(notice), icon=":material/content_cut:")

probabilities = zero_shot.probabilities[0].numpy()  # (P,)
logits = zero_shot.logits[0].numpy()  # (P,)
rule = zero_shot.rule
rule_text = (
    "softmax over the prompts: they sum to 100%, so each is relative to the others typed"
    if rule == "softmax"
    else "a sigmoid per prompt: each is its own yes/no, they need not sum to 100% (SigLIP's training loss)"
)
with scores_column:
    show_chart(
        plots.predictions_bar(prompts, probabilities, x_title=f"zero-shot probability (%): {PROBABILITY_RULES[rule]}"),
        "tp_zero_shot",
        filename="text_zero_shot",
    )
    st.caption(
        f"What the model computes: the score s of each prompt ({', '.join(f'{s:.3g}' for s in logits)}), "
        f"then a {rule_text}."
    )
    download_npz(
        "tp_scores_data",
        "text_zero_shot",
        prompts=np.asarray(prompts),
        logits=logits,
        probabilities=probabilities,
        rule=np.array(rule),
        model=np.array(source),
    )

# --------------------------------------------------------------------------- maps

st.subheader("Where does each prompt match?")
controls = st.columns([3, 2], gap="medium")
with controls[0]:
    st.session_state.setdefault("tp_methods", list(DEFAULT_METHODS))
    st.session_state["tp_methods"] = [m for m in st.session_state["tp_methods"] if m in TEXT_METHODS]
    methods = st.multiselect(
        "Methods",
        list(TEXT_METHODS),
        format_func=METHOD_LABELS.get,
        key="tp_methods",
        max_selections=5,
        help="Each map explains the image's score s with one prompt.",
    )
with controls[1]:
    kept = [p for p in st.session_state.get("tp_mapped", []) if p in prompts]
    ranked = [prompts[i] for i in analysis.top_classes(logits)]  # the best-matching prompts first
    st.session_state["tp_mapped"] = kept or ranked[:2]
    mapped = st.multiselect(
        "Prompts to map",
        prompts,
        key="tp_mapped",
        max_selections=MAX_MAPPED,
        help=f"Up to {MAX_MAPPED}; one row each. At first, the two best-scoring prompts.",
    )
if not methods or not mapped:
    st.info("Choose at least one method and one prompt to map.", icon=":material/info:")
    raise PageRefused("nothing to map")

refused: dict[str, str] = {}
raw: dict[tuple[str, str], np.ndarray] = {}
for prompt in mapped:
    for method in methods:
        if method in refused:
            continue
        try:
            raw[prompt, method] = compute.text_map(*image_args, prompt, method)[0]
        except AnalysisError as exc:  # not defined for this model: the library's reason
            refused[method] = error_text(exc)
for method, reason in refused.items():
    st.info(f"**{METHOD_LABELS[method]}**: {reason}", icon=":material/block:")
methods = [m for m in methods if m not in refused]
if not methods:
    raise PageRefused("no method defined for this model")
maps = np.stack([np.stack([raw[p, m] for m in methods]) for p in mapped])  # (prompts, methods, gh, gw)
scaled = scale_by_peak(maps, negative="zero")  # each map by its own peak |value|
index_of = {p: i for i, p in enumerate(prompts)}
titles = [f"{METHOD_LABELS[m]} · {p} ({probabilities[index_of[p]]:.0%})" for p in mapped for m in methods]
background = compute.clip_background_uri(*image_args)
ncols = len(methods)
show_chart(
    plots.map_panels(
        background,
        spec.img_size,
        list(scaled.reshape(-1, *spec.grid_size)),
        spec.patch_size,
        titles,
        ncols=ncols,
        opacity=0.65,
        colorscale=cur.colorscale,
        zmin=0.0,
        zmax=1.0,
        colorbar_title="map / its max |value| (negative → 0)",
        panel_height=320 if ncols <= 2 else 260,
        upsampled=[
            analysis.upsample_map(m, tuple(spec.img_size), cur.map_cells) for m in scaled.reshape(-1, *spec.grid_size)
        ]
        if cur.smooth
        else None,
    ),
    "tp_maps",
    filename="text_maps",
)
st.caption(
    "Rows: prompts; columns: methods. Each map is divided by its own largest |value|, so all share one 0–1 colour "
    "scale (the shape of each map compares, not its size); negative values (the cosine of patch–text, the signed "
    "decomposition and AttnLRP) are drawn as 0 and kept, signed and unscaled, in the download."
)
download_npz(
    "tp_maps_data",
    "text_maps",
    maps=maps,
    scaled=scaled,
    prompts=np.asarray(mapped),
    methods=np.asarray(methods),
    model=np.array(source),
)

# --------------------------------------------------------------------------- decomposition

st.subheader("Which heads make the score?")
clamp_state("tp_focus", prompts, mapped[0])
st.session_state.setdefault("tp_focus", mapped[0])
focus = st.selectbox("Prompt to decompose (and to score below)", prompts, key="tp_focus")
try:
    parts = compute.text_decomposition(*image_args, focus)
except AnalysisError as exc:  # e.g. heads that do not separate: the library's reason; the sections above stay
    st.info(error_text(exc), icon=":material/block:")
    raise PageRefused(str(exc)) from exc
heads = parts["heads"]  # (L, heads)
cells = [f"{layer}:{head}" for layer in range(heads.shape[0]) for head in range(heads.shape[1])]
strongest = np.unravel_index(int(np.argmax(np.abs(heads))), heads.shape)
clamp_state(HEAD, cells, f"{strongest[0]}:{strongest[1]}")
st.session_state.setdefault(HEAD, f"{strongest[0]}:{strongest[1]}")
layer, head = (int(v) for v in st.session_state[HEAD].split(":"))
heatmap_key = f"tp_heads_{st.session_state.get(HEAD_CLICKS, 0)}"


def choose_head() -> None:
    """A click on the heatmap: that cell becomes the shown head."""
    point = selected_point(heatmap_key)
    custom = point_customdata(point) if point else None
    if custom is not None and len(custom) >= 2:
        cell = f"{int(round(float(custom[0])))}:{int(round(float(custom[1])))}"
        if cell in cells:
            st.session_state[HEAD] = cell
            st.session_state[HEAD_CLICKS] = st.session_state.get(HEAD_CLICKS, 0) + 1


heat_column, head_column = st.columns([3, 2], gap="medium")
with heat_column:
    show_chart(
        plots.head_heatmap(
            heads, title=f"contributions to s('{focus}')", colorbar_title="score units", selected=(layer, head)
        ),
        heatmap_key,
        filename="text_head_contributions",
        on_select=choose_head,
    )
with head_column:

    def cell_label(cell: str) -> str:
        row, column = (int(v) for v in cell.split(":"))
        return f"layer {row}, head {column} ({heads[row, column]:+.3g})"

    layer, head = (
        int(v) for v in st.selectbox("Head (or click the heatmap)", cells, key=HEAD, format_func=cell_label).split(":")
    )
    head_map = parts["head_maps"][layer, head]  # (gh, gw), score units
    limit = symmetric_limit(head_map)
    show_chart(
        plots.map_panels(
            background,
            spec.img_size,
            [head_map],
            spec.patch_size,
            [f"layer {layer}, head {head}"],
            ncols=1,
            opacity=0.7,
            colorscale=DIVERGING,
            zmin=-limit,
            zmax=limit,
            colorbar_title=f"score units (±{limit:.3g})",
            panel_height=300,
            chart_width=plots.column_width(2 / 5),
        ),
        "tp_head_map",
        filename=f"text_head_L{layer}H{head}",
    )
    st.caption(
        f"Head {head} of layer {layer}: its term ({heads[layer, head]:+.4g}) split over the patches it "
        f"attended to; blue lowers the score, red raises it (±{limit:.3g}, the map's largest |value|)."
        + (
            f" Its share read from the {spec.num_prefix_tokens} prefix token(s) "
            f"({', '.join(spec.token_names[: spec.num_prefix_tokens])}) is not drawn."
            if spec.num_prefix_tokens
            else ""
        )
    )
remainder = parts["remainder"]
terms = "".join(
    f" {'−' if value < 0 else '+'} {abs(value):.4g} ({REMAINDER_LABELS.get(name, name)})"
    for name, value in remainder.items()
)
st.markdown(
    f"s('{escape_markdown(focus)}') = **{parts['score']:.4g}** = {heads.sum():.4g} (the {heads.size} heads "
    f"above){escape_markdown(terms)} = {parts['total']:.4g}."
)
st.caption(
    "Each head's direct contribution through the final norm and projection, with the norm's scale and ‖u‖ "
    "frozen at this image's values (Gandelsman et al. 2024): the heads and the named remainder terms sum to "
    "the model's score (to float32 rounding). Diverging colours: ±the largest |contribution|."
)
download_npz(
    "tp_decomposition_data",
    "text_decomposition",
    heads=heads,
    head_maps=parts["head_maps"],
    head_map=head_map,
    layer=np.array(layer),
    head=np.array(head),
    score=np.array(parts["score"]),
    total=np.array(parts["total"]),
    remainder_names=np.asarray(list(remainder)),
    remainder_values=np.asarray(list(remainder.values())),
    prompt=np.array(focus),
    model=np.array(source),
)

# --------------------------------------------------------------------------- deletion and insertion

st.subheader(f"Deletion and insertion · s('{focus}')")
clamp_state("tp_curve_method", list(TEXT_METHODS), "chefer")
curve_method = st.selectbox(
    "Map to test", [m for m in TEXT_METHODS if m not in refused], format_func=METHOD_LABELS.get, key="tp_curve_method"
)
curves, rows, curve_data = [], [], {}
for name in ["random", curve_method]:
    try:
        result = compute.text_curves(*image_args, focus, name, STEPS)
    except AnalysisError as exc:  # the map is not defined for this model: the library's reason
        st.info(f"No curves for **{METHOD_LABELS.get(name, name)}**: {error_text(exc)}", icon=":material/block:")
        raise PageRefused(str(exc)) from exc
    fractions, deletion, insertion = result["fractions"], result["deletion"], result["insertion"]
    aucs = area_under_curve(fractions, deletion), area_under_curve(fractions, insertion)
    label = "random" if name == "random" else METHOD_LABELS[name]
    curves.append((label, fractions, deletion, insertion, *aucs))
    rows.extend([label, float(f), float(d), float(i)] for f, d, i in zip(fractions, deletion, insertion))
    prefix = "random_" if name == "random" else ""
    curve_data.update(
        {
            f"{prefix}deletion": deletion,
            f"{prefix}insertion": insertion,
            f"{prefix}deletion_auc": np.array(aucs[0]),
            f"{prefix}insertion_auc": np.array(aucs[1]),
        }
    )
    curve_data["fractions"] = fractions
show_chart(
    plots.perturbation_curves(curves, y_title="image–text score s", symbol="s"),
    "tp_curves",
    filename="text_deletion_insertion",
)
st.caption(
    "The score s of the image with the prompt as the patches the map ranks first are replaced by the mean colour "
    "(deletion) or restored onto a mean-colour image (insertion), in 16 steps; the AUCs are in the legend (units of "
    "the score × fraction, so they compare methods on this model only). A faithful map beats the random one "
    "(dashed, seed 0): lower deletion AUC, higher insertion AUC. Over many scenes: "
    "`python -m analysis.faithfulness --model demo_clip`."
)
download_csv("tp_curves_csv", "text_deletion_insertion", ["map", "fraction", "deletion_s", "insertion_s"], rows)
download_npz(
    "tp_curves_data", "text_deletion_insertion", method=np.array(curve_method), prompt=np.array(focus), **curve_data
)
show_code(
    text_prompts_code(
        source,
        cur.image,
        prompts=prompts,
        mapped=mapped,
        methods=methods,
        focus=focus,
        layer=layer,
        head=head,
        curve_method=curve_method,
        steps=STEPS,
    )
)

# --------------------------------------------------------------------------- head descriptions

st.subheader("What does each head write? (TextSpan)")
st.caption(
    "For each head, the descriptions of the bundled vocabulary (analysis/text/vocabulary.txt) whose text "
    "directions explain most of the variance of the head's direct contribution over an image set, greedily "
    "(Gandelsman et al. 2024, Algorithm 1), with the share of the variance each explains."
)
set_column, count_column = st.columns([3, 1], vertical_alignment="bottom")
with set_column:
    clamp_state("tp_set", list(SETS), "samples")
    which = st.radio("Image set", list(SETS), format_func=SETS.get, key="tp_set", horizontal=True)
with count_column:
    st.session_state.setdefault("tp_texts_per_head", 3)
    per_head = int(st.number_input("Texts per head", 1, 10, key="tp_texts_per_head"))
images, problems = inputs.image_set(which, "tp_files", scenes=choice == "demo")
digests = tuple(i.digest for i in images)
stored = compute.stored_head_texts(source, digests, per_head)
if stored is None and st.button(
    f"Describe the heads over {len(images)} images",
    key="tp_describe",
    disabled=len(images) < 2,
    icon=":material/text_fields:",
):
    bar = st.progress(0.0, text=f"Reading the heads: 0 / {len(images)} images")
    try:
        stored = compute.compute_head_texts(
            source,
            digests,
            tuple(i.data for i in images),
            per_head,
            progress=lambda done, total: bar.progress(done / total, text=f"Reading the heads: {done} / {total} images"),
        )
    except AnalysisError as exc:
        st.error(error_text(exc), icon=":material/error:")
    finally:
        bar.empty()
if stored is not None:
    described, skipped = stored
    problems += [f"{images[index].name}: {reason} (skipped)" for index, reason in skipped]
    table = [
        {
            "layer": d.layer,
            "head": d.head,
            "texts (share of the head's variance)": " · ".join(
                f"{text} ({share:.0%})" for text, share in zip(d.texts, d.shares)
            ),
            "explained": round(d.explained, 3),
            "variance": float(f"{d.variance:.4g}"),
        }
        for d in described.heads
    ]
    st.dataframe(table, hide_index=True, width="stretch")
    st.caption(
        f"Over {described.images} images and {described.vocabulary_size} descriptions. A head that barely "
        "varies (small variance) has little to describe, whatever its shares."
    )
    for notice in described.notices:
        st.warning(escape_markdown(notice), icon=":material/content_cut:")
    download_csv(
        "tp_head_texts_csv",
        "text_head_descriptions",
        ["layer", "head", "rank", "text", "share", "variance"],
        [
            [d.layer, d.head, rank, text, float(share), float(d.variance)]
            for d in described.heads
            for rank, (text, share) in enumerate(zip(d.texts, d.shares))
        ],
    )
elif len(images) < 2:
    st.info("Head descriptions need at least 2 images (a variance over images).", icon=":material/info:")
for problem in problems:
    st.warning(escape_markdown(problem))
