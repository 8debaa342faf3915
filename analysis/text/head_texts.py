"""Which heads say what: TextSpan (Gandelsman et al. 2024) over an image set.

Each head ``(l, h)`` writes a direct contribution ``c_{l,h}(x) ∈ R^E`` to the image embedding of
image ``x`` (:func:`analysis.circuits.attribution.head_output_vectors`: its output summed over tokens, through
the final norm with its scale frozen and the projection; SigLIP: through the pooling head with its
probabilities frozen). Over ``K`` images they form ``C ∈ R^{K×E}``. TextSpan (Gandelsman, Efros &
Steinhardt 2024, "Interpreting CLIP's image representation via text-based decomposition",
Algorithm 1) greedily picks the texts whose embedding directions explain most of ``C``'s variance:

    T ← T projected onto the span of C's top ``rank`` right singular vectors; C ← C − mean(C)
    repeat m times:
        j* = argmax_j Var_k(C_k · t_j)                      (the text with the largest variance)
        share_i = Var_k(C_k · t̂_j*) / Σ_e Var_k(C_{k,e})     (the part of the head's variance it explains)
        C ← C − (C t_j*) t_j*ᵀ / ‖t_j*‖²;   T ← T − (T t_j*) t_j*ᵀ / ‖t_j*‖²

The picked directions are orthogonal, so the shares add up to the variance their span explains
(at most 1). ``t_j`` are the unit text embeddings of the vocabulary (variances as in the paper's
code: of ``C·t`` with the text vectors as they shrink, unnormalised).

``head_vectors=`` picks how the final norm's mean and shifts are shared among the parts
(:func:`analysis.circuits.attribution.output_vector_parts`): ``"centred"`` (default) centres each
part on its own; ``"textspan"`` follows TextSpan's repository, which shares the norm's mean and
shifts (and a block's output bias among its heads) equally among the parts and divides each by the
image embedding's norm ``‖u‖`` (CLIP's class-token readout only).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..base.arguments import check_int, resolve_layers
from ..base.errors import AnalysisError, TextPromptError
from ..base.progress import Progress
from ..circuits.attribution import HEAD_VECTORS, head_output_vectors
from ..model.geometry import input_spec
from .prompts import require_clip

__all__ = ["HeadDescription", "HeadTexts", "head_texts", "text_span", "default_vocabulary", "DEFAULT_VOCABULARY"]

#: the bundled vocabulary: one description a line (colours, shapes, positions, objects, textures).
DEFAULT_VOCABULARY = Path(__file__).with_name("vocabulary.txt")


@dataclass(frozen=True)
class HeadDescription:
    """One head's texts, in the order TextSpan picked them.

    Attributes
    ----------
    layer : int
        The head's model layer.
    head : int
        The head's index in its layer.
    texts : tuple of str
        The picked descriptions.
    shares : tuple of float
        The share of the head's variance over the images each explains (0–1, they add up).
    variance : float
        The head's total variance ``Σ_e Var_k(c_{k,e})`` (embedding units squared): a head
        that barely varies has little to describe, whatever its shares.
    """

    layer: int
    head: int
    texts: tuple[str, ...]
    shares: tuple[float, ...]
    variance: float

    @property
    def explained(self) -> float:
        """The share of the head's variance its texts explain together."""
        return float(sum(self.shares))


@dataclass(frozen=True)
class HeadTexts:
    """``head_texts``' result: one :class:`HeadDescription` per head, layers in the order asked, and
    any notice about the vocabulary (descriptions truncated to the text tower's length).

    Attributes
    ----------
    heads : tuple of HeadDescription
        Every head of each described layer, layer by layer (in the order asked), heads in order;
        :meth:`of` finds one.
    images : int
        How many images the variances are over (``N``).
    vocabulary_size : int
        How many distinct descriptions were searched.
    notices : tuple of str, default ()
        What was done to the vocabulary (descriptions truncated to the text tower's length).
    """

    heads: tuple[HeadDescription, ...]
    images: int
    vocabulary_size: int
    notices: tuple[str, ...] = ()

    def of(self, layer: int, head: int) -> HeadDescription:
        for description in self.heads:
            if (description.layer, description.head) == (layer, head):
                return description
        raise AnalysisError(
            f"Head ({layer}, {head}) was not described; described layers: {sorted({d.layer for d in self.heads})}."
        )


