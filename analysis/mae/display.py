"""What the Masked-autoencoder page (and a notebook) shows of one :class:`~analysis.mae.MAEReconstruction`:
the four pictures of MAE Figure 2 in pixel units, the per-patch error on the hidden patches,
and a mask edited patch by patch. Pure functions of tensors; no plotting here
(:mod:`analysis.plots.mae` draws them).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from ..base.preprocessing import Preprocessing
from .patches import pixel_mask
from .reconstruct import MAEReconstruction

__all__ = ["FIGURE_2_PANELS", "unit_pixels", "figure_2_images", "hidden_patch_loss", "flip_patches"]

#: The pictures of MAE Figure 2, in the order shown: name -> title.
FIGURE_2_PANELS = {  # composite: the reconstruction with the visible patches pasted back
    "original": "original",
    "masked": "masked input",
    "reconstruction": "reconstruction",  # every patch as the decoder predicts it
    "composite": "composite",
}


def unit_pixels(pixels: torch.Tensor, preprocessing: Preprocessing) -> np.ndarray:
    """``(3, H, W)`` model-input (normalised) pixels -> ``(H, W, 3)`` float32 in the image's
    own units, ``x·std + mean`` per channel (0..1 for a real image), NOT clipped: a
    reconstruction may leave 0..1, and a figure says how much it clips.

    Parameters
    ----------
    pixels : torch.Tensor
        ``(3, H, W)`` normalised pixels (one image of the model's input).
    preprocessing : Preprocessing
        The model's preprocessing (``mae.preprocessing``): its mean and std.

    Returns
    -------
    numpy.ndarray
        ``(H, W, 3)`` float32.
    """
    unit = preprocessing.unnormalise(pixels.detach().float().cpu())  # (3, H, W)
    return unit.permute(1, 2, 0).numpy()


def figure_2_images(
    result: MAEReconstruction, preprocessing: Preprocessing, *, image: int = 0
) -> dict[str, np.ndarray]:
    """The pictures of :data:`FIGURE_2_PANELS`, each ``(H, W, 3)`` float32 in image units
    (:func:`unit_pixels`): the input, the input with its hidden patches NaN (they were never
    shown to the model), the decoder's reconstruction of every patch, and the reconstruction
    with the visible patches pasted back (``result.composite``).

    Parameters
    ----------
    result : MAEReconstruction
        One pass of :func:`~analysis.mae.mae_reconstruct`.
    preprocessing : Preprocessing
        The model's preprocessing (``mae.preprocessing``).
    image : int, default 0
        Which image of the batch.

    Returns
    -------
    dict of str to numpy.ndarray
        Keys ``"original"``, ``"masked"``, ``"reconstruction"``, ``"composite"``, each
        ``(H, W, 3)`` float32.
    """
    original = unit_pixels(result.pixels[image], preprocessing)
    hidden_pixels = pixel_mask(result.mask[image : image + 1], result.grid_size, result.patch_size)  # (1, 1, H, W)
    hidden = hidden_pixels[0, 0].bool().numpy()  # (H, W)
    masked = original.copy()
    masked[hidden] = np.nan
    return {
        "original": original,
        "masked": masked,
        "reconstruction": unit_pixels(result.reconstruction[image], preprocessing),
        "composite": unit_pixels(result.composite[image], preprocessing),
    }


def hidden_patch_loss(result: MAEReconstruction, *, image: int = 0) -> np.ndarray:
    """Each hidden patch's loss (``result.patch_loss``, the mean squared error against the model's
    target), NaN on the visible patches, which the loss leaves out.

    Parameters
    ----------
    result : MAEReconstruction
        One pass of :func:`~analysis.mae.mae_reconstruct`.
    image : int, default 0
        Which image of the batch.

    Returns
    -------
    numpy.ndarray
        ``(gh, gw)`` float32.
    """
    loss = result.patch_loss[image].detach().float().cpu().numpy().copy()  # (N,)
    loss[~result.mask[image].numpy()] = np.nan
    return loss.reshape(result.grid_size)


def flip_patches(mask: torch.Tensor, flipped: Iterable[int]) -> torch.Tensor:
    """A mask with the patches in ``flipped`` switched: a hidden one revealed, a visible one hidden
    (indices outside ``0..N-1`` are ignored; an index given twice is switched once).

    Parameters
    ----------
    mask : torch.Tensor
        ``(N,)`` bool, True = hidden, row-major over the patch grid.
    flipped : iterable of int
        Patch indices to switch.

    Returns
    -------
    torch.Tensor
        ``(N,)`` bool, a new tensor (``mask`` is not changed).
    """
    out = mask.clone()
    for index in set(int(i) for i in flipped):
        if 0 <= index < out.shape[0]:
            out[index] = not bool(out[index])
    return out
