"""Two-tower image–text models (CLIP, SigLIP): ``load_clip(source)`` -> :class:`LoadedCLIP`.

The image tower is converted once, at this boundary, into an ordinary :class:`LoadedViT`
(:mod:`.hf_transformers` for Hugging Face ``CLIPModel`` / ``SiglipModel``, :mod:`.open_clip_source`
for open_clip), so every image analysis works on ``clip.image`` unchanged. The text side stays
the source library's own module, wrapped as ``text_tower(ids, mask) -> (P, E)`` embeddings in the
joint space. The image–text score is the model's own (Radford et al. 2021; Zhai et al. 2023):

    s(image, text) = exp(t) · cos(u, v) + b

with ``u`` the image embedding, ``v`` the text embedding, ``exp(t)`` the learned logit scale and
``b`` SigLIP's learned bias (0 for CLIP). CLIP turns scores into probabilities with a softmax
over the prompts; SigLIP with a sigmoid per prompt (its training loss: each image–text pair is
its own binary decision).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..devices import resolve_device
from ..errors import ModelLoadError, NoTextTowerError, TextPromptError
from .loaded import LoadedViT

__all__ = ["LoadedCLIP", "TextEncoding", "load_clip", "PROBABILITY_RULES"]

#: how each kind of model turns its scores into probabilities.
PROBABILITY_RULES = {"softmax": "softmax over the prompts (CLIP)", "sigmoid": "a sigmoid per prompt (SigLIP)"}
_IMAGE_ONLY_HINT = (
    "Load a two-tower image-text model with load_clip: a Hugging Face CLIPModel or SiglipModel folder or "
    "'hf:openai/clip-vit-base-patch32', or 'open_clip:ViT-B-32' (pip install open_clip_torch)."
)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "spiece.model")
#: the bundled demo CLIP by name (``"demo-clip"`` is the same model): its folder is ``asset_path("demo_clip")``.
DEMO_CLIP_NAMES = ("demo_clip", "demo-clip")
_DEMO_CLIP_RETRAIN = "python -m training.train_demo_clip"


@dataclass(frozen=True)
class TextEncoding:
    """Prompts through the text tower.

    Attributes:
        embeddings: ``(P, E)`` float32 text embeddings in the joint space (not normalised).
        token_ids: ``(P, S)`` the ids the text tower read (after truncation and padding).
        prompts: the prompts, or ``None`` when token ids were given.
        notices: what was done to the input that the caller must know (a prompt truncated to
            the text tower's length); empty when nothing was.
    """

    embeddings: torch.Tensor
    token_ids: torch.Tensor
    prompts: tuple[str, ...] | None
    notices: tuple[str, ...] = ()


@dataclass(eq=False)
class LoadedCLIP:
    """A two-tower image–text model.

    Attributes:
        image: the image tower as a :class:`LoadedViT`: its output is the image embedding ``u``
            ``(B, E)`` (CLIP: the class token through ``post_layernorm`` and ``visual_projection``;
            SigLIP: its attention-pooling head).
        text_tower: ``(ids (P, S), mask (P, S) | None) -> (P, E)`` text embeddings ``v``.
        logit_scale: ``exp(t)``, the model's learned temperature (already exponentiated).
        logit_bias: SigLIP's learned bias ``b``; ``None`` for CLIP.
        probability: ``"softmax"`` (CLIP) or ``"sigmoid"`` (SigLIP): see :data:`PROBABILITY_RULES`.
        context_length: the most tokens the text tower reads (its position table).
        tokenizer: the model's tokenizer, or ``None`` (then text must be given as token ids).
        pad_to_context: pad every prompt to ``context_length`` (SigLIP pools the last position,
            as it was trained) rather than to the longest prompt.
        use_attention_mask: pass the tokenizer's attention mask to the text tower (CLIP); SigLIP
            was trained without one.
        name: the source it was loaded from.
        source_library: ``"transformers"`` or ``"open_clip"``.
        tokenizer_note: why there is no tokenizer, when there is none.
        vocab_size: the text tower's vocabulary (token ids lie in ``0..vocab_size-1``), when known.
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
                f"({', '.join(_TOKENIZER_FILES)})."
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
        if self.source_library == "open_clip":
            ids = self.tokenizer(prompts, context_length=self.context_length)
            return ids.long(), torch.ones_like(ids, dtype=torch.long)
        encoded = self.tokenizer(
            prompts, padding="max_length" if self.pad_to_context else True, truncation=True,
            max_length=self.context_length, return_tensors="pt",
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
            raise TextPromptError("No prompt was given: pass a prompt, a list of prompts, or a (P, S) tensor of token ids.")
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
            raise TextPromptError(f"Token ids must be a (P, S) tensor or list of equal-length lists of ints: {exc}") from exc
        if ids.ndim == 1:
            ids = ids[None]
        if ids.ndim != 2 or ids.shape[1] == 0 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise TextPromptError(f"Token ids must be a (P, S) integer tensor with S ≥ 1; got {tuple(ids.shape)} {ids.dtype}.")
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
        return logits.softmax(-1) if self.probability == "softmax" else logits.sigmoid()

    def __repr__(self) -> str:
        bias = "" if self.logit_bias is None else f", bias={self.logit_bias:.3g}"
        return (f"LoadedCLIP({self.name!r}, {self.source_library}, probability={self.probability}, scale={self.logit_scale:.3g}"
                f"{bias}, context={self.context_length}, tokenizer={'yes' if self.tokenizer is not None else 'no'}, "
                f"image={self.image!r})")


def _shorten(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --------------------------------------------------------------------------- loading


def load_clip(
    source, *, device: str | torch.device | None = None, pretrained: bool = True, checkpoint: str | None = None,
) -> LoadedCLIP:
    """Load a two-tower image–text model.

    Args:
        source: ``"demo_clip"`` (the bundled demo CLIP, trained on the demo scenes), a Hugging Face
            ``CLIPModel`` / ``SiglipModel`` ``save_pretrained`` folder (or
            ``"local-dir:PATH"``), ``"hf:org/name"`` (the local cache, else the hub), such a model
            object, ``"open_clip:<arch>"`` (e.g. ``"open_clip:ViT-B-32"``, ``"open_clip:hf-hub:org/name"``),
            or a :class:`LoadedCLIP` (returned as is).
        device: ``None`` picks cuda, then mps, then cpu.
        pretrained: ``hf:`` ids only: ``False`` gives random weights.
        checkpoint: open_clip only: a pretrained tag (``"laion2b_s34b_b79k"``) or a local checkpoint file.

    Raises:
        NoTextTowerError: for an image-only model (a ViT, or a CLIP/SigLIP vision tower alone).
        ModelLoadError: and its subclasses otherwise, with what to do.
    """
    if isinstance(source, LoadedCLIP):
        return source
    if isinstance(source, LoadedViT):
        raise NoTextTowerError(f"{source.name!r} is an image-only model (a LoadedViT): it has no text tower. {_IMAGE_ONLY_HINT}")
    target = resolve_device(device)
    if isinstance(source, nn.Module):
        if type(source).__module__.startswith("open_clip"):
            from .open_clip_source import wrap_open_clip

            return wrap_open_clip(source, type(source).__name__, target, tokenizer=None)
        return wrap_hf_two_tower(source, type(source).__name__, target)
    if not isinstance(source, (str, os.PathLike)) or not os.fspath(source).strip():
        raise ModelLoadError(f"load_clip takes a folder, 'hf:org/name', 'open_clip:<arch>' or a model object; got {source!r}.")
    name = os.fspath(source)
    if name.startswith("open_clip:"):
        from .open_clip_source import load_open_clip

        return load_open_clip(name.removeprefix("open_clip:"), target, checkpoint=checkpoint)
    if name in DEMO_CLIP_NAMES:
        return _load_demo_clip(name, target)
    if name.startswith("hf:"):
        return _load_hf_hub(name.removeprefix("hf:"), target, pretrained=pretrained)
    folder = Path(name.removeprefix("local-dir:")).expanduser()
    if folder.is_dir():
        return load_hf_two_tower_folder(folder, name, target)
    raise NoTextTowerError(
        f"{name!r} is not a two-tower image-text model: model names, 'demo' and weights files open image-only models "
        f"(no text tower), with load_vit. {_IMAGE_ONLY_HINT} The bundled demo CLIP is 'demo_clip'."
    )


def _load_demo_clip(name: str, device: torch.device) -> LoadedCLIP:
    """The bundled demo CLIP (``assets/demo_clip``: a ``CLIPModel`` folder with its tokenizer)."""
    from ..assets import asset_path

    folder = asset_path("demo_clip")
    if not (folder / "config.json").is_file():
        raise ModelLoadError(
            f"The bundled demo CLIP is missing ({folder}). Restore it from git (`git checkout -- assets/demo_clip`) "
            f"or reinstall the package, or retrain it with `{_DEMO_CLIP_RETRAIN}` (from a checkout's root)."
        )
    return load_hf_two_tower_folder(folder, name, device)


class _HFTextTower(nn.Module):
    """A transformers text model and its projection: ``(ids, mask) -> (P, E)`` as ``get_text_features``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.text_model = model.text_model
        self.projection = getattr(model, "text_projection", None)  # CLIP; SigLIP's head is inside the text model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        pooled = self.text_model(input_ids=ids, attention_mask=mask).pooler_output  # (P, D_text)
        return pooled if self.projection is None else self.projection(pooled)  # (P, E)


def _two_tower_kind(model: nn.Module, name: str) -> str:
    model_type = str(getattr(getattr(model, "config", None), "model_type", ""))
    if model_type in ("clip", "siglip") and getattr(model, "text_model", None) is not None:
        return model_type
    raise NoTextTowerError(
        f"{name!r} is a transformers {type(model).__name__} (model_type {model_type!r}): an image-only model with "
        f"no text tower. {_IMAGE_ONLY_HINT}"
    )


def wrap_hf_two_tower(model: nn.Module, name: str, device: torch.device, *, tokenizer=None, tokenizer_note: str = "",
                      preprocessor: dict | None = None) -> LoadedCLIP:
    """A transformers ``CLIPModel`` / ``SiglipModel`` as a :class:`LoadedCLIP` (modules shared, not copied)."""
    from .hf_transformers import wrap_hf

    kind = _two_tower_kind(model, name)
    model.eval().requires_grad_(False)
    image = wrap_hf(model, name, device, preprocessor=preprocessor)
    text_tower = _HFTextTower(model).to(device).eval()
    bias = getattr(model, "logit_bias", None)
    text_config = model.config.text_config
    return LoadedCLIP(
        image=image, text_tower=text_tower, logit_scale=float(model.logit_scale.detach().exp()),
        logit_bias=None if bias is None else float(bias.detach().reshape(-1)[0]),
        probability="sigmoid" if kind == "siglip" else "softmax",
        context_length=int(text_config.max_position_embeddings), tokenizer=tokenizer, name=name,
        pad_to_context=kind == "siglip", use_attention_mask=kind == "clip", source_library="transformers",
        tokenizer_note=tokenizer_note, vocab_size=int(text_config.vocab_size),
        _count_tokens=None if tokenizer is None else (lambda prompt: len(tokenizer(prompt, truncation=False)["input_ids"])),
    )


def _hf_tokenizer(folder: Path):
    """``(tokenizer or None, why none)`` from a folder's tokenizer files."""
    if not any((folder / f).is_file() for f in _TOKENIZER_FILES):
        return None, f"{folder} has no tokenizer files"
    import transformers

    try:
        return transformers.AutoTokenizer.from_pretrained(str(folder)), ""
    except Exception as exc:  # noqa: BLE001 - a broken tokenizer leaves token ids usable
        return None, f"its tokenizer could not be loaded: {type(exc).__name__}: {str(exc)[:200]}"


def load_hf_two_tower_folder(folder: Path, name: str, device: torch.device) -> LoadedCLIP:
    """A ``save_pretrained`` folder of a ``CLIPModel`` / ``SiglipModel`` (with its tokenizer and
    ``preprocessor_config.json`` when it has them)."""
    from .files import read_folder_config
    from .hf_transformers import _transformers, read_preprocessor

    config = read_folder_config(folder)
    model_type = str(config.get("model_type", ""))
    architectures = config.get("architectures") or []
    if model_type not in ("clip", "siglip"):
        what = f"a transformers {model_type!r} model" if model_type else f"a {config.get('architecture', 'timm')} model"
        raise NoTextTowerError(f"{folder} holds {what}: an image-only model with no text tower. {_IMAGE_ONLY_HINT}")
    transformers = _transformers()
    model_class = getattr(transformers, architectures[0], None) if architectures else None
    if model_class is None:
        model_class = transformers.CLIPModel if model_type == "clip" else transformers.SiglipModel
    try:
        model = model_class.from_pretrained(str(folder))
    except Exception as exc:  # noqa: BLE001 - corrupt or mismatched folders
        raise ModelLoadError(f"transformers could not load {folder}: {type(exc).__name__}: {str(exc)[:400]}") from exc
    tokenizer, note = _hf_tokenizer(folder)
    return wrap_hf_two_tower(model, name, device, tokenizer=tokenizer, tokenizer_note=note,
                             preprocessor=read_preprocessor(folder))


def _load_hf_hub(repo_id: str, device: torch.device, *, pretrained: bool) -> LoadedCLIP:
    """``"hf:org/name"``: the local Hugging Face cache, else the hub (weights, config, tokenizer)."""
    from huggingface_hub import snapshot_download

    from ..errors import WeightsUnavailableError
    from .hub import hub_offline_env, in_hf_cache, offline_message

    if not in_hf_cache(repo_id, ("config.json",)) and hub_offline_env():
        raise WeightsUnavailableError(offline_message(f"hf:{repo_id}"))
    patterns = ["*.json", "*.txt", "*.model"] + (["*.safetensors"] if pretrained else [])
    try:
        folder = Path(snapshot_download(repo_id, allow_patterns=patterns, local_files_only=hub_offline_env()))
    except Exception as exc:  # noqa: BLE001 - offline, missing repo, auth
        raise WeightsUnavailableError(f"{offline_message(f'hf:{repo_id}')} ({type(exc).__name__}: {exc})") from exc
    if pretrained:
        return load_hf_two_tower_folder(folder, f"hf:{repo_id}", device)
    import transformers

    config = transformers.AutoConfig.from_pretrained(str(folder))
    model_class = transformers.SiglipModel if config.model_type == "siglip" else transformers.CLIPModel
    tokenizer, note = _hf_tokenizer(folder)
    from .hf_transformers import read_preprocessor

    from .random_weights import seeded_random_weights

    with seeded_random_weights():
        model = model_class._from_config(config)
    return wrap_hf_two_tower(model, f"hf:{repo_id}", device, tokenizer=tokenizer,
                             tokenizer_note=note, preprocessor=read_preprocessor(folder))
