"""The Text prompts page's "Reproduce in Python": the public ``analysis`` calls that recompute what it
shows, ending with its arrays under the names of its ``.npz`` download (:mod:`vizapp.python_snippet`)."""

from __future__ import annotations

from collections.abc import Sequence

from vizapp.python_snippet import sample_path, script
from vizapp.refs import ImageRef

__all__ = ["text_prompts_code"]


def text_prompts_code(
    clip_source: str,
    image: ImageRef,
    *,
    prompts: Sequence[str],
    mapped: Sequence[str],
    methods: Sequence[str],
    focus: str,
    layer: int,
    head: int,
    curve_method: str,
    steps: int = 16,
) -> str:
    """The Text prompts page, under its downloads' names: ``logits`` and ``probabilities`` ``(P,)``
    (zero-shot), ``maps`` ``(len(MAPPED), len(METHODS), gh, gw)`` and ``scaled`` (each by its peak,
    negatives 0), the decomposition of ``FOCUS``'s score (``heads`` ``(L, heads)``, ``head_map``,
    ``score``) and its deletion / insertion curves of ``curve_method``'s map."""
    path = sample_path(image)
    image_line = (
        f"IMAGE = {str(path)!r}  # the bundled sample shown in the app"
        if path is not None
        else f"IMAGE = {image.name!r}  # the image you uploaded: fill in its path on your machine"
    )
    return script(
        [
            "import numpy as np",
            "import analysis",
            "from analysis.faithfulness import perturbation_curve",
            "from analysis.text import explain_text, score_value, text_decomposition, zero_shot",
            "",
            f"clip = analysis.load_clip({clip_source!r})",
            image_line,
            "pixels = clip.preprocess(analysis.load_image(IMAGE))  # (1, 3, H, W): the image tower's own preprocessing",
            "",
            f"PROMPTS = {list(prompts)!r}",
            "result = zero_shot(clip, pixels, PROMPTS)",
            "logits = result.logits[0].numpy()  # (P,) the model's score s = exp(t)·cos(u, v) + b of each prompt",
            "probabilities = result.probabilities[0].numpy()  # result.rule: softmax over the prompts (CLIP) or sigmoid (SigLIP)",
            "",
            f"MAPPED, METHODS = {list(mapped)!r}, {list(methods)!r}",
            "maps = np.stack([np.stack([explain_text(clip, pixels, p, method=m).maps[0].numpy() for m in METHODS])",
            "                 for p in MAPPED])  # (prompts, methods, gh, gw)",
            "scaled = analysis.scale_by_peak(maps, negative='zero')  # as drawn: each map / its max |value|, negatives 0",
            "",
            f"FOCUS = {focus!r}",
            "decomposition = text_decomposition(clip, pixels, FOCUS)",
            "heads = decomposition.heads()[0].numpy()  # (L, heads): each head's direct contribution to the score",
            f"head_map = decomposition.head_maps()[0, {int(layer)}, {int(head)}].numpy()  # (gh, gw): layer {int(layer)}, "
            f"head {int(head)}",
            "score = float(decomposition.score[0])  # = decomposition.total(): heads + decomposition.remainder()",
            "",
            f"saliency = explain_text(clip, pixels, FOCUS, method={curve_method!r}).maps[0]",
            "value = score_value(clip, clip.encode_text(FOCUS).embeddings)  # perturbed images -> their score s",
            f"fractions, deletion = perturbation_curve(clip.image, pixels, saliency, 0, mode='deletion', steps={int(steps)}, "
            "value=value)",
            f"_, insertion = perturbation_curve(clip.image, pixels, saliency, 0, mode='insertion', steps={int(steps)}, "
            "value=value)",
        ]
    )
