"""Class-specific explanation methods, each ``(vit, pixels, targets...) -> (B, gh, gw)``.

All maps are over the patch grid in row-major order, prefix tokens (class, distillation,
registers) dropped by index from the model's own spec, never by a hard-coded grid.

Windowed models (Swin, SAM) have no one grid for every layer:
:func:`explanation_grid` says which grid each method's map lies on. ``"gradcam"`` works on
the last stage's grid, ``"input_x_gradient"`` and ``"integrated_gradients"`` on the stem's
patch grid, ``"rollout"`` on its start layer's grid; ``"attention"`` and ``"chefer"``, which
read a class token's row over one global token set, are refused with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..attention.maps import attention_map
from ..attention.rollout import attention_rollout
from ..base.arguments import check_int
from ..base.errors import AnalysisError
from ..base.image_ops import BASELINES, baseline_pixels
from ..engine.capture import capture_attention
from ..model.geometry import ViTSpec
from ..model.windowed_support import require_global_attention
from .gradients import (
    attention_gradients,
    last_block_gradients,
    pixel_gradients,
    require_classes,
    resolve_targets,
)

__all__ = [
    "raw_attention",
    "rollout_map",
    "chefer_relevance",
    "relevance_from_gradients",
    "grad_cam",
    "grad_cam_from",
    "input_x_gradient",
    "integrated_gradients",
    "integrated_gradients_result",
    "IntegratedGradients",
    "quadrature_rule",
    "IG_QUADRATURES",
    "explanation_grid",
    "GLOBAL_TOKEN_METHODS",
]

#: method -> why it is not defined for a windowed model (Swin, SAM).
GLOBAL_TOKEN_METHODS = {
    "attention": (
        "it reads the class token's row of the last layer's attention over every token (or the mean over every "
        "patch query of one global attention); a windowed model has no class token, and a Swin's last layer "
        "attends inside windows. For one cell's window use attention_map(record, layer, query=cell or (y, x))"
    ),
    "chefer": (
        "Chefer et al.'s rule R = R + E_h[(∇A ⊙ A)⁺]·R propagates relevance through every layer over one token "
        "set with a class token; a windowed model has no class token and a Swin's token set changes at every "
        "patch merging, where the rule has no step"
    ),
}


def refuse_global_token_method(vit, method: str) -> None:
    """AnalysisError naming why ``method`` is not defined for a windowed model."""
    require_global_attention(
        vit,
        lambda spec: AnalysisError(
            f"method={method!r} is not defined for a windowed model ({spec.family}): {GLOBAL_TOKEN_METHODS[method]}. "
            "Use method='gradcam', 'input_x_gradient', 'integrated_gradients' or 'rollout' (stage=k)."
        ),
    )


def explanation_grid(vit, method: str, **options) -> tuple[tuple[int, int], tuple[int, int]]:
    """``(grid_size, stride)`` of the map ``explain(vit, ..., method=method, **options)``
    returns: ``(gh, gw)`` cells of ``(sy, sx)`` input pixels each. A ViT: its patch grid for
    every method (its one grid). A windowed model: ``"gradcam"`` the last stage's grid; ``"input_x_gradient"``,
    ``"integrated_gradients"`` and ``"attnlrp"`` (relevance at the pixels) the stem's patch grid
    (``spec.grid_size``, ``spec.patch_size``);
    ``"rollout"`` the grid of its start layer (``start_layer`` or the first layer of ``stage``).

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`).
    method : str
        An explanation method's name (:data:`~analysis.explanations.EXPLANATION_METHODS`).
    **options : Any
        The method's options; only ``"rollout"``'s ``start_layer``, ``end_layer`` and ``stage``
        are read.

    Returns
    -------
    tuple of (tuple of int, tuple of int)
        ``((gh, gw), (sy, sx))``: the map's grid and the input pixels per cell.

    Raises
    ------
    AnalysisError
        ``"attention"`` or ``"chefer"`` for a windowed model (:data:`GLOBAL_TOKEN_METHODS`), or a
        rollout layer range or ``stage`` not in the model.
    """
    spec = vit.spec
    if method in GLOBAL_TOKEN_METHODS:
        refuse_global_token_method(vit, method)
    if method == "gradcam":
        geometry = spec.geometry(spec.num_layers - 1)
        return geometry.grid_size, geometry.stride
    if method == "rollout":
        from ..attention.rollout_rules import layer_range

        start, _ = layer_range(spec, options.get("start_layer", 0), options.get("end_layer"), options.get("stage"))
        geometry = spec.geometry(start)
        return geometry.grid_size, geometry.stride
    return tuple(spec.grid_size), tuple(spec.patch_size)


def _grid(values: torch.Tensor, spec: ViTSpec) -> torch.Tensor:
    """``(B, N_patches)`` -> ``(B, gh, gw)`` float32 on the CPU."""
    return values.float().cpu().reshape(values.shape[0], *spec.grid_size)


def raw_attention(vit, pixels: torch.Tensor) -> torch.Tensor:
    """The last block's attention over the patches, mean over heads, for the default query
    (:func:`~analysis.records.queries.default_query`): ``mean_h A_L[h, cls, patches]``, or without a
    class token the mean over every patch query (what a global-average-pooling head reads).
    Refused for a windowed model (:data:`GLOBAL_TOKEN_METHODS`).

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`).
    pixels : torch.Tensor
        ``(B, 3, H, W)`` floating preprocessed input (``vit.preprocess(image)``).

    Returns
    -------
    torch.Tensor
        ``(B, gh, gw)`` float32 on the CPU, the patch grid.

    Raises
    ------
    AnalysisError
        A windowed model (Swin, SAM), or ``pixels`` that do not fit the model.
    """
    refuse_global_token_method(vit, "attention")
    queries = [0] if vit.spec.has_class_token else None  # keep only the class token's row when it is the query
    record = capture_attention(vit, pixels, layers=-1, query_tokens=queries)
    return attention_map(record, record.layers[0], head=None).float().cpu()


def rollout_map(vit, pixels: torch.Tensor, **options) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema 2020) of the class token (mean over patch queries
    without one). A windowed model: the mean over every cell (see :mod:`analysis.attention.rollout`;
    a Swin needs ``stage=k`` or ``merge="mean_2x2"``), on :func:`explanation_grid`'s grid.

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`).
    pixels : torch.Tensor
        ``(B, 3, H, W)`` floating preprocessed input (``vit.preprocess(image)``).
    **options : Any
        Passed on to :func:`analysis.attention_rollout` (``head_fusion``, ``discard_ratio``,
        ``start_layer``, ``end_layer``, ``query``, ``stage``, ``merge``).

    Returns
    -------
    torch.Tensor
        ``(B, gh, gw)`` float32 on :func:`explanation_grid`'s grid.

    Raises
    ------
    AnalysisError
        ``pixels`` that do not fit the model, or as :func:`analysis.attention_rollout`.
    """
    record = capture_attention(vit, pixels)
    return attention_rollout(record, **options).float()


