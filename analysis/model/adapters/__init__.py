"""Attention adapters: one small file per attention family, all in one registry.

See :mod:`analysis.model.adapters.base` for how probabilities are read exactly, and
:mod:`analysis.model.adapters.registry` for how a module finds its adapter.
"""

from . import (  # noqa: F401  (register the families)
    attention_pool,
    cosine_window,
    cosine_window_cr,
    decomposed_window,
    hf_vit_mae,
    multihead,
    relative_position,
    rotary,
    shifted_window,
)
from .base import AttentionAdapter, AttentionInputs
from .registry import (
    AttentionSite,
    adapter_for,
    block_sites,
    model_blocks,
    pool_site,
    register_adapter,
    registered_adapters,
    supported_attention,
)

__all__ = [
    "AttentionAdapter",
    "AttentionInputs",
    "AttentionSite",
    "adapter_for",
    "block_sites",
    "model_blocks",
    "pool_site",
    "register_adapter",
    "registered_adapters",
    "supported_attention",
]
