"""Robustness probes of "Intriguing Properties of Vision Transformers" (Naseer et al. 2021)."""

from .attacks import ATTACKS, AttackCurve, AttackError, attack, attack_curve, fgsm, pgd, transfer_matrix
from .corruptions import (
    FAST_CORRUPTIONS,
    CorruptionCurve,
    CorruptionError,
    CorruptionsUnavailableError,
    corrupt_image,
    corruption_curve,
    corruption_errors,
    corruption_names,
)
from .cnn import DEMO_CNN_DIR, IMAGENET_1K_CNNS, LoadedCNN, cnn_gradcam, load_cnn
from .probe import SALIENCY_NAMES, Probe, probe
from .dropped import DroppedTokenPass, kept_attention_distance, kept_rollout, token_drop_attention
from .curves import PERTURBATIONS, SET_LEVELS, RobustnessCurve, perturb, robustness_curve
from .perturbations import (
    DROP_SELECTIONS,
    check_token_drop,
    drop_pixels,
    gaussian_blur,
    gaussian_noise,
    patch_drop_indices,
    shuffle_grids,
    shuffle_patches,
    token_drop,
)

__all__ = [
    "ATTACKS",
    "AttackCurve",
    "AttackError",
    "attack",
    "attack_curve",
    "fgsm",
    "pgd",
    "transfer_matrix",
    "FAST_CORRUPTIONS",
    "CorruptionCurve",
    "CorruptionError",
    "CorruptionsUnavailableError",
    "corrupt_image",
    "corruption_curve",
    "corruption_errors",
    "corruption_names",
    "DEMO_CNN_DIR",
    "IMAGENET_1K_CNNS",
    "LoadedCNN",
    "load_cnn",
    "cnn_gradcam",
    "Probe",
    "probe",
    "SALIENCY_NAMES",
    "DroppedTokenPass",
    "kept_rollout",
    "kept_attention_distance",
    "token_drop_attention",
    "PERTURBATIONS",
    "SET_LEVELS",
    "RobustnessCurve",
    "perturb",
    "robustness_curve",
    "DROP_SELECTIONS",
    "check_token_drop",
    "drop_pixels",
    "gaussian_blur",
    "gaussian_noise",
    "patch_drop_indices",
    "shuffle_grids",
    "shuffle_patches",
    "token_drop",
]
