"""Perturbation curves: how fast the class score falls when the patches an explanation ranks
first are removed (deletion), or rises when they are restored (insertion).

A patch is "removed" by replacing its pixels with a baseline image's pixels (the model's
normalised zero, i.e. the dataset mean colour, by default; Chefer et al. and RISE do the same).
Patches are ranked by the saliency map, ties broken by patch order.
"""

from __future__ import annotations

import numpy as np
import torch

from ..base.arguments import check_int
from ..base.errors import AnalysisError
from ..base.image_ops import BASELINES, baseline_pixels, patch_grid, patch_pixel_mask

__all__ = [
    "CURVE_MODES",
    "CURVE_METRICS",
    "PERTURBATION_FRACTIONS",
    "patch_ranking",
    "perturbed_inputs",
    "perturbation_curve",
    "area_under_curve",
    "map_cells",
]

#: ``deletion``: remove the top-ranked patches first (a faithful map falls fast: low AUC);
#: ``insertion``: start from the baseline and restore the top-ranked patches first (high AUC).
CURVE_MODES = ("deletion", "insertion")
#: Chefer et al.'s positive / negative perturbation removes 0%, 10%, ..., 90% of the patches.
PERTURBATION_FRACTIONS = tuple(i / 10 for i in range(10))


def patch_ranking(saliency: torch.Tensor, *, most_first: bool = True) -> torch.Tensor:
    """``(gh, gw)`` map -> ``(N,)`` row-major patch indices, highest (or lowest) first; ties
    keep patch order.

    Parameters
    ----------
    saliency : torch.Tensor
        ``(gh, gw)`` map (any array-like; flattened row-major).
    most_first : bool, default True
        Highest saliency first; ``False``, lowest first.

    Returns
    -------
    torch.Tensor
        ``(N,)`` long, ``N = gh·gw``.

    Raises
    ------
    AnalysisError
        The map has NaN or infinite values.
    """
    flat = torch.as_tensor(saliency).detach().reshape(-1).double()
    if not torch.isfinite(flat).all():
        raise AnalysisError("The saliency map has NaN or infinite values: it cannot rank patches.")
    return torch.sort(-flat if most_first else flat, stable=True).indices


def perturbed_inputs(
    pixels: torch.Tensor,
    replacement: torch.Tensor,
    patch_sets: list[torch.Tensor],
    patch_size: tuple[int, int],
    grid_size: tuple[int, int],
) -> torch.Tensor:
    """``K`` copies of one image, copy ``k`` with the patches in ``patch_sets[k]`` taken from
    ``replacement``.

    Parameters
    ----------
    pixels : torch.Tensor
        ``(3, H, W)`` the image.
    replacement : torch.Tensor
        ``(3, H, W)`` on the device of ``pixels``: where the chosen patches' pixels come from.
    patch_sets : list of torch.Tensor
        ``K`` sets of row-major patch indices into the ``(gh, gw)`` grid.
    patch_size : tuple of int
        ``(ph, pw)``, a patch's (cell's) side in pixels.
    grid_size : tuple of int
        ``(gh, gw)``, the grid.

    Returns
    -------
    torch.Tensor
        ``(K, 3, H, W)`` on the device of ``pixels``; pixels no patch covers are kept.
    """
    mask = patch_pixel_mask(
        patch_grid(patch_sets, grid_size), patch_size, (pixels.shape[-2], pixels.shape[-1])
    )  # (K, H, W)
    mask = mask[:, None].to(pixels.device)  # (K, 1, H, W)
    return torch.where(mask, replacement[None], pixels[None])


def map_cells(spec, shape: tuple[int, ...]) -> tuple[tuple[int, int], tuple[int, int]]:
    """``(grid_size, cell size in pixels)`` of a saliency map of ``shape``: the model's patch
    grid (``spec.grid_size`` of ``spec.patch_size``), or for a windowed model (Swin, SAM) the
    layer grid of that shape (``spec.geometry(l).grid_size`` of ``.stride`` pixels, e.g. the
    last stage's for Grad-CAM).

    Parameters
    ----------
    spec : ViTSpec
        The model's geometry.
    shape : tuple of int
        The map's shape ``(gh, gw)``.

    Returns
    -------
    tuple of (tuple of int, tuple of int)
        ``((gh, gw), (sy, sx))``: the grid and a cell's size in input pixels.

    Raises
    ------
    AnalysisError
        ``shape`` is neither the patch grid nor one of the layer grids.
    """
    if tuple(shape) == tuple(spec.grid_size):
        return tuple(spec.grid_size), tuple(spec.patch_size)
    for geometry in spec.layer_geometry:
        if tuple(shape) == tuple(geometry.grid_size):
            return geometry.grid_size, geometry.stride
    grids = sorted({tuple(g.grid_size) for g in spec.layer_geometry} | {tuple(spec.grid_size)})
    raise AnalysisError(
        f"The saliency map is {tuple(shape)}, the model's grid is {spec.grid_size}"
        + (f" (its layer grids: {grids})." if len(grids) > 1 else ".")
    )


#: What a curve measures at each step: the target's softmax ``probability`` (deletion and
#: insertion, as in RISE), or ``top1``: 1 while the target is still the top class (Chefer et
#: al.'s positive / negative perturbation accuracy).
CURVE_METRICS = ("probability", "top1")


