"""Hugging Face ``transformers`` Swin and Swin V2 (``SwinForImageClassification``, ``SwinModel``,
``Swinv2ForImageClassification``, ``Swinv2Model``).

Converted once, at the boundary, into the equivalent timm ``SwinTransformer`` /
``SwinTransformerV2`` built from the Hugging Face model's *own* modules and parameters (see
:mod:`.swin_assemble`; nothing is copied): the patch projection and its LayerNorm (with the
embedding dropout), each layer's LayerNorms, MLP, relative-position bias table (v1) or
``logit_scale``, ``continuous_position_bias_mlp`` and ``relative_coords_table`` (v2), the
patch mergings (Hugging Face keeps each at the *end* of a stage, timm at the start of the
next: the same modules, in the same order), the final LayerNorm and the classifier. The
separate q/k/v projections become timm's ``qkv`` through :class:`~.assemble.ConcatLinear`
(for v2 too: its key has no bias, so timm's own ``q_bias``/``v_bias`` are left out). The timm
window adapters then read the probabilities that transformers returns with
``output_attentions=True`` under eager attention, window by window in the same row-major order.

Not shared: timm's shift mask (no weights; the same −100 rule. transformers' Swin V2 adds its
mask twice, −200, which moves no probability by more than e⁻¹⁰⁰). Refused, with the reason:
absolute position embeddings (``use_absolute_embeddings``, timm's Swin has none), an input size
other than the config's ``image_size`` (transformers derives each layer's window from it), and
stage grids that are not whole windows (transformers pads before its shift, timm after).

Both the transformers 4.x layout (``attention.self.query``, ``intermediate``/``output``) and the
5.x layout of Swin (``attention.q_proj``, ``relative_position_bias``, ``mlp``) are read.
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from ...base.errors import ModelLoadError, UnsupportedModelError
from .assemble import ConcatLinear
from .hf_parts import IntermediateOutput, first_attribute
from .swin_assemble import MlpWithDropout, SwinBlockParts, SwinParts, assemble_swin

__all__ = ["SWIN_MODEL_TYPES", "to_timm_swin"]

SWIN_MODEL_TYPES = ("swin", "swinv2")

# transformers' models and layers are annotated ``Any``: their submodules are read by name, which torch's
# ``nn.Module.__getattr__`` types as ``Tensor | Module`` whatever transformers put there.


def _v1_block(layer: Any, grid: tuple[int, int]) -> SwinBlockParts:
    attention = layer.attention
    q = first_attribute(attention, "q_proj", "self.query")
    k = first_attribute(attention, "k_proj", "self.key")
    v = first_attribute(attention, "v_proj", "self.value")
    proj = first_attribute(attention, "o_proj", "output.dense")
    position = first_attribute(attention, "relative_position_bias", "self")
    if None in (q, k, v, proj, position):
        raise UnsupportedModelError(f"Unrecognised attention layout in transformers' {type(layer).__name__}.")
    window, shift = int(layer.window_size), int(layer.shift_size)
    if min(grid) <= window:  # SwinLayer.set_shift_and_window_size, called in every forward
        window, shift = min(grid), 0
    mlp = first_attribute(layer, "mlp")
    if mlp is not None:  # 5.x: one dropout module after the attention output and after the MLP
        mlp, proj_drop = MlpWithDropout(mlp, layer.dropout), layer.dropout
    else:  # 4.x: intermediate (dense + act), output (dense + dropout); attention.output.dropout
        mlp, proj_drop = IntermediateOutput(layer.intermediate, layer.output), attention.output.dropout
    attention_dropout = first_attribute(attention, "self.dropout") or nn.Dropout(
        float(getattr(attention, "attention_dropout", 0.0))
    )
    return SwinBlockParts(
        norm1=layer.layernorm_before,
        qkv=ConcatLinear(q, k, v),
        proj=proj,
        norm2=layer.layernorm_after,
        mlp=mlp,
        position_index=position.relative_position_index,
        bias_table=position.relative_position_bias_table,
        window=(window, window),
        shift=(shift, shift),
        attn_drop=attention_dropout,
        proj_drop=proj_drop,
        drop_path1=layer.drop_path,
        drop_path2=nn.Identity(),  # transformers' Swin: no drop path on the MLP branch
    )


def _v2_block(layer: Any) -> SwinBlockParts:
    attention = layer.attention.self
    window, shift = int(layer.window_size), int(layer.shift_size)  # fixed at init from the config's grid
    return SwinBlockParts(
        norm1=layer.layernorm_before,
        qkv=ConcatLinear(attention.query, attention.key, attention.value),
        proj=layer.attention.output.dense,
        norm2=layer.layernorm_after,
        mlp=IntermediateOutput(layer.intermediate, layer.output),
        position_index=attention.relative_position_index,
        logit_scale=attention.logit_scale,
        cpb_mlp=attention.continuous_position_bias_mlp,
        coords_table=attention.relative_coords_table,
        window=(window, window),
        shift=(shift, shift),
        attn_drop=attention.dropout,
        proj_drop=layer.attention.output.dropout,
        drop_path1=layer.drop_path,
        drop_path2=layer.drop_path,
    )


def to_timm_swin(model: Any, img_size: tuple[int, int] | None = None) -> tuple[nn.Module, str]:
    """The timm Swin made of ``model``'s own modules, and its head kind ("classifier" or "none").

    Parameters
    ----------
    model : Any
        A transformers ``SwinForImageClassification`` / ``SwinModel`` or ``Swinv2ForImageClassification``
        / ``Swinv2Model``.
    img_size : tuple of int or None, default None
        ``(H, W)`` input size; ``None``, the config's ``image_size`` (the only size accepted).

    Returns
    -------
    tuple of (torch.nn.Module, str)
        The timm ``SwinTransformer`` / ``SwinTransformerV2`` in eval mode, sharing every weight, and
        ``"classifier"`` or ``"none"``.

    Raises
    ------
    UnsupportedModelError
        Not a Swin classifier or base model; absolute position embeddings; an attention layout not
        recognised; a patch grid that does not halve evenly, or stage grids that are not whole windows
        (or windows / shifts other than timm's).
    ModelLoadError
        ``img_size`` differs from the config's ``image_size``.
    """
    config = model.config
    v2 = config.model_type == "swinv2"
    backbone = first_attribute(model, "swinv2" if v2 else "swin") or model
    if getattr(backbone, "layernorm", None) is None or getattr(backbone, "encoder", None) is None:
        raise UnsupportedModelError(
            f"transformers' {type(model).__name__} is not a Swin classifier or SwinModel (no final layernorm): "
            "load SwinForImageClassification / Swinv2ForImageClassification or SwinModel / Swinv2Model."
        )
    embeddings = backbone.embeddings
    native = (int(config.image_size),) * 2 if isinstance(config.image_size, int) else tuple(config.image_size)
    size = tuple(img_size or native)
    if size != native:
        raise ModelLoadError(
            f"This transformers {type(model).__name__} was built for {native[0]}x{native[1]} inputs, which set each "
            f"layer's window; img_size={size} is not supported for it."
        )
    if getattr(embeddings, "position_embeddings", None) is not None:
        raise UnsupportedModelError(
            f"This transformers {type(model).__name__} uses absolute position embeddings (use_absolute_embeddings), "
            "which timm's Swin does not have: not supported."
        )
    patch = int(config.patch_size)
    grid = (size[0] // patch, size[1] // patch)
    stages = list(backbone.encoder.layers)
    blocks = []
    for index, stage in enumerate(stages):
        stage_grid = (grid[0] >> index, grid[1] >> index)
        if stage_grid[0] << index != grid[0] or stage_grid[1] << index != grid[1]:
            raise UnsupportedModelError(
                f"transformers Swin: the {grid[0]}x{grid[1]} patch grid does not halve evenly at every patch merging "
                "(padded merging is not supported)."
            )
        blocks.append([_v2_block(layer) if v2 else _v1_block(layer, stage_grid) for layer in stage.blocks])
    classifier = first_attribute(model, "classifier")
    classifier = classifier if isinstance(classifier, nn.Linear) else None
    stem_proj = embeddings.patch_embeddings.projection
    parts = SwinParts(
        v2=v2,
        img_size=size,
        patch_size=patch,
        embed_dim=int(config.embed_dim),
        num_heads=tuple(int(h) for h in config.num_heads),
        mlp_ratio=float(config.mlp_ratio),
        stem_proj=stem_proj,
        stem_norm=nn.Sequential(embeddings.norm, embeddings.dropout),
        stages=blocks,
        mergings=[(stage.downsample.norm, stage.downsample.reduction) for stage in stages[:-1]],
        norm=backbone.layernorm,
        classifier=classifier,
    )
    return assemble_swin(parts, "transformers"), "classifier" if classifier is not None else "none"
