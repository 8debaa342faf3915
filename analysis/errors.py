"""Typed errors raised by the analysis API.

Every message says what went wrong *and* what to do about it, so the app can show
it verbatim and a notebook user can act on it without reading our source.
"""

from __future__ import annotations

__all__ = [
    "VitExplorerError",
    "ModelLoadError",
    "UnsupportedModelError",
    "CheckpointError",
    "WeightsUnavailableError",
    "MissingDecoderError",
    "ImageLoadError",
    "ArchiveError",
    "AnalysisError",
    "TextPromptError",
    "NoTextTowerError",
]


class VitExplorerError(Exception):
    """Base class of every error this package raises on purpose."""


class ModelLoadError(VitExplorerError, ValueError):
    """A model could not be built or its weights could not be loaded."""


class UnsupportedModelError(ModelLoadError):
    """The model exists but is not a Vision Transformer this tool can inspect."""


class CheckpointError(ModelLoadError):
    """A checkpoint file is missing, unreadable or does not fit the architecture."""


class WeightsUnavailableError(ModelLoadError):
    """Pretrained weights are neither cached locally nor downloadable right now."""


class MissingDecoderError(UnsupportedModelError):
    """A masked-autoencoder encoder was asked to reconstruct, but its decoder is not there."""


class ImageLoadError(VitExplorerError, ValueError):
    """The input is not an image we can decode (or is unsafe to decode)."""


class ArchiveError(ImageLoadError):
    """An archive of images is unreadable, unsafe (path traversal) or over its size limits."""


class AnalysisError(VitExplorerError, ValueError):
    """An analysis was asked for something the captured record cannot give."""


class TextPromptError(AnalysisError):
    """A text prompt (or its token ids) cannot be encoded: empty, no tokenizer, or malformed ids."""


class NoTextTowerError(AnalysisError):
    """Text was asked of an image-only model (a ViT, or a CLIP/SigLIP vision tower alone)."""