def _measure(vit, batch: torch.Tensor, target: int, metric: str, chunk: int, value=None) -> torch.Tensor:
    out = []
    with torch.no_grad():
        for start in range(0, len(batch), chunk):
            logits = vit.model(batch[start : start + chunk].to(vit.device)).float()
            if value is not None:
                out.append(value(logits).double().cpu())
                continue
            logits = logits.cpu()
            if metric == "probability":
                out.append(vit.probabilities(logits)[:, target])
            else:
                out.append((logits.argmax(-1) == target).double())
    return torch.cat(out)


def perturbation_curve(
    vit,
    pixels: torch.Tensor,
    saliency: torch.Tensor,
    target: int,
    *,
    mode: str = "deletion",
    baseline: str = BASELINES[0],
    steps: int = 16,
    fractions=None,
    most_first: bool = True,
    metric: str = "probability",
    chunk: int = 64,
    value=None,
) -> tuple[np.ndarray, np.ndarray]:
    """The perturbation curve of one image: the model's value at each fraction of patches removed.

    At fraction ``f`` the ``round(f·N)`` patches ranked first by ``saliency`` are removed
    (``deletion``) or are the only ones kept (``insertion``); the value is the softmax
    probability of ``target`` (or, ``metric="top1"``, whether it is still the top class).
    A windowed model's (Swin, SAM) map may lie on any of its layer grids (:func:`map_cells`):
    its cells are then what is removed.

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`).
    pixels : torch.Tensor
        ``(1, 3, H, W)`` preprocessed input, one image.
    saliency : torch.Tensor
        ``(gh, gw)`` map on the patch grid or one of the layer grids, finite.
    target : int
        The class whose probability (or top-1) is measured; unused with ``value``.
    mode : str, default "deletion"
        One of :data:`CURVE_MODES`: ``"deletion"`` or ``"insertion"``.
    baseline : str, default "mean"
        What removed patches become, one of :data:`BASELINES`.
    steps : int, default 16
        ``fractions`` default to ``steps + 1`` even points on [0, 1] (at least 1; ignored when
        ``fractions`` is given).
    fractions : sequence of float or None, default None
        The fractions of patches removed (kept); ``None``, the ``steps + 1`` even points.
    most_first : bool, default True
        ``False`` ranks the lowest saliency first (negative perturbation).
    metric : str, default "probability"
        One of :data:`CURVE_METRICS`: ``"probability"`` or ``"top1"``.
    chunk : int, default 64
        Perturbed inputs per forward pass.
    value : callable or None, default None
        ``value(output (K, ...)) -> (K,)``, measures something else of the model's output
        instead of ``metric`` (a two-tower model's image–text score of the image embedding:
        :func:`~analysis.faithfulness.text_benchmark.text_benchmark`).

    Returns
    -------
    tuple of numpy.ndarray
        ``(fractions, values)``, each ``(S,)`` float64.

    Raises
    ------
    AnalysisError
        An unknown ``mode``, ``metric`` or ``baseline``; ``pixels`` not ``(1, 3, H, W)``; a
        ``saliency`` shape that is no grid of the model, or non-finite values; ``steps < 1``.
    """
    if mode not in CURVE_MODES:
        raise AnalysisError(f"mode must be one of {', '.join(CURVE_MODES)}, got {mode!r}.")
    if metric not in CURVE_METRICS:
        raise AnalysisError(f"metric must be one of {', '.join(CURVE_METRICS)}, got {metric!r}.")
    if baseline not in BASELINES:
        raise AnalysisError(f"baseline must be one of {', '.join(BASELINES)}, got {baseline!r}.")
    spec = vit.spec
    if pixels.ndim != 4 or pixels.shape[0] != 1:
        raise AnalysisError(f"perturbation_curve takes one image (1, 3, H, W), got {tuple(pixels.shape)}.")
    grid, cell = map_cells(spec, tuple(torch.as_tensor(saliency).shape))
    if fractions is None:
        steps = check_int("steps", steps, minimum=1)
        fractions = np.linspace(0.0, 1.0, steps + 1)
    fractions = np.asarray(fractions, dtype=np.float64)
    n = grid[0] * grid[1]
    order = patch_ranking(saliency, most_first=most_first)
    image = pixels[0].detach().float().cpu()
    reference = baseline_pixels(vit, pixels.detach().float().cpu(), baseline)[0]
    counts = [int(round(f * n)) for f in fractions]
    if mode == "deletion":
        batch = perturbed_inputs(image, reference, [order[:k] for k in counts], cell, grid)
    else:  # the baseline with the first k patches restored
        batch = perturbed_inputs(reference, image, [order[:k] for k in counts], cell, grid)
    return fractions, _measure(vit, batch, int(target), metric, chunk, value).numpy().astype(np.float64)


def area_under_curve(fractions, values) -> float:
    """Trapezoidal area ``Σ_i (f_{i+1} − f_i)·(v_i + v_{i+1})/2``.

    Parameters
    ----------
    fractions : array_like
        ``(S,)`` the x values ``f``.
    values : array_like
        ``(S,)`` the y values ``v``.

    Returns
    -------
    float
        The area (0 for one point).
    """
    f, v = np.asarray(fractions, np.float64), np.asarray(values, np.float64)
    return float(np.sum(np.diff(f) * (v[1:] + v[:-1]) / 2))
