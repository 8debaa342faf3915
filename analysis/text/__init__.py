"""Text prompts for two-tower image–text models (CLIP, SigLIP).

    >>> import torch
    >>> from analysis import asset_path, load_clip, load_image
    >>> from analysis.text import explain_text, head_texts, zero_shot
    >>> clip = load_clip("demo_clip")  # or open_clip:<arch>, hf:<org/name>, a folder; clip.image is a LoadedViT
    >>> images = [load_image(path) for path in sorted(asset_path("samples").glob("scene_*.png"))]
    >>> pixels = clip.preprocess(images[1])  # the star scene, (1, 3, H, W)
    >>> result = zero_shot(clip, pixels, ["a star", "a ring"])
    >>> tuple(result.probabilities.shape)  # (B, P), by the model's own rule
    (1, 2)
    >>> explanation = explain_text(clip, pixels, "a star", method="chefer")
    >>> tuple(explanation.maps.shape)  # (B, gh, gw)
    (1, 8, 8)
    >>> spans = head_texts(clip, torch.cat([clip.preprocess(image) for image in images]))  # TextSpan, over 3 images
    >>> spans.of(3, 1).texts  # the texts that describe what head 1 of layer 3 writes
    ('a circle', 'a cross', 'a ring')

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
