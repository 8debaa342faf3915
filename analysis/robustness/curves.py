"""Robustness curves: accuracy (or agreement with the clean prediction) against the level of
one perturbation, streamed over an image set, with the ViT's attention summary per level."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from ..attention.distance import mean_attention_distance
from ..base.errors import AnalysisError
from ..base.image_ops import gaussian_blur, gaussian_noise
from ..base.images import load_image
from ..base.progress import Progress
from .dropped import kept_attention_distance, kept_rollout, token_drop_attention
from .perturbations import check_token_drop, drop_pixels, patch_drop_indices, shuffle_patches, token_drop
from .saliency import SALIENCY_NAMES, attention_saliency

__all__ = ["PERTURBATIONS", "SET_LEVELS", "RobustnessCurve", "perturb", "robustness_curve"]

#: perturbation -> what its level means
PERTURBATIONS = {
    "token_drop": "fraction of patch tokens removed after the position embedding (ViT only; not Swin, SAM or CNNs)",
    "pixel_drop": "fraction of patches set to the mean colour",
    "shuffle": "shuffle grid g (g x g blocks permuted; 1 = none)",
    "noise": "Gaussian noise σ (normalised units)",
    "blur": "Gaussian blur σ (pixels)",
}

#: levels measured over an image set (shuffle: every grid that divides the patch grid)
SET_LEVELS = {
    "token_drop": (0.0, 0.25, 0.5, 0.75, 0.9),
    "pixel_drop": (0.0, 0.25, 0.5, 0.75, 0.9),
    "noise": (0.0, 0.25, 0.5, 1.0, 2.0),
    "blur": (0.0, 1.0, 2.0, 4.0, 8.0),
}


@dataclass(frozen=True)
class RobustnessCurve:
    """One value per level of one perturbation, averaged over an image set (:func:`robustness_curve`).

    ViT only (NaN otherwise, and with ``attention=False``): ``attention_distance`` and
    ``rollout_entropy``; under token drop both are of the shorter sequence, over the patches that
    remain (NaN at a level that drops every patch). A windowed model (Swin, SAM) has
    ``attention_distance``, each layer on its own stage grid
    (:func:`~analysis.mean_attention_distance`, averaged over every layer's own heads), and
    ``rollout_entropy`` NaN (no class-token rollout across its windows and stages).

    Attributes
    ----------
    perturbation : str
        The key of :data:`PERTURBATIONS` measured.
    levels : tuple of float
        The ``S`` levels, in the order given.
    metric : str
        ``"accuracy"`` (top-1 against ``labels``) or ``"agreement"`` (with the clean prediction,
        without labels).
    score : numpy.ndarray
        ``(S,)`` float64: top-1 accuracy against the labels, or agreement with the clean prediction
        (``metric`` says which).
    probability : numpy.ndarray
        ``(S,)`` float64: mean probability of the label (or the clean prediction), by the model's
        own rule (softmax for a classifier).
    attention_distance : numpy.ndarray
        ``(S,)`` float64: mean attention distance in input pixels, over layers, heads and images.
    rollout_entropy : numpy.ndarray
        ``(S,)`` float64: entropy in nats of the class-token rollout normalised over the patches,
        mean over images.
    images : int
        How many images were scored.
    """

    perturbation: str
    levels: tuple[float, ...]
    metric: str
    score: np.ndarray
    probability: np.ndarray
    attention_distance: np.ndarray
    rollout_entropy: np.ndarray
    images: int


def perturb(
    vit,
    pixels: torch.Tensor,
    perturbation: str,
    level: float,
    *,
    seed: int = 0,
    selection: str = "random",
    saliency=None,
    mask=None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(pixels', dropped token indices or None)`` for one image batch at one level.

    Every perturbation but token drop is a function of the pixels and the patch grid only
    (``vit.spec.patch_size``, ``vit.spec.grid_size``: a windowed model's stem patches), so a
    ViT, a Swin, SAM or a CNN with the same grid get the same pixels.

    Parameters
    ----------
    vit : LoadedViT or LoadedCNN
        The model whose ``spec`` defines the patch grid.
    pixels : torch.Tensor
        ``(B, 3, H, W)`` preprocessed images.
    perturbation : str
        A key of :data:`PERTURBATIONS`.
    level : float
        The level (:data:`PERTURBATIONS` says what it means; a shuffle's is a whole grid size).
    seed : int, default 0
        Seed of random drops, shuffles and noise.
    selection : str, default "random"
        With ``saliency`` and ``mask``, chooses the dropped patches (:func:`patch_drop_indices`,
        :data:`DROP_SELECTIONS`).
    saliency : array-like or None, default None
        Per-patch saliency for the ``"most_salient"`` / ``"least_salient"`` selections.
    mask : array-like or None, default None
        The object's ``(gh, gw)`` patch mask for the ``"foreground"`` / ``"background"`` selections.

    Returns
    -------
    tuple of (torch.Tensor, torch.Tensor or None)
        The ``(B, 3, H, W)`` perturbed pixels (for ``"token_drop"``: ``pixels`` itself) and, for
        ``"token_drop"`` only, the patch indices to drop (for :func:`token_drop`), else ``None``.

    Raises
    ------
    AnalysisError
        An unknown ``perturbation``; a bad drop ``level`` / ``selection`` / ``saliency`` / ``mask``;
        a shuffle grid that does not split the patch grid into whole patches.
    """
    spec = vit.spec
    if perturbation in ("pixel_drop", "token_drop"):
        indices = patch_drop_indices(spec, level, selection=selection, seed=seed, saliency=saliency, mask=mask)
        return (drop_pixels(pixels, spec, indices), None) if perturbation == "pixel_drop" else (pixels, indices)
    if perturbation == "shuffle":
        return shuffle_patches(pixels, spec, int(level), seed=seed), None
    if perturbation == "noise":
        return gaussian_noise(pixels, float(level), seed=seed), None
    if perturbation == "blur":
        return gaussian_blur(pixels, float(level)), None
    raise AnalysisError(f"perturbation must be one of {', '.join(PERTURBATIONS)}, got {perturbation!r}.")


def _entropy(maps: torch.Tensor) -> torch.Tensor:
    p = maps.flatten(1).double()
    p = p / p.sum(1, keepdim=True).clamp(min=1e-300)
    return -(p * p.clamp(min=1e-300).log()).sum(1)


def robustness_curve(
    vit,
    images: Sequence,
    perturbation: str,
    levels: Sequence[float],
    labels: Sequence[int] | None = None,
    *,
    seed: int = 0,
    attention: bool = True,
    progress: Progress | None = None,
) -> RobustnessCurve:
    """Score ``vit`` (a :class:`~analysis.LoadedViT`, or a CNN from :func:`load_cnn`) on every
    image at every level of ``perturbation`` (:data:`PERTURBATIONS`).

    Image ``i`` at any level uses seed ``seed + i``, so random drops and shuffles are
    reproducible. Images are processed one at a time, so memory does not grow with the set.

    Parameters
    ----------
    vit : LoadedViT or LoadedCNN
        A classifier (a model without a class head is refused).
    images : Sequence
        Paths, bytes, PIL images or preprocessed ``(3, H, W)`` tensors.
    perturbation : str
        A key of :data:`PERTURBATIONS`.
    levels : Sequence of float
        The levels to measure, e.g. :data:`SET_LEVELS` ``[perturbation]``; shuffle levels are whole
        grid sizes.
    labels : Sequence of int or None, default None
        One class index per image: the score is accuracy; ``None``, agreement with the clean
        prediction.
    seed : int, default 0
        Image ``i`` uses ``seed + i``.
    attention : bool, default True
        ``False`` skips the attention summary (faster; its values are then NaN).
    progress : Progress or None, default None
        Called as ``progress(done, total)`` after each image.

    Returns
    -------
    RobustnessCurve
        One value per level, averaged over the images.

    Raises
    ------
    AnalysisError
        An unknown ``perturbation``; no levels or no images; as many labels as images not given, or
        a label out of range; a shuffle level that is not a whole grid size (or does not divide the
        patch grid); token drop on a model that cannot drop tokens; a model without a class head.
    """
    if perturbation not in PERTURBATIONS:
        raise AnalysisError(f"perturbation must be one of {', '.join(PERTURBATIONS)}, got {perturbation!r}.")
    levels = tuple(float(level) for level in levels)
    if not levels:
        raise AnalysisError("levels is empty: pass the perturbation levels to measure, e.g. [0, 0.25, 0.5].")
    if len(images) == 0:
        raise AnalysisError("No images: pass at least one.")
    if labels is not None and len(labels) != len(images):
        raise AnalysisError(f"{len(labels)} labels for {len(images)} images.")
    if perturbation == "shuffle":
        for level in levels:
            if level != int(level):
                raise AnalysisError(f"Shuffle levels are whole grid sizes, got {level}.")
    if perturbation == "token_drop":
        check_token_drop(vit)  # refuses models where token drop is undefined, before any work
    spec = vit.spec
    classes = spec.num_outputs
    if not spec.has_classifier:
        raise AnalysisError("Robustness curves score class predictions, and this model has no class head.")
    steps = len(levels)
    score = np.zeros(steps)
    probability = np.zeros(steps)
    distance = np.zeros(steps)
    entropy = np.zeros(steps)
    with_attention = attention and int(getattr(spec, "num_layers", 0)) > 0  # ViTs, Swin, SAM: not CNNs
    for index, image in enumerate(images):
        if isinstance(image, torch.Tensor):
            pixels = image[None]
        else:
            pixels = vit.preprocess(image.convert("RGB") if isinstance(image, Image.Image) else load_image(image))
        with torch.no_grad():
            clean = vit.model(pixels.to(vit.device)).float().cpu()
        reference = int(labels[index]) if labels is not None else int(clean.argmax(-1)[0])
        if not 0 <= reference < classes:
            raise AnalysisError(f"Label {reference} of image {index} is not one of the {classes} classes.")
        for step, level in enumerate(levels):
            perturbed, dropped = perturb(vit, pixels, perturbation, level, seed=seed + index)
            if with_attention and dropped is not None:  # the shorter sequence's own attention
                passed = token_drop_attention(vit, perturbed, dropped)
                logits = passed.logits
                kept = kept_rollout(passed)[0]
                if bool(kept.isnan().all()):  # every patch dropped: no patch attention to summarise
                    distance[step] = entropy[step] = math.nan
                else:
                    distance[step] += float(kept_attention_distance(passed).mean())
                    entropy[step] += float(_entropy(kept[~kept.isnan()][None])[0])
            elif with_attention:
                record, saliency, name = attention_saliency(vit, perturbed, every_layer=True)
                logits = record.logits
                distance[step] += float(mean_attention_distance(record).nanmean())  # NaN: heads a layer lacks
                if name == SALIENCY_NAMES["vit"]:  # the rollout's entropy; no rollout, no entropy
                    entropy[step] += float(_entropy(saliency)[0])
                else:
                    entropy[step] = math.nan
            else:
                with torch.no_grad():
                    if dropped is not None:
                        with token_drop(vit, dropped):
                            logits = vit.model(perturbed.to(vit.device)).float().cpu()
                    else:
                        logits = vit.model(perturbed.to(vit.device)).float().cpu()
            score[step] += float(int(logits.argmax(-1)[0]) == reference)
            probability[step] += float(vit.probabilities(logits)[0, reference])
        if progress is not None:
            progress(index + 1, len(images))
    n = len(images)
    nan = np.full(steps, math.nan)
    return RobustnessCurve(
        perturbation=perturbation,
        levels=levels,
        metric="accuracy" if labels is not None else "agreement",
        score=score / n,
        probability=probability / n,
        attention_distance=distance / n if with_attention else nan,
        rollout_entropy=entropy / n if with_attention else nan,
        images=n,
    )
