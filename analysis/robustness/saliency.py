"""The robustness probes' attention saliency: which map stands for "where the model looks" on each
model, in one place. A model whose layers attend over one token sequence (a ViT) gives its
class-token attention rollout (Abnar & Zuidema 2020, as the ViT paper's Figure 6); a model whose
layers attend inside windows (Swin, SAM), where the rollout across windows and stages is not
defined without an approximation, gives its last layer's attention received by each cell, the mean
over every query cell and head, on that layer's own grid."""

from __future__ import annotations

import torch

from ..attention.maps import attention_map
from ..attention.rollout import attention_rollout
from ..engine.capture import capture_attention
from ..records.attention import AttentionRecord

__all__ = ["SALIENCY_NAMES", "attention_saliency", "is_last_layer_attention", "saliency_description"]

#: what ``Probe.saliency`` is, per kind of model
SALIENCY_NAMES = {
    "vit": "class-token attention rollout",
    "windowed": "last layer's attention, mean over every query cell and head",
    "cnn": "Grad-CAM",
}


def is_last_layer_attention(saliency_name: str) -> bool:
    """Whether a probe's map (its ``saliency_name``) is a windowed model's last-layer attention on
    that layer's own grid (:data:`SALIENCY_NAMES` ``["windowed"]``), not a rollout over the patch grid.

    Parameters
    ----------
    saliency_name : str
        A :class:`Probe`'s ``saliency_name`` (a value of :data:`SALIENCY_NAMES`).

    Returns
    -------
    bool
        ``True`` for the windowed model's last-layer attention.
    """
    return saliency_name == SALIENCY_NAMES["windowed"]


def saliency_description(saliency_name: str, grid: tuple[int, int], image_size: tuple[int, int]) -> str:
    """What a probe's ``(gh, gw)`` map over an ``image_size`` ``(H, W)`` input is, for a caption:
    its ``saliency_name``, and for a windowed model's map (:func:`is_last_layer_attention`) the grid
    it lies on, ``", on the last layer's {gw}×{gh} grid ({sx} px cells; no rollout across
    windows and stages)"`` with ``sx = max(1, ⌊W/gw⌋)``.

    Parameters
    ----------
    saliency_name : str
        The probe's ``saliency_name`` (a value of :data:`SALIENCY_NAMES`).
    grid : tuple of int
        ``(gh, gw)``, the map's shape.
    image_size : tuple of int
        ``(H, W)`` of the model's input.

    Returns
    -------
    str
        ``saliency_name``, with the grid clause appended for a windowed model's map.
    """
    if not is_last_layer_attention(saliency_name):
        return saliency_name
    gh, gw = int(grid[0]), int(grid[1])
    width = int(image_size[1])
    return (
        f"{saliency_name}, on the last layer's {gw}×{gh} grid "
        f"({max(1, width // gw)} px cells; no rollout across windows and stages)"
    )


def attention_saliency(
    vit, pixels: torch.Tensor, *, every_layer: bool = False
) -> tuple[AttentionRecord, torch.Tensor, str]:
    """One forward pass and the model's attention saliency (the module docstring's rule):

        rollout:    S = (R_{L-1} ⋯ R_0)[cls, patches],  R_l = ½·Ā_l + ½·I  (Ā_l: mean over heads)
        last layer: S[c] = mean over query cells q and heads h of A_{L-1}[h, q, c]

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`).
    pixels : torch.Tensor
        ``(B, 3, H, W)`` preprocessed input.
    every_layer : bool, default False
        Capture every layer even where the saliency reads only the last (the caller also wants
        each layer's attention, e.g. its mean attention distance).

    Returns
    -------
    tuple of (AttentionRecord, torch.Tensor, str)
        ``(record, saliency, name)``: the captured pass, ``(B, gh, gw)`` float saliency on the grid
        it lies on (the patch grid, or the last layer's), and its name (a value of
        :data:`SALIENCY_NAMES`).
    """
    if vit.spec.attends_globally:
        record = capture_attention(vit, pixels)
        return record, attention_rollout(record), SALIENCY_NAMES["vit"]
    last = vit.spec.num_layers - 1
    record = capture_attention(vit, pixels, layers=None if every_layer else [last])
    return record, attention_map(record, last, query="mean"), SALIENCY_NAMES["windowed"]