def default_vocabulary() -> list[str]:
    """The bundled descriptions (:data:`DEFAULT_VOCABULARY`).

    Returns
    -------
    list of str
        One description per non-blank line of the file, stripped.

    Raises
    ------
    TextPromptError
        The file cannot be read.
    """
    return _read_vocabulary(DEFAULT_VOCABULARY)


def _read_vocabulary(path: Path) -> list[str]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise TextPromptError(f"Cannot read the vocabulary file {path}: {exc}") from exc
    return [line.strip() for line in lines if line.strip()]


def _vocabulary(vocabulary) -> list[str]:
    if vocabulary is None:
        texts = default_vocabulary()
    elif isinstance(vocabulary, (str, os.PathLike)):
        texts = _read_vocabulary(Path(vocabulary))
    elif isinstance(vocabulary, Sequence):
        texts = [str(text).strip() for text in vocabulary if str(text).strip()]
    else:
        raise TextPromptError(
            f"vocabulary must be None, a text file or a list of descriptions; got {type(vocabulary).__name__}."
        )
    if not texts:
        raise TextPromptError("The vocabulary is empty: pass at least one description (one a line in a file).")
    return list(dict.fromkeys(texts))  # repeated descriptions once


def text_span(
    contributions: torch.Tensor, texts: torch.Tensor, count: int, rank: int | None = None
) -> tuple[list[int], list[float], float]:
    """TextSpan's greedy search (module docstring), computed in float64. Stops early when
    nothing is left to explain.

    Parameters
    ----------
    contributions : torch.Tensor
        ``(K, E)`` one head's direct contributions ``C`` over ``K`` images.
    texts : torch.Tensor
        ``(M, E)`` text embeddings (used as given; pass unit vectors).
    count : int
        The most texts to pick (``>= 1``; named ``texts_per_head`` in errors).
    rank : int or None, default None
        Project the texts onto the span of the contributions' top ``rank`` right singular vectors
        first (the paper's code: 80); ``None``: no projection.

    Returns
    -------
    tuple of (list of int, list of float, float)
        ``(picked, shares, total)``: the picked text indices in order, the share of the variance each
        explains, and the total variance ``Σ_e Var_k(C_{k,e})``.

    Raises
    ------
    AnalysisError
        ``count`` or ``rank`` is not an integer ``>= 1``.
    """
    count = check_int("texts_per_head", count, minimum=1)
    data = contributions.double()
    candidates = texts.double().clone()
    if rank is not None:
        rank = check_int("rank", rank, minimum=1)
        _, _, vh = torch.linalg.svd(data, full_matrices=False)
        basis = vh[:rank]  # (r, E) orthonormal rows
        candidates = candidates @ basis.T @ basis
    data = data - data.mean(0, keepdim=True)
    total = float((data**2).sum(1).mean())
    picked, shares = [], []
    for _ in range(min(count, candidates.shape[0])):
        variances = (data @ candidates.T).var(0, unbiased=False)  # (M,)
        best = int(variances.argmax())
        direction = candidates[best]
        norm2 = float(direction @ direction)
        if total <= 0 or norm2 <= 1e-24 or float(variances[best]) <= 1e-12 * total:
            break
        along = data @ direction / norm2  # (K,)
        picked.append(best)
        shares.append(float((along**2).mean() * norm2) / total)
        data = data - along[:, None] * direction[None]
        candidates = candidates - (candidates @ direction / norm2)[:, None] * direction[None]
    return picked, shares, total


def _pixels(clip, images) -> torch.Tensor:
    if isinstance(images, torch.Tensor):
        return images
    if isinstance(images, Sequence) and images:
        return torch.cat([clip.preprocess(image) for image in images])
    raise AnalysisError("images must be a (N, 3, H, W) tensor of preprocessed images or a list of PIL images.")


