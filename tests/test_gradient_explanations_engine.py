"""The gradient explanations and LeGrad read their activations through the engine's gradient
mode; these tests hold them to 1e-6 of references that use no code of ours: each attention
module's own unfused path (``fused_attn`` off, the probabilities it multiplies with ``v`` kept by a
forward hook on its ``attn_drop``, as timm's ``AttentionExtract`` and the peers do) and plain
forward hooks on the block modules, differentiated by ``torch.autograd.grad``."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest
import torch

from analysis.explanations import gradients
from analysis.model.adapters import block_sites
from families import family_pixels
from windowed_models import small_pixels, small_swin

ROOT = Path(__file__).resolve().parents[1]
EXACT = dict(rtol=0, atol=1e-6)


def _leaf(vit, pixels):
    return pixels.detach().to(vit.device, dtype=torch.float32).clone().requires_grad_(True)


def _score(target):
    return lambda logits: logits[:, target].sum()


@contextlib.contextmanager
def _unfused_probabilities(model, layers, kept: dict):
    """Within the block, ``kept[layer]`` is the probability tensor that layer's attention module
    multiplies with ``v`` on its own unfused path (its ``attn_drop``'s output; dropout is off in
    eval mode)."""
    modules = {site.layer: site.module for site in block_sites(model)}
    handles, fused = [], {}
    try:
        for layer in layers:
            module = modules[layer]
            fused[layer], module.fused_attn = module.fused_attn, False
            handles.append(
                module.attn_drop.register_forward_hook(lambda m, a, o, layer=layer: kept.__setitem__(layer, o))
            )
        yield
    finally:
        for handle in handles:
            handle.remove()
        for layer, value in fused.items():
            modules[layer].fused_attn = value


def _unfused_reference(vit, pixels, score):
    """``(A, ∂y/∂A, output)`` from the modules' own unfused attention."""
    kept = {}
    layers = [site.layer for site in block_sites(vit.model)]
    with torch.enable_grad(), _unfused_probabilities(vit.model, layers, kept):
        output = vit.model(_leaf(vit, pixels))
        probabilities = [kept[layer] for layer in layers]
        found = torch.autograd.grad(score(output), probabilities, allow_unused=True)
    found = [torch.zeros_like(p) if g is None else g for p, g in zip(probabilities, found)]
    return torch.stack([p.detach() for p in probabilities]), torch.stack([g.detach() for g in found]), output.detach()


def _plain_hook_reference(vit, pixels, module, read, score):
    """``(X, ∂y/∂X, output)``: ``X`` the input (``read="input"``) or output of ``module``, by a plain hook."""
    seen = []
    if read == "input":
        handle = module.register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    else:
        handle = module.register_forward_hook(lambda m, a, o: seen.append(o))
    try:
        with torch.enable_grad():
            output = vit.model(_leaf(vit, pixels))
            (gradient,) = torch.autograd.grad(score(output), [seen[0]])
    finally:
        handle.remove()
    return seen[0].detach(), gradient.detach(), output.detach()


@pytest.mark.parametrize("family", ["vit", "rope_mixed", "relpos", "beit"])
def test_attention_gradients_equal_the_unfused_modules(family, family_vits):
    vit, pixels = family_vits[family], family_pixels(family)
    result = gradients.attention_gradients(vit, pixels, target=3)
    attentions, found, logits = _unfused_reference(vit, pixels, _score(3))
    torch.testing.assert_close(result.attentions, attentions, **EXACT)
    torch.testing.assert_close(result.gradients, found, **EXACT)
    torch.testing.assert_close(result.logits, logits, **EXACT)
    assert float(found.abs().max()) > 1e-4


@pytest.mark.parametrize("family", ["siglip", "pe_core", "eva02", "dinov2_registers"])
def test_output_attention_gradients_of_an_embedding_tower_equal_the_unfused_modules(family, family_vits):
    vit, pixels = family_vits[family], family_pixels(family)

    def score(output):
        return output[:, :5].pow(2).sum()

    got = gradients.output_attention_gradients(vit, pixels, score)
    for a, b in zip(got, _unfused_reference(vit, pixels, score)):
        torch.testing.assert_close(a, b, **EXACT)


