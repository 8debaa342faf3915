"""Zero-shot classification by text prompts, with the model's own scale, bias and rule."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..model.geometry import input_spec
from .prompts import image_embeddings, require_clip

__all__ = ["ZeroShot", "zero_shot"]


@dataclass(frozen=True)
class ZeroShot:
    """Each image scored against each prompt.

    Attributes
    ----------
    logits : torch.Tensor
        ``(B, P)`` float32 on the CPU, the model's scores ``exp(t)·cos(u_b, v_p) + b`` (its
        ``logits_per_image``).
    probabilities : torch.Tensor
        ``(B, P)``: ``softmax`` over the prompts (CLIP: they sum to one per image),
        or ``sigmoid`` per prompt (SigLIP: each is its own yes/no, they need not sum to one).
    rule : str
        ``"softmax"`` or ``"sigmoid"``.
    prompts : tuple of str or None
        The prompts (``None`` when token ids were given).
    notices : tuple of str, default ()
        What was done to the prompts (a prompt truncated to the text tower's length).
    """

    logits: torch.Tensor
    probabilities: torch.Tensor
    rule: str
    prompts: tuple[str, ...] | None
    notices: tuple[str, ...] = ()


def zero_shot(clip, pixels: torch.Tensor, prompts) -> ZeroShot:
    """Score ``(B, 3, H, W)`` preprocessed images against prompts (strings, or ``(P, S)`` token ids).

    The probabilities follow what the model was trained with (Radford et al. 2021, CLIP:
    ``softmax_p(s_{b,p})``; Zhai et al. 2023, SigLIP: ``σ(s_{b,p})``, a pairwise sigmoid loss), so
    a SigLIP's numbers are not a distribution over the prompts and are not shown as one.

    Parameters
    ----------
    clip : LoadedCLIP
        A two-tower model (:func:`~analysis.load_clip`).
    pixels : torch.Tensor
        ``(B, 3, H, W)`` images preprocessed for the image tower.
    prompts : str, sequence of str or token ids
        ``P`` prompts: a string, a list of strings (needs the tokenizer), or ``(P, S)`` token ids.

    Returns
    -------
    ZeroShot
        ``logits`` and ``probabilities`` ``(B, P)``, the rule, the prompts and any notices.

    Raises
    ------
    NoTextTowerError
        ``clip`` is an image-only model.
    TextPromptError
        No prompt, an empty prompt, ids longer than the text tower reads, or text without a tokenizer.
    AnalysisError
        ``pixels`` does not fit the image tower.
    """
    clip = require_clip(clip, "zero_shot")
    input_spec(clip.image, pixels)
    text = clip.encode_text(prompts)
    with torch.no_grad():
        logits = clip.logits(image_embeddings(clip, pixels), text.embeddings).cpu()
    return ZeroShot(
        logits=logits,
        probabilities=clip.probabilities(logits),
        rule=clip.probability,
        prompts=text.prompts,
        notices=text.notices,
    )
