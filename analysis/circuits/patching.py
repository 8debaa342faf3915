"""Activation patching: which activations carry the clean image's answer.

Run the *corrupted* image, but at one place — block ``l``'s residual stream at token ``t``
(``resid_pre``), or head ``h``'s output (``attn.z``) — use the activation of the *clean* image,
and measure how much of the clean answer comes back (Meng et al. 2022 "Locating and Editing
Factual Associations in GPT", causal tracing; Wang et al. 2022 §3; the normalisation as in
TransformerLens's patching utilities):

    effect = (m(patched) − m(corrupted)) / (m(clean) − m(corrupted))

with ``m`` the target logit, or the logit difference ``logit_a − logit_b``. 1 means the patched
activation alone restores the clean answer, 0 that it carries none of it. Patching every
token's ``resid_pre`` at block 0 restores the clean logits exactly (tested at 1e-5).
The patched runs are batched: one forward pass patches several positions (or heads), each
copy of the corrupted image a different one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..base.arguments import resolve_layers
from ..base.errors import AnalysisError
from ..base.progress import Progress
from ..engine.activations import run_with_cache, run_with_hooks
from ..explanations.gradients import resolve_targets
from ..model.windowed_support import refuse_windowed
from .ablation import check_separable_heads

__all__ = ["PATCH_POINTS", "PatchingResult", "activation_patching"]

#: What is patched: the residual stream per (layer, token), or each head's output per (layer, head).
PATCH_POINTS = ("resid_pre", "attn.z")


@dataclass(frozen=True)
class PatchingResult:
    """Effects of patching clean activations into the corrupted run (what
    :func:`activation_patching` returns).

    Attributes
    ----------
    effect : torch.Tensor
        ``(L, T)`` float32 for ``resid_pre`` (tokens in the model's order: prefix, then patches
        row-major), ``(L, heads)`` for ``attn.z``: the normalised effect (module docstring).
    patched : torch.Tensor
        The metric of each patched run, same shape and dtype.
    clean : float
        The metric on the clean image.
    corrupted : float
        The metric on the corrupted image.
    point : str
        One of :data:`PATCH_POINTS`.
    target : tuple of int
        The class measured, ``(c,)``, or the pair ``(a, b)`` of the logit difference.
    layers : tuple of int, default ()
        The model layer of each row, ascending (all, unless ``layers=`` chose some).
    """

    effect: torch.Tensor
    patched: torch.Tensor
    clean: float
    corrupted: float
    point: str
    target: tuple[int, ...]
    layers: tuple[int, ...] = ()


def activation_patching(
    vit,
    clean: torch.Tensor,
    corrupted: torch.Tensor,
    *,
    point: str = "resid_pre",
    target=None,
    versus=None,
    layers=None,
    batch_size: int = 16,
    progress: Progress | None = None,
) -> PatchingResult:
    """Patch each (layer, token) or (layer, head) of ``clean`` into ``corrupted``, one at a time.

    The metric ``m`` is the target logit, or ``logit_target − logit_versus``; the effect is
    normalised as in the module docstring. The passes run in float32, ``batch_size`` patched
    copies of the corrupted image per pass.

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`), with a class head.
    clean : torch.Tensor
        ``(1, 3, H, W)`` the preprocessed clean image, whose activations are patched in.
    corrupted : torch.Tensor
        ``(1, 3, H, W)`` the preprocessed corrupted image, of the same size.
    point : str, default "resid_pre"
        ``"resid_pre"`` (each block's residual stream input, per token) or ``"attn.z"`` (each
        head's output, per head).
    target : int, torch.Tensor or None, default None
        The class measured (:func:`~analysis.explanations.gradients.resolve_targets`); ``None``,
        the clean image's prediction.
    versus : int, torch.Tensor or None, default None
        A second class, to measure ``logit_target − logit_versus``; ``None``, the target logit alone.
    layers : int, sequence of int or None, default None
        Only these layers (one row each, ascending; negative counts from the end); ``None``, every
        layer.
    batch_size : int, default 16
        Patched copies per forward pass.
    progress : Progress or None, default None
        Called as ``progress(done, total)`` after each forward pass.

    Returns
    -------
    PatchingResult
        ``effect`` and ``patched`` ``(L, T)`` (``resid_pre``) or ``(L, heads)`` (``attn.z``), the
        clean and corrupted metrics, the point, the classes measured and the layers of the rows.

    Raises
    ------
    AnalysisError
        A windowed model (Swin, SAM); an unknown ``point``; ``clean`` / ``corrupted`` not
        ``(1, 3, H, W)`` tensors of the same shape; a model without a class head, or (``"attn.z"``)
        whose heads are not separable; a bad ``target``, ``versus`` or ``layers``; clean and
        corrupted images with the same metric (nothing to restore).
    """
    refuse_windowed(vit, "activation_patching")
    if point not in PATCH_POINTS:
        raise AnalysisError(f"point must be one of {', '.join(PATCH_POINTS)}, got {point!r}.")
    if not isinstance(clean, torch.Tensor) or not isinstance(corrupted, torch.Tensor):
        raise AnalysisError("clean and corrupted must be preprocessed images, (1, 3, H, W) tensors (vit.preprocess).")
    if clean.ndim != 4 or clean.shape[0] != 1 or corrupted.shape != clean.shape:
        raise AnalysisError(
            f"Patching compares one clean and one corrupted image of the same size, (1, 3, H, W); got "
            f"{tuple(clean.shape)} and {tuple(corrupted.shape)}."
        )
    spec = vit.spec
    if not spec.has_classifier:
        raise AnalysisError(f"Patching measures a class logit; this model has a {spec.head} head.")
    if point == "attn.z":
        check_separable_heads(vit, "activation_patching(point='attn.z')")
    layers = tuple(sorted(resolve_layers(layers, spec.num_layers)))
    names = [f"blocks.{layer}.{point}" for layer in layers]
    source = run_with_cache(vit, clean, names=names, precision="float32", to_cpu=False)
    targets = resolve_targets(target, source.output.cpu(), spec)
    rival = None if versus is None else resolve_targets(versus, source.output.cpu(), spec)

    def metric(logits: torch.Tensor) -> torch.Tensor:  # (N,)
        logits = logits.float()
        value = logits[:, int(targets[0])]
        return value if rival is None else value - logits[:, int(rival[0])]

    corrupted_metric = float(metric(run_with_hooks(vit, corrupted, {}, precision="float32"))[0])
    clean_metric = float(metric(source.output)[0])
    axis = 1 if point == "resid_pre" else 2  # tokens of (B, T, D), heads of (B, T, heads, d)
    width = source[names[0]].shape[axis]
    patched = torch.empty(len(layers), width)
    total = len(layers) * -(-width // batch_size)
    done = 0
    for row, name in enumerate(names):
        clean_value = source[name][0]  # (T, D) or (T, heads, d)
        for start in range(0, width, batch_size):
            where = list(range(start, min(start + batch_size, width)))

            def patch(x: torch.Tensor, where=where, clean_value=clean_value) -> torch.Tensor:  # x: (n, ...)
                x = x.clone()
                for copy, index in enumerate(where):
                    if axis == 1:
                        x[copy, index] = clean_value[index].to(x.dtype)
                    else:
                        x[copy, :, index] = clean_value[:, index].to(x.dtype)
                return x

            logits = run_with_hooks(vit, corrupted.expand(len(where), -1, -1, -1), {name: patch}, precision="float32")
            patched[row, start : start + len(where)] = metric(logits)
            done += 1
            if progress is not None:
                progress(done, total)
    gap = clean_metric - corrupted_metric
    if abs(gap) < 1e-6:
        raise AnalysisError(
            "The clean and corrupted images give the same metric: there is nothing to restore. "
            "Choose another corruption or target."
        )
    chosen = (int(targets[0]),) if rival is None else (int(targets[0]), int(rival[0]))
    return PatchingResult(
        (patched - corrupted_metric) / gap, patched, clean_metric, corrupted_metric, point, chosen, tuple(layers)
    )
