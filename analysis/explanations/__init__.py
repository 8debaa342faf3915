"""Why this class? Class-specific explanations of a ViT's prediction.

    >>> from analysis import asset_path, explain, load_image, load_vit
    >>> vit = load_vit("demo")
    >>> pixels = vit.preprocess(load_image(asset_path("samples", "scene_1_star.png")))
    >>> tuple(explain(vit, pixels, target=None, method="chefer").shape)  # (B, gh, gw), the predicted class
    (1, 8, 8)

Methods (see each function for its formula and source):

* ``"attention"``: the last block's class-token attention, mean over heads (not class-specific);
* ``"rollout"``: attention rollout (not class-specific);
* ``"chefer"``: Chefer et al. 2021b gradient-weighted relevance propagation;
* ``"gradcam"``: Grad-CAM on the last block's first-norm output (a pre-norm block's attention input);
* ``"input_x_gradient"``: input × gradient pooled per patch;
* ``"integrated_gradients"``: integrated gradients pooled per patch (``steps``, ``baseline``,
  ``quadrature``; the convergence delta: :func:`integrated_gradients_result`);
* ``"attnlrp"``: AttnLRP (Achtibat et al. 2024) layer-wise relevance pooled per patch
  (:mod:`analysis.explanations.lrp`; :func:`attnlrp_relevance` also gives per-token relevance);
  by default LXT's ViT recipe, CP-LRP inside attention and the γ-rule on the convolution and linear
  layers (``attention``, ``gamma``; ``attention="attnlrp", gamma=None`` is the paper's rules throughout).

Windowed models (Swin, SAM): ``"gradcam"`` (last stage), ``"input_x_gradient"``,
``"integrated_gradients"``, ``"attnlrp"`` (stem patch grid) and ``"rollout"``
(:mod:`analysis.attention.rollout`) work; ``"attention"`` and ``"chefer"`` are refused with the reason.
Maps then lie on different grids: :func:`explanation_grid` says which, and :func:`methods_for` lists
the defined methods.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from ..attention.rollout import attention_rollout
from ..base.errors import AnalysisError
from ..base.image_ops import BASELINES
from ..model.geometry import input_spec
from .gradients import AttentionGradients, attention_gradients, last_block_gradients, resolve_targets
from .lrp import AttnLRPRelevance, attnlrp, attnlrp_relevance
from .methods import (
    GLOBAL_TOKEN_METHODS,
    IG_QUADRATURES,
    IntegratedGradients,
    chefer_relevance,
    explanation_grid,
    grad_cam,
    input_x_gradient,
    integrated_gradients,
    integrated_gradients_result,
    raw_attention,
    refuse_global_token_method,
    relevance_from_gradients,
    rollout_map,
)

__all__ = [
    "EXPLANATION_METHODS",
    "CLASS_SPECIFIC",
    "BASELINES",
    "explain",
    "method_options",
    "attention_gradients",
    "AttentionGradients",
    "relevance_from_gradients",
    "resolve_targets",
    "last_block_gradients",
    "explanation_grid",
    "methods_for",
    "GLOBAL_TOKEN_METHODS",
    "integrated_gradients_result",
    "IntegratedGradients",
    "IG_QUADRATURES",
    "attnlrp_relevance",
    "AttnLRPRelevance",
]

#: method name -> function; the class-specific ones take ``target``.
EXPLANATION_METHODS: dict[str, Callable[..., Any]] = {
    "attention": raw_attention,
    "rollout": rollout_map,
    "chefer": chefer_relevance,
    "gradcam": grad_cam,
    "input_x_gradient": input_x_gradient,
    "integrated_gradients": integrated_gradients,
    "attnlrp": attnlrp,
}
CLASS_SPECIFIC = ("chefer", "gradcam", "input_x_gradient", "integrated_gradients", "attnlrp")


def method_options(method: str) -> tuple[str, ...]:
    """The keyword options ``explain(..., method=method, **options)`` accepts, read from the
    method's own signature (``"rollout"`` passes its options to :func:`analysis.attention_rollout`).

    Parameters
    ----------
    method : str
        A key of :data:`EXPLANATION_METHODS`.

    Returns
    -------
    tuple of str
        The keyword-only parameter names of the method's function, in signature order.

    Raises
    ------
    KeyError
        ``method`` is not a key of :data:`EXPLANATION_METHODS`.
    """
    function = attention_rollout if method == "rollout" else EXPLANATION_METHODS[method]
    return tuple(p.name for p in inspect.signature(function).parameters.values() if p.kind is p.KEYWORD_ONLY)


def methods_for(vit) -> tuple[str, ...]:
    """The methods of :data:`EXPLANATION_METHODS` defined for this model's attention: every one for
    a ViT; a windowed model (Swin, SAM) leaves out :data:`GLOBAL_TOKEN_METHODS`, by the one rule
    that refuses them. (A model without class scores is refused the class-specific ones
    separately, :data:`CLASS_SPECIFIC`.)

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`).

    Returns
    -------
    tuple of str
        Method names, in the order of :data:`EXPLANATION_METHODS`.
    """
    return tuple(m for m in EXPLANATION_METHODS if m not in GLOBAL_TOKEN_METHODS or _defined(vit, m))


def _defined(vit, method: str) -> bool:
    """Whether :func:`~analysis.explanations.methods.refuse_global_token_method` lets ``method`` through."""
    try:
        refuse_global_token_method(vit, method)
    except AnalysisError:
        return False
    return True


def explain(vit, pixels: torch.Tensor, target=None, method: str = "chefer", **options) -> torch.Tensor:
    """A ``(B, gh, gw)`` float32 CPU map of why the model scores ``target`` on ``pixels``.

    A windowed model's (Swin, SAM) map lies on the grid :func:`explanation_grid` names;
    ``"attention"`` and ``"chefer"`` are refused for it with the reason.

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`).
    pixels : torch.Tensor
        ``(B, 3, H, W)`` floating preprocessed input (``vit.preprocess(image)``).
    target : int, sequence of int, torch.Tensor or None, default None
        A class index, a ``(B,)`` sequence/tensor of them, or ``None`` for each image's predicted
        class (ignored by ``"attention"`` and ``"rollout"``, which are not class-specific;
        passing one is an error).
    method : str, default "chefer"
        One of :data:`EXPLANATION_METHODS`: ``"attention"``, ``"rollout"``, ``"chefer"``,
        ``"gradcam"``, ``"input_x_gradient"``, ``"integrated_gradients"``, ``"attnlrp"``.
    **options : Any
        Keyword options passed on to the method (:func:`method_options` lists them;
        ``integrated_gradients``: ``steps``, ``baseline``, ``quadrature``; ``chefer``:
        ``start_layer``; ``attnlrp``: ``attention``, ``gamma``; ``rollout``: ``head_fusion``, ...).

    Returns
    -------
    torch.Tensor
        ``(B, gh, gw)`` float32 on the CPU: a ViT's patch grid, or for a windowed model the grid
        :func:`explanation_grid` names.

    Raises
    ------
    AnalysisError
        For an unknown ``method``, an option the method does not accept, a ``target`` given to a
        method that is not class-specific, ``pixels`` that do not fit the model, or a method not
        defined for a windowed model (``"attention"``, ``"chefer"``).
    """
    if method not in EXPLANATION_METHODS:
        raise AnalysisError(f"Unknown explanation method {method!r}; use one of {', '.join(EXPLANATION_METHODS)}.")
    accepted = method_options(method)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        takes = f"takes only {', '.join(accepted)}" if accepted else "takes no options"
        raise AnalysisError(f"method={method!r} does not accept {', '.join(unknown)}: it {takes}.")
    input_spec(vit, pixels)
    function = EXPLANATION_METHODS[method]
    if method not in CLASS_SPECIFIC:
        if target is not None:
            raise AnalysisError(
                f"method={method!r} is not class-specific and takes no target; use 'chefer' or 'gradcam'."
            )
        return function(vit, pixels, **options)
    maps, _targets = function(vit, pixels, target, **options)
    return maps
