"""The Robustness page's cached computations (``st.cache_data`` / ``st.cache_resource``): what only this page
computes, beside it (the perturbation probes, attacks, corruptions, texture probes and adversarial patches).
The shared ones (a model, the comparison CNN, a captured forward pass) are :mod:`vizapp.resources`'."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import streamlit as st
import torch
from PIL import Image

from analysis import (
    load_image,
    upsample_map,
)
from analysis.attention.rollout import patch_grid_rollout
from analysis.robustness import drop_pixels, probe, robustness_curve
from vizapp import resources  # looked up at each call: a test may replace one
from vizapp.limits import MAX_RESULTS
from vizapp.records import RecordStore
from vizapp.refs import ModelRef

__all__ = [
    "AttackView",
    "PATCH_RESULTS",
    "ProbeView",
    "attack_chunk",
    "attack_view",
    "cnn_probe",
    "compute_patch_curve",
    "corruption_chunk",
    "corruption_view",
    "loaded_model",
    "patch_on_image",
    "robustness_chunk",
    "shape_bias_counts",
    "stored_patch_curve",
    "texture_chunk",
    "texture_view",
    "transfer_chunk",
    "vit_probe",
]


@dataclass(frozen=True)
class ProbeView:
    """One model on one image at one perturbation level (``analysis.robustness.probe``).

    input_image: ``(H, W, 3)`` uint8 as the model saw it (token drop: dropped patches shown
    as the mean colour, though the model never saw them); probabilities ``(classes,)``;
    saliency: ``(gh, gw)`` rollout (NaN where a token was dropped), ``(h, w)`` Grad-CAM, or a
    windowed model's last-layer attention on that layer's grid; saliency_name: which (a value of
    ``analysis.robustness.SALIENCY_NAMES``); dropped: the removed patch indices, or None.
    """

    input_image: np.ndarray
    probabilities: np.ndarray
    saliency: np.ndarray
    dropped: np.ndarray | None
    saliency_name: str = ""


def _probe_view(
    model,
    pixels: torch.Tensor,
    perturbation: str,
    level: float,
    selection: str,
    seed: int,
    clean_saliency: np.ndarray | None,
    target: int | None = None,
) -> ProbeView:
    result = probe(
        model, pixels, perturbation, level, seed=seed, selection=selection, saliency=clean_saliency, target=target
    )
    shown = result.pixels
    if perturbation == "token_drop":
        shown = drop_pixels(result.pixels, model.spec, result.dropped)  # type: ignore[arg-type]  # set for a token drop
    return ProbeView(
        input_image=model.preprocessing.to_image(shown[0]),
        probabilities=model.probabilities(result.logits[0:1])[0].numpy().astype(np.float32),
        saliency=result.saliency.numpy().astype(np.float32),
        dropped=None if result.dropped is None else result.dropped.numpy(),
        saliency_name=result.saliency_name,
    )


@st.cache_data(show_spinner="Perturbing the input and running the ViT…", max_entries=MAX_RESULTS)
def vit_probe(
    ref: ModelRef, digest: str, _image_bytes: bytes, perturbation: str, level: float, selection: str, seed: int
) -> ProbeView:
    """The ViT under one perturbation; salient drops rank patches by the clean class-token rollout
    (a windowed model: the rollout of its first stage for the mean cell, exact and on the stem's
    patch grid, the grid the drops use)."""
    vit = resources.get_model(ref)
    saliency = None
    if selection != "random":  # the clean rollout, from the shared captured pass (no second forward)
        record = resources.forward(ref, digest, _image_bytes).record
        saliency = patch_grid_rollout(record)[0].numpy()
    return _probe_view(vit, vit.preprocess(load_image(_image_bytes)), perturbation, level, selection, seed, saliency)


@st.cache_data(show_spinner="Perturbing the input and running the CNN…", max_entries=MAX_RESULTS)
def cnn_probe(
    source: str,
    pretrained: bool,
    digest: str,
    _image_bytes: bytes,
    perturbation: str,
    level: float,
    selection: str,
    seed: int,
) -> ProbeView:
    """The comparison CNN under one perturbation (token drop becomes pixel drop: a CNN has no
    tokens). Grad-CAM explains the clean prediction before and after; salient drops rank the
    CNN's drop grid by its clean Grad-CAM, bilinearly resized to that grid."""
    cnn = resources.get_cnn(source, pretrained)
    pixels = cnn.preprocess(load_image(_image_bytes))
    clean = _probe_view(cnn, pixels, "pixel_drop", 0.0, "random", 0, None)
    target = int(np.argmax(clean.probabilities))
    saliency = None
    if selection != "random":
        saliency = upsample_map(clean.saliency, cnn.spec.grid_size, "bilinear")  # resized to the drop grid
    kind = "pixel_drop" if perturbation == "token_drop" else perturbation
    return _probe_view(cnn, pixels, kind, level, selection, seed, saliency, target)


