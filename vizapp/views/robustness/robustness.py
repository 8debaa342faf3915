"""Robustness: patch drop, patch shuffle, noise and blur on one image and over an image set,
the ViT beside a CNN, as in Naseer et al. 2021, "Intriguing Properties of Vision Transformers"."""

from __future__ import annotations

import numpy as np
import streamlit as st

import analysis
from analysis import IMAGENET_1K, label_space, plots, shared_label_space
from analysis.demo.data import CLASS_NAMES as DEMO_CLASS_NAMES
from analysis.model.loading import DEMO_MODELS
from analysis.model.windowed_support import is_model_refusal
from analysis.robustness import (
    IMAGENET_1K_CNNS,
    SET_LEVELS,
    check_token_drop,
    is_last_layer_attention,
    saliency_description,
    shuffle_grids,
)
from vizapp import first_result, inputs, resources
from vizapp.image_sets import over_image_set
from vizapp.messages import demo_scope_note, error_text, escape_markdown
from vizapp.python_snippet import Source, show_code
from vizapp.state import DEMO_SWIN, current
from vizapp.ui import (
    clamp_state,
    download_csv,
    download_npz,
    end_page,
    refuse_page,
    show_chart,
    stride_of_map,
)
from vizapp.views.robustness import compute
from vizapp.views.robustness.recipe import robustness_code
from vizapp.views.robustness.sections import attack_section, corruption_section, patch_section, texture_section

PERTURBATION_LABELS = {
    "token_drop": "drop tokens",
    "pixel_drop": "drop patches (pixels)",
    "shuffle": "shuffle patches",
    "noise": "Gaussian noise",
    "blur": "Gaussian blur",
}
SELECTIONS = {"random": "random (seeded)", "most_salient": "most salient first", "least_salient": "least salient first"}
MODEL_LABELS = ("the ViT", "the CNN")
SETS = {"samples": "bundled sample images", "mine": "my images (files or a .zip)"}
LEVEL_AXIS = {
    "token_drop": "fraction of patches dropped (ViT: tokens; CNN: pixels)",
    "pixel_drop": "fraction of patches dropped",
    "shuffle": "shuffle grid g (g × g blocks)",
    "noise": "noise σ (normalised units)",
    "blur": "blur σ (px)",
}

cur = current()
spec = cur.spec
vit = cur.vit

st.header("Robustness", divider="gray")
st.caption(
    "How the prediction and the attention change when patches are dropped or shuffled, or the image is "
    "blurred or noisy, beside a CNN (Naseer et al. 2021, “Intriguing Properties of Vision Transformers”). "
    "Token drop removes patch tokens after the position embedding (the paper's protocol; prefix tokens stay); "
    "pixel drop sets patches to the mean colour, for any model."
)
if not spec.has_classifier:
    st.info(
        "This model has no class head (an embedding tower or a headless backbone): there is no prediction "
        "to perturb. Pick a classifier in the sidebar.",
        icon=":material/info:",
    )
    end_page()

try:
    check_token_drop(vit)
    offered = list(PERTURBATION_LABELS)
    token_note = None
except analysis.AnalysisError as exc:
    offered = [p for p in PERTURBATION_LABELS if p != "token_drop"]
    token_note = str(exc)

controls, comparison = st.columns([3, 2], gap="medium")
with controls:
    clamp_state("rob_perturbation", offered, offered[0])
    perturbation = st.radio(
        "Perturbation", offered, format_func=PERTURBATION_LABELS.get, key="rob_perturbation", horizontal=True
    )
    if token_note:
        st.caption(f"Token drop is not offered: {token_note}")
    selection = "random"
    if perturbation in ("token_drop", "pixel_drop"):
        st.session_state.setdefault("rob_fraction", 0.5)
        level = st.slider("Fraction of patches dropped", 0.0, 1.0, step=0.05, key="rob_fraction")
        selection = st.radio(
            "Which patches",
            list(SELECTIONS),
            format_func=SELECTIONS.get,
            key="rob_selection",
            horizontal=True,
            help="Salient: by the clean image's class-token rollout (ViT; "
            "Swin, SAM: the first stage's rollout of the mean cell, on the patch grid) "
            "and Grad-CAM (CNN), each model by its own map.",
        )
    elif perturbation == "shuffle":
        grids = shuffle_grids(spec)
        clamp_state("rob_grid", grids, grids[min(1, len(grids) - 1)])
        level = st.select_slider(
            "Shuffle grid g (g × g blocks of whole patches)",
            grids,
            key="rob_grid",
            help=f"The grids that divide the {spec.grid_size[0]}×{spec.grid_size[1]} patch grid.",
        )
    elif perturbation == "noise":
        st.session_state.setdefault("rob_noise", 0.5)
        level = st.slider("Noise σ (normalised units)", 0.0, 2.0, step=0.05, key="rob_noise")
    else:
        st.session_state.setdefault("rob_blur", 1.0)
        level = st.slider("Blur σ (px)", 0.0, 8.0, step=0.25, key="rob_blur")
    seed = int(
        st.number_input(
            "Seed", 0, 2**31 - 1, step=1, key="rob_seed", help="Random drops and shuffles are reproducible by seed."
        )
    )


