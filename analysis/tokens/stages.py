"""Which layers the logit lens reads, and the readout it reads them with, for every family.

The logit lens (``head(readout(h_l))``) is defined only for layers whose output the model's
own readout accepts: those of the last block's stage (same grid and width), every layer of a
ViT. A ViT's and a Swin's readout is the final ``norm`` then ``forward_head`` (pooling and the
classifier); SAM's is its ``neck`` (convolutions on the whole map) then ``forward_head``.
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from ..base.arguments import check_index
from ..base.errors import AnalysisError
from ..model.geometry import ViTSpec

__all__ = ["logit_lens_layers", "final_readout"]


def logit_lens_layers(spec) -> tuple[int, ...]:
    """The layers the logit lens reads: every layer of a ViT; for a windowed model, the layers of the
    last block's stage, whose outputs have the grid and width the model's final readout takes.

    Parameters
    ----------
    spec : ViTSpec, LoadedViT or record
        A :class:`~analysis.model.geometry.ViTSpec`, or anything with a ``spec`` attribute (a
        loaded model, a record), whose spec is used.

    Returns
    -------
    tuple of int
        Model layer indices, ascending.
    """
    geometries = getattr(spec, "spec", spec).geometries()  # a ViT's: one stage, one grid
    last = geometries[-1]
    return tuple(
        layer
        for layer, geometry in enumerate(geometries)
        if geometry.stage == last.stage and geometry.grid_size == last.grid_size
    )


def check_logit_lens_layer(spec: ViTSpec, layer: int) -> int:
    """``layer`` (made non-negative) if the logit lens reads it, else AnalysisError naming why."""
    layer = check_index("layer", layer, spec.num_layers, "layers")
    defined = logit_lens_layers(spec)
    if layer not in defined:
        geometry, last = spec.geometry(layer), spec.layer_geometry[-1]
        raise AnalysisError(
            f"logit lens: layer {layer} is in stage {geometry.stage} ({geometry.grid_size[0]}x{geometry.grid_size[1]} "
            f"grid), but this {spec.family}'s final norm and head read the last stage's output (stage {last.stage}, "
            f"{last.grid_size[0]}x{last.grid_size[1]} grid, after every patch merging, at its width): the lens is "
            f"defined only for layers {list(defined)}."
        )
    return layer


def final_readout(model: Any):  # timm's ViT / Swin / SAM: forward_head, neck, norm read by name
    """``h -> logits``: what the model does after its last block (the logit lens's map), on a
    block's output in its own layout (a ViT's ``(B, T, D)``, a windowed model's NHWC
    ``(B, gh, gw, C)``). A ViT or a Swin (v1, v2): ``forward_head(norm(h))`` (``norm`` may be
    absent: then ``forward_head(h)``); SAM: ``forward_head(neck(h as NCHW))``; timm's
    ``swinv2_cr``: ``forward_head(h as NCHW)``.

    Parameters
    ----------
    model : Any
        The loaded model (a timm ViT, Swin v1/v2, ``swinv2_cr`` or SAM image encoder); its
        ``forward_head``, ``neck`` and ``norm`` are read by name.

    Returns
    -------
    Callable[[torch.Tensor], torch.Tensor]
        The readout: a block's output (of the last stage) -> ``(B, classes)`` logits.

    Raises
    ------
    AnalysisError
        ``model`` is none of these (its readout after the last block is not known).
    """
    if isinstance(
        getattr(model, "neck", None), nn.Module
    ):  # SAM: forward_features ends with neck(x.permute(0, 3, 1, 2))
        return lambda hidden: model.forward_head(model.neck(hidden.permute(0, 3, 1, 2)))
    if type(model).__name__ == "SwinTransformerV2Cr":  # its last stage hands the head (B, C, gh, gw), no final norm
        return lambda hidden: model.forward_head(hidden.permute(0, 3, 1, 2))
    if callable(getattr(model, "forward_head", None)):  # ViT, Swin: forward_features ends with norm(x)
        norm = getattr(model, "norm", None) or nn.Identity()
        return lambda hidden: model.forward_head(norm(hidden))
    raise AnalysisError(f"logit lens: the readout after the last block of {type(model).__name__} is not known.")
