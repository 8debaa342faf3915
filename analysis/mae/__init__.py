"""Masked autoencoders (MAE, He et al. 2022): what the model reconstructs from the patches it is shown.

* :func:`load_mae`: a Hugging Face ``ViTMAEForPreTraining`` (encoder and decoder) from a folder,
  ``"hf:org/name"`` or an object, as a :class:`LoadedMAE`;
* :func:`mae_reconstruct`: hide patches (a given mask, or MAE's own seeded draw), reconstruct
  them with the model's own forward, and read the encoder's attention over the visible tokens
  (:class:`VisibleAttentionRecord`) in the same pass;
* :func:`dataset_mae_loss`: each image's loss at each mask ratio over an image set (the
  ``python -m analysis mae`` command);
* :mod:`.display`: the pictures of MAE Figure 2 in pixel units, the per-patch error map, a
  mask edited patch by patch (what the app's Masked-autoencoder page shows);
* :mod:`.masking` and :mod:`.patches`: the masks and the patch layout, as pure functions.
"""

from .attention import VisibleAttentionRecord, visible_attention_distance, visible_rollout
from .dataset import dataset_mae_loss
from .display import FIGURE_2_PANELS, figure_2_images, flip_patches, hidden_patch_loss, unit_pixels
from .loading import MAE_WITH_DECODER, LoadedMAE, load_mae, wrap_mae
from .masking import check_mask, draw_mask, draw_noise, mask_from_noise, noise_for_mask
from .reconstruct import MAEReconstruction, mae_reconstruct

__all__ = [
    "LoadedMAE",
    "load_mae",
    "wrap_mae",
    "MAE_WITH_DECODER",
    "mae_reconstruct",
    "MAEReconstruction",
    "VisibleAttentionRecord",
    "visible_attention_distance",
    "visible_rollout",
    "dataset_mae_loss",
    "draw_mask",
    "draw_noise",
    "mask_from_noise",
    "check_mask",
    "noise_for_mask",
    "FIGURE_2_PANELS",
    "figure_2_images",
    "hidden_patch_loss",
    "flip_patches",
    "unit_pixels",
]
