"""Where in the image does this text match? Maps of one prompt's image–text score.

    >>> from analysis import asset_path, load_clip, load_image
    >>> clip = load_clip("demo_clip")
    >>> pixels = clip.preprocess(load_image(asset_path("samples", "scene_1_star.png")))
    >>> explanation = explain_text(clip, pixels, "a star", method="chefer")
    >>> tuple(explanation.maps.shape)  # (B, gh, gw) float32 on the patch grid, prefix tokens dropped
    (1, 8, 8)

The explained quantity is always the model's own score ``s = exp(t)·cos(u, v) + b`` of each
image with the prompt (:meth:`~analysis.model.loading.LoadedCLIP.logits`), differentiated with
``torch.autograd.grad`` through the image tower's capture path (:mod:`analysis.explanations.gradients`);
the text embedding ``v`` is a constant. Methods (formulas and sources on each function):

* ``"chefer"``: Chefer et al. 2021b relevance of the score (:func:`chefer_text`);
* ``"gradcam"``: Grad-CAM of the score on the last block's attention input (:func:`gradcam_text`);
* ``"patch_text"``: each patch token through the final norm and projection, cosine with the text (:func:`patch_text`);
* ``"decomposition"``: each patch's direct contribution through every head (:func:`decomposition_text`);
* ``"legrad"``: LeGrad, the positive gradients of each late layer's own score (:mod:`analysis.text.legrad`);
* ``"attnlrp"``: AttnLRP relevance of the score pooled per patch (:func:`attnlrp_text`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..base.errors import AnalysisError
from ..engine.activations import run_with_cache
from ..explanations.gradients import last_block_score_gradients, output_attention_gradients
from ..explanations.lrp import score_relevance
from ..explanations.methods import grad_cam_from, refuse_global_token_method, relevance_from_gradients
from ..model.geometry import ViTSpec, input_spec
from .decomposition import TextDecomposition, text_decomposition
from .legrad import legrad_text
from .prompts import one_prompt, require_clip, score_of, score_value

__all__ = [
    "TEXT_METHODS",
    "TextExplanation",
    "explain_text",
    "chefer_text",
    "gradcam_text",
    "patch_text",
    "decomposition_text",
    "attnlrp_text",
    "token_embeddings",
]


@dataclass(frozen=True)
class TextExplanation:
    """One prompt's map over each image.

    Attributes
    ----------
    maps : torch.Tensor
        ``(B, gh, gw)`` float32 on the CPU, on the patch grid (prefix tokens dropped).
    scores : torch.Tensor
        ``(B,)`` float32, the model's score ``exp(t)·cos(u, v) + b`` of each image with the prompt.
    method : str
        The method's name (a key of :data:`TEXT_METHODS`).
    prompt : str or None
        The prompt (``None`` when token ids were given).
    readout : str
        Which token's relevance the map reads (``"chefer"``), or what the map's values are.
    notices : tuple of str, default ()
        What was done to the prompt (truncated to the text tower's length).
    decomposition : TextDecomposition or None, default None
        The full :class:`TextDecomposition` (``"decomposition"`` only).
    """

    maps: torch.Tensor
    scores: torch.Tensor
    method: str
    prompt: str | None
    readout: str
    notices: tuple[str, ...] = ()
    decomposition: TextDecomposition | None = None


def _grid(values: torch.Tensor, spec: ViTSpec) -> torch.Tensor:
    """``(B, T)`` per token -> ``(B, gh, gw)`` over the patches, float32 on the CPU."""
    return spec.split_prefix(values, 1)[1].float().cpu().reshape(values.shape[0], *spec.grid_size)


def _chefer_readout(spec: ViTSpec) -> str:
    if spec.has_class_token:
        return "the class token's row of R (the token the image embedding is read from)"
    return "the mean of the patch tokens' rows of R (this model has no class token; its pooling head reads every patch)"


def chefer_text(clip, pixels: torch.Tensor, text, *, start_layer: int = 0) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Chefer et al. 2021b ("Generic Attention-model Explainability for Interpreting Bi-Modal and
    Encoder-Decoder Transformers", eq. 5-6; Transformer-MM-Explainability's CLIP notebook) on the
    image–text score ``s``:

        R = I (T×T);   Āˡ = E_h[(∂s/∂Aˡ ⊙ Aˡ)⁺];   R ← R + Āˡ·R   for l = start_layer, ..., L − 1

    by default over every block of the image tower (:func:`~analysis.explanations.relevance_from_gradients`,
    the rule the class explanations use); ``start_layer=-1`` reads the last block only, as that
    notebook's ``interpret`` does by default. The map is the class token's row of R over the patches;
    a model without a class token (SigLIP, pooled by attention over every token) gives the mean of
    the patch tokens' rows.

    Parameters
    ----------
    clip : LoadedCLIP
        A two-tower model (:func:`~analysis.load_clip`).
    pixels : torch.Tensor
        ``(B, 3, H, W)`` images preprocessed for the image tower.
    text : TextEncoding
        One prompt's encoding (:func:`~analysis.text.prompts.one_prompt`), ``embeddings`` ``(1, E)``.
    start_layer : int, default 0
        The first block the rule reads (a Python index; ``-1``, the last block only).

    Returns
    -------
    tuple of (torch.Tensor, torch.Tensor, str)
        ``(maps, scores, readout)``: ``(B, gh, gw)`` float32 maps and ``(B,)`` float32 scores on the CPU,
        and which token's row of R the map is.

    Raises
    ------
    AnalysisError
        A windowed image tower, ``pixels`` that do not fit it, or ``start_layer`` not a block index.
    """
    vit = clip.image
    refuse_global_token_method(vit, "chefer")
    spec = input_spec(vit, pixels)
    attentions, gradients, output = output_attention_gradients(vit, pixels, score_of(clip, text.embeddings))
    scores = clip.logits(output, text.embeddings)[:, 0]
    maps = relevance_from_gradients(attentions, gradients, spec, start_layer=start_layer)
    return maps, scores, _chefer_readout(spec)


def gradcam_text(clip, pixels: torch.Tensor, text) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Grad-CAM (Selvaraju et al. 2017) of the image–text score ``s`` on the last block's first-norm
    output ``X`` on the last layer's grid (a pre-norm tower's last attention input), as the class
    Grad-CAM (:func:`~analysis.explanations.methods.grad_cam`,
    :func:`~analysis.explanations.gradients.last_block_score_gradients`):

        w_c = mean_cells ∂s/∂X[r, x, c];   map[r, x] = ReLU(Σ_c w_c · X[r, x, c])

    Parameters
    ----------
    clip : LoadedCLIP
        A two-tower model (:func:`~analysis.load_clip`).
    pixels : torch.Tensor
        ``(B, 3, H, W)`` images preprocessed for the image tower.
    text : TextEncoding
        One prompt's encoding (:func:`~analysis.text.prompts.one_prompt`), ``embeddings`` ``(1, E)``.

    Returns
    -------
    tuple of (torch.Tensor, torch.Tensor, str)
        ``(maps, scores, readout)``: ``(B, gh, gw)`` float32 maps (``>= 0``) and ``(B,)`` float32 scores on
        the CPU, and what the map's values are.

    Raises
    ------
    AnalysisError
        ``pixels`` that do not fit the image tower.
    """
    vit = clip.image
    activations, gradients, output, _ = last_block_score_gradients(vit, pixels, score_of(clip, text.embeddings))
    scores = clip.logits(output, text.embeddings)[:, 0]
    return grad_cam_from(activations, gradients), scores, "ReLU of the gradient-weighted last attention input"


def token_embeddings(model: Any, final: torch.Tensor) -> torch.Tensor:  # a timm ViT: norm, head... read by name
    """``(B, T, E)``: every token of the last block's output ``final`` ``(B, T, D)`` read out on
    its own, by the model's own modules: its final norm, then

    * a token or mean pooling model (CLIP): ``fc_norm`` and the head (the projection) per token;
    * an attention-pooling head (SigLIP): the pooling head applied to that token alone, i.e. the
      embedding the head gives when its probe attends only to that token (softmax over one key
      is 1), then ``fc_norm`` and the head. (MaskCLIP, Zhou et al. 2022, reads CLIP's attention
      pool the same way.)

    Parameters
    ----------
    model : Any
        The image tower's timm model (``clip.image.model``): its ``norm``, ``attn_pool`` or
        ``global_pool``, ``fc_norm``, ``head_drop`` and ``head``.
    final : torch.Tensor
        ``(B, T, D)``, the last block's output (``resid_post``), prefix tokens first.

    Returns
    -------
    torch.Tensor
        ``(B, T, E)`` in ``final``'s dtype and device, each token's own embedding (not normalised).

    Raises
    ------
    AnalysisError
        An attention-pooling head with its own position table, or a pooling other than ``"token"`` or
        ``"avg"`` without such a head.
    """
    batch, tokens, dim = final.shape
    normed = model.norm(final)
    pool = getattr(model, "attn_pool", None)
    if pool is not None:
        if getattr(pool, "pos_embed", None) is not None:
            raise AnalysisError(
                "This attention-pooling head adds its own position table: a token cannot be read alone."
            )
        normed = pool(normed.reshape(batch * tokens, 1, dim)).reshape(batch, tokens, -1)
    elif getattr(model, "global_pool", "token") not in ("token", "avg"):
        raise AnalysisError(f"Pooling {getattr(model, 'global_pool', None)!r} has no per-token reading.")
    return model.head(getattr(model, "head_drop", torch.nn.Identity())(model.fc_norm(normed)))


def patch_text(clip, pixels: torch.Tensor, text) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Each patch token of the last block, projected into the joint space by the image tower's
    own readout (:func:`token_embeddings`: final norm, projection; SigLIP's pooling head on that
    token alone), compared with the text:

        map[p] = cos(readout(x_L[p]), v)      ∈ [−1, 1]

    (the dense reading of CLIP features of MaskCLIP, Zhou et al. 2022, and Gandelsman et al. 2024's
    spatial decomposition read at the last layer). Not scaled by ``exp(t)``: a cosine.

    Parameters
    ----------
    clip : LoadedCLIP
        A two-tower model (:func:`~analysis.load_clip`).
    pixels : torch.Tensor
        ``(B, 3, H, W)`` images preprocessed for the image tower.
    text : TextEncoding
        One prompt's encoding (:func:`~analysis.text.prompts.one_prompt`), ``embeddings`` ``(1, E)``.

    Returns
    -------
    tuple of (torch.Tensor, torch.Tensor, str)
        ``(maps, scores, readout)``: ``(B, gh, gw)`` float32 cosines and ``(B,)`` float32 scores on the
        CPU, and what the map's values are.

    Raises
    ------
    AnalysisError
        ``pixels`` that do not fit the image tower, or a readout :func:`token_embeddings` refuses.
    """
    vit = clip.image
    spec = input_spec(vit, pixels)
    last = f"blocks.{spec.num_layers - 1}.resid_post"
    cache = run_with_cache(vit, pixels, names=[last], precision="float32", to_cpu=False)
    with torch.no_grad():
        per_token = token_embeddings(vit.model, cache[last].float())  # (B, T, E)
        direction = F.normalize(text.embeddings.to(per_token.device), dim=-1)[0]  # (E,)
        cosines = F.normalize(per_token, dim=-1) @ direction  # (B, T)
        scores = clip.logits(cache.output.float(), text.embeddings)[:, 0]
    return _grid(cosines, spec), scores.cpu(), "cosine of each patch's own embedding with the text embedding"