def relevance_from_gradients(
    attentions: torch.Tensor, gradients: torch.Tensor, spec: ViTSpec, *, start_layer: int = 0
) -> torch.Tensor:
    """Chefer et al. 2021b ("Generic Attention-model Explainability", eq. 5-6) for a
    self-attention encoder:

        R = I (T×T);   Āˡ = E_h[(∇Aˡ ⊙ Aˡ)⁺];   R ← R + Āˡ·R   for l = start_layer, ..., L − 1

    ``R`` is accumulated in float64.

    Parameters
    ----------
    attentions : torch.Tensor
        ``(L, B, heads, T, T)`` attention probabilities ``Aˡ`` of every block.
    gradients : torch.Tensor
        ``(L, B, heads, T, T)`` ``∇Aˡ``, the target score's gradient with respect to them.
    spec : ViTSpec
        The model's geometry (prefix tokens, ``grid_size``).
    start_layer : int, default 0
        The first block the rule reads (a Python index, ``-1`` the last): ``0``, every block, as
        Chefer's ViT notebook (Transformer-MM-Explainability, the default here); ``-1``, the last
        block only, as that repository's CLIP notebook (``interpret(..., start_layer=-1)``).

    Returns
    -------
    torch.Tensor
        ``(B, gh, gw)`` float32 on the CPU: the class token's row of R over the patch tokens;
        without a class token, the mean of the patch tokens' rows (every patch query, as
        global-average pooling reads them).

    Raises
    ------
    AnalysisError
        ``start_layer`` not an integer, or not a block index.
    """
    layers, batch, _, tokens, _ = attentions.shape
    first = _start_layer(start_layer, layers)
    relevance = torch.eye(tokens, dtype=torch.float64).expand(batch, tokens, tokens).clone()  # (B, T, T)
    for layer_attention, layer_gradient in zip(attentions[first:], gradients[first:]):
        fused = (layer_gradient.double() * layer_attention.double()).clamp(min=0).mean(1)  # (B, T, T)
        relevance = relevance + torch.bmm(fused, relevance)
    to_patches = spec.split_prefix(relevance, 2)[1]  # (B, T, N): relevance of each token to the patches
    rows = to_patches[:, 0] if spec.has_class_token else spec.split_prefix(to_patches, 1)[1].mean(1)  # (B, N)
    return _grid(rows, spec)


