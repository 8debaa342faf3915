"""One image, one perturbation level: what the app's Robustness page shows. The perturbed
input, the logits, and the model's map before and after (a ViT's class-token rollout, over the
kept tokens under token drop; a windowed model's last-layer attention; a CNN's Grad-CAM of the
clean prediction)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .cnn import LoadedCNN, cnn_gradcam
from .curves import perturb
from .dropped import kept_rollout, token_drop_attention
from .perturbations import check_token_drop, drop_pixels, patch_drop_indices
from .saliency import SALIENCY_NAMES, attention_saliency

__all__ = ["Probe", "probe"]


@dataclass(frozen=True)
class Probe:
    """One image under one perturbation level: what :func:`probe` returns.

    Attributes
    ----------
    pixels : torch.Tensor
        ``(1, 3, H, W)`` as the model saw them (under token drop: the clean pixels).
    logits : torch.Tensor
        ``(1, classes)`` float32.
    dropped : torch.Tensor or None
        The removed patch indices, row-major (pixel and token drops only, else ``None``).
    saliency : torch.Tensor
        ``(gh, gw)`` ViT class-token rollout (under token drop: NaN at the dropped tokens),
        ``(h, w)`` CNN Grad-CAM, or for a windowed model (Swin, SAM: no rollout across windows and
        stages) the last layer's attention map on its own grid (``spec.geometry(-1).grid_size``),
        averaged over every query cell and head (:func:`~analysis.attention.maps.attention_map`
        with ``query="mean"``): how much attention each cell receives.
    saliency_name : str
        Which of those ``saliency`` is (a value of :data:`SALIENCY_NAMES`).
    """

    pixels: torch.Tensor
    logits: torch.Tensor
    dropped: torch.Tensor | None
    saliency: torch.Tensor
    saliency_name: str = SALIENCY_NAMES["vit"]


def probe(
    model,
    pixels: torch.Tensor,
    perturbation: str,
    level: float,
    *,
    seed: int = 0,
    selection: str = "random",
    saliency=None,
    mask=None,
    target: int | None = None,
) -> Probe:
    """``model`` (a :class:`~analysis.LoadedViT` or :class:`LoadedCNN`) on one ``(1, 3, H, W)``
    image under ``perturbation`` at ``level`` (see :func:`~analysis.robustness.perturb`).

    Parameters
    ----------
    model : LoadedViT or LoadedCNN
        The model probed.
    pixels : torch.Tensor
        ``(1, 3, H, W)`` preprocessed image.
    perturbation : str
        A key of :data:`PERTURBATIONS` (``"token_drop"`` needs a ViT :func:`check_token_drop` accepts).
    level : float
        The perturbation's level (:data:`PERTURBATIONS` says what it means).
    seed : int, default 0
        Seed of random drops, shuffles and noise.
    selection : str, default "random"
        Which patches a drop removes (:data:`DROP_SELECTIONS`); only matters for drops.
    saliency : array-like or None, default None
        Per-patch saliency for ``"most_salient"`` / ``"least_salient"`` drops
        (:func:`patch_drop_indices`).
    mask : array-like or None, default None
        The object's ``(gh, gw)`` patch mask for ``"foreground"`` / ``"background"`` drops.
    target : int or None, default None
        The CNN's Grad-CAM class; ``None``, its prediction on these pixels. Unused for a ViT.

    Returns
    -------
    Probe
        The perturbed input, logits, dropped patches and the model's map.

    Raises
    ------
    AnalysisError
        An unknown ``perturbation``; token drop on a model that cannot drop tokens; a bad drop
        ``level`` / ``selection`` / ``saliency`` / ``mask`` (:func:`patch_drop_indices`) or shuffle
        grid; a Grad-CAM ``target`` out of range.
    """
    if perturbation == "token_drop":
        check_token_drop(model)
    dropped = None
    if perturbation in ("pixel_drop", "token_drop"):
        dropped = patch_drop_indices(model.spec, level, selection=selection, seed=seed, saliency=saliency, mask=mask)
        perturbed = drop_pixels(pixels, model.spec, dropped) if perturbation == "pixel_drop" else pixels
    else:
        perturbed, _ = perturb(model, pixels, perturbation, level, seed=seed)
    if isinstance(model, LoadedCNN):
        with torch.no_grad():
            logits = model.model(perturbed.to(model.device)).float().cpu()
        return Probe(perturbed, logits, dropped, cnn_gradcam(model, perturbed, target)[0], SALIENCY_NAMES["cnn"])
    if perturbation == "token_drop":
        passed = token_drop_attention(model, perturbed, dropped)
        return Probe(perturbed, passed.logits, dropped, kept_rollout(passed)[0])
    record, saliency, name = attention_saliency(model, perturbed)
    return Probe(perturbed, record.logits.float(), dropped, saliency[0], name)
