"""One image, one perturbation level: what the app's Robustness page shows. The perturbed
input, the logits, and the model's map before and after (a ViT's class-token rollout, over the
kept tokens under token drop; a windowed model's last-layer attention; a CNN's Grad-CAM of the
clean prediction)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..attention.maps import attention_map
from ..attention.rollout import attention_rollout
from ..engine.capture import capture_attention
from .cnn import LoadedCNN, cnn_gradcam
from .curves import perturb
from .dropped import kept_rollout, token_drop_attention
from .perturbations import check_token_drop, drop_pixels, patch_drop_indices

__all__ = ["Probe", "probe", "SALIENCY_NAMES", "saliency_description", "is_last_layer_attention"]

#: what ``Probe.saliency`` is, per kind of model
SALIENCY_NAMES = {
    "vit": "class-token attention rollout",
    "windowed": "last layer's attention, mean over every query cell and head",
    "cnn": "Grad-CAM",
}


def is_last_layer_attention(saliency_name: str) -> bool:
    """Whether a probe's map (its ``saliency_name``) is a windowed model's last-layer attention on
    that layer's own grid (:data:`SALIENCY_NAMES` ``["windowed"]``), not a rollout over the patch grid."""
    return saliency_name == SALIENCY_NAMES["windowed"]


def saliency_description(saliency_name: str, grid: tuple[int, int], image_size: tuple[int, int]) -> str:
    """What a probe's ``(gh, gw)`` map over an ``image_size`` ``(H, W)`` input is, for a caption:
    its ``saliency_name``, and for a windowed model's map (:func:`is_last_layer_attention`) the grid
    it lies on, ``", on the last layer's {gw}×{gh} grid ({sx} px cells; no rollout across
    windows and stages)"`` with ``sx = max(1, ⌊W/gw⌋)``."""
    if not is_last_layer_attention(saliency_name):
        return saliency_name
    gh, gw = int(grid[0]), int(grid[1])
    width = int(image_size[1])
    return (
        f"{saliency_name}, on the last layer's {gw}×{gh} grid "
        f"({max(1, width // gw)} px cells; no rollout across windows and stages)"
    )


@dataclass(frozen=True)
class Probe:
    """pixels ``(1, 3, H, W)`` as the model saw them (under token drop: the clean pixels);
    logits ``(1, classes)``; dropped: the removed patch indices (drops only, else None);
    saliency: ``(gh, gw)`` ViT rollout (NaN at dropped tokens), ``(h, w)`` CNN Grad-CAM, or for
    a windowed model (Swin, SAM: no rollout across windows and stages) the last layer's
    attention map on its own grid (``spec.geometry(-1).grid_size``), averaged over every query
    cell and head (:func:`~analysis.attention.maps.attention_map` with ``query="mean"``):
    how much attention each cell receives. ``saliency_name`` says which
    (a value of :data:`SALIENCY_NAMES`)."""

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
    image under ``perturbation`` at ``level`` (see :func:`~analysis.robustness.perturb`; the
    selection only matters for drops). ``target``: the CNN's Grad-CAM class (default: its
    prediction on these pixels)."""
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
    if not model.spec.attends_globally:
        last = model.spec.num_layers - 1
        record = capture_attention(model, perturbed, layers=[last])
        saliency = attention_map(record, last, query="mean")[0]  # (gh, gw) of the last layer's grid
        return Probe(perturbed, record.logits.float(), dropped, saliency, SALIENCY_NAMES["windowed"])
    record = capture_attention(model, perturbed)
    return Probe(perturbed, record.logits.float(), dropped, attention_rollout(record)[0])
