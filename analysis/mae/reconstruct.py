"""What a masked autoencoder reconstructs from the patches it is shown (MAE, He et al. 2022, Figure 2).

:func:`mae_reconstruct` runs the model's own forward (``ViTMAEForPreTraining(pixels, noise=...)``)
with a mask that is either given or drawn from a seed exactly as MAE draws it, and returns the
reconstruction in pixel space, the composite with the visible patches pasted back, the
per-patch and mean loss as the model defines it, and the encoder's attention over the
visible tokens, all from that one pass.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from ..base.arguments import check_pixels
from ..base.errors import AnalysisError
from .attention import (
    VisibleAttentionRecord,
    collect_visible_attention,
    encoder_attention_taps,
    stack_visible_attention,
)
from .loading import LoadedMAE, wrap_mae
from .masking import check_mask, draw_mask, mask_ratio_for, noise_for_mask
from .patches import NORM_PIX_EPS, normalise_patches, patch_statistics, patchify, pixel_mask, unpatchify

__all__ = ["MAEReconstruction", "mae_reconstruct"]

_LOCKS_GUARD = threading.Lock()
_MODEL_LOCKS: weakref.WeakKeyDictionary[nn.Module, threading.Lock] = weakref.WeakKeyDictionary()


def _model_lock(model: nn.Module) -> threading.Lock:
    """One lock per model object, held while its masking ratio is set for a call (see below)."""
    with _LOCKS_GUARD:
        lock = _MODEL_LOCKS.get(model)
        if lock is None:
            lock = _MODEL_LOCKS[model] = threading.Lock()
        return lock


@dataclass(frozen=True)
class MAEReconstruction:
    """One masked-autoencoder pass. Images are in the model's input space (normalised as
    ``pixels`` are: show them with ``mae.preprocessing.to_image``).

    All tensors are on the CPU.

    Attributes
    ----------
    pixels : torch.Tensor
        ``(B, 3, H, W)`` the input.
    reconstruction : torch.Tensor
        ``(B, 3, H, W)`` float32, the decoder's prediction of every patch, in pixel space. With
        ``norm_pix_loss`` the decoder predicts each patch normalised by its own mean and variance;
        the prediction is un-normalised with the *true* patch's mean and variance
        (``x̂·√(var + 1e-6) + mean``), as MAE's visualisation notebook does, so hidden patches show
        the predicted structure at the true patch's brightness and contrast.
    composite : torch.Tensor
        ``(B, 3, H, W)`` float32, the reconstruction with the visible patches of ``pixels`` pasted back.
    mask : torch.Tensor
        ``(B, N)`` bool, True = hidden, row-major over ``grid_size``.
    predictions : torch.Tensor
        ``(B, N, ph·pw·C)`` float32, the decoder's raw output (``logits``), in the loss's target space.
    patch_loss : torch.Tensor
        ``(B, N)`` float32, every patch's mean squared error against the target
        (``patchify(pixels)``, normalised per patch with ``norm_pix_loss``). Only hidden patches
        enter the loss; the visible ones are shown for comparison.
    image_loss : torch.Tensor
        ``(B,)`` float32, each image's mean ``patch_loss`` over its hidden patches.
    loss : torch.Tensor
        ``()`` float32, the model's own loss, ``Σ_hidden patch_loss / #hidden`` over the batch
        (NaN when nothing is hidden).
    attention : VisibleAttentionRecord
        The encoder's attention over the class token and the visible patches.
    grid_size : tuple of int
        ``(gh, gw)``.
    patch_size : tuple of int
        ``(ph, pw)``.
    norm_pix_loss : bool
        The model's flag.
    """

    pixels: torch.Tensor
    reconstruction: torch.Tensor
    composite: torch.Tensor
    mask: torch.Tensor
    predictions: torch.Tensor
    patch_loss: torch.Tensor
    image_loss: torch.Tensor
    loss: torch.Tensor
    attention: VisibleAttentionRecord
    grid_size: tuple[int, int]
    patch_size: tuple[int, int]
    norm_pix_loss: bool

    @property
    def visible_patches(self) -> torch.Tensor:
        """``(B, V)`` row-major grid index of each visible patch, ascending."""
        return self.attention.visible_patches

    def hidden_pixels(self) -> torch.Tensor:
        """``(B, 1, H, W)`` float, 1 on the pixels of hidden patches, 0 elsewhere."""
        return pixel_mask(self.mask, self.grid_size, self.patch_size)


def mae_reconstruct(
    mae: LoadedMAE | nn.Module,
    pixels: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    mask_ratio: float = 0.75,
    seed: int = 0,
) -> MAEReconstruction:
    """Hide patches, let the MAE reconstruct them, and read its encoder's attention, in one pass.

    The model computes with exactly this mask: the mask becomes the model's own ``noise``
    (:func:`~analysis.mae.masking.noise_for_mask`, visible patches first in raster order) and,
    for this call only and under a per-model lock, the ``mask_ratio`` its masking reads from
    its config keeps exactly the visible count. The returned mask is the one the model used.

    Parameters
    ----------
    mae : LoadedMAE or torch.nn.Module
        A :class:`~analysis.mae.LoadedMAE` (or a ``ViTMAEForPreTraining``, wrapped as it is).
    pixels : torch.Tensor
        ``(B, 3, H, W)`` preprocessed input (``mae.preprocess(image)``), any whole number of
        patches; sizes other than the model's own use its own position interpolation.
    mask : torch.Tensor or None, default None
        ``(B, N)`` or ``(N,)`` bool, True = hidden, row-major over the patch grid; every image must
        show the same number of patches, at least one. ``None``: drawn from ``seed`` exactly as MAE
        draws it (per-image uniform noise, argsort, the first ``int(N·(1 − mask_ratio))`` kept;
        :func:`~analysis.mae.masking.draw_mask`).
    mask_ratio : float, default 0.75
        The fraction hidden when the mask is drawn, in [0, 1) (unused with a ``mask``).
    seed : int, default 0
        The noise seed when the mask is drawn (the same seed gives the same mask).

    Returns
    -------
    MAEReconstruction
        The reconstruction, losses, mask and encoder attention of this pass, on the CPU.

    Raises
    ------
    AnalysisError
        ``mae`` neither a :class:`~analysis.mae.LoadedMAE` nor a module; ``pixels`` not
        ``(B, 3, H, W)`` floating or not a whole number of patches; a bad ``mask``, ``mask_ratio``
        or ``seed``; a model whose masking does not follow MAE's noise/argsort rule.
    MissingDecoderError
        A module that is an MAE encoder without its decoder.
    UnsupportedModelError
        Another module that is not a ``ViTMAEForPreTraining``.
    """
    if not isinstance(mae, LoadedMAE):
        if not isinstance(mae, nn.Module):
            raise AnalysisError(f"mae_reconstruct takes a LoadedMAE (analysis.mae.load_mae), got {type(mae).__name__}.")
        mae = wrap_mae(mae, type(mae).__name__, None)  # MissingDecoderError for an encoder alone
    check_pixels(pixels)
    batch, _, height, width = pixels.shape
    ph, pw = mae.spec.patch_size
    if height % ph or width % pw:
        raise AnalysisError(
            f"A {height}x{width} input is not a whole number of {ph}x{pw} patches: use mae.preprocess(image)."
        )
    grid = (height // ph, width // pw)
    num_patches = grid[0] * grid[1]
    mask = draw_mask(batch, num_patches, mask_ratio, seed) if mask is None else check_mask(mask, batch, num_patches)
    visible = num_patches - int(mask[0].sum())
    spec = mae.spec.with_image_size(height, width)
    model: Any = mae.model  # transformers' ViTMAEForPreTraining: its embeddings' config read by name
    device = mae.device
    x = pixels.to(device=device, dtype=torch.float32)
    store, sink = collect_visible_attention(spec.num_layers)
    masking_config = model.vit.embeddings.config  # what ViTMAEEmbeddings.random_masking reads
    with _model_lock(model):
        saved = masking_config.mask_ratio
        masking_config.mask_ratio = mask_ratio_for(visible, num_patches)
        try:
            with torch.no_grad(), encoder_attention_taps(model, spec.num_heads, sink):
                output = model(
                    pixel_values=x,
                    noise=noise_for_mask(mask).to(device),
                    interpolate_pos_encoding=(height, width) != tuple(mae.native_img_size),
                )
        finally:
            masking_config.mask_ratio = saved
    used = output.mask.detach().cpu() > 0.5  # (B, N)
    if not torch.equal(used, mask):
        raise AnalysisError(
            "The model hid other patches than the mask asked for: its masking does not follow MAE's "
            "noise/argsort rule, so this model is not supported."
        )
    predictions = output.logits.detach().float()  # (B, N, ph·pw·C)
    target = patchify(x, (ph, pw))  # (B, N, ph·pw·C)
    if mae.norm_pix_loss:
        mean, var = patch_statistics(target)
        patch_pixels = predictions * (var + NORM_PIX_EPS) ** 0.5 + mean  # the notebook's un-normalisation
        target = normalise_patches(target)
    else:
        patch_pixels = predictions
    patch_loss = ((predictions - target) ** 2).mean(dim=-1)  # (B, N)
    hidden = mask.to(device=patch_loss.device, dtype=patch_loss.dtype)  # (B, N)
    loss = (patch_loss * hidden).sum() / hidden.sum()
    image_loss = (patch_loss * hidden).sum(dim=1) / hidden.sum(dim=1)
    reconstruction = unpatchify(patch_pixels, grid, (ph, pw))  # (B, 3, H, W)
    hidden_pixels = pixel_mask(mask, grid, (ph, pw)).to(device).bool()  # (B, 1, H, W)
    composite = torch.where(hidden_pixels, reconstruction, x)
    visible_patches = torch.arange(num_patches).expand(batch, -1)[~mask].view(batch, visible)  # (B, V) ascending
    return MAEReconstruction(
        pixels=pixels.detach().cpu(),
        reconstruction=reconstruction.cpu(),
        composite=composite.cpu(),
        mask=mask,
        predictions=predictions.cpu(),
        patch_loss=patch_loss.cpu(),
        image_loss=image_loss.cpu(),
        loss=loss.cpu(),
        attention=stack_visible_attention(store, visible_patches, spec),
        grid_size=grid,
        patch_size=(ph, pw),
        norm_pix_loss=mae.norm_pix_loss,
    )
