"""Assemble a timm ``VisionTransformer`` from a foreign model's own modules.

The skeleton is built on the ``meta`` device (no memory, no random init), then every
submodule and parameter is replaced by the foreign model's: the result shares each weight
tensor with the original (nothing is copied) and runs the same layers, so the timm
attention adapter reads its attention. :func:`finish` refuses a skeleton with any part
left unreplaced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
from timm.models.vision_transformer import VisionTransformer

from ...base.errors import ModelLoadError

__all__ = ["skeleton", "shared_linear", "ConcatLinear", "finish"]


def skeleton(model_class: type[nn.Module] = VisionTransformer, **kwargs) -> Any:
    """A timm ``VisionTransformer`` (or Swin) with meta-device parameters, to be filled in.

    Typed ``Any``: the caller replaces its submodules with the foreign model's (another type than
    timm's annotations name), which is the point of the skeleton.

    torch < 2.4 has no meta kernel for ``Tensor.item()``, which timm's stochastic-depth
    schedule calls; there the skeleton is built on the CPU instead (random init, then
    replaced all the same).

    Parameters
    ----------
    model_class : type, default VisionTransformer
        The timm model class to build (timm's ``VisionTransformer``, or a Swin class).
    **kwargs : Any
        Its constructor arguments (``img_size``, ``patch_size``, ``embed_dim``, ``depth``, ...).

    Returns
    -------
    Any
        The ``model_class`` instance, parameters on the ``meta`` device (on the CPU under torch < 2.4).
    """
    try:
        with torch.device("meta"):
            return model_class(**kwargs)
    except NotImplementedError:
        return model_class(**kwargs)


def shared_linear(weight: nn.Parameter, bias: nn.Parameter | None) -> nn.Linear:
    """An ``nn.Linear`` whose parameters *are* ``weight`` and ``bias`` (no copy).

    Parameters
    ----------
    weight : torch.nn.Parameter
        ``(out_features, in_features)``.
    bias : torch.nn.Parameter or None
        ``(out_features,)``, or ``None`` for a layer without bias.

    Returns
    -------
    torch.nn.Linear
        ``in_features → out_features``, sharing the given tensors.
    """
    out_features, in_features = weight.shape
    with torch.device("meta"):
        linear = nn.Linear(in_features, out_features, bias=bias is not None)
    linear.weight = weight
    if bias is not None:
        linear.bias = bias
    return linear


class ConcatLinear(nn.Module):
    """``x -> cat([q(x), k(x), v(x)], -1)``: separate q/k/v projections (Hugging Face) as the
    fused ``qkv`` projection timm's ``Attention`` expects, sharing the original modules.

    Parameters
    ----------
    *parts : torch.nn.Module
        The projections, in the order their outputs are concatenated along the last axis
        (``q``, ``k``, ``v``).
    """

    def __init__(self, *parts: nn.Module) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([part(x) for part in self.parts], dim=-1)


def finish(
    model: VisionTransformer, source: str, extra_check: Callable[[nn.Module], None] | None = None
) -> VisionTransformer:
    """Check that no skeleton tensor is left, then put the model in eval mode.

    Parameters
    ----------
    model : VisionTransformer
        The filled-in :func:`skeleton`.
    source : str
        The foreign library's name, as the error writes it (``"Hugging Face"``).
    extra_check : callable or None, default None
        Called with ``model`` after the meta check, to refuse it for family-specific reasons.

    Returns
    -------
    VisionTransformer
        ``model`` in eval mode.

    Raises
    ------
    ModelLoadError
        A parameter or buffer is still on the ``meta`` device (the first six are named); or
        whatever ``extra_check`` raises.
    """
    leftover = [name for name, tensor in (*model.named_parameters(), *model.named_buffers()) if tensor.is_meta]
    if leftover:
        raise ModelLoadError(
            f"Could not map every part of the {source} model onto a timm ViT: {', '.join(leftover[:6])} "
            "were left unassigned. This model variant is not supported yet; please report it."
        )
    if extra_check is not None:
        extra_check(model)
    return model.eval()
