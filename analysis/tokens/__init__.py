"""Inside the tokens: block outputs and attention's q/k/v, the logit lens, high-norm artifacts."""

from .artifacts import MAX_OUTLIER_FRACTION, MIN_NORM_RATIO, HighNormTokens, attention_mass, high_norm_tokens, token_norms
from .capture import TOKEN_KINDS, capture_tokens, logit_lens
from .features import feature_pca, patch_similarity

__all__ = [
    "TOKEN_KINDS",
    "capture_tokens",
    "logit_lens",
    "feature_pca",
    "patch_similarity",
    "token_norms",
    "high_norm_tokens",
    "HighNormTokens",
    "attention_mass",
    "MAX_OUTLIER_FRACTION",
    "MIN_NORM_RATIO",
]