@st.cache_data(show_spinner=False, max_entries=4 * MAX_RESULTS)
def robustness_chunk(
    model_key: tuple,
    digests: tuple[str, ...],
    _images: tuple[bytes, ...],
    perturbation: str,
    levels: tuple[float, ...],
    seed: int,
) -> tuple[np.ndarray, np.ndarray, int, tuple[tuple[int, str], ...]]:
    """Agreement with the clean prediction, summed over one piece of an image set, per level
    (``analysis.robustness.robustness_curve``; image ``i`` of the piece uses seed ``seed + i``).
    ``model_key``: ``("vit", ModelRef)`` or ``("cnn", source, pretrained)``. Returns the summed
    agreement and probability ``(levels,)``, the images used, and ``(index, reason)`` per skipped image."""
    model = loaded_model(model_key)
    images, skipped = resources.decoded_images(_images)
    score, probability = np.zeros(len(levels)), np.zeros(len(levels))
    for index, image in images:  # one image at a time, each with its own seed
        curve = robustness_curve(model, [image], perturbation, levels, seed=seed + index, attention=False)
        score += curve.score
        probability += curve.probability
    return score, probability, len(images), tuple(skipped)


def loaded_model(model_key: tuple):
    """The model of a page's ``model_key``: ``("vit", ModelRef)`` or ``("cnn", source, pretrained)``."""
    return resources.get_model(model_key[1]) if model_key[0] == "vit" else resources.get_cnn(*model_key[1:])


@dataclass(frozen=True)
class AttackView:
    """One model attacked on one image against its own clean prediction (``analysis.robustness.attack``).

    clean_probabilities, adversarial_probabilities: ``(classes,)``; adversarial_image: ``(H, W, 3)`` uint8
    as the model saw it; perturbation: ``(H, W, 3)`` float, adversarial − clean in 0–255 pixel units."""

    clean_probabilities: np.ndarray
    adversarial_probabilities: np.ndarray
    adversarial_image: np.ndarray
    perturbation: np.ndarray


@st.cache_data(show_spinner="Attacking the image…", max_entries=MAX_RESULTS)
def attack_view(
    model_key: tuple, digest: str, _image_bytes: bytes, attack_name: str, epsilon: float, steps: int, seed: int
) -> AttackView:
    """FGSM or PGD of ε (0–255 units) on this image, untargeted, against the model's clean prediction."""
    from analysis.robustness import attack

    model = loaded_model(model_key)
    pixels = model.preprocess(load_image(_image_bytes)).to(model.device)  # (1, 3, H, W)
    with torch.no_grad():
        clean_logits = model.model(pixels).float()
    target = clean_logits.argmax(-1)
    adversarial = attack(attack_name, model, pixels, target, epsilon=epsilon, steps=steps, seed=seed)
    with torch.no_grad():
        adversarial_logits = model.model(adversarial.to(model.device)).float()
    to_unit = model.preprocessing.unnormalise
    clean_unit = to_unit(pixels).clamp(0, 1)[0].permute(1, 2, 0).cpu().numpy()  # (H, W, 3) in [0, 1]
    unit = to_unit(adversarial.to(model.device)).clamp(0, 1)[0].permute(1, 2, 0).cpu().numpy()
    return AttackView(
        model.probabilities(clean_logits)[0].cpu().numpy(),  # the model's own rule
        model.probabilities(adversarial_logits)[0].cpu().numpy(),
        np.round(unit * 255).astype(np.uint8),
        (unit - clean_unit) * 255.0,
    )


