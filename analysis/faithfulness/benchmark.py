"""The faithfulness benchmark: every explanation method, and a random map, scored on the same
images by localisation (pointing game, mask IoU), perturbation (deletion / insertion AUC,
Chefer et al.'s positive / negative perturbation AUC), the model-randomisation sanity check
and time per image. ``python -m analysis.faithfulness`` runs it from a command line."""

from __future__ import annotations

import ast
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image

from ..base.errors import AnalysisError
from ..base.progress import Progress
from ..explanations import CLASS_SPECIFIC, EXPLANATION_METHODS, explain
from .localisation import mask_iou, patch_mask, pointing_score
from .perturbation import PERTURBATION_FRACTIONS, area_under_curve, map_cells, perturbation_curve
from .sanity import randomized_copy, rank_correlation

__all__ = ["RANDOM", "COLUMNS", "MethodScores", "benchmark", "format_table", "method_maps", "parse_method"]

RANDOM = "random"  # the baseline: a uniformly random map per image (seeded by image index)

#: column -> (header, better: "high" | "low")
COLUMNS = {
    "pointing": ("pointing ↑", "high"),
    "mask_iou": ("mask IoU ↑", "high"),
    "deletion_auc": ("deletion AUC ↓", "low"),
    "insertion_auc": ("insertion AUC ↑", "high"),
    "positive_auc": ("pos. perturb. AUC ↓", "low"),
    "negative_auc": ("neg. perturb. AUC ↑", "high"),
    "sanity_rho": ("sanity ρ ↓", "low"),
    "ms_per_image": ("ms / image", "low"),
}


@dataclass
class MethodScores:
    """Per-image scores of one method (lists grow with each image).

    Attributes
    ----------
    method : str
        The method's name (:data:`RANDOM` for the random baseline).
    values : dict of str to list of float
        Column key (of :data:`COLUMNS`) -> one score per image scored; :meth:`mean` averages one.
    """

    method: str
    values: dict[str, list[float]] = field(default_factory=lambda: {key: [] for key in COLUMNS})

    def mean(self, key: str) -> float:
        scores = self.values[key]
        return float(np.mean(scores)) if scores else float("nan")


def parse_method(label: str) -> tuple[str, dict]:
    """A method's name and options from a label: ``"attnlrp"`` is the method with its defaults,
    ``"attnlrp(attention='cp', gamma=0.25)"`` the method with those options (Python literals;
    a bare name such as ``cp`` reads as a string), so that one table compares a method's variants.

    Parameters
    ----------
    label : str
        A method of :data:`~analysis.explanations.EXPLANATION_METHODS` or :data:`RANDOM`, optionally
        followed by keyword options in parentheses.

    Returns
    -------
    tuple of (str, dict)
        The method's name and its options (empty for a plain name).

    Raises
    ------
    AnalysisError
        A label that is not a name followed by keyword arguments of literal values.
    """
    label = label.strip()
    if "(" not in label:
        return label, {}
    try:
        call = ast.parse(label, mode="eval").body
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name) or call.args:
            raise ValueError("not name(key=value, ...)")
        options = {}
        for keyword in call.keywords:
            if keyword.arg is None:
                raise ValueError("no **options")
            value = keyword.value
            options[keyword.arg] = value.id if isinstance(value, ast.Name) else ast.literal_eval(value)
    except (SyntaxError, ValueError) as exc:
        raise AnalysisError(f"Cannot read the method {label!r} ({exc}); write name(key=value, ...).") from exc
    return call.func.id, options


def method_maps(vit, pixels: torch.Tensor, method: str, target: int, *, index: int = 0, **options) -> torch.Tensor:
    """The map of one image by ``method`` (or the seeded random baseline).

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`).
    pixels : torch.Tensor
        ``(1, 3, H, W)`` preprocessed input (only the first image's map is returned).
    method : str
        A method of :data:`~analysis.explanations.EXPLANATION_METHODS`, or :data:`RANDOM`, or a
        label with options (:func:`parse_method`), which add to (and override) ``options[name]``.
    target : int
        The class explained (passed only to the class-specific methods).
    index : int, default 0
        The random baseline's seed (the image's index).
    **options : Any
        Method name -> dict of that method's options for
        :func:`~analysis.explanations.explain`; only ``options[method]`` is used.

    Returns
    -------
    torch.Tensor
        ``(gh, gw)`` float32 on the CPU (the random map: uniform in ``[0, 1)`` on ``vit.spec.grid_size``).

    Raises
    ------
    AnalysisError
        As :func:`~analysis.explanations.explain`.
    """
    if method == RANDOM:
        generator = torch.Generator().manual_seed(int(index))
        return torch.rand(vit.spec.grid_size, generator=generator)
    name, own = parse_method(method)
    kwargs = {**options.get(name, {}), **own}
    target_arg = target if name in CLASS_SPECIFIC else None
    return explain(vit, pixels, target=target_arg, method=name, **kwargs)[0]


