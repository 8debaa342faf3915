"""Which patches a masked autoencoder is shown: masks, and the noise that makes the model use them.

MAE (He et al. 2022, ``random_masking`` in facebookresearch/mae ``models_mae.py``, and Hugging
Face's ``ViTMAEEmbeddings.random_masking``) hides patches per sample by sorting noise:

    noise ~ U[0, 1)^(B, N);  ids_shuffle = argsort(noise);  keep = ids_shuffle[:, :len_keep],
    len_keep = int(N · (1 − mask_ratio))

so patch ``n`` is hidden when its rank in the sorted noise is ``≥ len_keep``. A mask here is a
boolean ``(B, N)`` tensor, ``True`` = hidden, over the row-major patch grid. Pure functions on
tensors: no model.
"""

from __future__ import annotations

import numbers

import torch

from ..base.errors import AnalysisError

__all__ = [
    "MAE_MASK_HELP",
    "visible_count",
    "draw_noise",
    "mask_from_noise",
    "draw_mask",
    "check_mask",
    "noise_for_mask",
    "mask_ratio_for",
]

MAE_MASK_HELP = (
    "a reconstruction needs at least one visible patch and the same number of visible patches in every image"
)


def visible_count(num_patches: int, mask_ratio: float) -> int:
    """MAE's ``len_keep = int(N · (1 − mask_ratio))``, the visible patches per image.

    Parameters
    ----------
    num_patches : int
        ``N``, the patches per image.
    mask_ratio : float
        The fraction hidden, in [0, 1).

    Returns
    -------
    int
        ``len_keep``, at least 1.

    Raises
    ------
    AnalysisError
        ``mask_ratio`` not a number in [0, 1), or one that hides every patch (``len_keep = 0``).
    """
    if isinstance(mask_ratio, bool) or not isinstance(mask_ratio, numbers.Real) or not 0.0 <= float(mask_ratio) < 1.0:
        raise AnalysisError(
            f"mask_ratio must be a number in [0, 1) (the fraction of patches hidden), got {mask_ratio!r}."
        )
    keep = int(num_patches * (1 - float(mask_ratio)))
    if keep < 1:
        raise AnalysisError(
            f"mask_ratio={mask_ratio} hides all {num_patches} patches (MAE keeps int(N·(1 − ratio)) = 0): "
            f"{MAE_MASK_HELP}. Use a smaller ratio, at most {1 - 1 / num_patches:.4g}."
        )
    return keep


def draw_noise(batch: int, num_patches: int, seed: int) -> torch.Tensor:
    """Noise ``U[0, 1)``, as MAE draws it (``torch.rand``), from a CPU generator seeded with
    ``seed``: the same seed gives the same noise on every device.

    Parameters
    ----------
    batch : int
        ``B``, the images.
    num_patches : int
        ``N``, the patches per image.
    seed : int
        The generator's seed.

    Returns
    -------
    torch.Tensor
        ``(B, N)`` float32 on the CPU.

    Raises
    ------
    AnalysisError
        ``seed`` is not an integer.
    """
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise AnalysisError(f"seed must be an integer, got {seed!r}.")
    generator = torch.Generator().manual_seed(int(seed))
    return torch.rand(batch, num_patches, generator=generator)


def mask_from_noise(noise: torch.Tensor, mask_ratio: float) -> torch.Tensor:
    """MAE's rule (module docstring) applied to ``noise``: the ``len_keep`` patches of least
    noise are visible.

    Parameters
    ----------
    noise : torch.Tensor
        ``(B, N)`` noise (:func:`draw_noise`).
    mask_ratio : float
        The fraction hidden, in [0, 1) (:func:`visible_count`).

    Returns
    -------
    torch.Tensor
        ``(B, N)`` bool, True = hidden, on the device of ``noise``.

    Raises
    ------
    AnalysisError
        As :func:`visible_count`.
    """
    keep = visible_count(noise.shape[1], mask_ratio)
    rank = torch.argsort(torch.argsort(noise, dim=1), dim=1)  # (B, N) each patch's place in the sorted noise
    return rank >= keep