def cnn_choices() -> dict[str, str]:
    """The comparison CNNs offered: only those that predict the ViT's classes
    (``analysis.shared_label_space``), and a field for any other, checked once loaded."""
    choices = {"none": "none"}
    try:
        if shared_label_space(vit, resources.get_cnn("demo", True)):
            choices["demo"] = "the bundled demo CNN (the same shape classes)"
    except analysis.ModelLoadError:  # no bundled CNN in this installation
        pass
    space = label_space(vit)
    if space is not None and space.known == IMAGENET_1K:
        choices.update({name: f"{name} (timm, ImageNet-1k weights)" for name in IMAGENET_1K_CNNS})
    choices["other"] = "another timm CNN (a name or a folder)"
    return choices


with comparison:
    choices = cnn_choices()
    clamp_state("rob_cnn", list(choices), "none")
    st.session_state.setdefault(
        "rob_cnn", "demo" if "demo" in choices else "none"
    )  # no download before the first picture
    choice = st.selectbox(
        "Comparison CNN",
        list(choices),
        format_func=choices.get,
        key="rob_cnn",
        help="Only CNNs that predict the ViT's classes are offered: the predictions of models "
        "with different classes cannot be compared. The demo CNN was trained on the same "
        "scenes as the demo ViT; the ImageNet CNNs download their weights once.",
    )
    if len(choices) == 2:
        own = label_space(vit)
        st.caption(
            f"No offered CNN predicts the ViT's {escape_markdown(own.describe())}: name one under “another timm CNN”."
        )
    cnn_key = None
    if choice == "demo":
        cnn_key = ("demo", True)
    elif choice in IMAGENET_1K_CNNS:
        cnn_key = (choice, True)
    elif choice == "other":
        text = st.text_input(
            "timm CNN",
            key="rob_cnn_other",
            placeholder="resnet50.a1_in1k or random:resnet18",
            help="Any timm CNN, or a folder in timm's layout; weights from the local cache or the "
            "hub; random: for random weights. It must predict the ViT's classes.",
        ).strip()
        if text:
            cnn_key = (text.removeprefix("random:"), not text.startswith("random:"))
    cnn = None
    if cnn_key is not None:
        try:
            cnn = resources.get_cnn(*cnn_key)
        except Exception as exc:  # noqa: BLE001 - shown; the ViT's half of the page still works
            st.error(f"Could not load the CNN **{escape_markdown(cnn_key[0])}**: {error_text(exc)}")
    if cnn is not None:
        match = shared_label_space(vit, cnn, MODEL_LABELS)
        if not match:  # a message, never a comparison of predictions about different things
            st.info(
                f"{escape_markdown(match.reason)} The page compares two models only when they predict the "
                "same classes: pick a CNN with the ViT's classes.",
                icon=":material/compare_arrows:",
            )
            cnn = None
        else:
            st.caption(escape_markdown(match.reason))
    compared_cnn = cnn  # kept for the attack and corruption sections, whatever the perturbation
    if cnn is not None and perturbation == "token_drop":
        st.caption("A CNN has no tokens: it gets the same patches dropped as pixels.")
    if cnn is not None and perturbation == "shuffle" and int(level) not in shuffle_grids(cnn.spec):
        st.caption(
            f"The CNN's {cnn.spec.grid_size[0]}×{cnn.spec.grid_size[1]} drop grid has no {int(level)}×{int(level)} "
            "shuffle: it is left out here."
        )
        cnn = None

names = vit.class_names or [f"class {i}" for i in range(spec.num_outputs)]


def top5(probabilities: np.ndarray, class_names) -> tuple[list[str], np.ndarray]:
    order = analysis.top_classes(probabilities, 5)
    labels = [analysis.class_label(class_names, i) for i in order]
    return labels, probabilities[order]


