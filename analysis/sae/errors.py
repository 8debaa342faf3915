"""Typed errors of the sparse-autoencoder analyses; each message names the cause and the fix."""

from __future__ import annotations

from ..base.errors import AnalysisError

__all__ = [
    "SAEError",
    "UnknownPointError",
    "SAEWidthError",
    "SAEConfigError",
    "NoImagesError",
    "SAEFolderError",
    "SAEFeatureError",
    "NoClassHeadError",
]


class SAEError(AnalysisError):
    """Base class of the errors raised by :mod:`analysis.sae`."""


class UnknownPointError(SAEError):
    """The hook point is not a ``(B, T, D)`` point of this model (or not a hook point at all)."""


class SAEWidthError(SAEError):
    """The SAE's input width ``d_in`` is not the width of the layer it is applied to."""


class SAEConfigError(SAEError):
    """An SAE configuration that cannot work: an unknown architecture or token choice, ``k`` outside
    ``1..d_sae``, a ReLU SAE without an L1 coefficient."""


class NoImagesError(SAEError):
    """An SAE was asked to train or measure on no images (or no activations)."""


class SAEFolderError(SAEError):
    """A folder that is not an SAE folder (no ``cfg.json`` or no ``sae_weights.safetensors``)."""


class SAEFeatureError(SAEError, IndexError):
    """A feature index outside ``0..d_sae − 1``."""


class NoClassHeadError(SAEError):
    """A feature's classes were asked of a model without a linear class head after a LayerNorm
    (an embedding tower, a model with no head, or a readout this library does not unfold)."""