def draw_mask(batch: int, num_patches: int, mask_ratio: float, seed: int) -> torch.Tensor:
    """A mask drawn as MAE draws it from ``seed`` (:func:`draw_noise`, :func:`mask_from_noise`).
    With one seed, a higher ratio hides a superset of the patches.

    Parameters
    ----------
    batch : int
        ``B``, the images.
    num_patches : int
        ``N``, the patches per image.
    mask_ratio : float
        The fraction hidden, in [0, 1).
    seed : int
        The noise seed.

    Returns
    -------
    torch.Tensor
        ``(B, N)`` bool on the CPU, True = hidden.

    Raises
    ------
    AnalysisError
        As :func:`draw_noise` and :func:`visible_count`.
    """
    return mask_from_noise(draw_noise(batch, num_patches, seed), mask_ratio)


def check_mask(mask, batch: int, num_patches: int) -> torch.Tensor:
    """``mask`` as a CPU ``(B, N)`` bool tensor (True = hidden), or a typed error that says what
    a reconstruction needs: the right length, a visible patch, equal visible counts.

    Parameters
    ----------
    mask : torch.Tensor or array_like
        ``(B, N)`` or ``(N,)`` bool (one row for every image), True = hidden, row-major.
    batch : int
        ``B``, the images.
    num_patches : int
        ``N``, the patches per image.

    Returns
    -------
    torch.Tensor
        ``(B, N)`` bool on the CPU, contiguous.

    Raises
    ------
    AnalysisError
        A mask that is not boolean, not ``(B, N)`` or ``(N,)``, hides every patch of an image, or
        shows different numbers of patches in different images.
    """
    tensor = torch.as_tensor(mask) if not isinstance(mask, torch.Tensor) else mask
    if tensor.dtype != torch.bool:
        raise AnalysisError(f"mask must be boolean (True = hidden patch), got dtype {tensor.dtype}.")
    tensor = tensor.detach().cpu()
    if tensor.ndim == 1:
        tensor = tensor.unsqueeze(0).expand(batch, -1)
    if tensor.ndim != 2 or tensor.shape[1] != num_patches:
        raise AnalysisError(
            f"mask has shape {tuple(tensor.shape)}, but this input has {num_patches} patches: pass a boolean "
            f"(B, {num_patches}) or ({num_patches},) mask over the row-major patch grid, True = hidden."
        )
    if tensor.shape[0] != batch:
        raise AnalysisError(f"mask has {tensor.shape[0]} rows for {batch} images: pass one row per image.")
    visible = (~tensor).sum(dim=1)  # (B,)
    if int(visible.min()) == 0:
        raise AnalysisError(f"The mask hides every patch of image {int(visible.argmin())}: {MAE_MASK_HELP}.")
    if int(visible.max()) != int(visible.min()):
        raise AnalysisError(
            f"The masks show {visible.tolist()} patches per image: {MAE_MASK_HELP} (the encoder runs the visible "
            "patches of all images as one batch). Reconstruct the images one at a time instead."
        )
    return tensor.contiguous()


def noise_for_mask(mask: torch.Tensor) -> torch.Tensor:
    """``(B, N)`` noise whose MAE sort keeps exactly the visible patches of ``mask`` (with
    :func:`mask_ratio_for` as the ratio), visible first in row-major order, then the hidden ones:

        noise[b, n] = mask[b, n] + n / (2N)        (visible < ½ ≤ hidden, ties impossible)

    so the encoder's tokens after the class token are the visible patches in raster order.

    Parameters
    ----------
    mask : torch.Tensor
        ``(B, N)`` bool, True = hidden.

    Returns
    -------
    torch.Tensor
        ``(B, N)`` float32 on the device of ``mask``.
    """
    num_patches = mask.shape[1]
    order = torch.arange(num_patches, dtype=torch.float32) / (2 * num_patches)
    return mask.float() + order


def mask_ratio_for(visible: int, num_patches: int) -> float:
    """A ratio whose MAE ``len_keep = int(N · (1 − ratio))`` is exactly ``visible``: the middle
    of its interval, ``1 − (visible + ½) / N``, so float rounding cannot move it.

    Parameters
    ----------
    visible : int
        The visible patches per image.
    num_patches : int
        ``N``, the patches per image.

    Returns
    -------
    float
        ``1 − (visible + ½) / N``.
    """
    return 1.0 - (visible + 0.5) / num_patches
