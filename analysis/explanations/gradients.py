"""Gradients of one class score, read at the engine's named hook points.

Every gradient method here differentiates ``y = Σ_b logits[b, target_b]`` (the pre-softmax
class score, each image its own target) by the activation engine's gradient mode
(:func:`analysis.engine.activations.run_with_cache` with ``grad_of``): ``blocks.{i}.attn.probs`` (the
probabilities each block multiplied with ``v``), ``blocks.{i}.attn.in`` (the attention's input)
and ``blocks.{i}.ln1.out`` (the first norm's output). It uses ``torch.autograd.grad``, so no
``.grad`` is ever written on the model's parameters, and every hook lives for one call, reacts
only to the calling thread, and is removed in ``finally``: one loaded model can serve several
explanations at once. The pixels are cloned with ``requires_grad`` (the loaded models'
parameters are frozen), which connects the graph whatever the model's own settings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..base.arguments import check_int
from ..base.devices import autocast_context
from ..base.errors import AnalysisError
from ..engine.activations.run import run_with_cache
from ..model.adapters.registry import block_sites
from ..model.geometry import LayerGeometry, ViTSpec, input_spec
from ..model.windowed_support import refuse_windowed, require_global_attention
from ..records.layer_tokens import layer_grid

__all__ = [
    "AttentionGradients",
    "attention_gradients",
    "resolve_targets",
    "block_input_gradients",
    "pixel_gradients",
    "last_block_gradients",
    "last_block_score_gradients",
    "output_attention_gradients",
    "block_input_score_gradients",
]


@dataclass(frozen=True)
class AttentionGradients:
    """Attention probabilities and the gradient of the target score with respect to them.

    Attributes
    ----------
    attentions : torch.Tensor
        ``(L, B, heads, T, T)`` float32 on the CPU: the probabilities each block multiplied with ``v``.
    gradients : torch.Tensor
        ``(L, B, heads, T, T)`` float32 on the CPU: ``∂y/∂A`` of the target score ``y``.
    logits : torch.Tensor
        ``(B, classes)`` of the same forward pass.
    targets : torch.Tensor
        ``(B,)`` long: the class explained in each image.
    spec : ViTSpec
        The token geometry of this input.
    """

    attentions: torch.Tensor
    gradients: torch.Tensor
    logits: torch.Tensor
    targets: torch.Tensor
    spec: ViTSpec


def require_classes(spec: ViTSpec, what: str) -> None:
    """AnalysisError unless the model's output is class scores: ``what`` explains a class."""
    if not spec.has_classifier:
        kind = {
            "embedding": f"a {spec.num_outputs}-d embedding head (CLIP/SigLIP/PE tower)",
            "none": "no head (pooled features)",
        }.get(spec.head, f"a {spec.head} head")
        raise AnalysisError(
            f"{what} explains a class score, but this model has {kind}: there is no class to explain. "
            f"Use {_class_free_methods(spec)}, or load a classifier."
        )


def _class_free_methods(spec: ViTSpec) -> str:
    """The methods that need no class this model has, as advice: ``'rollout'``, and ``'attention'``
    where the model layer's rule lets a global-token method through (the rule that refuses it,
    :func:`analysis.explanations.methods.refuse_global_token_method`)."""
    try:
        require_global_attention(spec, lambda spec: AnalysisError(spec.family))
    except AnalysisError:
        return "method='rollout'"
    return "method='attention' or 'rollout'"


