"""Where a family's block keeps its norms, its two branches and its MLP: a :class:`BlockLayout`.

The engine's block points (:mod:`analysis.engine.activations.points`) are read on submodules of each
block, named by the block's attention adapter (:attr:`AttentionAdapter.block_layout
<analysis.model.adapters.base.AttentionAdapter.block_layout>`), so adding a family is one module:

* ``ln1.*`` / ``ln2.*``: the block's first and second norm (timm: ``norm1``, ``norm2``; pre-norm
  blocks normalise the branch input, post-norm blocks such as Swin V2 the branch output);
* ``attn.out`` / ``mlp.out``: the output of the module through which each branch joins the residual
  stream (timm: ``drop_path1`` / ``drop_path2``, identity at inference), so that::

      resid_mid  = resid_pre + attn.out
      resid_post = resid_mid + mlp.out

  hold exactly wherever the branch is added on the stream's layout (not SAM's windowed blocks,
  whose attention branch is per window: see :mod:`.decomposed_window`); a block with a norm on
  the stream itself after its MLP branch (``swinv2_cr``'s ``norm3`` in some blocks) gives
  ``resid_post = stream_norm(resid_mid + mlp.out)``;
* ``mlp.pre``: the output of the MLP's first linear layer (a SwiGLU: its gate ``fc1_g``),
  ``mlp.post``: the input of its output layer.

Attributes are dotted paths from the block (``"mlp.fc1"``); each entry lists alternatives, the
first present one wins. A path that leads to an ``nn.Identity`` norm counts as no norm.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch.nn as nn

from ...base.errors import AnalysisError

__all__ = ["BlockLayout", "TIMM_BLOCK", "NORMS", "BRANCHES"]

NORMS = ("ln1", "ln2")  # the block norms a layout names
BRANCHES = ("attn", "mlp")  # the branches that join the residual stream


def _default_norms() -> dict[str, tuple[str, ...]]:
    return {"ln1": ("norm1",), "ln2": ("norm2",)}


def _default_branches() -> dict[str, tuple[str, ...]]:
    return {"attn": ("drop_path1",), "mlp": ("drop_path2",)}


@dataclass(frozen=True)
class BlockLayout:
    """The submodules of one family's block where the engine reads its points (module docstring).

    Timm's names by default (the loaders of other libraries' ViTs rename their blocks' modules to
    these). Each entry is a tuple of dotted paths from the block, alternatives: the first present
    one wins.

    Attributes
    ----------
    norms : Mapping[str, tuple of str], default {"ln1": ("norm1",), "ln2": ("norm2",)}
        ``{"ln1": paths, "ln2": paths}``: the block's first and second norm.
    branches : Mapping[str, tuple of str], default {"attn": ("drop_path1",), "mlp": ("drop_path2",)}
        ``{"attn": paths, "mlp": paths}``: the modules whose output each branch adds to the residual
        stream.
    mlp_first : tuple of str, default ("mlp.fc1_g", "mlp.fc1")
        The MLP's first linear layer (a SwiGLU: its gate).
    mlp_output : tuple of str, default ("mlp.fc2",)
        The MLP's output linear layer.
    stream_norm : tuple of str, default ()
        A norm the block applies to the residual stream after adding its MLP branch (none by default).
    """

    norms: Mapping[str, tuple[str, ...]] = field(default_factory=_default_norms)
    branches: Mapping[str, tuple[str, ...]] = field(default_factory=_default_branches)
    mlp_first: tuple[str, ...] = ("mlp.fc1_g", "mlp.fc1")
    mlp_output: tuple[str, ...] = ("mlp.fc2",)
    stream_norm: tuple[str, ...] = ()

    def norm(self, block: nn.Module, which: str) -> nn.Module | None:
        """The block's first (``which="ln1"``) or second (``"ln2"``) norm, or ``None`` (absent or identity)."""
        if which not in NORMS:
            raise AnalysisError(f"{which!r} is not a block norm; use one of {', '.join(NORMS)}.")
        module = _first_module(block, self.norms.get(which, ()))
        return None if isinstance(module, nn.Identity) else module

    def branch(self, block: nn.Module, which: str) -> nn.Module | None:
        """The module whose output the ``"attn"`` or ``"mlp"`` branch adds to the residual stream, or ``None``."""
        if which not in BRANCHES:
            raise AnalysisError(f"{which!r} is not a block branch; use one of {', '.join(BRANCHES)}.")
        return _first_module(block, self.branches.get(which, ()))

    def post_norm(self, block: nn.Module) -> nn.Module | None:
        """The norm the block applies to the stream after its MLP branch, or ``None`` (absent or identity)."""
        module = _first_module(block, self.stream_norm)
        return None if isinstance(module, nn.Identity) else module

    def branch_attribute(self, which: str) -> str:
        """The name of the branch module, as written in errors (``"drop_path1"``)."""
        return " or ".join(self.branches.get(which, ())) or "no module"

    def mlp_layers(self, block: nn.Module) -> tuple[nn.Module, nn.Module] | None:
        """``(first, output)`` linear layers of the block's MLP, or ``None`` when it has no such MLP."""
        first, output = _first_module(block, self.mlp_first), _first_module(block, self.mlp_output)
        return None if first is None or output is None else (first, output)


def _first_module(block: nn.Module, paths: tuple[str, ...]) -> nn.Module | None:
    """The first of the dotted ``paths`` under ``block`` that leads to a module."""
    for path in paths:
        value: object = block
        for part in path.split("."):
            value = getattr(value, part, None)
        if isinstance(value, nn.Module):
            return value
    return None


TIMM_BLOCK = BlockLayout()
"""timm's block (``Block``, ``ResPostBlock``, EVA's, BEiT's, Swin's, SAM's): ``norm1``/``norm2``,
``drop_path1``/``drop_path2``, ``mlp.fc1`` (``mlp.fc1_g``) and ``mlp.fc2``."""
