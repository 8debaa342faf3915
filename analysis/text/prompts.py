"""What every text analysis shares: the model check, one prompt's embedding, and the score."""

from __future__ import annotations

import torch

from ..errors import NoTextTowerError, TextPromptError
from ..loading.two_tower import LoadedCLIP, TextEncoding

__all__ = ["require_clip", "one_prompt", "image_embeddings", "score_of"]


def require_clip(clip, what: str) -> LoadedCLIP:
    """``clip`` if it is a two-tower model, else a NoTextTowerError that says what to load."""
    if isinstance(clip, LoadedCLIP):
        return clip
    name = getattr(clip, "name", type(clip).__name__)
    raise NoTextTowerError(
        f"{what} scores images against text, but {name!r} is an image-only model with no text tower. Load a "
        "two-tower model with load_clip (a Hugging Face CLIPModel/SiglipModel folder or 'hf:org/name', or "
        "'open_clip:<arch>')."
    )


def one_prompt(clip: LoadedCLIP, prompt) -> TextEncoding:
    """The encoding of exactly one prompt (a string, or one row of token ids)."""
    encoding = clip.encode_text(prompt)
    if encoding.embeddings.shape[0] != 1:
        raise TextPromptError(f"This explains one prompt at a time; got {encoding.embeddings.shape[0]}. Loop over them.")
    return encoding


def image_embeddings(clip: LoadedCLIP, pixels: torch.Tensor) -> torch.Tensor:
    """``(B, E)`` image embeddings ``u`` (the image tower's output), float32."""
    return clip.image.model(pixels.to(clip.device, dtype=torch.float32)).float()


def score_of(clip: LoadedCLIP, text_embedding: torch.Tensor):
    """``score(u (B, E)) -> Σ_b s_b``, the image–text score summed over images (their gradients
    are per image: images do not interact)."""
    def score(output: torch.Tensor) -> torch.Tensor:
        return clip.logits(output, text_embedding).sum()

    return score
