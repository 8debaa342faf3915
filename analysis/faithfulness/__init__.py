"""How faithful is an explanation? Perturbation curves, localisation against known masks,
the model-randomisation sanity check, and a benchmark over every method with a random
baseline (``python -m analysis.faithfulness --model demo --n 500``; the text methods of a
two-tower model: ``--model demo_clip``)."""

from .benchmark import COLUMNS, RANDOM, MethodScores, benchmark, format_table
from .localisation import mask_iou, patch_mask, pointing_score
from .perturbation import (
    CURVE_METRICS,
    CURVE_MODES,
    PERTURBATION_FRACTIONS,
    area_under_curve,
    patch_ranking,
    perturbation_curve,
    perturbed_inputs,
)
from .sanity import randomized_copy, rank_correlation
from .text_benchmark import TEXT_COLUMNS, text_benchmark

__all__ = [
    "COLUMNS",
    "RANDOM",
    "MethodScores",
    "benchmark",
    "format_table",
    "mask_iou",
    "patch_mask",
    "pointing_score",
    "CURVE_METRICS",
    "CURVE_MODES",
    "PERTURBATION_FRACTIONS",
    "area_under_curve",
    "patch_ranking",
    "perturbation_curve",
    "perturbed_inputs",
    "randomized_copy",
    "rank_correlation",
    "TEXT_COLUMNS",
    "text_benchmark",
]