def decomposition_text(clip, pixels: torch.Tensor, text) -> tuple[torch.Tensor, torch.Tensor, str, TextDecomposition]:
    """The score's direct contributions through every head (:func:`~analysis.text.text_decomposition`),
    by the patch each head attended to, summed over layers and heads:
    ``map[s] = Σ_l Σ_h Σ_q P_{l,h}[q, s] · w·R(γ_l ⊙ W_O[:, h] v_{l,h,s})`` (Gandelsman et al. 2024's
    spatial decomposition; the query ``q`` is the token the readout reads: CLIP's class token, every
    token a SigLIP's pooling probe attends to, by its frozen probabilities).
    Signed, in units of the score.

    Parameters
    ----------
    clip : LoadedCLIP
        A two-tower model (:func:`~analysis.load_clip`).
    pixels : torch.Tensor
        ``(B, 3, H, W)`` images preprocessed for the image tower.
    text : TextEncoding
        One prompt's encoding (:func:`~analysis.text.prompts.one_prompt`), ``embeddings`` ``(1, E)``.

    Returns
    -------
    tuple of (torch.Tensor, torch.Tensor, str, TextDecomposition)
        ``(maps, scores, readout, decomposition)``: ``(B, gh, gw)`` float32 maps on the CPU, the ``(B,)``
        scores, what the map's values are, and the full :class:`TextDecomposition`.

    Raises
    ------
    AnalysisError
        As :func:`~analysis.text.text_decomposition`.
    """
    decomposition = text_decomposition(clip, pixels, text)
    return (
        decomposition.head_maps().sum((1, 2)),
        decomposition.score,
        "each patch's direct contribution through every head that read it, summed over layers and heads",
        decomposition,
    )


