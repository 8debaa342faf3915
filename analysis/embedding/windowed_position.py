"""What windowed models learn about position: the windowed analogue of the ViT paper's
Figure 7 (centre), which shows how each patch's position embedding resembles the others.

A Swin or SAM model has no absolute table worth comparing patch by patch; position enters
every attention call as a bias on the scores that depends only on the offset between the
query's and the key's cell. That bias, drawn over all offsets a window allows, is the
picture of what the model learned about position:

* Swin v1: ``relative_position_bias_table``, one learned value per head and offset;
* Swin v2: the continuous position bias ``16·sigmoid(cpb_mlp(Δ))`` of the log-spaced
  offsets ``Δ`` (``relative_coords_table``), per head and offset (timm ``swinv2_cr``:
  ``meta_mlp(sign(d)·log(1 + |d|))``, no sigmoid);
* SAM: decomposed tables ``rel_pos_h``, ``rel_pos_w`` (one row per offset along each axis,
  a head-dimension vector), shared by the heads; the bias ``q·R_h[Δy] + q·R_w[Δx]`` depends
  on the query's content, so there is no per-head image, only the tables.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ..base.arguments import check_index
from ..base.errors import AnalysisError

__all__ = ["relative_position_bias", "decomposed_relative_position", "DecomposedPosition"]


def _attention_module(vit, layer: int, function: str) -> tuple[Any, int]:  # a timm attention: tables read by name
    """The attention module of model layer ``layer`` of a windowed LoadedViT, and the layer."""
    spec = getattr(vit, "spec", None)
    if spec is None or not hasattr(vit, "model"):
        raise AnalysisError(f"{function} takes the LoadedViT that load_vit returns, got {type(vit).__name__}.")
    if not spec.is_windowed:
        raise AnalysisError(
            f"{function} reads a windowed model's (Swin, SAM) relative-position bias; {spec.family or 'this model'} "
            "is not windowed: use position_embedding_similarity(vit) for its position embeddings."
        )
    layer = check_index("layer", layer, spec.num_layers, "layers")
    from ..model.adapters import model_blocks

    return model_blocks(vit.model)[layer][1].attn, layer


def relative_position_bias(vit, layer: int) -> torch.Tensor:
    """The relative-position bias a Swin layer adds to its attention scores, per head, as an
    image over offsets: the windowed analogue of the ViT paper's Figure 7 (centre).

        image[h, Δy + wh − 1, Δx + ww − 1] = the bias head ``h`` adds to the score of a query
        cell and a key cell of one window with ``query − key = (Δy, Δx)``,

    for ``|Δy| < wh``, ``|Δx| < ww`` (``wh × ww`` the layer's window). The centre is the
    query's own cell. Swin v1 reads the learned ``relative_position_bias_table``; Swin v2
    computes ``16·sigmoid(cpb_mlp(relative_coords_table))`` as the module does, and timm's
    ``swinv2_cr`` ``meta_mlp(sign(Δ)·log(1 + |Δ|))``.

    Args:
        vit: a windowed LoadedViT (Swin v1 or v2).
        layer: model layer index (negative from the end).

    Returns:
        ``(heads, 2·wh − 1, 2·ww − 1)`` float32, detached, on the model's device.
    """
    attn, layer = _attention_module(vit, layer, "relative_position_bias")
    window = vit.spec.geometry(layer).window_size
    side = (2 * window[0] - 1, 2 * window[1] - 1)
    with torch.no_grad():
        if hasattr(attn, "cpb_mlp"):  # v2: (1, 2wh−1, 2ww−1, 2) log-spaced offsets -> (2wh−1, 2ww−1, heads)
            table = 16 * torch.sigmoid(attn.cpb_mlp(attn.relative_coords_table).view(*side, -1))
        elif hasattr(attn, "meta_mlp"):  # swinv2_cr: meta_mlp of the log-spaced offset sign(d)·log(1 + |d|)
            rows, cols = (
                torch.arange(-(w - 1), w, dtype=torch.float32, device=attn.logit_scale.device) for w in window
            )
            offsets = torch.stack(torch.meshgrid(rows, cols, indexing="ij"), dim=-1)  # (2wh−1, 2ww−1, 2) as (Δy, Δx)
            table = attn.meta_mlp((torch.sign(offsets) * torch.log1p(offsets.abs())).to(attn.logit_scale.dtype))
        elif hasattr(attn, "relative_position_bias_table"):  # v1: ((2wh−1)·(2ww−1), heads), row-major in (Δy, Δx)
            table = attn.relative_position_bias_table.view(*side, -1)
        else:
            raise AnalysisError(
                f"relative_position_bias: layer {layer} of {vit.spec.family} has no per-head bias table; SAM's "
                "relative positions are decomposed into two tables: use decomposed_relative_position(vit, layer)."
            )
    return table.permute(2, 0, 1).float().contiguous()


class DecomposedPosition(NamedTuple):
    """SAM's decomposed relative positions of one layer, as the module uses them:
    ``rows (2·h − 1, head_dim)`` indexed by ``Δy + h − 1``, ``cols (2·w − 1, head_dim)`` by
    ``Δx + w − 1`` (``h × w`` the window, or the grid for a global block)."""

    rows: torch.Tensor
    cols: torch.Tensor


def _table_by_offset(side: int, rel_pos: torch.Tensor) -> torch.Tensor:
    """``(2·side − 1, C)``: the row the module uses for each offset ``Δ = query − key``,
    read from timm's own ``get_rel_pos`` (which resizes a table of another length)."""
    from timm.models.vision_transformer_sam import get_rel_pos

    pairs = get_rel_pos(side, side, rel_pos)  # (side_q, side_k, C): row of offset q − k
    offsets = torch.arange(-(side - 1), side)
    return pairs[offsets.clamp(min=0), (-offsets).clamp(min=0)]


def decomposed_relative_position(vit, layer: int) -> DecomposedPosition:
    """SAM's decomposed relative-position tables of one layer (the windowed analogue of the
    ViT paper's Figure 7, centre, for SAM):

        B[(i, j), (k, l)] = q_(i,j) · rows[i − k + h − 1] + q_(i,j) · cols[j − l + w − 1]

    The bias depends on the query vector, so unlike Swin's there is no fixed per-head
    image: the tables are what the model learned (shared by all heads). A table whose
    length is not ``2·side − 1`` is resized exactly as the module resizes it.

    Returns:
        :class:`DecomposedPosition` ``(rows (2h − 1, head_dim), cols (2w − 1, head_dim))``
        float32, detached.
    """
    attn, layer = _attention_module(vit, layer, "decomposed_relative_position")
    if getattr(attn, "rel_pos_h", None) is None:
        raise AnalysisError(
            f"decomposed_relative_position: layer {layer} of {vit.spec.family} has no decomposed tables "
            "(rel_pos_h / rel_pos_w); a Swin's bias is one table per head: use relative_position_bias(vit, layer)."
        )
    height, width = vit.spec.geometry(layer).window_size
    with torch.no_grad():
        rows = _table_by_offset(height, attn.rel_pos_h)
        cols = _table_by_offset(width, attn.rel_pos_w)
    return DecomposedPosition(rows=rows.float(), cols=cols.float())
