"""The geometry of a ViT, read from the model itself (never assumed)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn as nn

__all__ = ["ViTSpec", "spec_from_model", "patch_embedding_module", "POSITION_KINDS", "HEAD_KINDS"]

# How positions enter the model: a learned absolute table, rotary embeddings inside
# attention, a relative-position bias on the attention scores, or combinations.
POSITION_KINDS = ("learned", "rope", "learned+rope", "relative", "learned+relative", "none")
# What the model's output is: class scores, an embedding (CLIP/SigLIP/PE projection), or
# pooled features with no head at all.
HEAD_KINDS = ("classifier", "embedding", "none")


@dataclass(frozen=True)
class ViTSpec:
    """Token layout and sizes of a ViT.

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
    position_embedding: str = "learned"  # one of POSITION_KINDS
    head: str = "classifier"  # one of HEAD_KINDS
    num_outputs: int = 0  # classes (classifier), embedding width (embedding), 0 (none)
    dynamic_img_size: bool = False  # accepts other whole-patch input sizes
    dynamic_img_pad: bool = False  # pads partial patches up to whole ones
    family: str = ""  # the model class, e.g. "VisionTransformer", "Eva", "Beit"
    residual_norm: str = "pre"  # "pre": x + f(norm(x)); "post": x + norm(f(x)) (timm's *_rpn ResPost blocks)
    prefix_names: tuple[str, ...] = ()  # one per prefix token, e.g. ("class", "register 1", ...); see token_names

    @property
    def token_names(self) -> tuple[str, ...]:
        """A name for each prefix token: "class", "distillation", "register k" (read from the
        model; specs built by hand get "class" then registers)."""
        if len(self.prefix_names) == self.num_prefix_tokens:
            return self.prefix_names
        first = ("class",) if self.has_class_token else ()
        return first + tuple(f"register {k}" for k in range(1, self.num_prefix_tokens - len(first) + 1))

    @property
    def num_patches(self) -> int:
        return self.grid_size[0] * self.grid_size[1]

    @property
    def num_tokens(self) -> int:
        """T, the sequence length seen by attention."""
        return self.num_prefix_tokens + self.num_patches

    @property
    def has_classifier(self) -> bool:
        """True when the output is class scores (a softmax over it means something)."""
        return self.head == "classifier" and self.num_outputs > 1

    def with_image_size(self, height: int, width: int) -> "ViTSpec":
        """The spec for an input of another size (models with ``dynamic_img_size``)."""
        ph, pw = self.patch_size
        grid = (height // ph, width // pw)
        return replace(self, grid_size=grid, img_size=(grid[0] * ph, grid[1] * pw))


def _pair(value) -> tuple[int, int]:
    if isinstance(value, int):
        return (value, value)
    return (int(value[0]), int(value[1]))


def patch_embedding_module(model: nn.Module) -> nn.Module | None:
    """``patch_embed`` (timm ViT, Eva, BEiT, relpos) or ``embeds`` (NaFlex)."""
    return getattr(model, "patch_embed", None) or getattr(model, "embeds", None)


def _position_kind(model: nn.Module) -> str:
    embed = patch_embedding_module(model)
    table = isinstance(getattr(model, "pos_embed", None), torch.Tensor) or isinstance(
        getattr(embed, "pos_embed", None), torch.Tensor
    )
    rope = getattr(model, "rope", None) is not None
    relative = any(getattr(model, name, None) is not None for name in ("rel_pos_bias", "shared_rel_pos")) or any(
        getattr(block.attn, name, None) is not None
        for block in model.blocks
        for name in ("relative_position_bias_table", "rel_pos")
    )
    if rope:
        return "learned+rope" if table else "rope"
    if relative:
        return "learned+relative" if table else "relative"
    return "learned" if table else "none"


def _class_token(model: nn.Module, embed: nn.Module | None):
    token = getattr(model, "cls_token", None)
    return token if token is not None else getattr(embed, "cls_token", None)


def _head_kind(model: nn.Module, embedding_output: bool) -> tuple[str, int]:
    outputs = int(getattr(model, "num_classes", 0) or 0)
    if outputs == 0:
        return "none", 0
    return ("embedding" if embedding_output else "classifier"), outputs


def spec_from_model(model: nn.Module, *, embedding_output: bool = False, default_img_size=None) -> ViTSpec:
    """Read a :class:`ViTSpec` off a timm ViT-like model (VisionTransformer, Eva, Beit,
    VisionTransformerRelPos, NaFlexVit).

    ``embedding_output``: the model's head projects to an embedding (CLIP/SigLIP/PE towers),
    not to classes. ``default_img_size``: the input size of models whose patch embedding
    has none (NaFlex).
    """
    from .adapters import block_sites

    embed = patch_embedding_module(model)
    if getattr(embed, "grid_size", None) is not None and getattr(embed, "img_size", None) is not None:
        grid = _pair(embed.grid_size)
        img = _pair(embed.img_size)
        # For hybrid (CNN stem) embeddings patch_size is the stem's feature patch, so derive
        # the effective stride in input pixels from the image and grid sizes instead.
        patch = (img[0] // grid[0], img[1] // grid[1])
    else:
        patch = _pair(embed.patch_size)
        img = _pair(default_img_size or 224)
        grid = (img[0] // patch[0], img[1] // patch[1])
    sites = block_sites(model)
    head, outputs = _head_kind(model, embedding_output)
    dynamic = bool(getattr(model, "dynamic_img_size", False)) or type(model).__name__ == "NaFlexVit"
    return ViTSpec(
        patch_size=patch,
        grid_size=grid,
        num_prefix_tokens=int(model.num_prefix_tokens),
        num_layers=len(sites),
        num_heads=sites[0].adapter.num_heads(sites[0].module),
        embed_dim=int(getattr(model, "embed_dim", None) or model.num_features),
        img_size=(grid[0] * patch[0], grid[1] * patch[1]),
        has_class_token=_class_token(model, embed) is not None,
        position_embedding=_position_kind(model),
        head=head,
        num_outputs=outputs,
        dynamic_img_size=dynamic,
        dynamic_img_pad=bool(getattr(embed, "dynamic_img_pad", False)),
        family=type(model).__name__,
        residual_norm=_residual_norm(model),
        prefix_names=_prefix_names(model, embed),
    )


def _prefix_names(model: nn.Module, embed: nn.Module | None) -> tuple[str, ...]:
    """Prefix tokens in timm's order: class token, distillation token, registers."""
    names = ["class"] if _class_token(model, embed) is not None else []
    if getattr(model, "dist_token", None) is not None:
        names.append("distillation")
    registers = int(model.num_prefix_tokens) - len(names)
    return tuple(names + [f"register {k}" for k in range(1, registers + 1)])


def _residual_norm(model: nn.Module) -> str:
    """"post" when the blocks normalise the branch output (timm ``ResPost*Block``), else "pre"."""
    blocks = getattr(model, "blocks", None) or ()
    return "post" if any(type(block).__name__.startswith("ResPost") for block in blocks) else "pre"
