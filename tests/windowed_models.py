"""Small random-weight windowed models (Swin v1/v2, SAM) shared by the windowed test files, built
the same way everywhere: seeded, with the position tables that timm starts near zero drawn
large enough that a wrong index shows."""

from __future__ import annotations

import torch

from analysis import load_vit

__all__ = [
    "SWIN_SMALL",
    "SWIN_SMALL_GEOMETRY",
    "SAM_SMALL",
    "small_swin",
    "small_sam",
    "small_pixels",
    "randomise_bias_tables",
    "no_hooks_left",
    "assert_bias_image_is_per_pair",
]

# Swin: a 16x16 grid of 4 px cells in 4x4 windows (shift 2 every other block), then 8x8 cells of 8 px
SWIN_SMALL = dict(img_size=64, window_size=4, embed_dim=32, depths=(2, 2), num_heads=(2, 4))
# The layers of SWIN_SMALL (and of the HF / torchvision Swins built to the same sizes):
# (stage, grid, stride, window, shift, heads) per layer
SWIN_SMALL_GEOMETRY = [
    (0, (16, 16), (4, 4), (4, 4), (0, 0), 2),
    (0, (16, 16), (4, 4), (4, 4), (2, 2), 2),
    (1, (8, 8), (8, 8), (4, 4), (0, 0), 4),
    (1, (8, 8), (8, 8), (4, 4), (2, 2), 4),
]
# SAM: one 8x8 grid: 3x3 windows padded to 9x9, and two global blocks
SAM_SMALL = dict(
    img_size=64,
    patch_size=8,
    embed_dim=32,
    depth=4,
    num_heads=2,
    global_attn_indexes=(1, 3),
    window_size=3,
    neck_chans=16,
)


def randomise_bias_tables(model: torch.nn.Module, seed: int) -> None:
    """Swin's relative-position bias tables of size 1, not timm's std 0.02, so a wrong bias index shows."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("relative_position_bias_table"):
                parameter.copy_(torch.randn(parameter.shape, generator=generator))


def small_swin(arch: str = "swin_tiny_patch4_window7_224", *, bias_seed: int | None = None, **extra):
    """A :data:`SWIN_SMALL` Swin (v1 by default, or ``arch``), seed 0; ``bias_seed``: randomise its bias tables."""
    torch.manual_seed(0)
    vit = load_vit(arch, pretrained=False, device="cpu", **{**SWIN_SMALL, **extra})
    if bias_seed is not None:
        randomise_bias_tables(vit.model, bias_seed)
    return vit


def small_sam(**extra):
    """A :data:`SAM_SMALL` SAM encoder, seed 0, its decomposed tables (zero in timm) drawn at std 0.5."""
    torch.manual_seed(0)
    vit = load_vit("samvit_base_patch16", pretrained=False, device="cpu", **{**SAM_SMALL, **extra})
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, parameter in vit.model.named_parameters():
            if name.endswith(("rel_pos_h", "rel_pos_w")):
                parameter.copy_(0.5 * torch.randn(parameter.shape, generator=generator))
    return vit


def small_pixels() -> torch.Tensor:
    """``(2, 3, 64, 64)`` standard-normal input, seed 3."""
    return torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(3))


def no_hooks_left(model: torch.nn.Module) -> None:
    """Every forward hook and pre-hook a capture registered is gone."""
    for name, module in model.named_modules():
        assert not module._forward_hooks and not module._forward_pre_hooks, f"hook left on {name or 'model'}"


def assert_bias_image_is_per_pair(image: torch.Tensor, added: torch.Tensor, window: tuple[int, int]) -> None:
    """``image (heads, 2wh−1, 2ww−1)`` (a relative-position bias image) holds, at offset
    ``(yi − yj, xi − xj)``, what the module adds to the scores of slots ``i, j``: ``added (heads, Wt, Wt)``,
    every pair of a window written out."""
    wh, ww = window
    assert image.shape == (added.shape[0], 2 * wh - 1, 2 * ww - 1)
    for i in range(wh * ww):
        for j in range(wh * ww):
            (yi, xi), (yj, xj) = divmod(i, ww), divmod(j, ww)
            torch.testing.assert_close(image[:, yi - yj + wh - 1, xi - xj + ww - 1], added[:, i, j], atol=1e-6, rtol=0)
