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
    "ModelPathNotFoundError",
    "WeightsUnavailableError",
    "MissingDecoderError",
    "ImageLoadError",
    "ImageTooLargeError",
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


class ModelPathNotFoundError(CheckpointError):
    """A model source that is a path (a folder or a weights file) names nothing on disk.

    Attributes: ``path``, the path as given (``~`` expanded)."""

    def __init__(self, message: str, path=None):
        super().__init__(message)
        self.path = path


class WeightsUnavailableError(ModelLoadError):
    """Pretrained weights are neither cached locally nor downloadable right now."""


class MissingDecoderError(UnsupportedModelError):
    """A masked-autoencoder encoder was asked to reconstruct, but its decoder is not there."""


class ImageLoadError(VitExplorerError, ValueError):
    """The input is not an image we can decode (or is unsafe to decode)."""


class ImageTooLargeError(ImageLoadError):
    """The image declares more pixels than we decode (decompression-bomb protection).

    Attributes: ``width``, ``height`` (as the file declares them) and ``limit`` (pixels)."""

    def __init__(self, message: str, width: int = 0, height: int = 0, limit: int = 0):
        super().__init__(message)
        self.width, self.height, self.limit = width, height, limit


class ArchiveError(ImageLoadError):
    """An archive of images is unreadable, unsafe (path traversal) or over its size limits."""


class AnalysisError(VitExplorerError, ValueError):
    """An analysis was asked for something the captured record cannot give."""


class TextPromptError(AnalysisError):
    """A text prompt (or its token ids) cannot be encoded: empty, no tokenizer, or malformed ids."""


class NoTextTowerError(AnalysisError):
    """Text was asked of an image-only model (a ViT, or a CLIP/SigLIP vision tower alone)."""
