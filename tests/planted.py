"""A random ViT with planted artifact tokens: a few patches made high-norm attention sinks, as the
outlier tokens of real ViTs are (Darcet et al. 2024, "Vision Transformers Need Registers").

Two edits, both in the weights, so that any image shows them:

* the position embedding of each planted patch gets ``scale · u`` (one random unit direction
  ``u``), so those tokens' norms stand far above the others in every layer;
* in every block, the key projection gets a rank-one term ``a ⊗ v / ‖v‖²`` with ``v = norm1(u)``
  (what the block's LayerNorm makes of a token dominated by ``u``) and the query bias ``+ pull · a``:
  a planted token's key then carries ``a``, every query carries ``pull · a``, and their score
  rises by about ``pull · ‖a‖² / √d`` per head: every query's attention sinks into them.
"""

from __future__ import annotations

import copy

import torch

PLANTED = (0, 5, 17)  # row-major patch indices (a corner, an edge, an inner patch)


def plant_artifacts(vit, patches=PLANTED, *, scale: float = 100.0, pull: float = 1.0, seed: int = 0):
    """A deep copy of ``vit`` (a LoadedViT of a timm VisionTransformer) with ``patches`` planted."""
    planted = copy.deepcopy(vit)
    model = planted.model
    generator = torch.Generator().manual_seed(seed)
    width = model.pos_embed.shape[-1]
    u = torch.randn(width, generator=generator)
    u = u / u.norm()
    prefix = 0 if getattr(model, "no_embed_class", False) else model.num_prefix_tokens
    with torch.no_grad():
        spike = scale * u  # a norm of `scale`: about 10× the tokens' of these small random models
        for patch in patches:
            model.pos_embed[0, prefix + patch] += spike
        a = torch.ones(width)
        for block in model.blocks:
            v = block.norm1(u[None])[0]
            qkv = block.attn.qkv
            qkv.weight[width : 2 * width] += torch.outer(a, v) / v.dot(v)
            qkv.bias[:width] += pull * a
    return planted
