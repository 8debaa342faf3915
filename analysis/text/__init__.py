"""Text prompts for two-tower image–text models (CLIP, SigLIP).

    >>> clip = load_clip("path/to/clip")                     # a LoadedCLIP; clip.image is a LoadedViT
    >>> result = zero_shot(clip, pixels, ["a photo of a dog", "a photo of a cat"])
    >>> result.probabilities                                 # (B, P): the model's own rule
    >>> explanation = explain_text(clip, pixels, "a photo of a dog", method="chefer")
    >>> explanation.maps                                     # (B, gh, gw)
    >>> head_texts(clip, images).of(11, 3).texts             # TextSpan: what head 3 of layer 11 writes

Every analysis scores an image against a prompt with the model's own score
``s = exp(t)·cos(u, v) + b`` (:meth:`~analysis.model.loading.LoadedCLIP.logits`).
"""

from .decomposition import TextDecomposition, text_decomposition
from .explain import TEXT_METHODS, TextExplanation, explain_text
from .head_texts import DEFAULT_VOCABULARY, HeadDescription, HeadTexts, default_vocabulary, head_texts, text_span
from .prompts import prompts_from_template, score_value
from .zero_shot import ZeroShot, zero_shot

__all__ = [
    "zero_shot",
    "ZeroShot",
    "explain_text",
    "TextExplanation",
    "TEXT_METHODS",
    "text_decomposition",
    "TextDecomposition",
    "head_texts",
    "HeadTexts",
    "HeadDescription",
    "text_span",
    "default_vocabulary",
    "DEFAULT_VOCABULARY",
    "prompts_from_template",
    "score_value",
]
