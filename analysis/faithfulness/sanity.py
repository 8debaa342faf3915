"""Model-randomisation sanity check (Adebayo et al. 2018, "Sanity Checks for Saliency Maps"):
an explanation that barely changes when the model's weights are re-initialised explains the
image, not the model.

Cascading randomisation, from the top down: stage 0 re-initialises the head, stage ``k``
also blocks ``L−1 … L−k``. Always on a deep copy: the loaded (shared) model is never touched.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import torch
import torch.nn as nn

from ..base.arguments import check_int
from ..model.adapters.registry import model_blocks

__all__ = ["randomized_copy", "rank_correlation"]


def _reinitialise(module: nn.Module) -> None:
    """``reset_parameters()`` of ``module`` and every submodule that has one (Linear, Conv,
    LayerNorm, ...); parameters of layers without one (e.g. LayerScale's γ) are kept."""
    for part in module.modules():
        reset = getattr(part, "reset_parameters", None)
        if callable(reset):
            reset()


def randomized_copy(vit, blocks_from_top: int, *, seed: int = 0):
    """A :class:`~analysis.LoadedViT` whose head and top ``blocks_from_top`` blocks are
    re-initialised (``reset_parameters`` of every layer in them), seeded; the caller's global
    random state is left as it was. A deep copy: ``vit`` is not touched.

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`).
    blocks_from_top : int
        How many of the last blocks are re-initialised besides the head (at least 0; more than
        the model has means all).
    seed : int, default 0
        The seed of the re-initialisation.

    Returns
    -------
    LoadedViT
        A copy with the re-initialised, frozen model.

    Raises
    ------
    AnalysisError
        ``blocks_from_top`` is not an integer at least 0.
    """
    blocks_from_top = check_int("blocks_from_top", blocks_from_top, minimum=0)
    model = copy.deepcopy(vit.model)
    blocks = [block for _, block in model_blocks(model)]  # in order, every family's (Swin: across stages)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = model.get_classifier() if hasattr(model, "get_classifier") else getattr(model, "head", None)
        if isinstance(head, nn.Module):
            _reinitialise(head)
        for block in blocks[len(blocks) - min(blocks_from_top, len(blocks)) :]:
            _reinitialise(block)
    model.requires_grad_(False)
    return dataclasses.replace(vit, model=model, _cpu_copy=None)


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n with ties given their average rank."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.arange(1, len(values) + 1)
    for value in np.unique(values):
        tied = values == value
        if tied.sum() > 1:
            ranks[tied] = ranks[tied].mean()
    return ranks


def rank_correlation(a, b) -> float:
    """Spearman's ρ of two maps (Pearson correlation of their average ranks); 0 when either
    map is constant.

    Parameters
    ----------
    a : torch.Tensor or array_like
        A map, e.g. ``(gh, gw)`` (flattened).
    b : torch.Tensor or array_like
        A map with as many values as ``a``.

    Returns
    -------
    float
        ρ in ``[-1, 1]``.
    """
    x = _ranks(np.asarray(torch.as_tensor(a).double().reshape(-1)))
    y = _ranks(np.asarray(torch.as_tensor(b).double().reshape(-1)))
    x, y = x - x.mean(), y - y.mean()
    denominator = np.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / denominator) if denominator > 0 else 0.0