def benchmark(
    vit,
    images: Sequence[Image.Image],
    masks: Sequence[np.ndarray] | np.ndarray | None = None,  # an (n, H, W) array is n masks
    *,
    methods: Sequence[str] = tuple(EXPLANATION_METHODS),
    steps: int = 16,
    baseline: str = "mean",
    sanity_images: int = 20,
    method_options: dict | None = None,
    progress: Progress | None = None,
) -> list[MethodScores]:
    """Score every method (and :data:`RANDOM`) on ``images``. Each image is explained for the
    model's predicted class. The sanity check runs on the first ``sanity_images`` images against
    a copy with the head and every block re-initialised.

    A windowed model's (Swin, SAM) methods give maps on different grids
    (:func:`~analysis.explanations.explanation_grid`): each map is scored on its own grid (its
    cells of the object mask, its cells removed; :func:`~.perturbation.map_cells`), so the
    curves' x axis, the fraction of the image's cells, means the same for every method, while a
    coarser grid makes the pointing game easier (fewer, larger cells).

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`).
    images : sequence of PIL.Image.Image
        The images, each preprocessed by ``vit.preprocess``.
    masks : sequence of numpy.ndarray, numpy.ndarray or None, default None
        ``masks[i]``, image ``i``'s ``(H, W)`` bool object mask (an ``(n, H, W)`` array is ``n``
        masks); ``None`` skips pointing and IoU, as does a mask that covers no cell of a map.
    methods : sequence of str, default every method of ``EXPLANATION_METHODS``
        The methods scored, after :data:`RANDOM`; a label with options (:func:`parse_method`,
        ``"attnlrp(attention='cp')"``) scores that variant, as a row of its own.
    steps : int, default 16
        Deletion and insertion curves take ``steps + 1`` points on [0, 1].
    baseline : str, default "mean"
        What removed patches become, one of :data:`~analysis.explanations.BASELINES`.
    sanity_images : int, default 20
        How many images (the first ones) the sanity check runs on; 0 skips it.
    method_options : dict or None, default None
        Method name -> dict of that method's options for :func:`~analysis.explanations.explain`.
    progress : Progress or None, default None
        Called ``progress(done, len(images))`` after each image.

    Returns
    -------
    list of MethodScores
        One per method, :data:`RANDOM` first, then ``methods`` in order.

    Raises
    ------
    AnalysisError
        An unknown method, a number of masks other than of images, or as
        :func:`~analysis.explanations.explain` and :func:`~.perturbation.perturbation_curve`.
    """
    unknown = [m for m in methods if parse_method(m)[0] not in EXPLANATION_METHODS]
    if unknown:
        raise AnalysisError(f"Unknown methods {unknown}; use some of {', '.join(EXPLANATION_METHODS)}.")
    if masks is not None and len(masks) != len(images):
        raise AnalysisError(f"{len(masks)} masks for {len(images)} images.")
    names = [RANDOM, *methods]
    scores = {name: MethodScores(name) for name in names}
    options = method_options or {}
    randomized = randomized_copy(vit, vit.spec.num_layers) if sanity_images > 0 else None
    spec = vit.spec
    for index, image in enumerate(images):
        pixels = vit.preprocess(image)
        with torch.no_grad():
            target = int(vit.model(pixels.to(vit.device)).argmax(-1)[0])
        pixel_mask = None
        if masks is not None:
            mask_image = Image.fromarray(np.asarray(masks[index], dtype=np.uint8) * 255, "L").convert("RGB")
            pixel_mask = np.asarray(vit.model_input_image(mask_image))[..., 0] > 127
        for name in names:
            started = time.perf_counter()
            saliency = method_maps(vit, pixels, name, target, index=index, **options)
            elapsed = time.perf_counter() - started
            row = scores[name].values
            row["ms_per_image"].append(1000 * elapsed)
            object_patches = None
            if pixel_mask is not None:  # the object's cells on this map's own grid
                grid, cell = map_cells(spec, tuple(saliency.shape))
                object_patches = patch_mask(pixel_mask, cell, grid)
            if object_patches is not None and object_patches.any():
                row["pointing"].append(float(pointing_score(saliency, object_patches)))
                row["mask_iou"].append(mask_iou(saliency, object_patches))
            for key, mode in (("deletion_auc", "deletion"), ("insertion_auc", "insertion")):
                fractions, values = perturbation_curve(
                    vit, pixels, saliency, target, mode=mode, baseline=baseline, steps=steps
                )
                row[key].append(area_under_curve(fractions, values))
            for key, most_first in (("positive_auc", True), ("negative_auc", False)):
                fractions, values = perturbation_curve(
                    vit,
                    pixels,
                    saliency,
                    target,
                    fractions=PERTURBATION_FRACTIONS,
                    most_first=most_first,
                    metric="top1",
                    baseline=baseline,
                )
                row[key].append(100 * area_under_curve(fractions, values))
            if randomized is not None and index < sanity_images:
                other = method_maps(
                    randomized, pixels, name, target, index=index + 1_000_000 if name == RANDOM else index, **options
                )
                row["sanity_rho"].append(rank_correlation(saliency, other))
        if progress is not None:
            progress(index + 1, len(images))
    return [scores[name] for name in names]


def format_table(results: Sequence[MethodScores], columns: Sequence[str] | None = None) -> str:
    """A Markdown table, one row per method, the random baseline first; each cell the mean over
    images (``n/a`` when no image was scored).

    Parameters
    ----------
    results : sequence of MethodScores
        The rows, in order (as :func:`benchmark` returns them).
    columns : sequence of str or None, default None
        Keys of :data:`COLUMNS`, the columns shown; ``None``, all.

    Returns
    -------
    str
        The table, one line per row, no trailing newline.

    Raises
    ------
    KeyError
        A column that is not a key of :data:`COLUMNS`.
    """
    keys = list(COLUMNS) if columns is None else list(columns)
    headers = ["method", *(COLUMNS[key][0] for key in keys)]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for scores in results:
        cells = [scores.method]
        for key in keys:
            value = scores.mean(key)
            cells.append(
                "n/a"
                if np.isnan(value)
                else (f"{value:.1f}" if key in ("ms_per_image", "positive_auc", "negative_auc") else f"{value:.3f}")
            )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