@st.cache_data(show_spinner=False, max_entries=4 * MAX_RESULTS)
def attack_chunk(
    model_key: tuple,
    digests: tuple[str, ...],
    _images: tuple[bytes, ...],
    attack_name: str,
    epsilons: tuple[float, ...],
    steps: int,
    seed: int,
) -> tuple[np.ndarray, int, tuple[tuple[int, str], ...]]:
    """``analysis.robustness.attack_curve`` on one piece of an image set, each image scored against the
    model's own clean prediction: the summed agreement ``(epsilons,)``, the images used, the skipped."""
    from analysis.robustness import attack_curve

    model = loaded_model(model_key)
    images, skipped = resources.decoded_images(_images)
    if not images:
        return np.zeros(len(epsilons)), 0, tuple(skipped)
    pictures = [image for _, image in images]
    curve = attack_curve(
        {"model": model},
        pictures,
        model.top1(pictures).tolist(),
        epsilons=epsilons,
        attack_name=attack_name,
        steps=steps,
        seed=seed,
    )
    return curve.accuracy["model"] * len(pictures), len(pictures), tuple(skipped)


@st.cache_data(show_spinner=False, max_entries=4 * MAX_RESULTS)
def transfer_chunk(
    model_keys: tuple[tuple, ...],
    digests: tuple[str, ...],
    _images: tuple[bytes, ...],
    attack_name: str,
    epsilon: float,
    steps: int,
    seed: int,
) -> tuple[np.ndarray, int, tuple[tuple[int, str], ...]]:
    """``analysis.robustness.transfer_matrix`` on the images of one piece where every model predicts the
    same clean class (that class is the label): the summed ``(models, models)`` accuracy, the images used,
    the skipped (unreadable, or the models disagree on the clean image)."""
    from analysis.robustness import transfer_matrix

    models = {str(i): loaded_model(key) for i, key in enumerate(model_keys)}
    images, skipped = resources.decoded_images(_images)
    agreed, labels = [], []
    for index, image in images:
        classes = {int(model.top1([image])[0]) for model in models.values()}
        if len(classes) == 1:
            agreed.append(image)
            labels.append(classes.pop())
        else:
            skipped.append((index, "the models disagree on the clean image (left out of the transfer)"))
    if not agreed:
        return np.zeros((len(models), len(models))), 0, tuple(skipped)
    _, matrix = transfer_matrix(
        models, agreed, labels, epsilon=epsilon, attack_name=attack_name, steps=steps, seed=seed
    )
    return matrix * len(agreed), len(agreed), tuple(skipped)


