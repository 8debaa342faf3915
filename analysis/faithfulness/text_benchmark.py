"""The faithfulness benchmark of the text explanation methods on a two-tower model.

Each scene has a prompt that names one of its objects (``"a star"``) and that object's mask.
Every method of :data:`~analysis.text.TEXT_METHODS` (and the seeded random map,
:data:`~analysis.faithfulness.RANDOM`) explains the model's own image–text score
``s = exp(t)·cos(u, v) + b`` of the scene and the prompt, and is scored by

* the pointing game and mask IoU against the named object's patches (:mod:`.localisation`);
* deletion and insertion AUC of ``s`` (:func:`~analysis.faithfulness.perturbation_curve` with
  the score as its value: removed patches take the baseline colour, ``steps + 1`` points on
  [0, 1]). In units of the score, so comparable between methods on one model only.

``python -m analysis.faithfulness --model demo_clip`` runs it on the demo CLIP's held-out
two-object scenes (:mod:`analysis.demo.text_scenes`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image

from ..base.errors import AnalysisError
from ..base.progress import Progress
from .benchmark import RANDOM, MethodScores, method_maps
from .localisation import mask_iou, patch_mask, pointing_score
from .perturbation import area_under_curve, perturbation_curve

__all__ = ["TEXT_COLUMNS", "text_benchmark"]

#: the columns the text benchmark fills (the rest of :data:`~analysis.faithfulness.COLUMNS` stay n/a).
TEXT_COLUMNS = ("pointing", "mask_iou", "deletion_auc", "insertion_auc", "ms_per_image")


def text_benchmark(
    clip,
    images: Sequence[Image.Image],
    prompts: Sequence[str],
    masks: Sequence[np.ndarray],
    *,
    methods: Sequence[str] | None = None,
    steps: int = 16,
    baseline: str = "mean",
    progress: Progress | None = None,
) -> list[MethodScores]:
    """Score every text method (and :data:`RANDOM`) on ``images``: image ``i`` is explained for
    ``prompts[i]``, whose object's ``(H, W)`` bool mask is ``masks[i]``.

    Parameters
    ----------
    clip : LoadedCLIP
        A two-tower model (:func:`analysis.load_clip`).
    images : sequence of PIL.Image.Image
        The scenes.
    prompts : sequence of str
        ``prompts[i]`` names one object of image ``i``.
    masks : sequence of numpy.ndarray
        ``masks[i]``, the ``(H, W)`` bool mask of the object ``prompts[i]`` names (pointing and
        IoU are skipped when it covers no patch).
    methods : sequence of str or None, default None
        Methods of :data:`~analysis.text.TEXT_METHODS`; ``None``, all of them.
    steps : int, default 16
        Deletion and insertion curves take ``steps + 1`` points on [0, 1].
    baseline : str, default "mean"
        What removed patches become, one of :data:`~analysis.explanations.BASELINES`.
    progress : Progress or None, default None
        Called ``progress(done, len(images))`` after each image.

    Returns
    -------
    list of MethodScores
        One per method, :data:`RANDOM` first; only the :data:`TEXT_COLUMNS` are filled.

    Raises
    ------
    NoTextTowerError
        ``clip`` is an image-only model.
    AnalysisError
        An unknown method, or not one prompt and one mask per image.
    """
    from ..text import TEXT_METHODS, explain_text
    from ..text.prompts import one_prompt, require_clip, score_value

    clip = require_clip(clip, "text_benchmark")
    methods = list(TEXT_METHODS) if methods is None else list(methods)
    unknown = [m for m in methods if m not in TEXT_METHODS]
    if unknown:
        raise AnalysisError(f"Unknown text methods {unknown}; use some of {', '.join(TEXT_METHODS)}.")
    if not len(images) == len(prompts) == len(masks):
        raise AnalysisError(
            f"{len(images)} images, {len(prompts)} prompts and {len(masks)} masks: give one of each per image."
        )
    vit, spec = clip.image, clip.image.spec
    names = [RANDOM, *methods]
    scores = {name: MethodScores(name) for name in names}
    encodings: dict[str, torch.Tensor] = {}
    for index, (image, prompt, mask) in enumerate(zip(images, prompts, masks)):
        pixels = clip.preprocess(image)
        if prompt not in encodings:
            encodings[prompt] = one_prompt(clip, prompt).embeddings
        score = score_value(clip, encodings[prompt])  # (K, E) -> (K,) the image-text score of each perturbed input

        mask_image = Image.fromarray(np.asarray(mask, dtype=np.uint8) * 255, "L").convert("RGB")
        object_patches = patch_mask(
            np.asarray(vit.model_input_image(mask_image))[..., 0] > 127, spec.patch_size, spec.grid_size
        )
        for name in names:
            started = time.perf_counter()
            if name == RANDOM:
                saliency = method_maps(vit, pixels, RANDOM, 0, index=index)
            else:
                saliency = explain_text(clip, pixels, prompt, method=name).maps[0]
            row = scores[name].values
            row["ms_per_image"].append(1000 * (time.perf_counter() - started))
            if object_patches.any():
                row["pointing"].append(float(pointing_score(saliency, object_patches)))
                row["mask_iou"].append(mask_iou(saliency, object_patches))
            for key, mode in (("deletion_auc", "deletion"), ("insertion_auc", "insertion")):
                fractions, values = perturbation_curve(
                    vit, pixels, saliency, 0, mode=mode, baseline=baseline, steps=steps, value=score
                )
                row[key].append(area_under_curve(fractions, values))
        if progress is not None:
            progress(index + 1, len(images))
    return [scores[name] for name in names]
