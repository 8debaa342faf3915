"""Head ablation: what the prediction loses when one head's output is removed.

For block ``l`` and head ``h`` the head's output ``z_{l,h}`` (``blocks.{l}.attn.z[:, :, h]``,
what the output projection receives from it) is replaced by

* ``"zero"``: 0 — the same as zeroing the projection's input columns for ``h`` (tested);
* ``"mean"``: its mean over a reference image set, per token position (mean ablation,
  Wang et al. 2022 "Interpretability in the Wild", §3);
* ``"resample"``: its value on another image (resample ablation, Chan et al. 2022 "Causal
  scrubbing"),

and the forward pass continues from there (:func:`analysis.engine.activations.run_with_hooks`). The
effect is ``Δ = logit_c(ablated) − logit_c(clean)`` of the target class ``c``, and likewise for
its softmax probability. :func:`cumulative_head_ablation` removes heads together, in a given
order (e.g. most important first), and traces the target logit as heads go.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..base.arguments import check_index, resolve_layers
from ..base.errors import AnalysisError
from ..base.progress import Progress
from ..engine.activations import run_with_cache, run_with_hooks
from ..explanations.gradients import resolve_targets
from ..model.adapters.registry import block_sites
from ..model.windowed_support import refuse_windowed

__all__ = [
    "ABLATIONS",
    "HeadAblation",
    "head_ablation",
    "cumulative_head_ablation",
    "heads_by_effect",
    "check_separable_heads",
]

ABLATIONS = ("zero", "mean", "resample")


@dataclass(frozen=True)
class HeadAblation:
    """Effects of ablating each head alone (what :func:`head_ablation` returns).

    Attributes
    ----------
    delta_logit : torch.Tensor
        ``(B, L, heads)`` float32: the target logit after ablation minus before. ``L`` the rows of
        ``layers``, ``heads`` the most heads of any block; NaN beyond a block's own heads.
    delta_probability : torch.Tensor
        ``(B, L, heads)`` float32: the same for the target's probability (by the model's own rule).
    clean_logit : torch.Tensor
        ``(B,)`` float32: the target logit before ablation.
    clean_probability : torch.Tensor
        ``(B,)`` float32: the target probability before ablation.
    targets : torch.Tensor
        ``(B,)`` long: the class of each image whose logit is measured.
    method : str
        One of :data:`ABLATIONS`.
    layers : tuple of int, default ()
        The model layer of each row, ascending (all, unless ``layers=`` chose some).
    """

    delta_logit: torch.Tensor
    delta_probability: torch.Tensor
    clean_logit: torch.Tensor
    clean_probability: torch.Tensor
    targets: torch.Tensor
    method: str
    layers: tuple[int, ...] = ()


def check_separable_heads(vit, what: str) -> None:
    """Refuse a model whose blocks normalise the heads' joint output before the projection
    (timm ``scale_norm``: BEiT-3, EVA-02-CLIP): there ``attn.z`` mixes the heads, so a single
    head's output cannot be removed, patched or attributed.

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`).
    what : str
        The analysis that asks, named in the error.

    Raises
    ------
    AnalysisError
        A block's attention has a norm (not ``nn.Identity``) on the heads' joint output.
    """
    for site in block_sites(vit.model):
        norm = getattr(site.module, "norm", None)
        if isinstance(norm, torch.nn.Module) and not isinstance(norm, torch.nn.Identity):
            raise AnalysisError(
                f"{what}: block {site.layer}'s attention normalises the heads' joint output ({type(norm).__name__}) "
                "before its projection, so no single head's output exists there to remove or attribute."
            )


def _replacements(vit, pixels: torch.Tensor, method: str, reference: torch.Tensor | None, layers: Sequence[int]):
    """Per layer, the ``(B or 1, T, heads, d)`` values that replace ``z`` (``None`` for "zero")."""
    if method not in ABLATIONS:
        raise AnalysisError(f"method must be one of {', '.join(ABLATIONS)}, got {method!r}.")
    if method == "zero":
        return {layer: None for layer in layers}
    if reference is None:  # the batch itself would make a one-image mean ablation a no-op
        raise AnalysisError(
            f"method={method!r} needs reference=: the images whose head outputs "
            f"{'are averaged' if method == 'mean' else 'replace this one'} (e.g. a set of samples)."
        )
    if not isinstance(reference, torch.Tensor) or reference.ndim != 4:
        raise AnalysisError("reference must be preprocessed images, a (R, 3, H, W) tensor (vit.preprocess).")
    if method == "resample" and reference.shape[0] not in (1, pixels.shape[0]):
        raise AnalysisError(f"reference has {reference.shape[0]} images: pass 1, or one per image ({pixels.shape[0]}).")
    cache = run_with_cache(
        vit, reference, names=[f"blocks.{layer}.attn.z" for layer in layers], precision="float32", to_cpu=False
    )
    values = {layer: cache[f"blocks.{layer}.attn.z"] for layer in layers}  # (R, T, heads, d)
    if method == "mean":
        values = {layer: z.mean(0, keepdim=True) for layer, z in values.items()}
    return values


def _ablating(heads: Sequence[int], value: torch.Tensor | None):
    """A hook on ``attn.z`` that replaces the listed heads' outputs."""

    def hook(z: torch.Tensor) -> torch.Tensor:  # (B, T, heads, d)
        z = z.clone()
        for head in heads:
            z[:, :, head] = 0 if value is None else value[:, :, head].to(z.dtype)
        return z

    return hook


def _measure(vit, logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's logit and probability (by the model's own rule), ``(B,)`` each."""
    logits = logits.float()
    return logits.gather(1, targets[:, None])[:, 0], vit.probabilities(logits).gather(1, targets[:, None])[:, 0]


def head_ablation(
    vit,
    pixels: torch.Tensor,
    *,
    target=None,
    method: str = "zero",
    reference: torch.Tensor | None = None,
    layers: Sequence[int] | None = None,
    progress: Progress | None = None,
) -> HeadAblation:
    """Ablate every head alone (``L × heads`` forward passes of the batch) and measure the target.

    The head's output ``z_{l,h}`` is replaced as ``method`` says (module docstring) and the effect
    is ``Δ = logit_c(ablated) − logit_c(clean)``, and likewise for the probability. The passes run
    in float32.

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`), with a class head.
    pixels : torch.Tensor
        ``(B, 3, H, W)`` preprocessed input (``vit.preprocess(image)``).
    target : int, sequence of int, torch.Tensor or None, default None
        The class measured, as in :func:`~analysis.explanations.gradients.resolve_targets`: a
        class, one per image, or ``None`` for each image's predicted class.
    method : str, default "zero"
        ``"zero"``, ``"mean"`` (the mean over the ``reference`` images, required) or
        ``"resample"`` (from ``reference``: one image, or one per image).
    reference : torch.Tensor or None, default None
        ``(R, 3, H, W)`` preprocessed reference images, for ``"mean"`` and ``"resample"``.
    layers : int, sequence of int or None, default None
        Only these layers' heads (one row each, ascending; negative counts from the end);
        ``None``, every layer.
    progress : Progress or None, default None
        Called as ``progress(done, total)`` after each forward pass.

    Returns
    -------
    HeadAblation
        ``delta_logit`` and ``delta_probability`` ``(B, L, heads)``, the clean values ``(B,)``,
        the targets, the method and the layers of the rows.

    Raises
    ------
    AnalysisError
        A windowed model (Swin, SAM); a model without a class head, or whose heads are not
        separable (:func:`check_separable_heads`); an unknown ``method``; ``"mean"`` /
        ``"resample"`` without a 4-d ``reference``, or ``"resample"`` with neither 1 nor ``B``
        reference images; a bad ``target`` or ``layers``.
    """
    refuse_windowed(vit, "head_ablation")
    spec = vit.spec
    if not spec.has_classifier:
        raise AnalysisError(f"Head ablation measures a class logit; this model has a {spec.head} head.")
    check_separable_heads(vit, "head_ablation")
    clean = run_with_hooks(vit, pixels, {}, precision="float32")
    targets = resolve_targets(target, clean, spec)
    clean_logit, clean_probability = _measure(vit, clean, targets)
    layers = tuple(sorted(resolve_layers(layers, spec.num_layers)))
    values = _replacements(vit, pixels, method, reference, layers)
    heads = [site.adapter.num_heads(site.module) for site in block_sites(vit.model)]
    delta_logit = torch.full((pixels.shape[0], len(layers), max(heads)), float("nan"))
    delta_probability = delta_logit.clone()
    total, done = sum(heads[layer] for layer in layers), 0
    for row, layer in enumerate(layers):
        for head in range(heads[layer]):
            logits = run_with_hooks(
                vit, pixels, {f"blocks.{layer}.attn.z": _ablating([head], values[layer])}, precision="float32"
            )
            logit, probability = _measure(vit, logits, targets)
            delta_logit[:, row, head] = logit - clean_logit
            delta_probability[:, row, head] = probability - clean_probability
            done += 1
            if progress is not None:
                progress(done, total)
    return HeadAblation(delta_logit, delta_probability, clean_logit, clean_probability, targets, method, tuple(layers))


def heads_by_effect(
    ablation: HeadAblation | torch.Tensor, layers: Sequence[int] | None = None
) -> list[tuple[int, int]]:
    """``(layer, head)`` pairs ordered from the largest drop of the target logit to the largest
    gain (a stable sort: ties keep their row-major order). NaN entries are left out.

    Parameters
    ----------
    ablation : HeadAblation or array-like
        A :class:`HeadAblation` (its ``delta_logit`` averaged over its batch), or an
        ``(rows, heads)`` array of effects.
    layers : sequence of int or None, default None
        The model layer of each row of an array (``None``: ``0..rows−1``); ignored for a
        :class:`HeadAblation`, whose own ``layers`` are used.

    Returns
    -------
    list of tuple of (int, int)
        ``(layer, head)`` pairs, most negative effect first.
    """
    if isinstance(ablation, HeadAblation):
        effect, layers = ablation.delta_logit.mean(0), ablation.layers
    else:
        effect = torch.as_tensor(ablation, dtype=torch.float64)
        layers = tuple(range(effect.shape[0])) if layers is None else tuple(layers)
    order = torch.argsort(effect.flatten().nan_to_num(float("inf")), stable=True)
    width = effect.shape[1]
    return [(int(layers[int(i) // width]), int(i) % width) for i in order if not torch.isnan(effect.flatten()[i])]


def cumulative_head_ablation(
    vit,
    pixels: torch.Tensor,
    heads: Sequence[tuple[int, int]],
    *,
    target=None,
    method: str = "zero",
    reference: torch.Tensor | None = None,
    progress: Progress | None = None,
) -> torch.Tensor:
    """Target logits with the first ``k`` of ``heads`` ablated together, ``k = 0..K``: the curve of
    the logit as heads go (e.g. in the order of :func:`heads_by_effect`). The passes run in float32.

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`), with a class head.
    pixels : torch.Tensor
        ``(B, 3, H, W)`` preprocessed input (``vit.preprocess(image)``).
    heads : sequence of (int, int)
        The ``K`` ``(layer, head)`` pairs, in the order they are removed (negative indices count
        from the end).
    target : int, sequence of int, torch.Tensor or None, default None
        The class measured, as in :func:`~analysis.explanations.gradients.resolve_targets`;
        ``None``, each image's predicted class.
    method : str, default "zero"
        ``"zero"``, ``"mean"`` or ``"resample"``, as in :func:`head_ablation`.
    reference : torch.Tensor or None, default None
        ``(R, 3, H, W)`` preprocessed reference images, for ``"mean"`` and ``"resample"``.
    progress : Progress or None, default None
        Called as ``progress(k, K)`` after each ablated forward pass.

    Returns
    -------
    torch.Tensor
        ``(K + 1, B)`` float32: row ``k`` the target logit with the first ``k`` heads ablated
        (row 0 the clean logit).

    Raises
    ------
    AnalysisError
        A windowed model (Swin, SAM); a model without a class head, or whose heads are not
        separable; an entry of ``heads`` not a ``(layer, head)`` pair, or out of range; the
        errors of ``method`` / ``reference`` / ``target`` as in :func:`head_ablation`.
    """
    refuse_windowed(vit, "cumulative_head_ablation")
    if not vit.spec.has_classifier:
        raise AnalysisError(f"Head ablation measures a class logit; this model has a {vit.spec.head} head.")
    check_separable_heads(vit, "cumulative_head_ablation")
    counts = [site.adapter.num_heads(site.module) for site in block_sites(vit.model)]
    pairs = []
    for pair in heads:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise AnalysisError(f"heads must be (layer, head) pairs, got {pair!r}.")
        layer = check_index("layer", pair[0], len(counts), "layers")
        pairs.append((layer, check_index("head", pair[1], counts[layer], f"heads in layer {layer}")))
    clean = run_with_hooks(vit, pixels, {}, precision="float32")
    targets = resolve_targets(target, clean, vit.spec)
    values = _replacements(vit, pixels, method, reference, sorted({layer for layer, _ in pairs}))
    curve = [_measure(vit, clean, targets)[0]]
    for k in range(1, len(pairs) + 1):
        by_layer: dict[int, list[int]] = {}
        for layer, head in pairs[:k]:
            by_layer.setdefault(layer, []).append(head)
        hooks = {f"blocks.{layer}.attn.z": _ablating(chosen, values[layer]) for layer, chosen in by_layer.items()}
        curve.append(_measure(vit, run_with_hooks(vit, pixels, hooks, precision="float32"), targets)[0])
        if progress is not None:
            progress(k, len(pairs))
    return torch.stack(curve)