@pytest.mark.parametrize("family, layer", [("vit", -1), ("vit", 0), ("rope_mixed", -1), ("eva02", -1), ("siglip", 1)])
def test_block_input_gradients_equal_a_plain_hook_on_the_attention_input(family, layer, family_vits):
    vit, pixels = family_vits[family], family_pixels(family)
    module = block_sites(vit.model)[layer].module
    if vit.spec.has_classifier:
        activation, found, targets, _ = gradients.block_input_gradients(vit, pixels, target=[1, 2], layer=layer)
        expected = _plain_hook_reference(
            vit, pixels, module, "input", lambda logits: logits.gather(1, torch.tensor([[1], [2]])).sum()
        )
        assert targets.tolist() == [1, 2]
    else:

        def score(output):
            return output.sum()

        activation, found, _ = gradients.block_input_score_gradients(vit, pixels, score, layer=layer)
        expected = _plain_hook_reference(vit, pixels, module, "input", score)
    torch.testing.assert_close(activation, expected[0], **EXACT)
    torch.testing.assert_close(found, expected[1], **EXACT)


@pytest.mark.parametrize("family", ["small_swin", "vit", "relpos_rpn"])
def test_last_block_gradients_equal_a_plain_hook_on_the_last_norm(family, family_vits):
    """Every family reads the last block's norm1 output on the last layer's grid (a ViT's prefix
    tokens dropped): a Swin (NHWC), a ViT with a class token, a post-norm ViT (norm1 after attention)."""
    if family == "small_swin":
        vit, pixels = small_swin(bias_seed=1), small_pixels()
    else:
        vit, pixels = family_vits[family], family_pixels(family)
    activation, found, _targets, geometry = gradients.last_block_gradients(vit, pixels, target=2)
    norm = block_sites(vit.model)[-1].block.norm1
    expected = _plain_hook_reference(vit, pixels, norm, "output", _score(2))
    prefix, grid = geometry.prefix_tokens, geometry.grid_size
    assert prefix == (0 if family == "small_swin" else vit.spec.num_prefix_tokens)
    for got, want in zip((activation, found), expected):
        want = want.reshape(len(pixels), -1, want.shape[-1])[:, prefix:]  # (B, gh·gw, C), prefix dropped
        torch.testing.assert_close(got, want.reshape(len(pixels), *grid, -1), **EXACT)


def test_legrad_equals_the_unfused_modules_and_plain_hooks(tmp_path):
    """LeGrad's per-layer gradients through the engine equal the former implementation: a plain
    forward hook on each block for ``x^l`` and the modules' unfused probabilities for ``A^l``."""
    import text_models
    from analysis import load_clip
    from analysis.text.explain import explain_text
    from analysis.text.prompts import one_prompt

    text_models.save("clip", tmp_path)
    clip = load_clip(tmp_path, device="cpu")
    side = text_models.VISION["image_size"]
    pixels = torch.randn(2, 3, side, side, generator=torch.Generator().manual_seed(1))
    text = one_prompt(clip, "a star")
    vit, model = clip.image, clip.image.model
    spec = vit.spec
    read = list(range(spec.num_layers - 2, spec.num_layers))
    streams, kept = {}, {}
    handles = [
        model.blocks[layer].register_forward_hook(lambda m, a, o, layer=layer: streams.__setitem__(layer, o))
        for layer in read
    ]
    total = torch.zeros(2, spec.num_tokens, dtype=torch.float64)
    try:
        with torch.enable_grad(), _unfused_probabilities(model, read, kept):
            model(_leaf(vit, pixels))
            for layer in read:
                score = clip.logits(model.forward_head(model.norm(streams[layer])), text.embeddings).sum()
                (gradient,) = torch.autograd.grad(score, [kept[layer]], retain_graph=True)
                total += gradient.clamp(min=0).mean((1, 2)).double()
    finally:
        for handle in handles:
            handle.remove()
    patches = spec.split_prefix(total, 1)[1]
    low, high = patches.min(1, keepdim=True).values, patches.max(1, keepdim=True).values
    expected = ((patches - low) / (high - low)).float()
    got = explain_text(clip, pixels, "a star", method="legrad").maps.reshape(2, -1)
    torch.testing.assert_close(got, expected, **EXACT)


def test_the_explanations_register_no_hooks_of_their_own():
    """Every activation they read goes through the engine's named points."""
    for path in ("analysis/explanations/gradients.py", "analysis/text/legrad.py"):
        source = (ROOT / path).read_text()
        assert not re.search(r"register_(full_backward_|forward_pre_|forward_)hook", source), path
