"""The model's own input pipeline: resize, centre crop, normalise.

We build it from timm's resolved data config (mean, std, interpolation, crop_pct) but
always at the model's *actual* input size, so an overridden ``img_size`` wins over the
pretrained default. The crop is exposed as an image too, so that overlays are drawn on
exactly the pixels the model saw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

__all__ = ["Preprocessing"]

_RESAMPLE = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}


@dataclass(frozen=True)
class Preprocessing:
    """Resize (keeping aspect) so the image covers ``img_size / crop_pct``, centre-crop
    ``img_size``, scale to [0, 1] and normalise with ``(x - mean) / std`` per channel."""

    img_size: tuple[int, int]  # (H, W)
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: str = "bicubic"
    crop_pct: float = 1.0

    @classmethod
    def from_data_config(cls, data_config: dict, img_size: tuple[int, int]) -> "Preprocessing":
        return cls(
            img_size=(int(img_size[0]), int(img_size[1])),
            mean=tuple(float(m) for m in data_config.get("mean", (0.5, 0.5, 0.5))),
            std=tuple(float(s) for s in data_config.get("std", (0.5, 0.5, 0.5))),
            interpolation=str(data_config.get("interpolation", "bicubic")),
            crop_pct=float(data_config.get("crop_pct", 1.0) or 1.0),
        )

    def crop(self, image: Image.Image) -> Image.Image:
        """The RGB image of size (W, H) that the model sees, before normalisation."""
        image = image.convert("RGB")
        height, width = self.img_size
        scale = max(height / self.crop_pct / image.height, width / self.crop_pct / image.width)
        new_w = max(width, math.floor(image.width * scale + 0.5))
        new_h = max(height, math.floor(image.height * scale + 0.5))
        resample = _RESAMPLE.get(self.interpolation, Image.Resampling.BICUBIC)
        if (new_w, new_h) != image.size:
            image = image.resize((new_w, new_h), resample=resample)
        left = (new_w - width) // 2
        top = (new_h - height) // 2
        return image.crop((left, top, left + width, top + height))

    def __call__(self, image: Image.Image) -> torch.Tensor:
        """PIL image -> normalised float tensor ``(1, 3, H, W)``."""
        array = np.asarray(self.crop(image), dtype=np.float32) / 255.0  # (H, W, 3)
        pixels = torch.from_numpy(array).permute(2, 0, 1)  # (3, H, W)
        mean = torch.tensor(self.mean, dtype=torch.float32).view(-1, 1, 1)
        std = torch.tensor(self.std, dtype=torch.float32).view(-1, 1, 1)
        return ((pixels - mean) / std).unsqueeze(0)