def prediction_text(label: str, probabilities: np.ndarray, class_names) -> str:
    (name, *_), (probability, *_) = top5(probabilities, class_names)
    return f"**{label}:** {escape_markdown(name)} · {probability:.1%}"


def change_text(model: str, clean, perturbed) -> str:
    """Whether the prediction changed, and the clean class's probability before → after."""
    best = int(np.argmax(clean.probabilities))
    changed = int(np.argmax(perturbed.probabilities)) != best
    return (
        f"{model}: {'prediction changed' if changed else 'same prediction'}, "
        f"p(clean class) {clean.probabilities[best]:.1%} → {perturbed.probabilities[best]:.1%}"
    )


clean_level = 1 if perturbation == "shuffle" else 0.0  # g = 1 is no shuffle
try:
    before = compute.vit_probe(*cur.args, perturbation, clean_level, selection, seed)
    after = compute.vit_probe(*cur.args, perturbation, float(level), selection, seed)
except analysis.AnalysisError as exc:
    if is_model_refusal(exc, spec):  # e.g. not yet defined for windowed models (Swin, SAM): the reason, as information
        refuse_page(exc)
    st.error(error_text(exc))
    end_page()
cnn_before = cnn_after = None
if cnn is not None:
    try:
        args = (*cnn_key, cur.image.digest, cur.image.data, perturbation)
        cnn_before = compute.cnn_probe(*args, clean_level, selection, seed)
        cnn_after = compute.cnn_probe(*args, float(level), selection, seed)
    except Exception as exc:  # noqa: BLE001 - shown; the ViT's half stays
        st.error(f"The CNN could not process the image: {error_text(exc)}")
        cnn = None

st.subheader("One image")
level_text = f"{level:.0%}" if perturbation.endswith("drop") else f"{level:g}"
columns = st.columns(4 if cnn is not None else 2, gap="small")
panels = [("ViT · clean", before, names), (f"ViT · {PERTURBATION_LABELS[perturbation]} {level_text}", after, names)]
if cnn is not None:
    cnn_names = cnn.class_names
    cnn_perturbation = "pixel_drop" if perturbation == "token_drop" else perturbation  # a CNN has no tokens
    panels += [
        ("CNN · clean", cnn_before, cnn_names),
        (f"CNN · {PERTURBATION_LABELS[cnn_perturbation]} {level_text}", cnn_after, cnn_names),
    ]
for index, (column, (title, view, class_names)) in enumerate(zip(columns, panels)):
    with column:
        st.image(view.input_image, caption=title, width="stretch", output_format="PNG")
        st.markdown(prediction_text("prediction", view.probabilities, class_names))
        labels, probabilities = top5(view.probabilities, class_names)
        show_chart(plots.predictions_bar(labels, probabilities, height=200), f"rob_top5_{index}", filename="top5")
summary = [change_text("ViT", before, after)] + ([change_text("CNN", cnn_before, cnn_after)] if cnn is not None else [])
st.markdown(" · ".join(summary))
scope = demo_scope_note(cur.model.source, names, inputs.is_demo_scene(cur.image))
if scope:
    st.caption(scope)


