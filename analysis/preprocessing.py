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
        """The RGB image of size (W, H) that the model sees, before normalisation.

        Same pixels as timm's eval transform (torchvision ``Resize`` of the shorter side to
        ``floor(size / crop_pct)``, then ``CenterCrop``), generalised to non-square sizes by
        keeping the aspect ratio. Only the source region that survives the crop is resampled
        (PIL's ``resize(box=...)`` samples exactly the same positions), so a 1x10000 strip
        costs no more than a normal photo.
        """
        image = image.convert("RGB")
        height, width = self.img_size
        scaled_h, scaled_w = math.floor(height / self.crop_pct), math.floor(width / self.crop_pct)
        if scaled_h / image.height >= scaled_w / image.width:
            new_h, new_w = scaled_h, max(scaled_w, int(scaled_h * image.width / image.height))
        else:
            new_h, new_w = max(scaled_h, int(scaled_w * image.height / image.width)), scaled_w
        new_h, new_w = max(new_h, height), max(new_w, width)
        top, left = int(round((new_h - height) / 2.0)), int(round((new_w - width) / 2.0))
        sx, sy = image.width / new_w, image.height / new_h  # source pixels per resized pixel
        box = (left * sx, top * sy, (left + width) * sx, (top + height) * sy)
        resample = _RESAMPLE.get(self.interpolation, Image.Resampling.BICUBIC)
        return image.resize((width, height), resample=resample, box=box)

    def __call__(self, image: Image.Image) -> torch.Tensor:
        """PIL image -> normalised float tensor ``(1, 3, H, W)``."""
        array = np.asarray(self.crop(image), dtype=np.float32) / 255.0  # (H, W, 3)
        pixels = torch.from_numpy(array).permute(2, 0, 1)  # (3, H, W)
        mean = torch.tensor(self.mean, dtype=torch.float32).view(-1, 1, 1)
        std = torch.tensor(self.std, dtype=torch.float32).view(-1, 1, 1)
        return ((pixels - mean) / std).unsqueeze(0)
