"""A loaded two-tower image–text model: :class:`LoadedCLIP`, and its prompts' :class:`TextEncoding`.

The types that :func:`analysis.model.loading.two_tower.load_clip` and every source behind it
(:mod:`.two_tower` for Hugging Face, :mod:`.open_clip_source` for open_clip) build, below all of
them, as :mod:`.loaded` holds :class:`~.loaded.LoadedViT`.
The image–text score is the model's own (Radford et al. 2021; Zhai et al. 2023):

    s(image, text) = exp(t) · cos(u, v) + b

with ``u`` the image embedding, ``v`` the text embedding, ``exp(t)`` the learned logit scale and
``b`` SigLIP's learned bias (0 for CLIP); probabilities by :data:`~analysis.model.loading.loaded.PROBABILITY_RULES`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...base.errors import TextPromptError
from .loaded import LoadedViT, class_probabilities

__all__ = ["LoadedCLIP", "TextEncoding", "TOKENIZER_FILES"]

#: the files of a Hugging Face tokenizer, one of which a folder needs for prompts as text.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "spiece.model")


@dataclass(frozen=True)
class TextEncoding:
    """Prompts through the text tower (:meth:`LoadedCLIP.encode_text`).

    Attributes
    ----------
    embeddings : torch.Tensor
        ``(P, E)`` float32 text embeddings in the joint space (not normalised).
    token_ids : torch.Tensor
        ``(P, S)`` long: the ids the text tower read (after truncation and padding).
    prompts : tuple of str or None
        The prompts, or ``None`` when token ids were given.
    notices : tuple of str, default ()
        What was done to the input that the caller must know (a prompt truncated to the text
        tower's length); empty when nothing was.
    """

    embeddings: torch.Tensor
    token_ids: torch.Tensor
    prompts: tuple[str, ...] | None
    notices: tuple[str, ...] = ()


@dataclass(eq=False)
class LoadedCLIP:
    """A two-tower image–text model.

    Attributes
    ----------
    image : LoadedViT
        The image tower as a :class:`LoadedViT`: its output is the image embedding ``u``
        ``(B, E)`` (CLIP: the class token through ``post_layernorm`` and ``visual_projection``;
        SigLIP: its attention-pooling head).
    text_tower : torch.nn.Module
        ``(ids (P, S), mask (P, S) | None) -> (P, E)`` text embeddings ``v``.
    logit_scale : float
        ``exp(t)``, the model's learned temperature (already exponentiated).
    logit_bias : float or None
        SigLIP's learned bias ``b``; ``None`` for CLIP.
    probability : str
        ``"softmax"`` (CLIP) or ``"sigmoid"`` (SigLIP): see
        :data:`~analysis.model.loading.loaded.PROBABILITY_RULES`.
    context_length : int
        The most tokens the text tower reads (its position table).
    tokenizer : Any or None
        The model's tokenizer, or ``None`` (then text must be given as token ids).
    name : str
        The source it was loaded from.
    pad_to_context : bool, default False
        Pad every prompt to ``context_length`` (SigLIP pools the last position, as it was
        trained) rather than to the longest prompt.
    use_attention_mask : bool, default True
        Pass the tokenizer's attention mask to the text tower (CLIP); SigLIP was trained without one.
    source_library : str, default "transformers"
        ``"transformers"`` or ``"open_clip"``.
    tokenizer_note : str, default ""
        Why there is no tokenizer, when there is none.
    vocab_size : int or None, default None
        The text tower's vocabulary (token ids lie in ``0..vocab_size-1``), when known.
    """

    image: LoadedViT
    text_tower: nn.Module
    logit_scale: float
    logit_bias: float | None
    probability: str
    context_length: int
    tokenizer: Any | None
    name: str
    pad_to_context: bool = False
    use_attention_mask: bool = True
    source_library: str = "transformers"
    tokenizer_note: str = ""
    vocab_size: int | None = None
    _count_tokens: Any = field(default=None, repr=False)

    @property
    def device(self) -> torch.device:
        return self.image.device

    @property
    def spec(self):
        return self.image.spec

    def preprocess(self, image) -> torch.Tensor:
        """PIL image -> ``(1, 3, H, W)``: the image tower's own preprocessing."""
        return self.image.preprocess(image)

    # ------------------------------------------------------------------ text

    def tokenize(self, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor, tuple[str, ...]]:
        """``(ids (P, S), mask (P, S), notices)``. A prompt longer than :attr:`context_length`
        tokens (its start and end tokens included) is truncated, keeping its end token, and a
        notice says so (and a ``UserWarning`` is issued): never silently."""
        if self.tokenizer is None:
            raise TextPromptError(
                f"{self.name} has no tokenizer{f' ({self.tokenizer_note})' if self.tokenizer_note else ''}: pass token "
                "ids (a (P, S) LongTensor) instead of prompts, or load a folder that has the tokenizer files "
                f"({', '.join(TOKENIZER_FILES)})."
            )
        notices = []
        for prompt in prompts:
            count = self._count_tokens(prompt)
            if count > self.context_length:
                notices.append(
                    f"The prompt {_shorten(prompt)!r} is {count} tokens long; the text tower reads at most "
                    f"{self.context_length}, so it was truncated to its first {self.context_length} tokens (end token kept)."
                )
        for notice in notices:
            warnings.warn(notice, UserWarning, stacklevel=3)
        ids, mask = self._tokenize(list(prompts))
        return ids, mask, tuple(notices)

    def _tokenize(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.tokenizer is not None, "tokenize() refuses text without a tokenizer"
        if self.source_library == "open_clip":
            ids = self.tokenizer(prompts, context_length=self.context_length)
            return ids.long(), torch.ones_like(ids, dtype=torch.long)
        encoded = self.tokenizer(
            prompts,
            padding="max_length" if self.pad_to_context else True,
            truncation=True,
            max_length=self.context_length,
            return_tensors="pt",
        )
        ids = encoded["input_ids"].long()
        mask = encoded.get("attention_mask")
        return ids, (torch.ones_like(ids) if mask is None else mask.long())

    def encode_text(self, text) -> TextEncoding:
        """Prompts (a string or a list of strings; needs the tokenizer) or token ids (a ``(P, S)``
        LongTensor or list of lists, ``S ≤ context_length``) -> :class:`TextEncoding`.

        Raises TextPromptError for an empty prompt, no prompts, ids longer than the text tower
        reads, or prompts without a tokenizer."""
        prompts, ids, mask, notices = self._text_input(text)
        with torch.no_grad():
            embeddings = self.text_tower(ids.to(self.device), mask.to(self.device) if self.use_attention_mask else None)
        return TextEncoding(embeddings.float(), ids, prompts, notices)

    def _text_input(self, text):
        if isinstance(text, str):
            text = [text]
        if isinstance(text, torch.Tensor) or (isinstance(text, Sequence) and text and not isinstance(text[0], str)):
            return (None, *self._token_ids(text), ())
        prompts = list(text) if isinstance(text, Sequence) else None
        if not prompts:
            raise TextPromptError(
                "No prompt was given: pass a prompt, a list of prompts, or a (P, S) tensor of token ids."
            )
        for index, prompt in enumerate(prompts):
            if not isinstance(prompt, str):
                raise TextPromptError(f"Prompt {index} is a {type(prompt).__name__}, not a string.")
            if not prompt.strip():
                raise TextPromptError(f"Prompt {index} is empty: type some text (e.g. 'a photo of a dog').")
        ids, mask, notices = self.tokenize(prompts)
        return tuple(prompts), ids, mask, notices

    def _token_ids(self, text) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            ids = torch.as_tensor(text)
        except (TypeError, ValueError) as exc:
            raise TextPromptError(
                f"Token ids must be a (P, S) tensor or list of equal-length lists of ints: {exc}"
            ) from exc
        if ids.ndim == 1:
            ids = ids[None]
        if ids.ndim != 2 or ids.shape[1] == 0 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise TextPromptError(
                f"Token ids must be a (P, S) integer tensor with S ≥ 1; got {tuple(ids.shape)} {ids.dtype}."
            )
        if ids.shape[1] > self.context_length:
            raise TextPromptError(
                f"The token ids are {ids.shape[1]} long; the text tower reads at most {self.context_length}. "
                "Cut them yourself (keeping the end token, which the text tower pools), or pass the prompt as text "
                "to have it truncated with a notice."
            )
        if self.vocab_size is not None and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size):
            raise TextPromptError(
                f"Token ids must lie in 0..{self.vocab_size - 1} (the text tower's vocabulary); got "
                f"{int(ids.min())}..{int(ids.max())}."
            )
        return ids.long(), torch.ones_like(ids, dtype=torch.long)

    # ------------------------------------------------------------------ scores

    def logits(self, image_embeddings: torch.Tensor, text_embeddings: torch.Tensor) -> torch.Tensor:
        """``(B, P)`` scores ``exp(t)·cos(u_b, v_p) + b`` from ``(B, E)`` image and ``(P, E)`` text
        embeddings: the one rule every text analysis uses (differentiable)."""
        u = F.normalize(image_embeddings.float(), dim=-1)
        v = F.normalize(text_embeddings.float().to(u.device), dim=-1)
        scores = self.logit_scale * u @ v.T
        return scores if self.logit_bias is None else scores + self.logit_bias

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """``(B, P)``: softmax over the prompts (CLIP) or a sigmoid per prompt (SigLIP)."""
        return class_probabilities(logits, self.probability)

    def __repr__(self) -> str:
        bias = "" if self.logit_bias is None else f", bias={self.logit_bias:.3g}"
        return (
            f"LoadedCLIP({self.name!r}, {self.source_library}, probability={self.probability}, scale={self.logit_scale:.3g}"
            f"{bias}, context={self.context_length}, tokenizer={'yes' if self.tokenizer is not None else 'no'}, "
            f"image={self.image!r})"
        )


def _shorten(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