def pair_scaled(first: np.ndarray, second: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both maps divided by the larger finite maximum of the two, so that a map that fades
    under the perturbation reads fainter (NaN: a dropped token, left blank)."""
    peak = max((float(np.nanmax(m)) for m in (first, second) if np.isfinite(m).any()), default=0.0)
    return (first / peak, second / peak) if peak > 0 else (first * 0.0, second * 0.0)


maps = list(pair_scaled(before.saliency, after.saliency))
backgrounds = [plots.image_data_uri(before.input_image), plots.image_data_uri(after.input_image)]
sizes = [spec.img_size] * 2
cells = [stride_of_map(spec.img_size, m.shape) for m in maps]  # each map's own grid (windowed: a stage grid)
titles = [f"ViT {before.saliency_name} · clean", f"ViT {after.saliency_name} · perturbed"]
if cnn is not None:
    h, w = cnn_before.saliency.shape
    height_px, width_px = cnn.spec.img_size
    maps += list(pair_scaled(cnn_before.saliency, cnn_after.saliency))
    backgrounds += [plots.image_data_uri(cnn_before.input_image), plots.image_data_uri(cnn_after.input_image)]
    sizes += [cnn.spec.img_size] * 2
    cells += [(height_px // h, width_px // w)] * 2
    titles += ["CNN Grad-CAM · clean", "CNN Grad-CAM · perturbed"]
show_chart(
    plots.map_panels(
        backgrounds,
        sizes,
        maps,
        cells,
        titles,
        ncols=len(maps),
        colorscale=cur.colorscale,
        zmin=0.0,
        zmax=1.0,
        colorbar_title="map / max of the pair",
        panel_height=300,
        opacity=0.6,
    ),
    "rob_maps",
    filename="robustness_maps",
)
cnn_text = ""
if cnn is not None:
    cnn_text = (
        f" The CNN's Grad-CAM of its clean prediction, on its last {h}×{w} feature map "
        f"({height_px // h}×{width_px // w} px cells)."
    )
# a windowed model's map: its last layer's attention, on that layer's grid (the library says which)
vit_map_text = f"The ViT's map: {saliency_description(before.saliency_name, before.saliency.shape, spec.img_size)}"
st.caption(
    vit_map_text
    + (" (blank: dropped tokens; the rollout runs over the tokens that remain)" if perturbation == "token_drop" else "")
    + "."
    + cnn_text
    + " Each model's clean and perturbed maps are divided by the larger maximum of the two, so a fading map reads fainter."
)
arrays = {
    "vit_clean_rollout": before.saliency,
    "vit_perturbed_rollout": after.saliency,
    "vit_clean_probabilities": before.probabilities,
    "vit_perturbed_probabilities": after.probabilities,
    "vit_perturbed_input": after.input_image,
    "level": np.array(float(level)),
    "seed": np.array(seed),
}
if after.dropped is not None:
    arrays["dropped_patches"] = after.dropped
if cnn is not None:
    arrays.update(
        cnn_clean_gradcam=cnn_before.saliency,
        cnn_perturbed_gradcam=cnn_after.saliency,
        cnn_clean_probabilities=cnn_before.probabilities,
        cnn_perturbed_probabilities=cnn_after.probabilities,
    )
download_npz("rob_image_data", f"robustness_{perturbation}", **arrays, perturbation=np.array(perturbation))
show_code(
    robustness_code(
        Source.of(cur),
        perturbation=perturbation,
        clean_level=clean_level,
        level=level,
        selection=selection,
        seed=seed,
        windowed=is_last_layer_attention(before.saliency_name),  # the map the probe drew (not a rollout)
    )
)

first_result.hold_slow_sections(
    "robustness", "The curves over an image set follow as soon as the panels above are on screen."
)
st.subheader("Over an image set")
set_choice = st.radio("Image set", list(SETS), format_func=SETS.get, key="rob_set", horizontal=True)
demo_model = cur.model.source in DEMO_MODELS
images, problems = inputs.image_set(set_choice, "rob_files", scenes=demo_model)
if set_choice == "samples" and not demo_model:
    st.caption(
        f"The {len(images)} bundled photos: the synthetic scenes are left out (they are what the demo models "
        "were trained on); choose *my images* for a set of your own."
    )
levels = tuple(float(g) for g in shuffle_grids(spec)) if perturbation == "shuffle" else SET_LEVELS[perturbation]


def set_curve(model_key: tuple, label: str, kind: str, model_levels: tuple[float, ...]):
    """Mean agreement and probability per level over the set, streamed in cached pieces."""

    def piece(chunk, start):
        *sums, skipped = compute.robustness_chunk(
            model_key, tuple(i.digest for i in chunk), tuple(i.data for i in chunk), kind, model_levels, seed + start
        )
        return sums, skipped

    score, probability, used = np.zeros(len(model_levels)), np.zeros(len(model_levels)), 0
    for s, p, n in over_image_set(images, label, piece, problems):
        score, probability, used = score + s, probability + p, used + n
    return (score / used, probability / used, used) if used else (None, None, 0)


curves, rows = [], []
add_swin = False
if cur.model != DEMO_SWIN and "demo" in choices:  # the ViT predicts the bundled models' classes
    st.session_state.setdefault("rob_swin", cur.model.source == "demo")
    add_swin = st.toggle(
        "Add the bundled demo Swin (windowed attention, trained on the same scenes)",
        key="rob_swin",
        help="With the demo ViT and the demo CNN: the ViT vs Swin vs CNN comparison, offline. "
        "The Swin gets the same pixel perturbations (patch drop in pixels for token drop).",
    )
st.session_state.setdefault("rob_curves", True)
if images and st.toggle(
    "Measure the curves", key="rob_curves", help="One forward pass per image and level for each model."
):
    try:
        vit_score, vit_probability, used = set_curve(("vit", cur.model), "ViT", perturbation, levels)
    except analysis.AnalysisError as exc:  # e.g. not yet defined for this model: the CNN's curve still shows
        st.info(f"No ViT curve: {error_text(exc)}", icon=":material/block:")
        vit_score, vit_probability, used = None, None, 0
    if vit_score is not None:
        curves.append((f"ViT · {PERTURBATION_LABELS[perturbation]}", levels, vit_score))
        rows += [("ViT", lv, float(a), float(p)) for lv, a, p in zip(levels, vit_score, vit_probability)]
    if cnn is not None:
        cnn_kind = "pixel_drop" if perturbation == "token_drop" else perturbation
        cnn_levels = tuple(lv for lv in levels if perturbation != "shuffle" or int(lv) in shuffle_grids(cnn.spec))
        cnn_score, cnn_probability, cnn_used = set_curve(("cnn", *cnn_key), "CNN", cnn_kind, cnn_levels)
        used = max(used, cnn_used)
        if cnn_score is not None:
            curves.append((f"CNN · {PERTURBATION_LABELS[cnn_kind]}", cnn_levels, cnn_score))
            rows += [("CNN", lv, float(a), float(p)) for lv, a, p in zip(cnn_levels, cnn_score, cnn_probability)]
    swin_match = (
        shared_label_space(vit, resources.get_model(DEMO_SWIN), ("the ViT", "the demo Swin")) if add_swin else None
    )
    if swin_match is not None and not swin_match:  # loaded only now, when its curve is asked for
        st.info(escape_markdown(swin_match.reason), icon=":material/compare_arrows:")
    if swin_match:
        swin_kind = "pixel_drop" if perturbation == "token_drop" else perturbation
        swin_spec = resources.get_model(DEMO_SWIN).spec
        swin_levels = tuple(lv for lv in levels if perturbation != "shuffle" or int(lv) in shuffle_grids(swin_spec))
        swin_score, swin_probability, swin_used = set_curve(("vit", DEMO_SWIN), "Swin", swin_kind, swin_levels)
        used = max(used, swin_used)
        if swin_score is not None:
            curves.append((f"Swin · {PERTURBATION_LABELS[swin_kind]}", swin_levels, swin_score))
            rows += [("Swin", lv, float(a), float(p)) for lv, a, p in zip(swin_levels, swin_score, swin_probability)]
    if curves:
        show_chart(
            plots.robustness_curves(
                curves,
                x_title=LEVEL_AXIS[perturbation],
                y_title=f"agreement with the clean prediction ({used} images)",
                chance=1.0 / spec.num_outputs,
            ),
            "rob_curves_chart",
            filename=f"robustness_curve_{perturbation}",
        )
        st.caption(
            "Agreement: the share of images whose prediction is unchanged. Image i uses seed "
            "seed + i at every level and for every model (each perturbs on its own patch grid). Dotted: chance (1 / classes). "
            "The labelled benchmark: `python -m analysis.robustness --n 500`."
        )
        download_csv(
            "rob_curves_data",
            f"robustness_curve_{perturbation}",
            ["model", "level", "agreement", "mean_probability_of_clean_class"],
            rows,
        )
for problem in problems:
    st.warning(escape_markdown(problem))
if set_choice == "mine" and not images:
    st.info("Upload images (or a .zip of images) to measure the curves over them.")


# ------------------------------------------------------------------ adversarial attacks and natural corruptions
compared = [("ViT", ("vit", cur.model))]
if compared_cnn is not None:
    compared.append(("CNN", ("cnn", *cnn_key)))
if add_swin:
    swin = resources.get_model(DEMO_SWIN)
    if shared_label_space(vit, swin, ("the ViT", "the demo Swin")):
        compared.append(("Swin", ("vit", DEMO_SWIN)))
attack_problems: list[str] = []
attack_section(compared, cur.image, images, attack_problems, names, seed)
corruption_problems: list[str] = []
corruption_section(compared, cur.image, images, corruption_problems, names, seed)
texture_problems: list[str] = []
demo_classes = list(vit.class_names or ()) == list(DEMO_CLASS_NAMES)
texture_section(compared, cur.image, images, texture_problems, names, seed, demo_classes=demo_classes)
patch_section(compared, cur.image, names, seed, demo_classes=demo_classes)
for problem in dict.fromkeys(attack_problems + corruption_problems + texture_problems):  # each named once
    st.warning(escape_markdown(problem))
