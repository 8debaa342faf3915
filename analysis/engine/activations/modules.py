"""The model's final norm, and the scale of a norm.

Where a block keeps its norms (``ln1.*``, ``ln2.*``) and its MLP layers (``mlp.pre``, ``mlp.post``)
is the family's to say: its attention adapter's
:attr:`~analysis.model.adapters.base.AttentionAdapter.block_layout` (:mod:`analysis.model.adapters.blocks`).
``ln_final`` is the model's ``norm`` (not an ``nn.Identity``).

The per-token scale of a norm, from its input ``x`` over the width (float32)::

    LayerNorm:  s = 1 / sqrt(Var[x] + eps)      (biased variance; out = (x − mean x)·s·w + b)
    RMSNorm:    s = 1 / sqrt(mean(x²) + eps)    (out = x·s·w)

(the definitions of ``torch.nn.LayerNorm`` / ``torch.nn.RMSNorm``, and of TransformerLens's
``hook_scale``). A norm of another kind has ``ln*.out`` but no ``ln*.scale``.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ...model.adapters.base import AttentionAdapter
from ...model.adapters.blocks import TIMM_BLOCK
from ...model.adapters.registry import adapter_for

__all__ = ["block_norm", "final_norm", "norm_kind", "normalisation_scale", "mlp_layers"]

_RMS_NAMES = ("RmsNorm", "RmsNormFp32", "SimpleNorm", "SimpleNormFp32", "RMSNorm")


def block_norm(block: nn.Module, which: str) -> nn.Module | None:
    """The block's first (``which="ln1"``) or second (``"ln2"``) norm, or ``None``, where the
    adapter of the block's ``attn`` says (:meth:`~analysis.model.adapters.base.AttentionAdapter.block_norm`).

    Parameters
    ----------
    block : torch.nn.Module
        One transformer block of the model (a block whose ``attn`` no adapter claims is read as timm's).
    which : str
        ``"ln1"`` (before attention) or ``"ln2"`` (before the MLP).

    Returns
    -------
    torch.nn.Module or None
        The norm module, or ``None`` where the block has none.
    """
    adapter = _block_adapter(block)
    return TIMM_BLOCK.norm(block, which) if adapter is None else adapter.block_norm(block, which)


def _block_adapter(block: nn.Module) -> AttentionAdapter | None:
    return adapter_for(getattr(block, "attn", None))


def final_norm(model: nn.Module) -> nn.Module | None:
    """The model's norm after the last block (timm's ``norm``), or ``None`` (e.g. an ``nn.Identity``
    when the model pools first and normalises the pooled vector, ``fc_norm``).

    Parameters
    ----------
    model : torch.nn.Module
        The timm model.

    Returns
    -------
    torch.nn.Module or None
        ``model.norm`` when it is a module other than ``nn.Identity``, else ``None``.
    """
    module = getattr(model, "norm", None)
    return module if isinstance(module, nn.Module) and not isinstance(module, nn.Identity) else None


def norm_kind(module: nn.Module | None) -> str | None:
    """``"layer"``, ``"rms"`` (over the last axis only), or ``None`` for a norm whose scale we do not define.

    Parameters
    ----------
    module : torch.nn.Module or None
        A norm module: an ``nn.LayerNorm``, an ``nn.RMSNorm`` or timm's RMS norms (``RmsNorm``,
        ``SimpleNorm`` and their ``Fp32`` variants), each with a one-axis ``normalized_shape``.

    Returns
    -------
    str or None
        ``"layer"`` or ``"rms"``; ``None`` for ``None``, another kind, or a norm over several axes.
    """
    if module is None:
        return None
    shape = getattr(module, "normalized_shape", None)
    if shape is None or len(tuple(shape)) != 1:
        return None
    if isinstance(module, nn.LayerNorm):
        return "layer"
    if type(module).__name__ in _RMS_NAMES or isinstance(module, getattr(nn, "RMSNorm", ())):
        return "rms"
    return None


def normalisation_scale(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``s (…, 1)`` float32 of the norm ``module`` for its input ``x (…, D)`` (module docstring).

    Parameters
    ----------
    module : torch.nn.Module
        The norm; a LayerNorm (:func:`norm_kind` ``"layer"``) gets the LayerNorm scale, any other the RMS
        scale. Its ``eps``, or when it has none the machine epsilon of ``x``'s dtype.
    x : torch.Tensor
        The norm's input ``(…, D)``, any float dtype (computed in float32, autocast off).

    Returns
    -------
    torch.Tensor
        ``(…, 1)`` float32 on ``x``'s device.
    """
    kind = norm_kind(module)
    eps = getattr(module, "eps", None)
    if eps is None:  # torch.nn.RMSNorm's default: the input dtype's machine epsilon
        eps = torch.finfo(x.dtype).eps
    with torch.autocast(x.device.type, enabled=False):
        x = x.float()
        if kind == "layer":
            return (x.var(-1, unbiased=False, keepdim=True) + eps).rsqrt()
        return (x.pow(2).mean(-1, keepdim=True) + eps).rsqrt()


def mlp_layers(block: nn.Module) -> tuple[nn.Module, nn.Module] | None:
    """``(first, output)`` linear layers of the block's MLP (a SwiGLU: its gate first), or ``None``,
    where the adapter of the block's ``attn`` says (:meth:`~analysis.model.adapters.base.AttentionAdapter.mlp_layers`).

    Parameters
    ----------
    block : torch.nn.Module
        One transformer block of the model (a block whose ``attn`` no adapter claims is read as timm's).

    Returns
    -------
    tuple of torch.nn.Module or None
        ``(first, output)``: the MLP's input layer (``mlp.pre``) and output layer (``mlp.post``); ``None``
        where the block has no such MLP.
    """
    adapter = _block_adapter(block)
    return TIMM_BLOCK.mlp_layers(block) if adapter is None else adapter.mlp_layers(block)