def resolve_targets(target, logits: torch.Tensor, spec: ViTSpec) -> torch.Tensor:
    """``(B,)`` long targets: ``None`` → each image's predicted class; an int → that class for
    every image; a ``(B,)`` sequence or tensor → one class per image. Checked against the head.

    Parameters
    ----------
    target : int, sequence of int, torch.Tensor or None
        A class index (or a 0-d tensor), a ``(B,)`` sequence or tensor of them, or ``None`` for
        each image's predicted class.
    logits : torch.Tensor
        ``(B, classes)`` class scores.
    spec : ViTSpec
        The model's geometry.

    Returns
    -------
    torch.Tensor
        ``(B,)`` long on the CPU.

    Raises
    ------
    AnalysisError
        A target that is not an integer, a sequence whose length is not ``B``, or a class outside
        ``0..classes - 1``.
    """
    batch, classes = logits.shape
    if target is None:
        return logits.argmax(-1).cpu()
    if isinstance(target, torch.Tensor):
        if target.ndim == 0:
            target = int(target)
        else:
            target = target.tolist()
    if isinstance(target, Sequence) and not isinstance(target, (str, bytes)):
        values = [check_int("target", t) for t in target]
        if len(values) != batch:
            raise AnalysisError(f"target has {len(values)} classes for a batch of {batch} images: pass one per image.")
    else:
        values = [check_int("target", target)] * batch
    bad = [t for t in values if not 0 <= t < classes]
    if bad:
        raise AnalysisError(
            f"target {bad[0]} is not a class of this model: it has {classes} classes (0..{classes - 1})."
        )
    return torch.tensor(values, dtype=torch.long)


def _score(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``Σ_b logits[b, target_b]``: gradients of a sum are per image (images do not interact)."""
    return logits.float().gather(1, targets.to(logits.device)[:, None]).sum()


def _prepare(vit, pixels: torch.Tensor, windowed: bool = False) -> tuple[ViTSpec, torch.Tensor]:
    """``windowed``: the caller is defined for windowed models (Swin, SAM) too; else they are
    refused with the reason."""
    if not windowed:
        refuse_windowed(vit, "Gradients of attention over all tokens (attention_gradients, block_input_gradients)")
    spec = input_spec(vit, pixels)
    require_classes(spec, "A gradient explanation")
    return spec, pixels.detach().to(vit.device, dtype=torch.float32).clone().requires_grad_(True)


def attention_gradients(vit, pixels: torch.Tensor, target=None, *, precision: str = "auto") -> AttentionGradients:
    """One forward and one backward pass: every block's attention and ``∂y/∂A``.

    Fused attention is made explicit for this call and thread only (see
    :mod:`analysis.model.adapters.base`), so ``A`` is exactly what produced the logits.

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`).
    pixels : torch.Tensor
        ``(B, 3, H, W)`` floating preprocessed input (``vit.preprocess(image)``).
    target : int, sequence of int, torch.Tensor or None, default None
        The class to explain, as in :func:`resolve_targets`; ``None``, the prediction of this very pass.
    precision : str, default "auto"
        Autocast of the forward pass: ``"auto"`` (bfloat16 or float16 on CUDA, float32 elsewhere),
        ``"float32"``, ``"bfloat16"`` or ``"float16"``.

    Returns
    -------
    AttentionGradients
        ``(L, B, heads, T, T)`` attentions and ``∂y/∂A``, float32 on the CPU, with the logits,
        the ``(B,)`` targets and the spec.

    Raises
    ------
    AnalysisError
        A windowed model (Swin, SAM), a model without class scores, ``pixels`` that do not fit the
        model, a bad ``target`` or ``precision``.
    """
    spec, pixels = _prepare(vit, pixels)
    chosen: list[torch.Tensor] = []
    attentions, gradients, logits = _attention_gradients_of(vit, pixels, _class_score(target, spec, chosen), precision)
    return AttentionGradients(attentions=attentions, gradients=gradients, logits=logits, targets=chosen[0], spec=spec)


def output_attention_gradients(
    vit, pixels: torch.Tensor, score, *, precision: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Like :func:`attention_gradients` for any scalar ``y = score(output)`` of the model's output
    ``(B, outputs)`` (an embedding tower too: e.g. an image–text score).

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`).
    pixels : torch.Tensor
        ``(B, 3, H, W)`` floating preprocessed input (``vit.preprocess(image)``).
    score : callable
        ``score(output) -> torch.Tensor``, a scalar of the model's ``(B, outputs)`` output.
    precision : str, default "auto"
        Autocast of the forward pass: ``"auto"`` (bfloat16 or float16 on CUDA, float32 elsewhere),
        ``"float32"``, ``"bfloat16"`` or ``"float16"``.

    Returns
    -------
    tuple of torch.Tensor
        ``(attentions, gradients, output)``: ``(L, B, heads, T, T)`` attentions,
        ``(L, B, heads, T, T)`` ``∂y/∂A`` and the ``(B, outputs)`` output, float32 on the CPU.

    Raises
    ------
    AnalysisError
        A windowed model (Swin, SAM), ``pixels`` that do not fit the model, a ``score`` that is not
        callable or a bad ``precision``.
    """
    refuse_windowed(vit, "Gradients of attention over all tokens (output_attention_gradients)")
    input_spec(vit, pixels)
    pixels = pixels.detach().to(vit.device, dtype=torch.float32).clone().requires_grad_(True)
    return _attention_gradients_of(vit, pixels, score, precision)


def _attention_gradients_of(vit, pixels: torch.Tensor, score, precision: str):
    """``(A, ∂y/∂A, output)`` of every block, ``y = score(output)``: the engine's gradient mode at
    ``blocks.{i}.attn.probs`` (fused attention made explicit for this call and thread only)."""
    names = [f"blocks.{site.layer}.attn.probs" for site in block_sites(vit.model)]
    cache = run_with_cache(vit, pixels, names=names, grad_of=score, precision=precision)
    return cache.stack("attn.probs"), torch.stack([cache.grad(name) for name in names]), cache.logits


def _gradient_at(
    vit, pixels: torch.Tensor, name: str, score, precision: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(X, ∂y/∂X, output)``: ``X`` the activation at the hook point ``name`` (e.g.
    ``blocks.11.attn.in``) in one forward pass, ``y = score(output)`` a scalar of the model's output,
    all float32 on the CPU (the engine's gradient mode)."""
    cache = run_with_cache(vit, pixels, names=[name], grad_of=score, precision=precision)
    return cache[name], cache.grad(name), cache.output


