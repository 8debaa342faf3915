"""The one matrix of supported timm ViT families, shared by ``tests/test_families.py`` (the full
checks on the current versions), the per-family tests of explanations, tokens and robustness,
and ``tests/min_versions_smoke.py`` (the CI floor versions, run as a plain script: keep this
module free of pytest and of anything newer than Python 3.10).

Each entry builds a random-weight model small enough for the CPU: ``(timm architecture,
timm.create_model kwargs, input (H, W), oldest timm that has it)``. A family the floor timm
cannot build says so in its last field; the smoke test then prints that it skipped it instead
of dropping it silently. Every family listed here exists in timm 1.0.20 (the declared floor).
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Family", "FAMILIES", "FLOOR_TIMM"]

FLOOR_TIMM = "1.0.20"  # as .ci/min-versions.txt


class Family(NamedTuple):
    arch: str
    kwargs: dict
    size: tuple[int, int]  # input (H, W)
    since_timm: str = FLOOR_TIMM  # oldest timm version that can build it


FAMILIES: dict[str, Family] = {
    "vit": Family("vit_tiny_patch16_224", dict(img_size=48, depth=2), (48, 48)),
    "dinov2_registers": Family("vit_small_patch14_reg4_dinov2", dict(img_size=56, depth=2), (56, 56)),
    "deit_distilled": Family("deit_tiny_distilled_patch16_224", dict(img_size=48, depth=2), (48, 48)),
    # ResNet stem + 1x1 projection: the effective patch is the stem's stride (32 px here)
    "hybrid": Family("vit_tiny_r_s16_p8_224", dict(img_size=96, depth=2), (96, 96)),
    # OpenAI CLIP image tower (timm's twin of open_clip / HF CLIPVisionModel): a LayerNorm before the blocks
    "clip": Family("vit_base_patch16_clip_224", dict(img_size=48, depth=2, embed_dim=96, num_heads=4), (48, 48)),
    "dinov3": Family("vit_small_patch16_dinov3", dict(img_size=64, depth=2), (64, 64)),
    "dinov3_plus": Family("vit_small_plus_patch16_dinov3", dict(img_size=48, depth=2), (48, 48)),
    "eva02": Family("eva02_tiny_patch14_224", dict(img_size=56, depth=2), (56, 56)),
    "beit": Family("beit_base_patch16_224", dict(img_size=64, depth=2, embed_dim=96, num_heads=4), (64, 64)),
    "beitv2": Family("beitv2_base_patch16_224", dict(img_size=48, depth=2, embed_dim=96, num_heads=4), (48, 48)),
    "relpos": Family("vit_relpos_small_patch16_224", dict(img_size=(48, 64), depth=2), (48, 64)),
    "relpos_rpn": Family("vit_relpos_small_patch16_rpn_224", dict(img_size=48, depth=2), (48, 48)),
    "srelpos": Family("vit_srelpos_small_patch16_224", dict(img_size=64, depth=2), (64, 64)),
    "rope_reg1_gap": Family(
        "vit_base_patch16_rope_reg1_gap_256", dict(img_size=64, depth=2, embed_dim=96, num_heads=4), (64, 64)
    ),
    "rope_mixed": Family("vit_small_patch16_rope_mixed_224", dict(img_size=48, depth=2), (48, 48)),
    "pe_core": Family("vit_pe_core_small_patch16_384", dict(img_size=64, depth=2), (64, 64)),
    "naflex": Family("naflexvit_base_patch16_gap", dict(depth=2, embed_dim=96, num_heads=4), (48, 64)),
    "siglip": Family("vit_base_patch16_siglip_224", dict(img_size=48, depth=2, embed_dim=96, num_heads=4), (48, 48)),
}


def load_family(name: str):
    """The family's random-weight model on the CPU, every parameter nudged off its initial
    value (random init leaves some biases and layer scales at exactly zero), seeded."""
    import torch

    from analysis import load_vit

    family = FAMILIES[name]
    torch.manual_seed(0)
    vit = load_vit(family.arch, pretrained=False, device="cpu", **family.kwargs)
    with torch.no_grad():
        for param in vit.model.parameters():
            param.add_(torch.randn_like(param) * 0.02)
    return vit


def family_pixels(name: str, batch: int = 2, seed: int = 0):
    """``(batch, 3, H, W)`` standard-normal input of the family's size, seeded."""
    import torch

    height, width = FAMILIES[name].size
    return torch.randn(batch, 3, height, width, generator=torch.Generator().manual_seed(seed))
