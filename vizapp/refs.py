"""What identifies a model and an image in the app: the keys of every cache."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["ModelRef", "ImageRef", "parse_model_ref", "default_model_ref", "fallback_model_ref", "FALLBACK_SOURCE"]

FALLBACK_SOURCE = "vit_tiny_patch16_224"  # random weights: used when the demo is missing


class ModelRef(NamedTuple):
    """Everything that identifies a loaded model: the cache key of :func:`vizapp.resources.get_model`.

    ``source`` is whatever :func:`analysis.load_vit` accepts ("demo", a timm name,
    "hf-hub:...", "hf:...", "torchvision:...", a folder or a file); ``arch`` is needed for a bare weights file;
    ``img_size`` overrides the input resolution (``None``: the model's own).
    """

    source: str
    pretrained: bool = True
    arch: str | None = None
    img_size: int | None = None

    @property
    def label(self) -> str:
        text = self.source if self.pretrained else f"{self.source} (random weights)"
        if self.arch:
            text += f" [{self.arch}]"
        if self.img_size:
            text += f" @ {self.img_size}px"
        return text

    def with_img_size(self, img_size: int | None) -> ModelRef:
        return self._replace(img_size=img_size or None)


def parse_model_ref(text: str) -> ModelRef:
    """``"demo"``, ``"random:<name>"`` (random weights), a model name or a path."""
    text = text.strip()
    if text.startswith("random:"):
        return ModelRef(text.removeprefix("random:"), pretrained=False)
    return ModelRef(text)


def default_model_ref() -> ModelRef:
    """The model the app opens on: ``$VIZAPP_DEFAULT_MODEL`` if set, else the bundled demo."""
    return parse_model_ref(os.environ.get("VIZAPP_DEFAULT_MODEL", "demo") or "demo")


def fallback_model_ref() -> ModelRef:
    """A model that always loads offline (random weights), for when the default cannot."""
    return ModelRef(FALLBACK_SOURCE, pretrained=False)


@dataclass(frozen=True)
class ImageRef:
    """An input image: its name, bytes and the SHA-1 of the bytes (the cache key)."""

    name: str
    data: bytes
    digest: str

    @classmethod
    def from_bytes(cls, name: str, data: bytes) -> ImageRef:
        return cls(name=name, data=data, digest=hashlib.sha1(data).hexdigest())