def _class_score(target, spec: ViTSpec, chosen: list):
    """``score(logits)`` of the target classes (``None``: the prediction of this very pass),
    appending the resolved ``(B,)`` targets to ``chosen``."""

    def score(logits: torch.Tensor) -> torch.Tensor:
        chosen.append(resolve_targets(target, logits.detach(), spec))
        return _score(logits, chosen[-1])

    return score


def block_input_gradients(
    vit, pixels: torch.Tensor, target=None, *, layer: int = -1, precision: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, ViTSpec]:
    """The input of block ``layer``'s attention (after its norm, e.g. ``norm1``) and its
    gradient ``∂y/∂X`` of the target class score ``y``.

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`).
    pixels : torch.Tensor
        ``(B, 3, H, W)`` floating preprocessed input (``vit.preprocess(image)``).
    target : int, sequence of int, torch.Tensor or None, default None
        The class to explain, as in :func:`resolve_targets`; ``None``, the prediction of this very pass.
    layer : int, default -1
        Block index (negative counts from the end).
    precision : str, default "auto"
        Autocast of the forward pass: ``"auto"`` (bfloat16 or float16 on CUDA, float32 elsewhere),
        ``"float32"``, ``"bfloat16"`` or ``"float16"``.

    Returns
    -------
    tuple of (torch.Tensor, torch.Tensor, torch.Tensor, ViTSpec)
        ``(B, T, D)`` activations and ``(B, T, D)`` ``∂y/∂X`` (float32 on the CPU), the ``(B,)``
        long targets, and the spec.

    Raises
    ------
    AnalysisError
        A windowed model (Swin, SAM), a model without class scores, ``pixels`` that do not fit the
        model, a bad ``target`` or ``precision``.
    IndexError
        ``layer`` is not a block index.
    """
    spec, pixels = _prepare(vit, pixels)
    site = block_sites(vit.model)[layer]
    chosen: list[torch.Tensor] = []
    activation, gradient, _ = _gradient_at(
        vit, pixels, f"blocks.{site.layer}.attn.in", _class_score(target, spec, chosen), precision
    )
    return activation, gradient, chosen[0], spec


