"""Inside the tokens: block outputs and attention's q/k/v, the logit lens, high-norm artifacts,
in one record for every family (:class:`~analysis.tokens.record.TokenRecord`: each layer on its
own grid; a windowed model's stages, :mod:`analysis.tokens.stages`)."""

from .artifacts import (
    DOMINANT_SHARE,
    MAX_OUTLIER_FRACTION,
    MIN_NORM_RATIO,
    STANDOUT_RATIO,
    HighNormTokens,
    attention_mass,
    dominated_by_outliers,
    high_norm_tokens,
    outlier_patches,
    outlier_share,
    token_norms,
)
from .capture import TOKEN_KINDS, capture_limits, capture_tokens, logit_lens
from .features import feature_pca, patch_similarity
from .record import TokenRecord
from .stages import logit_lens_layers

__all__ = [
    "TOKEN_KINDS",
    "capture_tokens",
    "capture_limits",
    "logit_lens",
    "logit_lens_layers",
    "TokenRecord",
    "feature_pca",
    "patch_similarity",
    "token_norms",
    "high_norm_tokens",
    "HighNormTokens",
    "attention_mass",
    "MAX_OUTLIER_FRACTION",
    "MIN_NORM_RATIO",
    "DOMINANT_SHARE",
    "STANDOUT_RATIO",
    "outlier_patches",
    "outlier_share",
    "dominated_by_outliers",
]
