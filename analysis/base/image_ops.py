"""Operations on model-input pixels that several analyses share: Gaussian noise and blur
(robustness probes), the reference images that stand for "no information" (baselines of
integrated gradients, and what deletion/insertion fill removed patches with), and the one rule
that turns chosen patches into the pixels they cover (:func:`patch_pixel_mask`: pixel drop,
deletion/insertion, MAE's masks).

All take and return normalised ``(..., H, W)`` tensors (usually ``(B, 3, H, W)``, after the
model's own normalisation). Resizing patch maps to image pixels is
:func:`analysis.maps.upsampling.upsample_map`; resizing images to the model's input is the
model's own preprocessing (:mod:`analysis.base.preprocessing`).
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F

from .errors import AnalysisError

__all__ = ["gaussian_noise", "gaussian_blur", "BASELINES", "baseline_pixels", "patch_grid", "patch_pixel_mask"]

#: Baselines of integrated gradients and of the perturbation curves, the first the default of
#: both: ``"mean"`` (the normalised zero: the dataset mean colour), ``"black"`` (pixel value 0,
#: then the model's normalisation), ``"blur"`` (the image under a Gaussian blur with σ = one
#: patch side).
BASELINES = ("mean", "black", "blur")


def _check_sigma(sigma) -> float:
    if isinstance(sigma, bool) or not isinstance(sigma, numbers.Real) or sigma < 0:
        raise AnalysisError(f"sigma must be a non-negative number, got {sigma!r}.")
    return float(sigma)


def gaussian_noise(pixels: torch.Tensor, sigma: float, *, seed: int = 0) -> torch.Tensor:
    """``x + σ·ε``, ``ε ~ N(0, 1)`` (seeded), in normalised units.

    Parameters
    ----------
    pixels : torch.Tensor
        Normalised images ``(..., H, W)``, usually ``(B, 3, H, W)``.
    sigma : float
        Standard deviation ``σ`` of the noise, ``>= 0``, in normalised units.
    seed : int, default 0
        Seed of the CPU generator that draws ``ε`` (the same seed, the same noise).

    Returns
    -------
    torch.Tensor
        ``pixels + σ·ε``, same shape and dtype as ``pixels``.

    Raises
    ------
    AnalysisError
        ``sigma`` is not a non-negative number.
    """
    sigma = _check_sigma(sigma)
    noise = torch.randn(pixels.shape, generator=torch.Generator().manual_seed(int(seed)))
    return pixels + sigma * noise.to(pixels.dtype)


def gaussian_blur(pixels: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur with standard deviation ``sigma`` pixels (edges replicated;
    ``sigma = 0`` is the identity): ``k[t] ∝ exp(−t² / 2σ²)`` for ``|t| ≤ ⌈3σ⌉``, normalised
    to sum 1, applied along rows then columns.

    Parameters
    ----------
    pixels : torch.Tensor
        Normalised images ``(..., H, W)``, usually ``(B, 3, H, W)``.
    sigma : float
        Standard deviation in pixels, ``>= 0``.

    Returns
    -------
    torch.Tensor
        The blurred images, same shape and dtype as ``pixels`` (a copy when ``sigma = 0``).

    Raises
    ------
    AnalysisError
        ``sigma`` is not a non-negative number.
    """
    sigma = _check_sigma(sigma)
    if sigma == 0:
        return pixels.clone()
    radius = max(1, int(math.ceil(3 * sigma)))
    offsets = torch.arange(-radius, radius + 1, dtype=torch.float32)
    kernel = torch.exp(-0.5 * (offsets / sigma) ** 2)
    kernel = (kernel / kernel.sum()).to(pixels.dtype)
    out = pixels
    for shape, pad in (((1, 1, 1, -1), (radius, radius, 0, 0)), ((1, 1, -1, 1), (0, 0, radius, radius))):
        flat = F.pad(out.reshape(-1, 1, *out.shape[-2:]), pad, mode="replicate")
        out = F.conv2d(flat, kernel.reshape(shape)).reshape(pixels.shape)
    return out


