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
    compute different probabilities, so it needs its own adapter.

    Parameters
    ----------
    adapter : AttentionAdapter
        The family; later lookups try adapters in registration order.

    Returns
    -------
    AttentionAdapter
        ``adapter`` itself (so a module can write ``ADAPTER = register_adapter(...)``).
    """
    _ADAPTERS.append(adapter)
    return adapter


def registered_adapters() -> tuple[AttentionAdapter, ...]:
    """Every registered attention family, in registration order.

    Returns
    -------
    tuple of AttentionAdapter
        A snapshot of the registry.
    """
    return tuple(_ADAPTERS)


def adapter_for(module: nn.Module | None) -> AttentionAdapter | None:
    """The adapter whose ``module_types`` include ``type(module)`` exactly (not a subclass).

    Parameters
    ----------
    module : torch.nn.Module or None
        An attention module (``None`` has no adapter).

    Returns
    -------
    AttentionAdapter or None
        The first registered match, or ``None``.
    """
    for adapter in _ADAPTERS:
        if type(module) in adapter.module_types:
            return adapter
    return None


@dataclass(frozen=True)
class AttentionSite:
    """One attention module of a model.

    Attributes
    ----------
    layer : int or None
        The block index, counted through all stages of a hierarchical model; ``None`` for a
        pooling head.
    module : torch.nn.Module
        The attention module.
    adapter : AttentionAdapter
        Its family.
    block : torch.nn.Module or None, default None
        The block that holds it (``None`` for a pooling head).
    stage : int, default 0
        Its stage (0 for a ViT).
    """

    layer: int | None
    module: nn.Module
    adapter: AttentionAdapter
    block: nn.Module | None = None
    stage: int = 0


def model_blocks(model: nn.Module) -> list[tuple[int, nn.Module]]:
    """``(stage, block)`` for every transformer block in forward order: ``model.blocks`` (a
    ViT: stage 0), else the ``blocks`` of each of ``model.layers`` (timm Swin v1/v2 stages) or
    of ``model.stages`` (timm ``swinv2_cr_*``).

    Parameters
    ----------
    model : torch.nn.Module
        The vision model.

    Returns
    -------
    list of (int, torch.nn.Module)
        Empty when the model has no blocks found this way.
    """
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
    """The self-attention (``block.attn``) of every block of :func:`model_blocks`, in order.

    Parameters
    ----------
    model : torch.nn.Module
        The vision model.
    name : str, default "model"
        The model's name, as errors write it.

    Returns
    -------
    list of AttentionSite
        One per block, ``layer`` counted through all stages.

    Raises
    ------
    UnsupportedModelError
        The model has no transformer blocks, or a block's attention (the first such is named) has
        no adapter.
    """
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
    """The attention-pooling head (SigLIP/PE ``map`` pooling), if the model has one.

    Parameters
    ----------
    model : torch.nn.Module
        The vision model; its head is ``model.attn_pool``.

    Returns
    -------
    AttentionSite or None
        The site (``layer=None``), or ``None`` when there is no ``attn_pool`` or no adapter knows it.
    """
    pool = getattr(model, "attn_pool", None)
    adapter = adapter_for(pool)
    return AttentionSite(None, pool, adapter) if adapter is not None and pool is not None else None


def supported_attention() -> str:
    """The registered families and their module types, as error messages write them.

    Returns
    -------
    str
        ``"name (Type, ...); ..."`` in registration order.
    """
    return "; ".join(f"{a.name} ({', '.join(t.__name__ for t in a.module_types)})" for a in _ADAPTERS)
