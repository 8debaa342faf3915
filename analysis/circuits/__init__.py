"""Causal and decomposition analyses on the activation cache, one file each:
direct logit attribution, head ablation and activation patching."""

from .ablation import ABLATIONS, HeadAblation, cumulative_head_ablation, head_ablation, heads_by_effect
from .attribution import DirectLogitAttribution, direct_logit_attribution, output_attribution
from .dataset import HeadEffectSums, dataset_head_effects
from .patching import PATCH_POINTS, PatchingResult, activation_patching

__all__ = [
    "ABLATIONS",
    "HeadAblation",
    "head_ablation",
    "cumulative_head_ablation",
    "heads_by_effect",
    "DirectLogitAttribution",
    "direct_logit_attribution",
    "output_attribution",
    "PATCH_POINTS",
    "PatchingResult",
    "activation_patching",
    "HeadEffectSums",
    "dataset_head_effects",
]
