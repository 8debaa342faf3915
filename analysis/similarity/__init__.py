"""Representation similarity across layers and models: linear CKA (Kornblith et al. 2019) with the
minibatch estimator of Nguyen, Raghu and Kornblith 2021, as Raghu et al. 2021 compare ViTs with
CNNs (:func:`representation_similarity`)."""

from .cka import ESTIMATORS, CKAAccumulator, cka_from_hsic, gram, hsic_biased, hsic_unbiased
from .representations import (
    SimilarityResult,
    accumulate_similarity,
    block_outputs,
    layer_names,
    minibatches,
    representation_similarity,
    resolve_images,
)

__all__ = [
    "ESTIMATORS",
    "CKAAccumulator",
    "SimilarityResult",
    "accumulate_similarity",
    "minibatches",
    "block_outputs",
    "cka_from_hsic",
    "gram",
    "hsic_biased",
    "hsic_unbiased",
    "layer_names",
    "representation_similarity",
    "resolve_images",
]
