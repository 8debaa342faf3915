"""Hugging Face ``ViTMAEForPreTraining``'s encoder attention (transformers 5: ``ViTMAEAttention``;
4.x: ``ViTMAESelfAttention`` and its SDPA twin), read in place for :mod:`analysis.mae`.

The MAE is run as transformers builds it (its reconstruction needs the model's own forward),
so its attention is not converted into timm's. Its probabilities are read by the base contract:
the SDPA call's ``q``, ``k`` and scale (``attn_implementation="sdpa"``, the default), or the
result of the eager path's ``softmax`` (``"eager"``; that path has no ``attn_drop`` module).
Registered only when transformers is installed.
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from ...base.errors import UnsupportedModelError
from .base import AttentionAdapter
from .blocks import BlockLayout
from .registry import AttentionSite, adapter_for, register_adapter, supported_attention


def _module_types() -> tuple[type[nn.Module], ...]:
    """The classes that compute P: transformers 5's ``ViTMAEAttention``; in 4.x that class only
    wraps ``ViTMAESelfAttention`` / ``ViTMAESdpaSelfAttention``, which compute it."""
    try:
        import transformers
        from transformers.models.vit_mae import modeling_vit_mae as mae
    except ImportError:  # transformers is an optional extra
        return ()
    major = int(transformers.__version__.split(".")[0])
    names = ("ViTMAEAttention",) if major >= 5 else ("ViTMAESelfAttention", "ViTMAESdpaSelfAttention")
    return tuple(t for t in (getattr(mae, name, None) for name in names) if isinstance(t, type))


class ViTMAEAttentionAdapter(AttentionAdapter):
    name = "Hugging Face ViTMAE self-attention"
    module_types = _module_types()
    includes = "softmax(scale·q·kᵀ) over the class token and the visible patches (no position term: MAE adds a fixed table to the input)"
    explicit_softmax = True  # the eager path calls softmax and has no attn_drop module
    # transformers' ViTMAELayer (5.x first, 4.x second): its norms, the modules whose outputs its two
    # branches add to the stream (dropout after them is identity at inference), and its MLP.
    block_layout = BlockLayout(
        norms={"ln1": ("layernorm_before",), "ln2": ("layernorm_after",)},
        branches={"attn": ("attention.o_proj", "attention.output"), "mlp": ("mlp", "output.dropout")},
        mlp_first=("mlp.fc1", "intermediate.dense"),
        mlp_output=("mlp.fc2", "output.dense"),
    )

    def output_projection(self, module: nn.Module) -> nn.Module | None:
        """transformers 5's ``o_proj`` (4.x keeps it outside the module that computes P: ``None``)."""
        projection = getattr(module, "o_proj", None)
        return projection if isinstance(projection, nn.Module) else None

    def num_heads(self, module: nn.Module) -> int:
        heads = getattr(module, "num_attention_heads", None)
        if heads is None:
            heads = getattr(module, "config").num_attention_heads  # transformers: attributes read by name
        return int(heads)


ADAPTER = register_adapter(ViTMAEAttentionAdapter()) if ViTMAEAttentionAdapter.module_types else None


def encoder_sites(model: nn.Module) -> list[AttentionSite]:
    """The attention of every encoder layer of a ``ViTMAEForPreTraining`` (or ``ViTMAEModel``'s
    ``vit``), in order: the blocks of this family, as :func:`~analysis.model.adapters.block_sites` gives
    a timm model's. Raises UnsupportedModelError naming what is missing."""
    encoder = getattr(model, "vit", model)
    layers = None
    for path in ("layers", "encoder.layer"):  # transformers 5, transformers 4
        value: Any = encoder
        for part in path.split("."):
            value = getattr(value, part, None)
        if value is not None:
            layers = list(value)
            break
    if layers is None:
        raise UnsupportedModelError(f"Could not find the encoder layers of {type(model).__name__}.")
    return [AttentionSite(index, *_attention_of(layer), block=layer) for index, layer in enumerate(layers)]


def _attention_of(layer: nn.Module) -> tuple[nn.Module, AttentionAdapter]:
    """(the module of ``layer`` that computes its attention probabilities, its adapter)."""
    for module in (getattr(layer, "attention", None), getattr(getattr(layer, "attention", None), "attention", None)):
        adapter = adapter_for(module)
        if adapter is not None and module is not None:  # (no adapter is for None)
            return module, adapter
    raise UnsupportedModelError(
        f"{type(layer).__name__}'s attention ({type(getattr(layer, 'attention', None)).__name__}) has no adapter, so its "
        f"probabilities cannot be read exactly. Supported attention: {supported_attention()}."
    )
