"""A layer's tokens in either layout a model gives them, checked once against the layer's geometry.

A block's tokens come as a sequence ``(B, prefix + gh·gw, C)`` (a ViT: prefix tokens first, then the
patches row-major) or on the layer's grid, ``(B, gh, gw, C)`` (timm's windowed models, Swin and SAM,
work NHWC and have no prefix tokens). :func:`layer_sequence` gives the first, :func:`layer_grid` the
second without the prefix; both refuse a shape the geometry does not predict (the geometry read off
the model is then not the one its blocks used).
"""

from __future__ import annotations

import torch

from ..base.errors import AnalysisError
from ..model.geometry import LayerGeometry

__all__ = ["layer_grid", "layer_sequence"]


def layer_sequence(tokens: torch.Tensor, geometry: LayerGeometry, *, what: str = "A layer") -> torch.Tensor:
    """A layer's tokens as one sequence, prefix tokens first, the cells row-major on its grid.

    Parameters
    ----------
    tokens : torch.Tensor
        ``(B, prefix + gh·gw, C)``, or ``(B, gh, gw, C)`` on the layer's grid when it has no
        prefix tokens.
    geometry : LayerGeometry
        The layer's geometry: ``prefix_tokens`` and ``grid_size`` ``(gh, gw)``.
    what : str, default "A layer"
        What gave ``tokens``, for the error (``"Block 3"``).

    Returns
    -------
    torch.Tensor
        ``(B, prefix + gh·gw, C)``: ``tokens`` itself, or its grid flattened row-major.

    Raises
    ------
    AnalysisError
        ``tokens`` of neither shape.
    """
    (gh, gw), prefix = geometry.grid_size, geometry.prefix_tokens
    if tokens.ndim == 3 and tokens.shape[1] == prefix + gh * gw:
        return tokens
    if tokens.ndim == 4 and tuple(tokens.shape[1:3]) == (gh, gw) and not prefix:  # NHWC on the layer's grid
        return tokens.reshape(tokens.shape[0], gh * gw, tokens.shape[-1])
    raise AnalysisError(
        f"{what} gave a {tuple(tokens.shape)} output; its geometry predicts {prefix} prefix tokens and a "
        f"{gh}x{gw} grid, (B, {prefix + gh * gw}, C) or (B, {gh}, {gw}, C): this model is not supported."
    )


def layer_grid(tokens: torch.Tensor, geometry: LayerGeometry, *, what: str = "A layer") -> torch.Tensor:
    """A layer's tokens on its grid of cells, its prefix tokens (class, registers) left out:
    ``layer_sequence(tokens)[:, prefix:]`` as ``(B, gh, gw, C)``.

    Parameters
    ----------
    tokens : torch.Tensor
        As :func:`layer_sequence` takes them.
    geometry : LayerGeometry
        The layer's geometry.
    what : str, default "A layer"
        What gave ``tokens``, for the error.

    Returns
    -------
    torch.Tensor
        ``(B, gh, gw, C)``, a view of ``tokens`` where it can be.

    Raises
    ------
    AnalysisError
        ``tokens`` of neither shape.
    """
    if tokens.ndim == 4 and not geometry.prefix_tokens and tuple(tokens.shape[1:3]) == tuple(geometry.grid_size):
        return tokens  # already on the grid (NHWC)
    sequence = layer_sequence(tokens, geometry, what=what)
    return sequence[:, geometry.prefix_tokens :].reshape(sequence.shape[0], *geometry.grid_size, sequence.shape[-1])