def _start_layer(start_layer: int, layers: int) -> int:
    """``start_layer`` as a block index in ``0..layers-1`` (negative counts from the end)."""
    start_layer = check_int("start_layer", start_layer)
    if not -layers <= start_layer < layers:
        raise AnalysisError(
            f"start_layer={start_layer} is not a block of this model: it has {layers} blocks "
            f"(0..{layers - 1}, or -{layers}..-1 from the end)."
        )
    return start_layer % layers


def chefer_relevance(
    vit, pixels: torch.Tensor, target=None, *, start_layer: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chefer et al. 2021b relevance maps by :func:`relevance_from_gradients` from block
    ``start_layer`` on. Refused for a windowed model (:data:`GLOBAL_TOKEN_METHODS`).

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`).
    pixels : torch.Tensor
        ``(B, 3, H, W)`` floating preprocessed input (``vit.preprocess(image)``).
    target : int, sequence of int, torch.Tensor or None, default None
        A class index or a ``(B,)`` sequence/tensor of them
        (:func:`~analysis.explanations.resolve_targets`); ``None``, each image's predicted class.
    start_layer : int, default 0
        The first block the rule reads: ``0``, every block; ``-1``, the last, as Chefer's CLIP notebook.

    Returns
    -------
    tuple of torch.Tensor
        ``(maps, targets)``: ``(B, gh, gw)`` float32 maps on the CPU and the ``(B,)`` long targets.

    Raises
    ------
    AnalysisError
        A windowed model (Swin, SAM), ``start_layer`` not a block index, a model without class
        scores, a bad ``target``, ``pixels`` that do not fit the model.
    """
    refuse_global_token_method(vit, "chefer")
    _start_layer(start_layer, vit.spec.num_layers)  # before the backward pass
    record = attention_gradients(vit, pixels, target)
    maps = relevance_from_gradients(record.attentions, record.gradients, record.spec, start_layer=start_layer)
    return maps, record.targets


def grad_cam(vit, pixels: torch.Tensor, target=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Grad-CAM (Selvaraju et al. 2017) on the last block's first-norm output ``X`` on the last
    layer's grid of cells (``norm1``: the layer pytorch-grad-cam reads for ViTs and Swin;
    :func:`~analysis.explanations.gradients.last_block_gradients`), prefix tokens left out:

        w_c = mean_cells ∂y/∂X[r, x, c];   map[r, x] = ReLU(Σ_c w_c · X[r, x, c])

    The grid is a ViT's patch grid, a windowed model's last stage (:func:`explanation_grid`).

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`).
    pixels : torch.Tensor
        ``(B, 3, H, W)`` floating preprocessed input (``vit.preprocess(image)``).
    target : int, sequence of int, torch.Tensor or None, default None
        A class index or a ``(B,)`` sequence/tensor of them
        (:func:`~analysis.explanations.resolve_targets`); ``None``, each image's predicted class.

    Returns
    -------
    tuple of torch.Tensor
        ``(maps, targets)``: ``(B, gh, gw)`` float32 maps on the CPU and the ``(B,)`` long targets.

    Raises
    ------
    AnalysisError
        A model without class scores, a bad ``target``, ``pixels`` that do not fit the model, or a
        last block without a first norm on the last layer's grid.
    """
    activations, gradients, targets, _ = last_block_gradients(vit, pixels, target)  # (B, gh, gw, C)
    return grad_cam_from(activations, gradients), targets


def grad_cam_from(activations: torch.Tensor, gradients: torch.Tensor) -> torch.Tensor:
    """Grad-CAM's rule on activations on a grid of cells and their gradient:
    ``map[r, x] = ReLU(Σ_c mean_cells(∂y/∂X)[c] · X[r, x, c])``.

    Parameters
    ----------
    activations : torch.Tensor
        ``(B, gh, gw, C)`` activations ``X`` on a layer's grid
        (:func:`~analysis.records.layer_tokens.layer_grid`).
    gradients : torch.Tensor
        ``(B, gh, gw, C)`` ``∂y/∂X``.

    Returns
    -------
    torch.Tensor
        ``(B, gh, gw)`` float32, on the device of the inputs.
    """
    cells, cell_gradients = activations.flatten(1, 2), gradients.flatten(1, 2)  # (B, N, C)
    weights = cell_gradients.mean(1, keepdim=True)  # (B, 1, C)
    return (cells * weights).sum(-1).clamp(min=0).float().reshape(activations.shape[:3])


def _pool_patches(pixel_map: torch.Tensor, spec: ViTSpec) -> torch.Tensor:
    """``(B, H, W)`` per-pixel values -> ``(B, gh, gw)`` sums over each patch's pixels: the
    patch grid read off the model's patch embedding (``spec.grid_size`` of ``spec.patch_size``
    pixels; for a windowed model, the stem's grid, which is its first stage's)."""
    (gh, gw), (ph, pw) = spec.grid_size, spec.patch_size
    height, width = gh * ph, gw * pw
    if pixel_map.shape[-2] < height or pixel_map.shape[-1] < width:  # padded up to whole patches
        pixel_map = F.pad(pixel_map, (0, width - pixel_map.shape[-1], 0, height - pixel_map.shape[-2]))
    blocks = pixel_map[:, :height, :width].reshape(-1, gh, ph, gw, pw)
    return blocks.sum((2, 4))


def _targets_for(vit, pixels: torch.Tensor, target) -> torch.Tensor:
    """Targets fixed on the clean input (integrated gradients evaluates other inputs)."""
    require_classes(vit.spec, "A gradient explanation")
    if target is None:
        with torch.no_grad():
            logits = vit.model(pixels.to(vit.device, dtype=torch.float32))
        return logits.argmax(-1).cpu()
    return resolve_targets(target, torch.empty(pixels.shape[0], vit.spec.num_outputs), vit.spec)


def input_x_gradient(vit, pixels: torch.Tensor, target=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Input × gradient (Shrikumar et al. 2016) pooled per patch:
    ``map[p] = Σ_{c, (i, j) ∈ p} x[c, i, j] · ∂y/∂x[c, i, j]`` on the normalised input (signed:
    positive is evidence for the class). Model-agnostic: a windowed model's map lies on its
    stem's patch grid (:func:`explanation_grid`).

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`).
    pixels : torch.Tensor
        ``(B, 3, H, W)`` floating preprocessed input (``vit.preprocess(image)``).
    target : int, sequence of int, torch.Tensor or None, default None
        A class index or a ``(B,)`` sequence/tensor of them
        (:func:`~analysis.explanations.resolve_targets`); ``None``, each image's predicted class.

    Returns
    -------
    tuple of torch.Tensor
        ``(maps, targets)``: ``(B, gh, gw)`` float32 maps on the CPU and the ``(B,)`` long targets.

    Raises
    ------
    AnalysisError
        A model without class scores, a bad ``target``, ``pixels`` that do not fit the model.
    """
    gradient, targets = pixel_gradients(vit, pixels, target)  # one forward and backward
    return _pool_patches((pixels.detach().float().cpu() * gradient).sum(1), vit.spec), targets


