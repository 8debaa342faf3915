"""The geometry of a ViT, read from the model itself (never assumed)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch.nn as nn

__all__ = ["ViTSpec", "spec_from_model"]


@dataclass(frozen=True)
class ViTSpec:
    """Token layout and sizes of a timm ``VisionTransformer``.

    Token order in every sequence is ``[prefix tokens..., patch tokens...]`` where the
    prefix is (class token?) + (distillation token?) + (register tokens); patch tokens
    are in row-major order over a ``grid_size = (gh, gw)`` grid.
    """

    patch_size: tuple[int, int]  # (ph, pw) input pixels per patch (the stride for hybrid stems)
    grid_size: tuple[int, int]  # (gh, gw) patches per column / per row
    num_prefix_tokens: int  # class + distillation + register tokens
    num_layers: int
    num_heads: int
    embed_dim: int
    img_size: tuple[int, int]  # (H, W) input resolution = grid_size * patch_size
    has_class_token: bool

    @property
    def num_patches(self) -> int:
        return self.grid_size[0] * self.grid_size[1]

    @property
    def num_tokens(self) -> int:
        """T, the sequence length seen by attention."""
        return self.num_prefix_tokens + self.num_patches

    def with_image_size(self, height: int, width: int) -> "ViTSpec":
        """The spec for an input of another size (models with ``dynamic_img_size``)."""
        ph, pw = self.patch_size
        grid = (height // ph, width // pw)
        return replace(self, grid_size=grid, img_size=(grid[0] * ph, grid[1] * pw))


def _pair(value) -> tuple[int, int]:
    if isinstance(value, int):
        return (value, value)
    return (int(value[0]), int(value[1]))


def spec_from_model(model: nn.Module) -> ViTSpec:
    """Read a :class:`ViTSpec` off a timm ``VisionTransformer`` (or subclass)."""
    patch_embed = model.patch_embed
    grid = _pair(patch_embed.grid_size)
    img = _pair(patch_embed.img_size)
    # For hybrid (CNN stem) embeddings patch_size is the stem's feature patch, so derive
    # the effective stride in input pixels from the image and grid sizes instead.
    patch = (img[0] // grid[0], img[1] // grid[1])
    attn = model.blocks[0].attn
    return ViTSpec(
        patch_size=patch,
        grid_size=grid,
        num_prefix_tokens=int(model.num_prefix_tokens),
        num_layers=len(model.blocks),
        num_heads=int(attn.num_heads),
        embed_dim=int(model.embed_dim),
        img_size=(grid[0] * patch[0], grid[1] * patch[1]),
        has_class_token=getattr(model, "cls_token", None) is not None,
    )