def block_input_score_gradients(
    vit, pixels: torch.Tensor, score, *, layer: int = -1, precision: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Like :func:`block_input_gradients` for any scalar ``y = score(output)`` of the model's
    output (an embedding tower too).

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`).
    pixels : torch.Tensor
        ``(B, 3, H, W)`` floating preprocessed input (``vit.preprocess(image)``).
    score : callable
        ``score(output) -> torch.Tensor``, a scalar of the model's ``(B, outputs)`` output.
    layer : int, default -1
        Block index (negative counts from the end).
    precision : str, default "auto"
        Autocast of the forward pass: ``"auto"`` (bfloat16 or float16 on CUDA, float32 elsewhere),
        ``"float32"``, ``"bfloat16"`` or ``"float16"``.

    Returns
    -------
    tuple of torch.Tensor
        ``(B, T, D)`` activations, ``(B, T, D)`` ``∂y/∂X`` and the ``(B, outputs)`` output, float32
        on the CPU.

    Raises
    ------
    AnalysisError
        A windowed model (Swin, SAM), ``pixels`` that do not fit the model, a ``score`` that is not
        callable or a bad ``precision``.
    IndexError
        ``layer`` is not a block index.
    """
    refuse_windowed(vit, "block_input_score_gradients")
    input_spec(vit, pixels)
    pixels = pixels.detach().to(vit.device, dtype=torch.float32).clone().requires_grad_(True)
    site = block_sites(vit.model)[layer]
    return _gradient_at(vit, pixels, f"blocks.{site.layer}.attn.in", score, precision)


def pixel_gradients(
    vit, pixels: torch.Tensor, target=None, *, precision: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradient ``∂y/∂x`` of the target class score ``y`` with respect to the input pixels
    (any model, windowed ones too).

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`).
    pixels : torch.Tensor
        ``(B, 3, H, W)`` floating preprocessed input (``vit.preprocess(image)``).
    target : int, sequence of int, torch.Tensor or None, default None
        The class to explain, as in :func:`resolve_targets`; ``None``, the prediction of this very pass.
    precision : str, default "auto"
        Autocast of the forward pass: ``"auto"`` (bfloat16 or float16 on CUDA, float32 elsewhere),
        ``"float32"``, ``"bfloat16"`` or ``"float16"``.

    Returns
    -------
    tuple of torch.Tensor
        ``(gradient, targets)``: ``∂y/∂x`` ``(B, 3, H, W)`` float32 on the CPU and the ``(B,)``
        long targets.

    Raises
    ------
    AnalysisError
        A model without class scores, ``pixels`` that do not fit the model, a bad ``target`` or
        ``precision``.
    """
    spec, pixels = _prepare(vit, pixels, windowed=True)  # model-agnostic: windowed models too
    with torch.enable_grad():
        with autocast_context(vit.device, precision):
            logits = vit.model(pixels)
        targets = resolve_targets(target, logits.detach(), spec)
        (gradient,) = torch.autograd.grad(_score(logits, targets), [pixels])
    return gradient.detach().float().cpu(), targets


def _last_block_norm_name(vit) -> str:
    """``blocks.{L-1}.ln1.out``, the last block's first norm: pytorch-grad-cam's target layer."""
    site = block_sites(vit.model)[-1]
    if site.block is None or site.adapter.block_norm(site.block, "ln1") is None:
        raise AnalysisError(
            f"Grad-CAM reads the last block's first norm (norm1, ln_1 or layernorm_before); "
            f"{type(site.block).__name__} has none, so this model is not supported by method='gradcam'."
        )
    return f"blocks.{site.layer}.ln1.out"


def last_block_gradients(
    vit, pixels: torch.Tensor, target=None, *, precision: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, LayerGeometry]:
    """The last block's first-norm output ``X`` and its gradient ``∂y/∂X`` on the last layer's
    grid, as pytorch-grad-cam reads a ViT (``blocks[-1].norm1``, class token dropped) and a Swin
    (``layers[-1].blocks[-1].norm1``): any model, its prefix tokens left out
    (:func:`analysis.records.layer_tokens.layer_grid`).

    A pre-norm block (``spec.residual_norm == "pre"``: ViT, DeiT, DINOv2, CLIP, EVA, Swin v1, SAM)
    feeds ``X`` to its attention; a post-norm block (Swin v2, timm's ``ResPost*`` and
    ``EvaBlockPostNorm`` blocks: ``x + norm1(attn(x))``) adds it to the residual stream, so ``X``
    is its normalised attention output.

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`).
    pixels : torch.Tensor
        ``(B, 3, H, W)`` floating preprocessed input (``vit.preprocess(image)``).
    target : int, sequence of int, torch.Tensor or None, default None
        The class to explain, as in :func:`resolve_targets`; ``None``, the prediction of this very pass.
    precision : str, default "auto"
        Autocast of the forward pass: ``"auto"`` (bfloat16 or float16 on CUDA, float32 elsewhere),
        ``"float32"``, ``"bfloat16"`` or ``"float16"``.

    Returns
    -------
    tuple of (torch.Tensor, torch.Tensor, torch.Tensor, LayerGeometry)
        ``(B, gh, gw, C)`` activations and ``(B, gh, gw, C)`` ``∂y/∂X`` (float32 on the CPU), the
        ``(B,)`` long targets, and the last layer's :class:`~analysis.model.geometry.LayerGeometry`
        (``grid_size``, ``stride`` in input pixels).

    Raises
    ------
    AnalysisError
        A model without class scores, a last block without a first norm or whose norm output is
        not on the last layer's grid, ``pixels`` that do not fit the model, a bad ``target`` or
        ``precision``.
    """
    spec, pixels = _prepare(vit, pixels, windowed=True)
    chosen: list[torch.Tensor] = []
    activations, gradients, _, geometry = _last_block_norm_gradients(
        vit, pixels, spec, _class_score(target, spec, chosen), precision
    )
    return activations, gradients, chosen[0], geometry


def last_block_score_gradients(
    vit, pixels: torch.Tensor, score, *, precision: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, LayerGeometry]:
    """Like :func:`last_block_gradients` for any scalar ``y = score(output)`` of the model's output
    (an image tower's embedding too): the last block's first-norm output ``X`` and ``∂y/∂X`` on the
    last layer's grid.

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`, or a two-tower model's ``image``).
    pixels : torch.Tensor
        ``(B, 3, H, W)`` floating preprocessed input.
    score : callable
        ``score(output) -> torch.Tensor``, a scalar of the model's ``(B, outputs)`` output.
    precision : str, default "auto"
        Autocast of the forward pass, as in :func:`last_block_gradients`.

    Returns
    -------
    tuple of (torch.Tensor, torch.Tensor, torch.Tensor, LayerGeometry)
        ``(B, gh, gw, C)`` activations and ``∂y/∂X`` (float32 on the CPU), the model's output and
        the last layer's geometry.

    Raises
    ------
    AnalysisError
        ``pixels`` that do not fit the model, a last block without a first norm on the last
        layer's grid, or a bad ``precision``.
    """
    spec = input_spec(vit, pixels)
    pixels = pixels.detach().to(vit.device, dtype=torch.float32).clone().requires_grad_(True)
    return _last_block_norm_gradients(vit, pixels, spec, score, precision)


def _last_block_norm_gradients(vit, pixels: torch.Tensor, spec: ViTSpec, score, precision: str):
    """``(X, ∂y/∂X, output, geometry)`` at ``blocks.{L-1}.ln1.out``, ``X`` on the last layer's grid."""
    geometry = spec.geometry(spec.num_layers - 1)
    activation, gradient, output = _gradient_at(vit, pixels, _last_block_norm_name(vit), score, precision)
    return (
        layer_grid(activation, geometry, what="Grad-CAM's layer"),
        layer_grid(gradient, geometry, what="Grad-CAM's layer"),
        output,
        geometry,
    )