def attnlrp_text(clip, pixels: torch.Tensor, text) -> tuple[torch.Tensor, torch.Tensor, str]:
    """AttnLRP (Achtibat et al. 2024; :mod:`analysis.explanations.lrp`) of the image–text score
    ``s = exp(t)·cos(u, v) + b``, pooled per patch like the class map. The cosine's normalisation
    ``u/‖u‖`` takes the identity rule (its norm detached), so ``s − b`` is linear in ``u`` and the
    map sums to ``s − b`` less the image tower's bias terms. Signed, in units of the score.
    A windowed image tower takes the same rules (its map on the stem's patch grid, as in
    :mod:`analysis.explanations.lrp`).

    Parameters
    ----------
    clip : LoadedCLIP
        A two-tower model (:func:`~analysis.load_clip`).
    pixels : torch.Tensor
        ``(B, 3, H, W)`` images preprocessed for the image tower.
    text : TextEncoding
        One prompt's encoding (:func:`~analysis.text.prompts.one_prompt`), ``embeddings`` ``(1, E)``.

    Returns
    -------
    tuple of (torch.Tensor, torch.Tensor, str)
        ``(maps, scores, readout)``: ``(B, gh, gw)`` float32 relevance and ``(B,)`` float32 scores on the
        CPU, and what the map's values are.

    Raises
    ------
    AnalysisError
        ``pixels`` that do not fit the image tower.
    """
    relevance = score_relevance(clip.image, pixels, score_value(clip, text.embeddings))
    return relevance.map, relevance.targets, "each patch's AttnLRP relevance (its pixels' sum), in units of the score"


