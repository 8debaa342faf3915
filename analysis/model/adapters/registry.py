"""The one registry of attention families: module type -> :class:`AttentionAdapter`.

A model is inspectable when every block's ``attn`` module has an adapter here. Adding a
family is one file in this package that calls :func:`register_adapter`, plus one test.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import torch.nn as nn

from ...base.errors import UnsupportedModelError
from .base import AttentionAdapter

__all__ = [
    "register_adapter",
    "adapter_for",
    "registered_adapters",
    "AttentionSite",
    "block_sites",
    "model_blocks",
    "pool_site",
]

_ADAPTERS: list[AttentionAdapter] = []


def register_adapter(adapter: AttentionAdapter) -> AttentionAdapter:
    """Add a family. Exact module types are matched (``type(module) is T``): a subclass may
    compute different probabilities, so it needs its own adapter."""
    _ADAPTERS.append(adapter)
    return adapter


def registered_adapters() -> tuple[AttentionAdapter, ...]:
    return tuple(_ADAPTERS)


def adapter_for(module: nn.Module | None) -> AttentionAdapter | None:
    for adapter in _ADAPTERS:
        if type(module) in adapter.module_types:
            return adapter
    return None


@dataclass(frozen=True)
class AttentionSite:
    """One attention module of a model: ``layer`` is the block index (``None`` for a pooling
    head), counted through all stages of a hierarchical model; ``block`` the block that holds
    it and ``stage`` its stage (0 for a ViT)."""

    layer: int | None
    module: nn.Module
    adapter: AttentionAdapter
    block: nn.Module | None = None
    stage: int = 0


def model_blocks(model: nn.Module) -> list[tuple[int, nn.Module]]:
    """``(stage, block)`` for every transformer block in forward order: ``model.blocks`` (a
    ViT: stage 0), else the ``blocks`` of each of ``model.layers`` (timm Swin v1/v2 stages) or
    of ``model.stages`` (timm ``swinv2_cr_*``)."""
    blocks = getattr(model, "blocks", None)
    if blocks is not None:
        return [(0, block) for block in blocks]
    stages = getattr(model, "layers", None)
    if stages is None:
        stages = getattr(model, "stages", None)
    if isinstance(stages, nn.Sequential) and all(isinstance(getattr(s, "blocks", None), nn.Module) for s in stages):
        return [
            (index, block) for index, stage in enumerate(stages) for block in cast("Iterable[nn.Module]", stage.blocks)
        ]
    return []


def block_sites(model: nn.Module, name: str = "model") -> list[AttentionSite]:
    """The self-attention of every block, in order. Raises UnsupportedModelError naming the
    first block whose attention no adapter knows."""
    blocks = model_blocks(model)
    if len(blocks) == 0:
        raise UnsupportedModelError(f"{name!r} has no transformer blocks (model.blocks).")
    sites = []
    for index, (stage, block) in enumerate(blocks):
        attn = getattr(block, "attn", None)
        adapter = adapter_for(attn)
        if adapter is None or attn is None:  # (no adapter is for None)
            kind = type(attn).__name__ if attn is not None else "no attention module"
            raise UnsupportedModelError(
                f"{name!r}: block {index} uses {kind}, an attention module no adapter knows, so its "
                f"probabilities cannot be read exactly. Supported attention: {supported_attention()}."
            )
        sites.append(AttentionSite(index, attn, adapter, block, stage))
    return sites


def pool_site(model: nn.Module) -> AttentionSite | None:
    """The attention-pooling head (SigLIP/PE ``map`` pooling), if the model has one."""
    pool = getattr(model, "attn_pool", None)
    adapter = adapter_for(pool)
    return AttentionSite(None, pool, adapter) if adapter is not None and pool is not None else None


def supported_attention() -> str:
    return "; ".join(f"{a.name} ({', '.join(t.__name__ for t in a.module_types)})" for a in _ADAPTERS)
