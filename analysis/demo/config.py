"""What every demo model shares at run time: the scenes' normalisation and timm's ``pretrained_cfg``.

The demo ViT, CNN and Swin read the same 48 x 48 scenes (:mod:`.data`) the same way:
``x / 255`` then ``(x - MEAN) / STD`` per channel. The training scripts (``training/``) write
:func:`demo_pretrained_cfg` into each model's ``config.json``, so ``load_vit`` / ``load_cnn``
preprocess exactly as the training did; the tests use :func:`scenes_to_tensor` on the arrays
of :func:`.data.generate_arrays`.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["MEAN", "STD", "demo_pretrained_cfg", "normalize_uint8", "scenes_to_tensor"]

MEAN = (0.5, 0.5, 0.5)
STD = (0.25, 0.25, 0.25)


def demo_pretrained_cfg(height: int, width: int, num_classes: int, **extra) -> dict:
    """timm's ``pretrained_cfg`` of a demo model: the scenes' size and normalisation
    (``mean`` :data:`MEAN`, ``std`` :data:`STD`, bicubic, ``crop_pct`` 1.0).

    Parameters
    ----------
    height : int
        Scene height in pixels (``input_size`` is ``[3, height, width]``).
    width : int
        Scene width in pixels.
    num_classes : int
        Number of classes of the model's head.
    **extra : Any
        The model's own parts (``first_conv``, ``classifier``, ...), added to the dict last (they
        override a key of the same name).

    Returns
    -------
    dict
        The ``pretrained_cfg``, to write into the model's ``config.json``.
    """
    return {
        "tag": "demo_shapes",
        "custom_load": False,
        "input_size": [3, height, width],
        "interpolation": "bicubic",
        "crop_pct": 1.0,
        "crop_mode": "center",
        "mean": list(MEAN),
        "std": list(STD),
        "num_classes": num_classes,
        **extra,
    }


def normalize_uint8(x_u8: torch.Tensor) -> torch.Tensor:
    """uint8 ``(B, 3, H, W)`` -> float ``(x / 255 - MEAN) / STD``, what ``pretrained_cfg`` says.

    Parameters
    ----------
    x_u8 : torch.Tensor
        ``(B, 3, H, W)`` uint8 images on the CPU.

    Returns
    -------
    torch.Tensor
        ``(B, 3, H, W)`` float32, normalised per channel.
    """
    x = x_u8.float().div_(255.0)
    mean = torch.tensor(MEAN).view(1, 3, 1, 1)
    std = torch.tensor(STD).view(1, 3, 1, 1)
    return (x - mean) / std


def scenes_to_tensor(images_u8: np.ndarray) -> torch.Tensor:
    """uint8 ``(N, H, W, 3)`` scenes (:func:`.data.generate_arrays`) -> normalised float ``(N, 3, H, W)``.

    Parameters
    ----------
    images_u8 : numpy.ndarray
        ``(N, H, W, 3)`` uint8 scenes, channels last.

    Returns
    -------
    torch.Tensor
        ``(N, 3, H, W)`` float32, normalised as :func:`normalize_uint8`.
    """
    return normalize_uint8(torch.from_numpy(images_u8).permute(0, 3, 1, 2))