#: method -> function ``(clip, pixels, text) -> (maps, scores, readout[, decomposition])``.
TEXT_METHODS: dict[str, Callable[..., Any]] = {
    "chefer": chefer_text,
    "gradcam": gradcam_text,
    "patch_text": patch_text,
    "decomposition": decomposition_text,
    "legrad": legrad_text,
    "attnlrp": attnlrp_text,
}


def explain_text(clip, pixels: torch.Tensor, prompt, method: str = "chefer", **options) -> TextExplanation:
    """A ``(B, gh, gw)`` map of where each image matches ``prompt``, by ``method``, with the model's
    score and any notice about the prompt (truncation).

    Parameters
    ----------
    clip : LoadedCLIP
        A two-tower model (:func:`~analysis.load_clip`).
    pixels : torch.Tensor
        ``(B, 3, H, W)`` images preprocessed for the image tower.
    prompt : str or token ids
        One prompt: a string, or one row of token ids.
    method : str, default "chefer"
        One of :data:`TEXT_METHODS`: ``"chefer"``, ``"gradcam"``, ``"patch_text"``, ``"decomposition"``,
        ``"legrad"`` or ``"attnlrp"``.
    **options : Any
        Keyword options of the method (``"chefer"``: ``start_layer``; ``"legrad"``: ``layers``, how
        many of the last blocks it reads, and ``readout``); another method takes none.

    Returns
    -------
    TextExplanation
        ``maps`` ``(B, gh, gw)`` and ``scores`` ``(B,)``, float32 on the CPU, with the method, prompt,
        readout and notices (``decomposition`` for ``"decomposition"``).

    Raises
    ------
    NoTextTowerError
        ``clip`` is an image-only model.
    TextPromptError
        An empty prompt, more than one, or text without a tokenizer.
    AnalysisError
        An unknown method or an option it does not take, ``pixels`` that do not fit the image tower, or
        what the method refuses (e.g. ``"chefer"`` and ``"gradcam"`` on a windowed tower).
    """
    clip = require_clip(clip, "explain_text")
    if method not in TEXT_METHODS:
        raise AnalysisError(f"Unknown text explanation method {method!r}; use one of {', '.join(TEXT_METHODS)}.")
    function = TEXT_METHODS[method]
    accepted = [p.name for p in inspect.signature(function).parameters.values() if p.kind is p.KEYWORD_ONLY]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        takes = f"takes only {', '.join(accepted)}" if accepted else "takes no options"
        raise AnalysisError(f"method={method!r} does not accept {', '.join(unknown)}: it {takes}.")
    input_spec(clip.image, pixels)
    text = one_prompt(clip, prompt)
    maps, scores, readout, *rest = function(clip, pixels, text, **options)
    return TextExplanation(
        maps=maps.float().cpu(),
        scores=scores.detach().float().cpu(),
        method=method,
        prompt=text.prompts[0] if text.prompts else None,
        readout=readout,
        notices=text.notices,
        decomposition=rest[0] if rest else None,
    )
