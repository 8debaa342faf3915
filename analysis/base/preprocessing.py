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

from .images import to_rgb

__all__ = ["Preprocessing"]

_RESAMPLE = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}

# Resize the whole image (timm's exact pixels) unless the resized image would exceed this.
_EXACT_RESIZE_PIXELS = 4096 * 4096


@dataclass(frozen=True)
class Preprocessing:
    """Resize and crop to ``img_size`` as timm's eval transform does (see :meth:`crop`),
    scale to [0, 1] and normalise with ``(x - mean) / std`` per channel.

    Calling it on a PIL image gives the model input ``(1, 3, H, W)`` float32.

    Attributes
    ----------
    img_size : tuple of int
        ``(H, W)``, the model's actual input size (an overridden ``img_size`` wins over the pretrained
        default).
    mean : tuple of float
        Per-channel mean, in ``[0, 1]`` units.
    std : tuple of float
        Per-channel standard deviation, in ``[0, 1]`` units.
    interpolation : str, default "bicubic"
        PIL resampling of the resize: ``"nearest"``, ``"bilinear"``, ``"bicubic"``, ``"lanczos"``,
        ``"box"`` or ``"hamming"`` (another name resamples bicubic).
    crop_pct : float, default 1.0
        The resize target is ``floor(size / crop_pct)`` before the crop to ``img_size``.
    crop_mode : str, default "center"
        ``"center"``, ``"squash"`` or ``"border"``, as in timm's data config (see :meth:`crop`).
    """

    img_size: tuple[int, int]  # (H, W)
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: str = "bicubic"
    crop_pct: float = 1.0
    crop_mode: str = "center"  # "center" | "squash" | "border", as in timm's data config

    @classmethod
    def from_data_config(cls, data_config: dict, img_size: tuple[int, int]) -> Preprocessing:
        return cls(
            img_size=(int(img_size[0]), int(img_size[1])),
            mean=tuple(float(m) for m in data_config.get("mean", (0.5, 0.5, 0.5))),
            std=tuple(float(s) for s in data_config.get("std", (0.5, 0.5, 0.5))),
            interpolation=str(data_config.get("interpolation", "bicubic")),
            crop_pct=float(data_config.get("crop_pct", 1.0) or 1.0),
            crop_mode=str(data_config.get("crop_mode") or "center"),
        )

    def _resized_size(self, width: int, height: int) -> tuple[int, int]:
        """(new_w, new_h) of the resize step, exactly as timm's eval transform computes it."""
        target_h, target_w = self.img_size
        scale_h, scale_w = math.floor(target_h / self.crop_pct), math.floor(target_w / self.crop_pct)
        if self.crop_mode == "squash":  # each edge to its own scale: aspect ratio not kept
            return scale_w, scale_h
        if self.crop_mode == "center" and scale_h == scale_w:  # torchvision Resize(int): shorter edge
            if width <= height:
                return scale_w, int(scale_w * height / width)
            return int(scale_h * width / height), scale_h
        # timm ResizeKeepRatio: shorter edge fits ("center") or longer edge fits ("border")
        ratio_h, ratio_w = height / scale_h, width / scale_w
        ratio = max(ratio_h, ratio_w) if self.crop_mode == "border" else min(ratio_h, ratio_w)
        return max(1, round(width / ratio)), max(1, round(height / ratio))

    def crop(self, image: Image.Image) -> Image.Image:
        """The RGB image of size (W, H) that the model sees, before normalisation.

        The same pixels as timm's eval transform for the model's ``crop_mode``: "center"
        (resize keeping the aspect ratio so the shorter edge is ``floor(size / crop_pct)``,
        then centre-crop), "squash" (resize each edge to ``floor(size / crop_pct)``, then
        centre-crop) or "border" (fit the longer edge, then pad with the mean colour and
        centre-crop). Normally the whole image is resized, then cropped, exactly as timm
        does. When the resized image would be much larger than the crop (a 1x10000 strip),
        only the source region that survives the crop is resampled with PIL's
        ``resize(box=...)``: it samples the same positions, but PIL's fixed-point filter
        weights then differ by up to a few grey levels, so this path is kept for such shapes.
        """
        image = to_rgb(image)
        height, width = self.img_size
        new_w, new_h = self._resized_size(image.width, image.height)
        resample = _RESAMPLE.get(self.interpolation, Image.Resampling.BICUBIC)
        if self.crop_mode == "border" and (new_w < width or new_h < height):
            resized = image.resize((new_w, new_h), resample=resample)
            fill = tuple(round(255 * m) for m in self.mean[:3])
            canvas = Image.new("RGB", (max(width, new_w), max(height, new_h)), fill)
            pad_left = (width - new_w) // 2 if width > new_w else 0
            pad_top = (height - new_h) // 2 if height > new_h else 0
            canvas.paste(resized, (pad_left, pad_top))
            left = int(round((canvas.width - width) / 2.0))
            top = int(round((canvas.height - height) / 2.0))
            return canvas.crop((left, top, left + width, top + height))
        top, left = int(round((new_h - height) / 2.0)), int(round((new_w - width) / 2.0))
        if new_w * new_h <= max(_EXACT_RESIZE_PIXELS, 4 * width * height):
            resized = image.resize((new_w, new_h), resample=resample)
            return resized.crop((left, top, left + width, top + height))
        sx, sy = image.width / new_w, image.height / new_h  # source pixels per resized pixel
        box = (left * sx, top * sy, (left + width) * sx, (top + height) * sy)
        return image.resize((width, height), resample=resample, box=box)

    def statistics(self, device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean, std)`` as ``(C, 1, 1)`` float32 tensors on ``device``: they broadcast over
        ``(C, H, W)`` and ``(B, C, H, W)`` images."""
        mean = torch.tensor(self.mean, dtype=torch.float32, device=device).view(-1, 1, 1)
        std = torch.tensor(self.std, dtype=torch.float32, device=device).view(-1, 1, 1)
        return mean, std

    def normalise(self, unit: torch.Tensor) -> torch.Tensor:
        """Images in the image's own units (``[0, 1]``), ``(…, C, H, W)``, -> the model's input
        ``(x − mean) / std`` per channel, on ``unit``'s device: the one normalisation rule."""
        mean, std = self.statistics(unit.device)
        return (unit - mean) / std

    def unnormalise(self, pixels: torch.Tensor) -> torch.Tensor:
        """The model's input ``(…, C, H, W)`` -> the image's own units, ``x·std + mean`` per channel,
        on ``pixels``' device, not clipped (:meth:`normalise` undone)."""
        mean, std = self.statistics(pixels.device)
        return pixels * std + mean

    def __call__(self, image: Image.Image) -> torch.Tensor:
        """PIL image -> normalised float tensor ``(1, 3, H, W)``."""
        array = np.asarray(self.crop(image), dtype=np.float32) / 255.0  # (H, W, 3)
        pixels = torch.from_numpy(array).permute(2, 0, 1)  # (3, H, W)
        return self.normalise(pixels).unsqueeze(0)

    def to_image(self, pixels: torch.Tensor) -> np.ndarray:
        """Normalised ``(3, H, W)`` (or ``(1, 3, H, W)``) -> ``(H, W, 3)`` uint8: ``x·std + mean``,
        clipped to [0, 1], times 255, rounded. Inverts :meth:`__call__` on its own output exactly."""
        pixels = pixels.detach().float().cpu().reshape(-1, *pixels.shape[-2:])  # (3, H, W)
        unit = self.unnormalise(pixels).clamp(0.0, 1.0)
        return (unit * 255.0).round().to(torch.uint8).permute(1, 2, 0).numpy()