@st.cache_data(show_spinner="Corrupting the image…", max_entries=MAX_RESULTS)
def corruption_view(
    model_key: tuple, digest: str, _image_bytes: bytes, corruption: str, severity: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(corrupted image (H, W, 3) uint8, probabilities (classes,))``: the model's input crop corrupted
    (``analysis.robustness.model_corruption`` with seed 0, ImageNet-C's protocol), as the image-set
    curves corrupt it."""
    from analysis.robustness import model_corruption

    model = loaded_model(model_key)
    corrupted = model_corruption(model, load_image(_image_bytes), corruption, severity, seed=0)
    with torch.no_grad():
        logits = model.model(model.preprocess(Image.fromarray(corrupted), cropped=True).to(model.device)).float()
    return corrupted, model.probabilities(logits)[0].cpu().numpy()


@st.cache_data(show_spinner=False, max_entries=4 * MAX_RESULTS)
def corruption_chunk(
    model_keys: tuple[tuple, ...],
    digests: tuple[str, ...],
    _images: tuple[bytes, ...],
    corruptions: tuple[str, ...],
    severities: tuple[int, ...],
    seed: int,
) -> tuple[np.ndarray, int, tuple[tuple[int, str], ...]]:
    """``analysis.robustness.corruption_curve`` on one piece, each model scored against its own clean
    prediction (image ``i`` of the piece: seed ``seed + i``): the summed agreement ``(models, corruptions,
    severities)``, the images used, the skipped."""
    from analysis.robustness import corruption_curve

    models = {str(i): loaded_model(key) for i, key in enumerate(model_keys)}
    images, skipped = resources.decoded_images(_images)
    if not images:
        return np.zeros((len(models), len(corruptions), len(severities))), 0, tuple(skipped)
    curve = corruption_curve(
        models,
        [image for _, image in images],
        None,
        corruptions=corruptions,
        severities=severities,
        image_seeds=[seed + index for index, _ in images],
    )
    return np.stack([curve.accuracy[name] for name in models]) * len(images), len(images), tuple(skipped)


@st.cache_data(show_spinner="Taking the texture away…", max_entries=MAX_RESULTS)
def texture_view(model_key: tuple, digest: str, _image_bytes: bytes, probe: str) -> tuple[np.ndarray, np.ndarray]:
    """``(the probed image (H, W, 3) uint8 at the image's own size, probabilities (classes,))``
    (``analysis.robustness.remove_texture``; a probe that needs no mask)."""
    from analysis.robustness import remove_texture

    model = loaded_model(model_key)
    probed = remove_texture(load_image(_image_bytes), probe).convert("RGB")
    with torch.no_grad():
        logits = model.model(model.preprocess(probed).to(model.device)).float()
    return np.asarray(probed), model.probabilities(logits)[0].cpu().numpy()


@st.cache_data(show_spinner=False, max_entries=4 * MAX_RESULTS)
def texture_chunk(
    model_keys: tuple[tuple, ...], digests: tuple[str, ...], _images: tuple[bytes, ...], probes: tuple[str, ...]
) -> tuple[np.ndarray, int, tuple[tuple[int, str], ...]]:
    """``analysis.robustness.texture_curve`` on one piece of an image set, each model scored against its
    own clean prediction: the summed agreement ``(models, probes)``, the images used, the skipped."""
    from analysis.robustness import texture_curve

    images, skipped = resources.decoded_images(_images)
    if not images:
        return np.zeros((len(model_keys), len(probes))), 0, tuple(skipped)
    pictures = [image for _, image in images]
    sums = []
    for key in model_keys:
        model = loaded_model(key)
        curve = texture_curve({"model": model}, pictures, model.top1(pictures).tolist(), probes=probes)
        sums.append(curve.accuracy["model"] * len(pictures))
    return np.stack(sums), len(pictures), tuple(skipped)


@st.cache_data(show_spinner="Showing the models cue-conflict scenes…", max_entries=8)
def shape_bias_counts(model_keys: tuple[tuple, ...], scenes: int, seed: int) -> np.ndarray:
    """``(models, 3)`` int: each model's shape, texture and neither decisions over ``scenes`` cue-conflict
    scenes of stream ``seed`` (``analysis.robustness.shape_bias_of``; the models predict the demo classes)."""
    from analysis.demo.cue_conflict import cue_conflict_scenes
    from analysis.robustness import shape_bias_of

    models = {str(i): loaded_model(key) for i, key in enumerate(model_keys)}
    biases = shape_bias_of(models, cue_conflict_scenes(scenes, seed))
    return np.array([[b.shape, b.texture, b.neither] for b in biases.values()], dtype=np.int64)


@st.cache_data(show_spinner="Pasting the patch…", max_entries=MAX_RESULTS)
def patch_on_image(model_key: tuple, digest: str, _image_bytes: bytes, patch: np.ndarray) -> dict:
    """``patch`` ``(C, s, s)`` in [0, 1] pasted at the centre of the image as the model sees it: the patched
    picture ``(H, W, 3)`` uint8, the clean and patched probabilities ``(classes,)`` and, for a
    global-attention ViT, the class token's attention share on the patch's tokens per layer
    (:func:`analysis.robustness.patch_attention_share`: ``layers``, ``clean_share``, ``patched_share``)."""
    from analysis.robustness import (
        measures_patch_attention,
        model_input,
        paste_patch,
        patch_attention_share,
        unit_images,
    )

    model = loaded_model(model_key)
    image = load_image(_image_bytes)
    unit = unit_images(model, [image])  # (1, C, H, W) in [0, 1]
    side = int(patch.shape[-1])
    position = ((int(unit.shape[-2]) - side) // 2, (int(unit.shape[-1]) - side) // 2)
    patched = paste_patch(unit, torch.as_tensor(patch), position)
    result: dict = {"picture": np.round(patched[0].permute(1, 2, 0).cpu().numpy() * 255).astype(np.uint8)}
    if measures_patch_attention(model):
        # one forward per picture: the share's attention records hold the logits of the same passes
        share = patch_attention_share(model, [image], torch.as_tensor(patch), position)
        logits = torch.cat([share.clean.logits, share.patched.logits]).float()
        result.update(
            layers=np.array(share.layers), clean_share=share.clean_share[:, 0], patched_share=share.patched_share[:, 0]
        )
    else:
        with torch.no_grad():
            logits = model.model(model_input(model, torch.cat([unit, patched]))).float()
    probabilities = model.probabilities(logits).cpu().numpy()
    result.update(clean=probabilities[0], patched=probabilities[1])
    return result


# --------------------------------------------------------------------------- adversarial patches

PATCH_RESULTS = 4  # adversarial-patch trainings kept (the least recently used is dropped first)


@st.cache_resource(show_spinner=False)
def _patch_results() -> RecordStore:
    """Adversarial-patch trainings so far, process-wide and locked (sessions share them): key -> dict."""
    return RecordStore(PATCH_RESULTS, 2**62, size=lambda value: 0)


def stored_patch_curve(key: tuple):
    """The patch curve of ``key`` (:func:`compute_patch_curve`'s arguments but ``progress``), if trained."""
    return _patch_results().peek(key)


def compute_patch_curve(
    model_keys: tuple[tuple, ...],
    shares: tuple[float, ...],
    train_scenes: int,
    held_out_scenes: int,
    steps: int,
    batch_size: int,
    target: int | None,
    seed: int,
    progress=None,
) -> dict:
    """Each model's own universal patch per share, trained for ``steps`` steps of ``batch_size`` scenes on
    ``train_scenes`` demo scenes (stream ``PATCH_TRAIN_SEED``) and scored with the noise control on
    ``held_out_scenes`` held-out ones (stream ``seed``, checked disjoint:
    :func:`analysis.robustness.demo_patch_scenes`; :func:`analysis.robustness.patch_size_curve`), untargeted
    or towards class ``target``, and the transfer matrix of the largest share's patches
    (:func:`analysis.robustness.patch_transfer_matrix`). Kept for later runs and sessions.
    ``progress(done, total)``: the training's progress (of the session that trains)."""
    key = (model_keys, shares, train_scenes, held_out_scenes, steps, batch_size, target, seed)
    return _patch_results().get(
        key,
        lambda: _patch_curve(
            model_keys, shares, train_scenes, held_out_scenes, steps, batch_size, target, seed, progress
        ),
    )


def _patch_curve(model_keys, shares, train_scenes, held_out_scenes, steps, batch_size, target, seed, progress) -> dict:
    from analysis.robustness import demo_patch_scenes, patch_size_curve, patch_transfer_matrix

    models = {str(i): loaded_model(key) for i, key in enumerate(model_keys)}
    scenes = demo_patch_scenes(held_out_scenes, seed, train_scenes=train_scenes)
    held, held_labels = scenes.held_out_images, scenes.held_out_labels
    curve = patch_size_curve(
        models, scenes.train_images, scenes.train_labels, shares=shares, eval_images=held, eval_labels=held_labels,
        target=target, steps=steps, batch_size=batch_size, seed=seed, progress=progress,
    )  # fmt: skip
    largest = {name: patches[-1] for name, patches in curve.patches.items()}
    sizes = {tuple(int(v) for v in model.spec.img_size) for model in models.values()}
    matrix = patch_transfer_matrix(models, largest, held, held_labels, seed=seed + 1)[1] if len(sizes) == 1 else None
    order = list(models)
    hits, noise_hits = curve.target_rate, curve.noise_target_rate  # None untargeted
    return {
        "accuracy": np.stack([curve.accuracy[n] for n in order]),  # (models, shares)
        "noise_accuracy": np.stack([curve.noise_accuracy[n] for n in order]),
        "fooling_rate": np.stack([curve.fooling_rate[n] for n in order]),
        "clean_accuracy": np.array([curve.clean_accuracy[n] for n in order]),
        # targeted: (models, shares) the share of patched held-out scenes predicted as the target; else None
        "target_rate": None if hits is None else np.stack([hits[n] for n in order]),
        "noise_target_rate": None if noise_hits is None else np.stack([noise_hits[n] for n in order]),
        "losses": np.array([[p.losses for p in curve.patches[n]] for n in order]),  # (models, shares, steps)
        "largest_patches": [largest[n].patch.numpy() for n in order],  # (C, s, s) each, in [0, 1]
        "transfer": matrix,  # (models, models) or None (input sizes differ)
    }