#: integrated gradients' quadrature rules, by captum's names (``IntegratedGradients(method=...)``):
#: name -> ``(alphas, weights)`` of ``n`` steps, the points on the path and the weight of each gradient.
IG_QUADRATURES = ("riemann_middle", "riemann_left", "riemann_right", "riemann_trapezoid", "gausslegendre")


def quadrature_rule(name: str, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(alphas (n,), weights (n,))`` float64 of integrated gradients' rule ``name`` with ``n =
    steps`` points, as captum builds them (``captum.attr._utils.approximation_methods``):

    * ``"riemann_middle"`` (this library's default): ``αₖ = (k + ½)/n``, ``wₖ = 1/n``;
    * ``"riemann_left"``: ``αₖ = k/n``; ``"riemann_right"``: ``αₖ = (k + 1)/n``; both ``wₖ = 1/n``;
    * ``"riemann_trapezoid"``: ``αₖ = k/(n − 1)``, ``wₖ = 1/n`` with the two ends halved (captum's
      weights, which sum to ``1 − 1/n``); needs ``n ≥ 2``, as do the other Riemann rules but the middle one;
    * ``"gausslegendre"`` (captum's default): the Gauss–Legendre nodes ``xₖ`` and weights ``ωₖ`` on
      ``[−1, 1]`` moved to ``[0, 1]``: ``αₖ = (1 + xₖ)/2``, ``wₖ = ωₖ/2``.

    Parameters
    ----------
    name : str
        One of :data:`IG_QUADRATURES`.
    steps : int
        ``n``, the number of points.

    Returns
    -------
    tuple of torch.Tensor
        ``(alphas, weights)``, each ``(n,)`` float64.

    Raises
    ------
    AnalysisError
        ``name`` not in :data:`IG_QUADRATURES`, or ``steps < 2`` for a rule other than
        ``"riemann_middle"`` and ``"gausslegendre"``.
    """
    if name not in IG_QUADRATURES:
        raise AnalysisError(
            f"quadrature={name!r} is not a rule of integrated gradients; use one of {', '.join(IG_QUADRATURES)}."
        )
    if name == "riemann_middle":  # this library's own points, as before captum's names
        return (torch.arange(steps, dtype=torch.float64) + 0.5) / steps, torch.full(
            (steps,), 1.0 / steps, dtype=torch.float64
        )
    if name == "gausslegendre":
        nodes, weights = np.polynomial.legendre.leggauss(steps)
        return torch.from_numpy(0.5 * (1 + nodes)), torch.from_numpy(0.5 * weights)
    if steps < 2:
        raise AnalysisError(f"quadrature={name!r} needs steps >= 2 (captum's Riemann rules do); got steps={steps}.")
    uniform = torch.full((steps,), 1.0 / steps, dtype=torch.float64)
    if name == "riemann_trapezoid":
        uniform[0] /= 2
        uniform[-1] /= 2
        return torch.linspace(0, 1, steps, dtype=torch.float32).double(), uniform
    start, end = (0.0, 1 - 1 / steps) if name == "riemann_left" else (1 / steps, 1.0)
    return torch.linspace(start, end, steps, dtype=torch.float32).double(), uniform


@dataclass(frozen=True)
class IntegratedGradients:
    """Integrated gradients of each image with its convergence delta, on the CPU.

    Attributes
    ----------
    maps : torch.Tensor
        ``(B, gh, gw)`` float32: the attributions summed over channels and each patch's pixels.
    attributions : torch.Tensor
        ``(B, 3, H, W)`` float32: the per-pixel attributions ``(x − x′) ⊙ Σₖ wₖ ∂y/∂x(x′ + αₖ(x − x′))``.
    targets : torch.Tensor
        ``(B,)`` long: the class explained in each image.
    convergence_delta : torch.Tensor
        ``(B,)`` float64: ``Σ attributions − (y(x) − y(x′))``, captum's ``return_convergence_delta``:
        how far the quadrature is from completeness.
    """

    maps: torch.Tensor
    attributions: torch.Tensor
    targets: torch.Tensor
    convergence_delta: torch.Tensor


def integrated_gradients(
    vit,
    pixels: torch.Tensor,
    target=None,
    *,
    steps: int = 32,
    baseline: str = BASELINES[0],
    internal_batch: int = 16,
    quadrature: str = IG_QUADRATURES[0],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Integrated gradients (Sundararajan et al. 2017) pooled per patch, by default the midpoint rule:

        IG(x) = (x − x′) ⊙ (1/n) Σ_{k=0}^{n−1} ∂y/∂x (x′ + (k + ½)/n · (x − x′))

    summed over channels and each patch's pixels. Completeness: ``Σ_p map[p] ≈ y(x) − y(x′)``,
    more exactly as ``steps`` grows. Model-agnostic: a windowed model's map lies on its stem's
    patch grid (:func:`explanation_grid`). The convergence delta is in
    :func:`integrated_gradients_result`.

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`).
    pixels : torch.Tensor
        ``(B, 3, H, W)`` floating preprocessed input (``vit.preprocess(image)``).
    target : int, sequence of int, torch.Tensor or None, default None
        A class index or a ``(B,)`` sequence/tensor of them
        (:func:`~analysis.explanations.resolve_targets`); ``None``, each image's predicted class.
    steps : int, default 32
        ``n``, the number of points on the path (at least 1; 2 for the Riemann rules but the middle one).
    baseline : str, default "mean"
        The reference ``x′``, one of :data:`BASELINES`: ``"mean"``, ``"black"`` or ``"blur"``.
    internal_batch : int, default 16
        Path points per forward/backward pass (at least 1).
    quadrature : str, default "riemann_middle"
        The rule, by captum's names, one of :data:`IG_QUADRATURES` (:func:`quadrature_rule`;
        ``"riemann_middle"`` is the default here, captum's own default is ``"gausslegendre"``).

    Returns
    -------
    tuple of torch.Tensor
        ``(maps, targets)``: ``(B, gh, gw)`` float32 maps on the CPU and the ``(B,)`` long targets.

    Raises
    ------
    AnalysisError
        ``steps`` or ``internal_batch`` not a positive integer, an unknown ``quadrature`` (or
        ``steps < 2`` for a Riemann rule other than the middle one) or ``baseline``, a model without
        class scores, a bad ``target``, ``pixels`` that do not fit the model.
    """
    result = integrated_gradients_result(
        vit, pixels, target, steps=steps, baseline=baseline, internal_batch=internal_batch, quadrature=quadrature
    )
    return result.maps, result.targets


def integrated_gradients_result(
    vit,
    pixels: torch.Tensor,
    target=None,
    *,
    steps: int = 32,
    baseline: str = BASELINES[0],
    internal_batch: int = 16,
    quadrature: str = IG_QUADRATURES[0],
) -> IntegratedGradients:
    """:func:`integrated_gradients` with the per-pixel attributions and captum's convergence delta:

        IG(x) = (x − x′) ⊙ Σₖ wₖ · ∂y/∂x (x′ + αₖ · (x − x′))     (αₖ, wₖ: :func:`quadrature_rule`)
        δ = Σ_{c,i,j} IG(x) − (y(x) − y(x′))

    With ``quadrature`` and ``steps`` the same, the attributions and ``δ`` are captum's
    ``IntegratedGradients(model).attribute(x, baselines=x′, target=y, method=quadrature,
    n_steps=steps, return_convergence_delta=True)`` (tested to 1e-5).

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`).
    pixels : torch.Tensor
        ``(B, 3, H, W)`` floating preprocessed input (``vit.preprocess(image)``).
    target : int, sequence of int, torch.Tensor or None, default None
        A class index or a ``(B,)`` sequence/tensor of them
        (:func:`~analysis.explanations.resolve_targets`); ``None``, each image's predicted class on the clean input.
    steps : int, default 32
        ``n``, the number of points on the path (at least 1; 2 for the Riemann rules but the middle one).
    baseline : str, default "mean"
        The reference ``x′``, one of :data:`BASELINES`: ``"mean"``, ``"black"`` or ``"blur"``.
    internal_batch : int, default 16
        Path points per forward/backward pass (at least 1).
    quadrature : str, default "riemann_middle"
        The rule, by captum's names, one of :data:`IG_QUADRATURES` (:func:`quadrature_rule`;
        ``"riemann_middle"`` is the default here, captum's own default is ``"gausslegendre"``).

    Returns
    -------
    IntegratedGradients
        ``(B, gh, gw)`` maps, ``(B, 3, H, W)`` attributions, ``(B,)`` targets and ``(B,)``
        convergence deltas, on the CPU.

    Raises
    ------
    AnalysisError
        ``steps`` or ``internal_batch`` not a positive integer, an unknown ``quadrature`` (or
        ``steps < 2`` for a Riemann rule other than the middle one) or ``baseline``, a model without
        class scores, a bad ``target``, ``pixels`` that do not fit the model.
    """
    steps = check_int("steps", steps, minimum=1)
    internal_batch = check_int("internal_batch", internal_batch, minimum=1)
    alphas, weights = quadrature_rule(quadrature, steps)
    targets = _targets_for(vit, pixels, target)
    inputs = pixels.detach().float().cpu()
    reference = baseline_pixels(vit, inputs, baseline)  # (B, 3, H, W)
    difference = inputs - reference
    total = torch.zeros_like(inputs)
    alphas = alphas.float()
    for b in range(inputs.shape[0]):
        for start in range(0, steps, internal_batch):
            chunk = alphas[start : start + internal_batch]  # (n,)
            weight = weights[start : start + internal_batch].float()  # (n,)
            path = reference[b] + chunk[:, None, None, None] * difference[b]  # (n, 3, H, W)
            gradient, _ = pixel_gradients(vit, path, targets[b].repeat(len(chunk)))
            total[b] += (gradient * weight[:, None, None, None]).sum(0)
    attributions = difference * total  # (B, 3, H, W)
    with torch.no_grad():
        ends = torch.cat([inputs, reference]).to(vit.device)
        scores = vit.model(ends).float().cpu()  # (2B, classes)
    rows = torch.cat([targets, targets])[:, None]
    end_score, start_score = scores.gather(1, rows)[:, 0].split(inputs.shape[0])
    delta = attributions.double().sum((1, 2, 3)) - (end_score.double() - start_score.double())
    return IntegratedGradients(
        maps=_pool_patches(attributions.sum(1), vit.spec),
        attributions=attributions,
        targets=targets,
        convergence_delta=delta,
    )
