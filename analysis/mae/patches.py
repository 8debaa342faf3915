"""Images as rows of patches, in MAE's layout, and MAE's per-patch normalised target.

A patch row holds its ``ph·pw·C`` values in ``(row, column, channel)`` order, patches in
row-major order over the grid: the layout of MAE's ``patchify`` (facebookresearch/mae
``models_mae.py``, and Hugging Face's ``ViTMAEForPreTraining.patchify``), written for any
``(ph, pw)`` patch and any ``(gh, gw)`` grid. Pure tensor functions.
"""

from __future__ import annotations

import torch

from ..base.image_ops import patch_pixel_mask

__all__ = ["NORM_PIX_EPS", "patchify", "unpatchify", "patch_statistics", "normalise_patches", "pixel_mask"]

#: MAE's ``norm_pix_loss`` epsilon: ``(x − mean) / (var + 1e-6) ** 0.5``.
NORM_PIX_EPS = 1.0e-6


def patchify(pixels: torch.Tensor, patch_size: tuple[int, int]) -> torch.Tensor:
    """``(B, C, H, W)`` -> ``(B, N, ph·pw·C)`` with ``N = (H/ph)·(W/pw)``.

    Parameters
    ----------
    pixels : torch.Tensor
        ``(B, C, H, W)``, ``H`` and ``W`` whole multiples of ``ph`` and ``pw``.
    patch_size : tuple of int
        ``(ph, pw)``.

    Returns
    -------
    torch.Tensor
        ``(B, N, ph·pw·C)``, each row a patch's values in ``(row, column, channel)`` order, patches
        row-major; the dtype of ``pixels``.
    """
    batch, channels, height, width = pixels.shape
    ph, pw = patch_size
    gh, gw = height // ph, width // pw
    x = pixels.reshape(batch, channels, gh, ph, gw, pw)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(batch, gh * gw, ph * pw * channels)  # (B, N, ph·pw·C)


def unpatchify(patches: torch.Tensor, grid_size: tuple[int, int], patch_size: tuple[int, int]) -> torch.Tensor:
    """``(B, N, ph·pw·C)`` -> ``(B, C, gh·ph, gw·pw)``, the inverse of :func:`patchify`.

    Parameters
    ----------
    patches : torch.Tensor
        ``(B, N, ph·pw·C)``, ``N = gh·gw``, in :func:`patchify`'s layout.
    grid_size : tuple of int
        ``(gh, gw)``.
    patch_size : tuple of int
        ``(ph, pw)``.

    Returns
    -------
    torch.Tensor
        ``(B, C, gh·ph, gw·pw)``, the dtype of ``patches``.
    """
    batch = patches.shape[0]
    (gh, gw), (ph, pw) = grid_size, patch_size
    channels = patches.shape[-1] // (ph * pw)
    x = patches.reshape(batch, gh, gw, ph, pw, channels)
    return x.permute(0, 5, 1, 3, 2, 4).reshape(batch, channels, gh * ph, gw * pw)


def patch_statistics(patches: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean and variance of every patch row over its ``ph·pw·C`` values; ``var`` is the
    unbiased variance (``torch.var``), as MAE's ``norm_pix_loss`` uses it.

    Parameters
    ----------
    patches : torch.Tensor
        ``(B, N, ph·pw·C)`` (:func:`patchify`).

    Returns
    -------
    tuple of torch.Tensor
        ``(mean, var)``, each ``(B, N, 1)``.
    """
    return patches.mean(dim=-1, keepdim=True), patches.var(dim=-1, keepdim=True)


def normalise_patches(patches: torch.Tensor) -> torch.Tensor:
    """MAE's ``norm_pix_loss`` target: ``(x − mean) / √(var + 1e-6)`` per patch row
    (:func:`patch_statistics`, :data:`NORM_PIX_EPS`).

    Parameters
    ----------
    patches : torch.Tensor
        ``(B, N, ph·pw·C)`` (:func:`patchify`).

    Returns
    -------
    torch.Tensor
        ``(B, N, ph·pw·C)``, each row normalised.
    """
    mean, var = patch_statistics(patches)
    return (patches - mean) / (var + NORM_PIX_EPS) ** 0.5


def pixel_mask(mask: torch.Tensor, grid_size: tuple[int, int], patch_size: tuple[int, int]) -> torch.Tensor:
    """``(B, N)`` patch mask -> ``(B, 1, gh·ph, gw·pw)`` float, each patch's value over its pixels.

    Parameters
    ----------
    mask : torch.Tensor
        ``(B, N)`` patch values (e.g. bool, True = hidden), row-major, ``N = gh·gw``.
    grid_size : tuple of int
        ``(gh, gw)``.
    patch_size : tuple of int
        ``(ph, pw)``.

    Returns
    -------
    torch.Tensor
        ``(B, 1, gh·ph, gw·pw)`` float32.
    """
    gh, gw = grid_size
    return patch_pixel_mask(mask.reshape(mask.shape[0], 1, gh, gw).float(), patch_size)