def head_texts(
    clip,
    images,
    vocabulary=None,
    layers=None,
    *,
    texts_per_head: int = 5,
    rank: int | None = 80,
    batch_size: int = 16,
    progress: Progress | None = None,
    head_vectors: str = HEAD_VECTORS[0],
) -> HeadTexts:
    """Describe each head of ``layers`` by the ``texts_per_head`` texts of ``vocabulary`` that explain
    most of its direct contribution's variance over ``images``, by :func:`text_span`.

    Parameters
    ----------
    clip : LoadedCLIP
        A two-tower model (:func:`~analysis.load_clip`) with a global-attention image tower.
    images : torch.Tensor or list of PIL.Image.Image
        A ``(N, 3, H, W)`` preprocessed tensor or a list of PIL images, ``N ≥ 2``.
    vocabulary : str, os.PathLike, sequence of str or None, default None
        ``None``: the bundled :data:`DEFAULT_VOCABULARY`; the path of a text file, one description a
        line (a ``str`` is always a path); or a list of descriptions. Blank descriptions are dropped,
        repeated ones kept once.
    layers : int, sequence of int or None, default None
        Model layer indices (negative count from the end), described in the order asked; ``None``: every
        layer.
    texts_per_head : int, default 5
        The most texts picked per head.
    rank : int or None, default 80
        As :func:`text_span` (``None``: no projection).
    batch_size : int, default 16
        Images per forward pass.
    progress : Progress or None, default None
        ``progress(done, total)`` is called after each batch of images with the images read so far.
    head_vectors : str, default "centred"
        ``"centred"`` or ``"textspan"`` (TextSpan's repository's vectors; module docstring).

    Returns
    -------
    HeadTexts
        One :class:`HeadDescription` per head of each layer, with the image count, the vocabulary size
        and any notices.

    Raises
    ------
    NoTextTowerError
        ``clip`` is an image-only model.
    TextPromptError
        An unreadable vocabulary file, an empty vocabulary or one of another type.
    AnalysisError
        ``images`` neither a tensor nor a non-empty list, fewer than 2 images, pixels that do not fit the
        image tower, a bad ``layers``, ``batch_size``, ``texts_per_head``, ``rank`` or ``head_vectors``,
        or an image tower the direct attribution refuses (windowed, heads mixed by an inner norm).
    """
    clip = require_clip(clip, "head_texts")
    pixels = _pixels(clip, images)
    input_spec(clip.image, pixels)
    if pixels.shape[0] < 2:
        raise AnalysisError(f"head_texts needs at least 2 images (a variance over images); got {pixels.shape[0]}.")
    batch_size = check_int("batch_size", batch_size, minimum=1)
    texts = _vocabulary(vocabulary)
    encodings = [clip.encode_text(texts[start : start + 256]) for start in range(0, len(texts), 256)]
    embeddings = F.normalize(torch.cat([e.embeddings.cpu() for e in encodings]), dim=-1)  # (M, E)
    notices = tuple(notice for e in encodings for notice in e.notices)
    layer_ids = resolve_layers(layers, clip.spec.num_layers)  # in the order asked, each once
    pieces = []
    for start in range(0, pixels.shape[0], batch_size):
        pieces.append(
            head_output_vectors(
                clip.image,
                pixels[start : start + batch_size],
                layer_ids,
                attention_pool=True,
                head_vectors=head_vectors,
            )
        )
        if progress is not None:
            progress(min(start + batch_size, pixels.shape[0]), pixels.shape[0])
    vectors = torch.cat(pieces)  # (N, L', heads, E)
    descriptions = []
    for position, layer in enumerate(layer_ids):
        for head in range(vectors.shape[2]):
            picked, shares, total = text_span(vectors[:, position, head], embeddings, texts_per_head, rank)
            descriptions.append(HeadDescription(layer, head, tuple(texts[i] for i in picked), tuple(shares), total))
    return HeadTexts(tuple(descriptions), images=int(pixels.shape[0]), vocabulary_size=len(texts), notices=notices)
