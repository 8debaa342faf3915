"""What every text analysis shares: the model check, one prompt's embedding, and the score."""

from __future__ import annotations

import torch

from ..base.errors import NoTextTowerError, TextPromptError
from ..model.loading.loaded_clip import LoadedCLIP, TextEncoding

__all__ = ["require_clip", "one_prompt", "image_embeddings", "score_of", "score_value", "prompts_from_template"]


def require_clip(clip, what: str) -> LoadedCLIP:
    """``clip`` if it is a two-tower model, else a NoTextTowerError that says what to load.

    Parameters
    ----------
    clip : Any
        The model passed to a text analysis.
    what : str
        The analysis's name, for the error message.

    Returns
    -------
    LoadedCLIP
        ``clip`` itself.

    Raises
    ------
    NoTextTowerError
        ``clip`` is not a :class:`~analysis.model.loading.LoadedCLIP` (an image-only model).
    """
    if isinstance(clip, LoadedCLIP):
        return clip
    name = getattr(clip, "name", type(clip).__name__)
    raise NoTextTowerError(
        f"{what} scores images against text, but {name!r} is an image-only model with no text tower. Load a "
        "two-tower model with load_clip (a Hugging Face CLIPModel/SiglipModel folder or 'hf:org/name', or "
        "'open_clip:<arch>')."
    )


def one_prompt(clip: LoadedCLIP, prompt) -> TextEncoding:
    """The encoding of exactly one prompt (a string, or one row of token ids).

    Parameters
    ----------
    clip : LoadedCLIP
        The two-tower model.
    prompt : str or token ids
        A string (needs the tokenizer), or token ids ``(1, S)`` (a tensor or a list of one list).

    Returns
    -------
    TextEncoding
        Its ``embeddings`` are ``(1, E)`` float32.

    Raises
    ------
    TextPromptError
        More or fewer than one prompt, an empty prompt, ids longer than the text tower reads, or text
        without a tokenizer.
    """
    encoding = clip.encode_text(prompt)
    if encoding.embeddings.shape[0] != 1:
        raise TextPromptError(
            f"This explains one prompt at a time; got {encoding.embeddings.shape[0]}. Loop over them."
        )
    return encoding


def image_embeddings(clip: LoadedCLIP, pixels: torch.Tensor) -> torch.Tensor:
    """``(B, E)`` image embeddings ``u`` (the image tower's output), float32.

    Parameters
    ----------
    clip : LoadedCLIP
        The two-tower model.
    pixels : torch.Tensor
        ``(B, 3, H, W)`` preprocessed images (moved to the model's device as float32).

    Returns
    -------
    torch.Tensor
        ``(B, E)`` float32 on the model's device, in the graph when called under autograd.
    """
    return clip.image.model(pixels.to(clip.device, dtype=torch.float32)).float()


def score_of(clip: LoadedCLIP, text_embedding: torch.Tensor):
    """``score(u (B, E)) -> Σ_b s_b``, the image–text score summed over images (their gradients
    are per image: images do not interact).

    Parameters
    ----------
    clip : LoadedCLIP
        The two-tower model (its ``logits``: scale and bias).
    text_embedding : torch.Tensor
        One prompt's embedding ``v`` ``(1, E)``.

    Returns
    -------
    Callable
        ``score(u)``: ``u`` ``(B, E)`` image embeddings -> a scalar tensor, differentiable.
    """

    def score(output: torch.Tensor) -> torch.Tensor:
        return clip.logits(output, text_embedding).sum()

    return score


def score_value(clip: LoadedCLIP, text_embedding: torch.Tensor):
    """``value(u (K, E)) -> (K,)``: each image's score ``exp(t)·cos(u_k, v) + b`` with one prompt's
    embedding ``v`` ``(1, E)``: what :func:`~analysis.faithfulness.perturbation_curve` measures
    (``value=``) for a text explanation's deletion and insertion curves.

    Parameters
    ----------
    clip : LoadedCLIP
        The two-tower model (its ``logits``: scale and bias).
    text_embedding : torch.Tensor
        One prompt's embedding ``v`` ``(1, E)``.

    Returns
    -------
    Callable
        ``value(u)``: ``u`` ``(K, E)`` image embeddings -> ``(K,)`` float32 scores.
    """

    def value(output: torch.Tensor) -> torch.Tensor:
        return clip.logits(output, text_embedding)[:, 0]

    return value


#: the placeholder a template's class name goes in.
TEMPLATE_SLOT = "{}"


def prompts_from_template(template: str, classes) -> list[str]:
    """``template`` with each class name in its ``{}`` (CLIP's zero-shot prompts, Radford et al.
    2021: ``"a photo of a {}"``). Blank class names are dropped.

    Parameters
    ----------
    template : str
        A prompt with exactly one ``{}`` where the class name goes.
    classes : iterable
        The class names (each through ``str`` and stripped; blank ones dropped).

    Returns
    -------
    list of str
        One prompt per non-blank class name, in order.

    Raises
    ------
    TextPromptError
        ``template`` is not a string with exactly one ``{}``, or no class name is left.
    """
    if not isinstance(template, str) or template.count(TEMPLATE_SLOT) != 1:
        raise TextPromptError(
            f"The template {template!r} must hold exactly one {TEMPLATE_SLOT} where the class name goes, "
            "e.g. 'a photo of a {}'."
        )
    names = [str(name).strip() for name in classes if str(name).strip()]
    if not names:
        raise TextPromptError("No class name was given: type at least one (comma- or line-separated).")
    return [template.replace(TEMPLATE_SLOT, name) for name in names]
