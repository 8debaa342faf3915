"""The Robustness page's adversarial-attack, natural-corruption and texture sections: this image under
FGSM/PGD, an ImageNet-C corruption or with its texture taken away, and, behind a button, the measures
over an image set (accuracy against ε or severity, the transfer matrix, the mean corruption error
relative to the CNN, the agreement on each texture probe, the shape bias on cue-conflict scenes).

``models`` is ``[(label, model_key)]``, the ViT first, every model already checked to predict the ViT's
classes (``analysis.shared_label_space``); ``model_key`` as in :func:`vizapp.views.robustness.compute.loaded_model`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import streamlit as st

import analysis
from analysis import plots
from analysis.model.loading import TEXTURED_DEMO_MODELS
from analysis.robustness import (
    ATTACKS,
    FAST_CORRUPTIONS,
    PATCH_BATCH_SIZE,
    PATCH_STEPS,
    PATCH_TRAIN_SCENES,
    TEXTURE_PROBES,
    TEXTURED_DEMO_CNNS,
    CorruptionCurve,
    ShapeBias,
    corruption_errors,
)
from vizapp.image_sets import over_image_set
from vizapp.messages import error_text, escape_markdown
from vizapp.refs import ImageRef, ModelRef
from vizapp.ui import download_csv, download_npz, show_chart
from vizapp.views.robustness import compute

__all__ = [
    "attack_section",
    "corruption_section",
    "texture_section",
    "patch_section",
    "SET_EPSILONS",
    "CUE_CONFLICT_SCENES",
    "PATCH_SHARES",
    "PATCH_TRAIN_SCENES",
    "PATCH_HELD_OUT_SCENES",
    "PATCH_STEPS",
    "PATCH_BATCH_SIZE",
    "SHAPE_BIAS_MODELS",
    "textured_variant",
]

#: ε (0–255 pixel units) of the set-level curve
PANEL_WIDTH = 320  # px: a picture beside its numbers (an adversarial image, a corruption), never the page wide
SET_EPSILONS = (0.0, 1.0, 2.0, 4.0, 8.0)
ATTACK_LABELS = {"fgsm": "FGSM (one step)", "pgd": "PGD (L∞, random start)"}
#: cue-conflict scenes of the shape-bias measure (the demo classes)
CUE_CONFLICT_SCENES = 60
#: the page's adversarial-patch training: shares of the image area and held-out demo scenes to score on; the
#: training scenes and the step budget (PATCH_TRAIN_SCENES, PATCH_STEPS of PATCH_BATCH_SIZE scenes) are the
#: library's defaults (a universal patch per model and share, analysis.robustness.patch_size_curve)
PATCH_SHARES: tuple[float, ...] = (0.05, 0.1)
PATCH_HELD_OUT_SCENES = 200
#: the probes that need no mask (an uploaded photo has none)
MASKLESS_PROBES = tuple(p for p in TEXTURE_PROBES if p != "silhouette")
#: whose shape bias the page measures: the textured variants of the bundled demo models, or the page's
SHAPE_BIAS_MODELS = {
    "textured": "their variants trained on textured scenes too",
    "page": "the models above, as they are",
}


def textured_variant(model_key: tuple) -> tuple | None:
    """The model key of the variant of a bundled demo model fine-tuned on textured scenes as well
    (``analysis.model.loading.TEXTURED_DEMO_MODELS``, ``analysis.robustness.TEXTURED_DEMO_CNNS``), or ``None``
    when ``model_key`` is no such model."""
    if model_key[0] == "vit":
        ref = model_key[1]
        plain = ref.pretrained and not ref.arch and not ref.img_size
        return (
            ("vit", ModelRef(TEXTURED_DEMO_MODELS[ref.source]))
            if plain and ref.source in TEXTURED_DEMO_MODELS
            else None
        )
    source, pretrained = model_key[1:]
    return ("cnn", TEXTURED_DEMO_CNNS[source], True) if pretrained and source in TEXTURED_DEMO_CNNS else None


def _top(probabilities: np.ndarray, class_names) -> str:
    best = int(np.argmax(probabilities))
    name = analysis.class_label(class_names, best)
    return f"{escape_markdown(name)} · {probabilities[best]:.1%}"


def _perturbation_picture(perturbation: np.ndarray, epsilon: float) -> np.ndarray:
    """``(H, W, 3)`` uint8: the perturbation in pixel units, ±ε mapped to 0–255 around mid-grey."""
    scale = max(float(epsilon), 1e-6)
    return np.round(np.clip(perturbation / scale, -1, 1) * 127.5 + 127.5).astype(np.uint8)


def attack_section(
    models: Sequence[tuple[str, tuple]],
    image: ImageRef,
    images: Sequence[ImageRef],
    problems: list[str],
    class_names,
    seed: int,
) -> None:
    st.subheader("Adversarial attacks")
    st.caption(
        "Sample-specific L∞ attacks with ε in the 0–255 pixel units of the image (ε = 4 is the papers' "
        "4/255), each model attacked through its own gradient and normalisation, untargeted against its "
        "clean prediction (Goodfellow et al. 2015; Madry et al. 2018; the project's own PGD, "
        "`analysis.robustness.pgd`)."
    )
    left, middle, right = st.columns(3)
    with left:
        st.session_state.setdefault("rob_attack", "pgd")
        name = st.radio("Attack", list(ATTACKS), format_func=ATTACK_LABELS.get, key="rob_attack", horizontal=True)
        assert name is not None  # a radio with options and a default always has a value
    with middle:
        st.session_state.setdefault("rob_epsilon", 4.0)
        epsilon = st.number_input(
            "ε (0–255 pixel units)",
            min_value=0.0,
            max_value=64.0,
            step=1.0,
            key="rob_epsilon",
            help="The largest change of any pixel channel; 0 leaves every prediction unchanged.",
        )
    with right:
        st.session_state.setdefault("rob_steps", 10)
        steps = int(
            st.number_input("PGD steps", min_value=1, max_value=100, step=1, key="rob_steps", disabled=name == "fgsm")
        )
    views = []
    try:
        for label, key in models:
            views.append((label, compute.attack_view(key, image.digest, image.data, name, float(epsilon), steps, seed)))
    except analysis.AnalysisError as exc:
        st.error(error_text(exc))
        return
    columns = st.columns(len(views))
    for column, (label, view) in zip(columns, views):
        with column:
            st.image(
                view.adversarial_image,
                caption=f"{label} · adversarial, ε = {epsilon:g}",
                width=PANEL_WIDTH,
                output_format="PNG",
            )
            st.image(
                _perturbation_picture(view.perturbation, epsilon),
                width=PANEL_WIDTH,
                output_format="PNG",
                caption=f"perturbation (grey: 0, ±ε: black/white); max |δ| = {np.abs(view.perturbation).max():.1f}",
            )
            changed = int(np.argmax(view.adversarial_probabilities)) != int(np.argmax(view.clean_probabilities))
            st.markdown(
                f"**{label} clean:** {_top(view.clean_probabilities, class_names)}  \n"
                f"**{label} adversarial:** {_top(view.adversarial_probabilities, class_names)} "
                f"({'flipped by the attack' if changed else 'kept'})"
            )
    download_npz(
        "rob_attack_image_data",
        f"attack_{name}",
        epsilon=np.array(float(epsilon)),
        attack=np.array(name),
        **{
            f"{label.lower()}_{field}": getattr(view, field)
            for label, view in views
            for field in ("clean_probabilities", "adversarial_probabilities", "adversarial_image", "perturbation")
        },
    )

    st.markdown("**Over the image set**")
    if not images:
        return
    transfer_epsilon = st.select_slider(
        "ε of the transfer matrix", [e for e in SET_EPSILONS if e > 0], value=4.0, key="rob_transfer_epsilon"
    )
    if not st.button(
        "Measure the attack curves",
        key="rob_attack_run",
        help=f"{ATTACK_LABELS[name]} at ε = {', '.join(f'{e:g}' for e in SET_EPSILONS)} for every model, "
        "and the transfer between them: several forward and backward passes per image.",
    ):
        return
    curves, rows, used = [], [], 0
    for label, key in models:

        def piece(chunk, start, key=key):
            sums, count, skipped = compute.attack_chunk(
                key, tuple(i.digest for i in chunk), tuple(i.data for i in chunk), name, SET_EPSILONS, steps, seed
            )
            return (sums, count), skipped

        results = over_image_set(images, f"{label} · {name}", piece, problems)
        count = sum(n for _, n in results)
        if count:
            accuracy = sum(s for s, _ in results) / count
            used = max(used, count)
            curves.append((label, SET_EPSILONS, accuracy))
            rows += [(label, e, float(a)) for e, a in zip(SET_EPSILONS, accuracy)]
    if not curves:
        return
    show_chart(
        plots.robustness_curves(
            curves,
            x_title="ε (0–255 pixel units)",
            y_title=f"agreement with the clean prediction ({used} images)",
            chance=1.0 / len(class_names) if class_names else None,
        ),
        "rob_attack_chart",
        filename=f"attack_curve_{name}",
    )
    st.caption(
        "Agreement: the share of images whose adversarial prediction is still the model's clean prediction "
        "(ε = 0: 1). The labelled benchmark: `python -m analysis robustness attack --model demo --cnn demo "
        "--demo-scenes 200 --out attack.npz`."
    )
    download_csv("rob_attack_curve_data", f"attack_curve_{name}", ["model", "epsilon", "agreement"], rows)
    arrays = {
        "epsilons": np.array(SET_EPSILONS),
        "models": np.array([c[0] for c in curves]),
        "agreement": np.stack([c[2] for c in curves]),
    }
    if len(models) > 1:
        keys = tuple(key for _, key in models)
        transfer_problems: list[str] = []

        def transfer_piece(chunk, start):
            sums, count, skipped = compute.transfer_chunk(
                keys,
                tuple(i.digest for i in chunk),
                tuple(i.data for i in chunk),
                name,
                float(transfer_epsilon),
                steps,
                seed,
            )
            return (sums, count), skipped

        results = over_image_set(images, "transfer", transfer_piece, transfer_problems)
        agreed = sum(n for _, n in results)
        if agreed:
            matrix = sum(s for s, _ in results) / agreed
            labels = [label for label, _ in models]
            show_chart(plots.transfer_heatmap(labels, matrix), "rob_transfer_chart", filename="attack_transfer")
            st.caption(
                f"Accuracy of each column's model on the {name.upper()} images (ε = {transfer_epsilon:g}) made "
                f"against each row's model, over the {agreed} images where every model predicts the same clean "
                "class (that class is the label). The diagonal is the white-box attack."
            )
            arrays.update(
                transfer_accuracy=matrix,
                transfer_epsilon=np.array(float(transfer_epsilon)),
                transfer_images=np.array(agreed),
            )
            download_csv(
                "rob_transfer_data",
                "attack_transfer",
                ["made_against", "fed_to", "accuracy"],
                [(a, b, float(matrix[i, j])) for i, a in enumerate(labels) for j, b in enumerate(labels)],
            )
        else:
            st.info("No image where every model predicts the same clean class: no transfer matrix.")
    download_npz("rob_attack_set_data", f"attack_curve_{name}", **arrays)


def corruption_section(
    models: Sequence[tuple[str, tuple]],
    image: ImageRef,
    images: Sequence[ImageRef],
    problems: list[str],
    class_names,
    seed: int,
) -> None:
    st.subheader("Natural corruptions")
    st.caption(
        "ImageNet-C corruptions at severities 1–5 (Hendrycks & Dietterich 2019), from the `imagecorruptions` "
        "package's own functions, applied as ImageNet-C was made: to each model's input crop at its input size, "
        "then normalised; severity 0 is the clean image."
    )
    try:
        names = analysis.robustness.corruption_names()
    except analysis.AnalysisError as exc:  # the optional package is missing
        st.info(error_text(exc), icon=":material/extension:")
        return
    left, right = st.columns(2)
    with left:
        st.session_state.setdefault("rob_corruption", "gaussian_noise")
        corruption = st.selectbox(
            "Corruption",
            names,
            key="rob_corruption",
            help="Some (glass blur, zoom blur, elastic transform) take seconds per image.",
        )
        assert corruption is not None  # a selectbox with options and a default always has a value
    with right:
        st.session_state.setdefault("rob_severity", 3)
        severity = int(st.slider("Severity", 0, 5, key="rob_severity"))
    try:
        views = [
            (label, *compute.corruption_view(key, image.digest, image.data, corruption, severity))
            for label, key in models
        ]
    except analysis.AnalysisError as exc:
        st.error(error_text(exc))
        return
    st.image(
        views[0][1],
        caption=f"{corruption.replace('_', ' ')}, severity {severity}",
        width=PANEL_WIDTH,
        output_format="PNG",
    )
    st.markdown(" · ".join(f"**{label}:** {_top(probabilities, class_names)}" for label, _, probabilities in views))

    st.markdown("**Over the image set**")
    if not images:
        return
    chosen = st.multiselect(
        "Corruptions of the curves",
        names,
        default=[c for c in FAST_CORRUPTIONS[:4] if c in names],
        key="rob_corruption_set",
        help="The fast ones by default.",
    )
    if not chosen or not st.button("Measure the corruption curves", key="rob_corruption_run"):
        return
    keys, severities = tuple(key for _, key in models), (0, 1, 2, 3, 4, 5)

    def piece(chunk, start):
        sums, count, skipped = compute.corruption_chunk(
            keys, tuple(i.digest for i in chunk), tuple(i.data for i in chunk), tuple(chosen), severities, seed + start
        )
        return (sums, count), skipped

    try:
        results = over_image_set(images, "corruptions", piece, problems)
    except analysis.AnalysisError as exc:
        st.error(error_text(exc))
        return
    used = sum(n for _, n in results)
    if not used:
        return
    accuracy = sum(s for s, _ in results) / used  # (models, corruptions, severities)
    labels = [label for label, _ in models]
    curve = CorruptionCurve(
        tuple(chosen), severities, {lab: accuracy[m] for m, lab in enumerate(labels)}, used, "clean prediction"
    )
    curves = [(label, severities, accuracy[m].mean(0)) for m, label in enumerate(labels)]
    show_chart(
        plots.robustness_curves(
            curves,
            x_title="severity (0: clean)",
            y_title=f"agreement, mean over {len(chosen)} corruptions ({used} images)",
        ),
        "rob_corruption_chart",
        filename="corruption_curve",
    )
    rows = [
        (label, c, s, float(accuracy[m, i, j]))
        for m, label in enumerate(labels)
        for i, c in enumerate(chosen)
        for j, s in enumerate(severities)
    ]
    arrays = {
        "models": np.array(labels),
        "corruptions": np.array(chosen),
        "severities": np.array(severities),
        "agreement": accuracy,
    }
    if "CNN" in labels:
        errors = corruption_errors(curve, "CNN")
        st.markdown(
            "**Mean corruption error relative to the CNN** (below 1: fewer errors than the CNN): "
            + " · ".join(f"{label} {errors[label][1]:.3f}" for label in labels)
        )
        arrays.update(
            corruption_error=np.stack([errors[label][0] for label in labels]),
            mean_corruption_error=np.array([errors[label][1] for label in labels]),
        )
    st.caption(
        "Agreement with each model's own clean prediction; image i's random corruptions use seed + i. CE = Σ over severities 1–5 of the model's errors "
        "/ the CNN's; mCE: its mean over the corruptions (Hendrycks & Dietterich 2019, with the CNN as the "
        "baseline instead of AlexNet). The labelled benchmark: `python -m analysis robustness corruptions "
        "--model demo --cnn demo --demo-scenes 200 --out corruptions.npz`."
    )
    download_csv("rob_corruption_data", "corruption_curve", ["model", "corruption", "severity", "agreement"], rows)
    download_npz("rob_corruption_set_data", "corruption_curve", **arrays)


def texture_section(
    models: Sequence[tuple[str, tuple]],
    image: ImageRef,
    images: Sequence[ImageRef],
    problems: list[str],
    class_names,
    seed: int,
    *,
    demo_classes: bool,
) -> None:
    """``demo_classes``: the models predict the demo classes, so the cue-conflict scenes apply."""
    st.subheader("Texture removal and shape bias")
    st.caption(
        "Take the texture away and see what each model still recognises (Naseer et al. 2021, Section 3.2): "
        + "; ".join(f"**{p}**: {TEXTURE_PROBES[p]}" for p in MASKLESS_PROBES)
        + ". The silhouette needs the object's mask, which a photo does not have: the command line measures it "
        "on the demo scenes."
    )
    st.session_state.setdefault("rob_texture_probe", MASKLESS_PROBES[0])
    probe = st.radio("Texture probe", MASKLESS_PROBES, key="rob_texture_probe", horizontal=True)
    assert probe is not None  # a radio with options and a default always has a value
    try:
        views = [(label, *compute.texture_view(key, image.digest, image.data, probe)) for label, key in models]
    except analysis.AnalysisError as exc:
        st.error(error_text(exc))
        return
    st.image(views[0][1], caption=f"{probe}: what every model is shown", width=PANEL_WIDTH, output_format="PNG")
    st.markdown(" · ".join(f"**{label}:** {_top(probabilities, class_names)}" for label, _, probabilities in views))
    labels, keys = [label for label, _ in models], tuple(key for _, key in models)

    st.markdown("**Over the image set**")
    if st.button("Measure the texture probes", key="rob_texture_run", disabled=not images):
        st.session_state["rob_texture_asked"] = True  # the results stay on later reruns (cached pieces)
    if images and st.session_state.get("rob_texture_asked"):

        def piece(chunk, start):
            sums, count, skipped = compute.texture_chunk(
                keys, tuple(i.digest for i in chunk), tuple(i.data for i in chunk), MASKLESS_PROBES
            )
            return (sums, count), skipped

        try:
            results = over_image_set(images, "texture probes", piece, problems)
        except analysis.AnalysisError as exc:
            st.error(error_text(exc))
            results = []
        used = sum(n for _, n in results)
        if used:
            agreement = sum(s for s, _ in results) / used  # (models, probes)
            show_chart(
                plots.grouped_bars(
                    list(MASKLESS_PROBES),
                    [(label, agreement[m]) for m, label in enumerate(labels)],
                    y_title=f"agreement with the clean prediction ({used} images)",
                ),
                "rob_texture_chart",
                filename="texture_probes",
            )
            download_csv(
                "rob_texture_data",
                "texture_probes",
                ["model", "probe", "agreement"],
                [
                    (label, p, float(agreement[m, j]))
                    for m, label in enumerate(labels)
                    for j, p in enumerate(MASKLESS_PROBES)
                ],
            )
            download_npz(
                "rob_texture_set_data",
                "texture_probes",
                models=np.array(labels),
                probes=np.array(MASKLESS_PROBES),
                agreement=agreement,
                count=np.int64(used),
            )

    st.markdown("**Shape bias on cue-conflict scenes**")
    if not demo_classes:
        st.caption(
            "The cue-conflict scenes draw one demo class's shape with another demo class's texture: they apply to "
            "models that predict the demo classes (the bundled demo models). For ImageNet models, use Geirhos et "
            "al.'s stimuli with `analysis.robustness.shape_bias`."
        )
        return
    from analysis.demo.cue_conflict import cue_conflict_scenes
    from analysis.demo.data import CLASS_NAMES as names

    examples = cue_conflict_scenes(4, seed)
    st.image(
        [scene.image for scene in examples],
        caption=[f"shape {names[s.shape_class]}, texture {names[s.texture_class]}" for s in examples],
        width=110,
    )
    variants = [textured_variant(key) for key in keys]
    which = "page"
    if any(variants):
        st.session_state.setdefault("rob_shape_bias_models", "textured")
        which = st.radio(
            "Shape bias of the bundled demo models above, or of",
            list(SHAPE_BIAS_MODELS),
            format_func=SHAPE_BIAS_MODELS.get,
            key="rob_shape_bias_models",
            horizontal=True,
            help="The plain demo models never saw a textured object: on a cue-conflict scene they can only follow "
            "the shape or neither cue. Their variants were fine-tuned on plain scenes and on scenes whose "
            "object carries its class's texture, so they can read either cue (see docs/concepts/demo-models.md).",
        )
    if which == "textured":
        labels = [f"{label} (textured)" if v else label for label, v in zip(labels, variants)]
        keys = tuple(v or key for key, v in zip(keys, variants))
    sources = [key[1].source if key[0] == "vit" else f"CNN {key[1]}" for key in keys]
    st.caption(
        "Measured on: "
        + " · ".join(f"**{label}** (`{source}`)" for label, source in zip(labels, sources))
        + (
            ": each bundled demo model by its variant fine-tuned on plain and textured scenes."
            if which == "textured"
            else "."
        )
    )
    if st.button(f"Measure the shape bias ({CUE_CONFLICT_SCENES} scenes)", key="rob_shape_bias_run"):
        st.session_state["rob_shape_bias_asked"] = True  # the results stay on later reruns (cached)
    if not st.session_state.get("rob_shape_bias_asked"):
        return
    try:
        counts = compute.shape_bias_counts(keys, CUE_CONFLICT_SCENES, seed)  # (models, 3)
    except (analysis.AnalysisError, analysis.ModelLoadError) as exc:
        st.error(error_text(exc))
        return
    biases = [ShapeBias(*(int(v) for v in row)) for row in counts]
    show_chart(
        plots.grouped_bars(
            ["shape bias"],
            [(label, [b.fraction]) for label, b in zip(labels, biases)],
            y_title="shape / (shape + texture)",
        ),
        "rob_shape_bias_chart",
        filename="shape_bias",
    )
    st.markdown(
        " · ".join(
            f"**{label}:** {b.shape} shape, {b.texture} texture, {b.neither} neither"
            for label, b in zip(labels, biases)
        )
    )
    st.caption(
        "Shape bias (Geirhos et al. 2019): the share of the decisions that follow the shape among those that follow "
        "the shape or the texture; decisions for a third class are left out. "
        + (
            "The textured variants read either cue, so their decisions show which one wins. "
            if which == "textured"
            else "Models that never saw a textured object make many 'neither' decisions. "
        )
        + "`python -m analysis robustness texture --model demo --cnn demo --also demo_swin --demo-scenes 100 "
        "--cue-conflict 100 --out texture.npz` measures it (on the textured variants unless `--shape-bias-of given`) "
        "with the silhouettes."
    )
    download_csv(
        "rob_shape_bias_data",
        "shape_bias",
        ["model", "shape", "texture", "neither", "shape_bias"],
        [(label, b.shape, b.texture, b.neither, b.fraction) for label, b in zip(labels, biases)],
    )


def _patch_margins(labels: Sequence[str], shares: Sequence[float], stored: dict, names, target: int | None) -> str:
    """Per model, at the largest share: the held-out accuracy with its own patch and with the noise patch, the
    margin between them in points and, targeted, the target-hit rate of each."""
    k, lines = len(shares) - 1, []
    for m, label in enumerate(labels):
        own, noise = float(stored["accuracy"][m, k]), float(stored["noise_accuracy"][m, k])
        line = (
            f"**{label}:** accuracy {own:.3f} with its own {100 * shares[k]:g}% patch, {noise:.3f} with the noise "
            f"patch ({100 * (noise - own):+.1f} points)"
        )
        if target is not None and stored["target_rate"] is not None:
            line += (
                f"; predicted as *{names[target]}* {float(stored['target_rate'][m, k]):.3f} of the time with its "
                f"patch, {float(stored['noise_target_rate'][m, k]):.3f} with the noise"
            )
        lines.append(line)
    return "  \n".join(lines)


def patch_section(
    models: Sequence[tuple[str, tuple]], image: ImageRef, class_names, seed: int, *, demo_classes: bool
) -> None:
    """``demo_classes``: the models predict the demo classes, so the patches can train on demo scenes."""
    st.subheader("Adversarial patches")
    shares = PATCH_SHARES
    st.caption(
        "A universal patch (Brown et al. 2017): one square, a share of the image area, optimised over a set of "
        "images so that pasting it anywhere lowers a model's accuracy (or, targeted, pushes every image towards "
        "one class); each model gets its own, and a square of uniform noise of the same size at the same places "
        "is the control. The patches train on demo scenes and are scored on held-out ones (stream = the seed "
        "above), never the same scenes."
    )
    if not demo_classes:
        st.caption(
            "The page trains the patches on the bundled demo scenes, so it needs models of the demo classes. For "
            "your model: `analysis.robustness.patch_size_curve` on your own labelled images."
        )
        return
    names = list(class_names or ())
    chosen = st.selectbox(
        "Patch target",
        [None, *range(len(names))],
        format_func=lambda c: "none (untargeted: lower the accuracy)" if c is None else f"targeted: {names[c]}",
        key="rob_patch_target",
        help="Targeted: every patched image is pushed towards this class; the page then shows how often the "
        "patched held-out scenes are predicted as it (the target-hit rate).",
    )
    target = None if chosen is None else int(chosen)
    keys, labels = tuple(key for _, key in models), [label for label, _ in models]
    settings = (shares, PATCH_TRAIN_SCENES, PATCH_HELD_OUT_SCENES, PATCH_STEPS, PATCH_BATCH_SIZE, target)
    key = (keys, *settings, seed)
    stored = compute.stored_patch_curve(key)
    if stored is None:
        if not st.button(
            f"Train the patches ({len(models)} models × {len(shares)} sizes, {PATCH_STEPS} steps of "
            f"{PATCH_BATCH_SIZE} of {PATCH_TRAIN_SCENES} demo scenes each)",
            key="rob_patch_run",
        ):
            return
        bar = st.progress(0.0, text="Training the patches…")
        try:
            stored = compute.compute_patch_curve(
                keys, *settings, seed,
                progress=lambda done, total: bar.progress(done / total, text=f"Training the patches: step {done} / {total}"),
            )  # fmt: skip
        except analysis.AnalysisError as exc:
            st.error(error_text(exc))
            return
        finally:
            bar.empty()
    st.markdown(_patch_margins(labels, shares, stored, names, target))
    percent = [100 * s for s in shares]
    curves = [(label, percent, stored["accuracy"][m]) for m, label in enumerate(labels)]
    curves += [(f"{label}, noise patch", percent, stored["noise_accuracy"][m]) for m, label in enumerate(labels)]
    show_chart(
        plots.robustness_curves(
            curves,
            x_title="patch size (% of the image area)",
            y_title=f"top-1 accuracy ({PATCH_HELD_OUT_SCENES} held-out demo scenes)",
            dashed=[f"{label}, noise patch" for label in labels],
        ),
        "rob_patch_chart",
        filename="patch_curve",
    )
    if stored["transfer"] is not None:
        show_chart(
            plots.transfer_heatmap(
                labels, stored["transfer"], title=f"The {100 * shares[-1]:g}% patches pasted on each model"
            ),
            "rob_patch_transfer_chart",
            filename="patch_transfer",
        )
    first = models[0]
    try:
        pasted = compute.patch_on_image(first[1], image.digest, image.data, stored["largest_patches"][0])
    except analysis.AnalysisError as exc:
        st.error(error_text(exc))
        return
    left, right = st.columns([1, 2])
    with left:
        st.image(pasted["picture"], caption=f"{first[0]}'s {100 * shares[-1]:g}% patch at the centre", width=220)
        st.markdown(
            f"**Clean:** {_top(pasted['clean'], class_names)}  \n**Patched:** {_top(pasted['patched'], class_names)}"
        )
    if "layers" in pasted:
        with right:
            show_chart(
                plots.robustness_curves(
                    [
                        ("patched", pasted["layers"], pasted["patched_share"]),
                        ("clean (the same tokens)", pasted["layers"], pasted["clean_share"]),
                    ],
                    x_title="layer",
                    y_title="class-token attention on the patch",
                    x_dtick=1,
                ),
                "rob_patch_attention_chart",
                filename="patch_attention",
            )
    hits = () if stored["target_rate"] is None else ("target_rate", "noise_target_rate")
    download_csv(
        "rob_patch_data",
        "patch_curve",
        ["model", "share", "accuracy", "noise_accuracy", "fooling_rate", *hits],
        [
            (
                label,
                s,
                float(stored["accuracy"][m, k]),
                float(stored["noise_accuracy"][m, k]),
                float(stored["fooling_rate"][m, k]),
                *(float(stored[field][m, k]) for field in hits),
            )
            for m, label in enumerate(labels)
            for k, s in enumerate(shares)
        ],
    )
