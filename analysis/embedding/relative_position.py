"""What models with relative positions learn about position: the analogue of the ViT paper's
Figure 7 (centre), which shows how each patch's position embedding resembles the others.

A Swin or SAM model has no absolute table worth comparing patch by patch; position enters
every attention call as a bias on the scores that depends only on the offset between the
query's and the key's cell. That bias, drawn over all offsets a window allows, is the
picture of what the model learned about position. How each family computes it is its
adapter's rule (:mod:`analysis.model.adapters`), read here layer by layer:

* Swin v1: ``relative_position_bias_table``, one learned value per head and offset;
* Swin v2: the continuous position bias ``16·sigmoid(cpb_mlp(Δ))`` of the log-spaced
  offsets ``Δ`` (``relative_coords_table``), per head and offset (timm ``swinv2_cr``:
  ``meta_mlp(sign(d)·log(1 + |d|))``, no sigmoid);
* SAM: decomposed tables ``rel_pos_h``, ``rel_pos_w`` (one row per offset along each axis,
  a head-dimension vector), shared by the heads; the bias ``q·R_h[Δy] + q·R_w[Δx]`` depends
  on the query's content, so there is no per-head image, only the tables.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..base.arguments import check_index
from ..base.errors import AnalysisError
from ..model.adapters import block_sites

__all__ = ["relative_position_bias", "decomposed_relative_position", "DecomposedPosition", "relative_position_kind"]


def _layer_site(vit, layer: int, function: str):
    """The :class:`~analysis.model.adapters.registry.AttentionSite` of model layer ``layer``, and the layer."""
    spec = getattr(vit, "spec", None)
    if spec is None or not hasattr(vit, "model"):
        raise AnalysisError(f"{function} takes the LoadedViT that load_vit returns, got {type(vit).__name__}.")
    layer = check_index("layer", layer, spec.num_layers, "layers")
    return block_sites(vit.model)[layer], layer


def _refusal(vit, site, layer: int, function: str) -> AnalysisError:
    """Why ``function`` has nothing to read at ``site``, naming the function that does."""
    window = vit.spec.geometry(layer).window_size
    family = vit.spec.family or "this model"
    if function == "relative_position_bias" and site.adapter.decomposed_relative_position(site.module, window):
        other = "its relative positions are decomposed into two tables: use decomposed_relative_position(vit, layer)"
    elif (
        function == "decomposed_relative_position"
        and site.adapter.relative_position_bias(site.module, window) is not None
    ):
        other = "its bias is one table per head: use relative_position_bias(vit, layer)"
    else:
        other = "use position_embedding_similarity(vit) for its position embeddings"
    return AnalysisError(
        f"{function}: layer {layer} of {family} ({site.adapter.name}) has no relative-position bias of this kind; {other}."
    )


def relative_position_bias(vit, layer: int) -> torch.Tensor:
    """The relative-position bias a Swin layer adds to its attention scores, per head, as an
    image over offsets: the windowed analogue of the ViT paper's Figure 7 (centre).

        image[h, Δy + wh − 1, Δx + ww − 1] = the bias head ``h`` adds to the score of a query
        cell and a key cell of one window with ``query − key = (Δy, Δx)``,

    for ``|Δy| < wh``, ``|Δx| < ww`` (``wh × ww`` the layer's window). The centre is the
    query's own cell. Swin v1 reads the learned ``relative_position_bias_table``; Swin v2
    computes ``16·sigmoid(cpb_mlp(relative_coords_table))`` as the module does, and timm's
    ``swinv2_cr`` ``meta_mlp(sign(Δ)·log(1 + |Δ|))``.

    Parameters
    ----------
    vit : LoadedViT
        A model whose attention adds a per-head bias by offset (Swin v1, v2, swinv2_cr).
    layer : int
        Model layer index (negative from the end).

    Returns
    -------
    torch.Tensor
        ``(heads, 2·wh − 1, 2·ww − 1)`` float32, detached, on the model's device.

    Raises
    ------
    AnalysisError
        If ``vit`` is not a LoadedViT, ``layer`` does not exist, or the layer adds no per-head bias by
        offset (the message names :func:`decomposed_relative_position` for SAM, else
        :func:`~analysis.embedding.position.position_embedding_similarity`).
    """
    site, layer = _layer_site(vit, layer, "relative_position_bias")
    bias = site.adapter.relative_position_bias(site.module, vit.spec.geometry(layer).window_size)
    if bias is None:
        raise _refusal(vit, site, layer, "relative_position_bias")
    return bias


class DecomposedPosition(NamedTuple):
    """SAM's decomposed relative positions of one layer, as the module uses them
    (:func:`decomposed_relative_position`), with ``h × w`` the window, or the grid for a global block.

    Attributes
    ----------
    rows : torch.Tensor
        ``(2·h − 1, head_dim)`` float32, row ``Δy + h − 1`` for the vertical offset ``Δy = query − key``.
    cols : torch.Tensor
        ``(2·w − 1, head_dim)`` float32, row ``Δx + w − 1`` for the horizontal offset ``Δx = query − key``.
    """

    rows: torch.Tensor
    cols: torch.Tensor


def decomposed_relative_position(vit, layer: int) -> DecomposedPosition:
    """SAM's decomposed relative-position tables of one layer (the windowed analogue of the
    ViT paper's Figure 7, centre, for SAM):

        B[(i, j), (k, l)] = q_(i,j) · rows[i − k + h − 1] + q_(i,j) · cols[j − l + w − 1]

    The bias depends on the query vector, so unlike Swin's there is no fixed per-head
    image: the tables are what the model learned (shared by all heads). A table whose
    length is not ``2·side − 1`` is resized exactly as the module resizes it.

    Parameters
    ----------
    vit : LoadedViT
        A model whose attention has decomposed relative-position tables (SAM).
    layer : int
        Model layer index (negative from the end).

    Returns
    -------
    DecomposedPosition
        ``(rows (2h − 1, head_dim), cols (2w − 1, head_dim))`` float32, detached, on the model's device,
        with ``h × w`` the layer's window (the grid for a global block).

    Raises
    ------
    AnalysisError
        If ``vit`` is not a LoadedViT, ``layer`` does not exist, or the layer has no decomposed tables
        (the message names :func:`relative_position_bias` for Swin, else
        :func:`~analysis.embedding.position.position_embedding_similarity`).
    """
    site, layer = _layer_site(vit, layer, "decomposed_relative_position")
    tables = site.adapter.decomposed_relative_position(site.module, vit.spec.geometry(layer).window_size)
    if tables is None:
        raise _refusal(vit, site, layer, "decomposed_relative_position")
    return DecomposedPosition(rows=tables[0], cols=tables[1])


def relative_position_kind(vit, layer: int) -> str | None:
    """Which reading of relative positions model layer ``layer`` has.

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`~analysis.load_vit`).
    layer : int
        Model layer index (negative from the end).

    Returns
    -------
    str or None
        ``"bias"`` (a per-head bias by offset, :func:`relative_position_bias`), ``"decomposed"``
        (query-dependent tables by axis, :func:`decomposed_relative_position`) or ``None`` (neither:
        an absolute table, rotary features or no position at all; see
        :func:`~analysis.embedding.position.position_encoding_kinds`).

    Raises
    ------
    AnalysisError
        If ``vit`` is not a LoadedViT or ``layer`` does not exist.
    """
    site, layer = _layer_site(vit, layer, "relative_position_kind")
    window = vit.spec.geometry(layer).window_size
    if site.adapter.relative_position_bias(site.module, window) is not None:
        return "bias"
    if site.adapter.decomposed_relative_position(site.module, window) is not None:
        return "decomposed"
    return None