def baseline_pixels(vit, pixels: torch.Tensor, baseline: str) -> torch.Tensor:
    """The ``baseline`` (one of :data:`BASELINES`) reference image for normalised ``pixels``
    ``(B, 3, H, W)``, same shape: black is ``(0 − mean) / std`` per channel, mean is 0, blur is
    :func:`gaussian_blur` with ``σ = max(patch side)`` pixels.

    Parameters
    ----------
    vit : LoadedViT
        The loaded model: its ``preprocessing`` (mean and std) and ``spec.patch_size``.
    pixels : torch.Tensor
        Normalised model input ``(B, 3, H, W)``.
    baseline : str
        ``"mean"``, ``"black"`` or ``"blur"``.

    Returns
    -------
    torch.Tensor
        ``(B, 3, H, W)``, the reference image in normalised units.

    Raises
    ------
    AnalysisError
        ``baseline`` is not one of :data:`BASELINES`.
    """
    if baseline not in BASELINES:
        raise AnalysisError(f"baseline must be one of {', '.join(BASELINES)}, got {baseline!r}.")
    if baseline == "black":
        black = vit.preprocessing.normalise(torch.zeros(pixels.shape[-3], 1, 1))  # (3, 1, 1): (0 − mean) / std
        return black.expand_as(pixels).clone()
    if baseline == "mean":
        return torch.zeros_like(pixels)
    return gaussian_blur(pixels, float(max(vit.spec.patch_size)))


def patch_grid(patch_sets, grid_size: tuple[int, int]) -> torch.Tensor:
    """``(K, gh, gw)`` bool: row ``k`` is True at the patches ``patch_sets[k]`` (row-major
    indices into the ``(gh, gw)`` grid, index ``r·gw + c``).

    Parameters
    ----------
    patch_sets : sequence of sequence of int
        ``K`` sets of patch indices (lists or tensors), each row-major into the grid.
    grid_size : tuple of int
        ``(gh, gw)``, the patch grid.

    Returns
    -------
    torch.Tensor
        ``(K, gh, gw)`` bool on the CPU.
    """
    gh, gw = grid_size
    grid = torch.zeros(len(patch_sets), gh * gw, dtype=torch.bool)
    for k, patches in enumerate(patch_sets):
        grid[k, torch.as_tensor(patches).to("cpu", torch.long).reshape(-1)] = True
    return grid.reshape(len(patch_sets), gh, gw)


def patch_pixel_mask(
    grid: torch.Tensor, patch_size: tuple[int, int], image_size: tuple[int, int] | None = None
) -> torch.Tensor:
    """``(..., gh, gw)`` patch values -> ``(..., H, W)``: each patch's value over the
    ``ph × pw`` pixels it covers (patch ``(r, c)`` covers rows ``r·ph … (r+1)·ph − 1`` and columns
    ``c·pw … (c+1)·pw − 1``). ``image_size`` larger than ``(gh·ph, gw·pw)`` pads with zeros (the
    pixels no patch covers, e.g. a border that the patch embedding drops); smaller crops.

    Parameters
    ----------
    grid : torch.Tensor
        Patch values ``(..., gh, gw)``, any dtype (e.g. bool from :func:`patch_grid`).
    patch_size : tuple of int
        ``(ph, pw)``, a patch's side in pixels.
    image_size : tuple of int or None, default None
        ``(H, W)`` of the output; ``None``, ``(gh·ph, gw·pw)``.

    Returns
    -------
    torch.Tensor
        ``(..., H, W)``, same dtype as ``grid``.
    """
    ph, pw = patch_size
    pixels = grid.repeat_interleave(ph, dim=-2).repeat_interleave(pw, dim=-1)  # (..., gh·ph, gw·pw)
    if image_size is None:
        return pixels
    height, width = image_size
    pixels = pixels[..., :height, :width]
    return F.pad(pixels, (0, width - pixels.shape[-1], 0, height - pixels.shape[-2]))
