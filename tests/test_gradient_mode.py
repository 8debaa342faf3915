"""The engine's gradient mode (``run_with_cache(..., grad_of=fn)``, ``cache.grad(name)``,
``run_with_hooks(..., differentiable=True)``) against references built here, independent of the
attention adapters:

* a hand-written forward of a global timm ViT whose attention is ``softmax(q·kᵀ·scale)`` written
  out, on the model's own weights, differentiated by autograd;
* every other family (rotary EVA-02, RoPE ViTs, relative-position, BEiT, PE, SigLIP, Swin v1/v2,
  SAM): a copy of the model on its own *unfused* path (``fused_attn=False``: the module computes
  the softmax itself) with a plain forward hook on ``attn_drop`` keeping the probabilities it
  multiplies with ``v``, differentiated by autograd.
"""

from __future__ import annotations

import copy
import threading

import pytest
import torch
import torch.nn.functional as F

from analysis.engine.activations import run_with_cache, run_with_hooks
from analysis.model.adapters import block_sites
from families import FAMILIES, family_pixels
from windowed_models import small_pixels, small_sam, small_swin


def _target_logit(logits: torch.Tensor, target: int = 3) -> torch.Tensor:
    return logits[:, target].sum()


def _assert_no_hooks(model):
    for name, module in model.named_modules():
        assert not module._forward_hooks and not module._forward_pre_hooks, f"hook left on {name or 'model'}"


def _hand_written_vit(model, pixels):
    """A timm ``VisionTransformer``'s forward with each block written out (attention unfused:
    ``P = softmax(q·kᵀ·scale)``): ``(logits, [P of each block])``, in the graph."""
    x = model.patch_embed(pixels)
    x = model._pos_embed(x)
    x = model.norm_pre(model.patch_drop(x))
    probabilities = []
    for block in model.blocks:
        attn = block.attn
        h = block.norm1(x)
        batch, tokens, width = h.shape
        qkv = attn.qkv(h).reshape(batch, tokens, 3, attn.num_heads, width // attn.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # (B, heads, T, d)
        q, k = attn.q_norm(q), attn.k_norm(k)
        probs = torch.softmax(q @ k.transpose(-2, -1) * attn.scale, dim=-1)  # (B, heads, T, T)
        probabilities.append(probs)
        z = (probs @ v).transpose(1, 2).reshape(batch, tokens, width)
        x = x + block.ls1(attn.proj(attn.norm(z)))
        x = x + block.ls2(block.mlp(block.norm2(x)))
    return model.forward_head(model.norm(x)), probabilities


def _unfused_reference(model, pixels):
    """``(logits, [P of each block])`` of the model's own unfused attention (a deep copy with
    ``fused_attn=False``), read by a plain forward hook on each block's ``attn_drop``."""
    model = copy.deepcopy(model)
    kept, handles = {}, []
    for site in block_sites(model):
        if hasattr(site.module, "fused_attn"):
            site.module.fused_attn = False
        handles.append(
            site.module.attn_drop.register_forward_hook(
                lambda module, args, output, layer=site.layer: kept.__setitem__(layer, output)
            )
        )
    try:
        with torch.enable_grad():
            logits = model(pixels.clone().requires_grad_(True))
    finally:
        for handle in handles:
            handle.remove()
    return logits, [kept[layer] for layer in sorted(kept)]


def _live_swinv2():
    """A small Swin v2 whose attention counts: timm starts its post-norms at weight 0."""
    vit = small_swin("swinv2_tiny_window8_256", bias_seed=1)
    with torch.no_grad():
        for name, parameter in vit.model.named_parameters():
            if name.endswith(("norm1.weight", "norm2.weight")):
                parameter.fill_(1.0)
    return vit


def _engine(vit, pixels):
    layers = vit.spec.num_layers
    cache = run_with_cache(
        vit,
        pixels,
        names=[f"blocks.{layer}.attn.probs" for layer in range(layers)],
        grad_of=_target_logit,
        precision="float32",
    )
    return cache, [cache.grad(f"blocks.{layer}.attn.probs") for layer in range(layers)]


def test_the_gradient_of_the_target_logit_wrt_the_probabilities_equals_a_hand_written_vit(family_vits):
    vit = family_vits["vit"]
    pixels = family_pixels("vit")
    with torch.enable_grad():
        logits, probabilities = _hand_written_vit(vit.model, pixels.clone().requires_grad_(True))
        expected = torch.autograd.grad(_target_logit(logits), probabilities)
    cache, gradients = _engine(vit, pixels)
    torch.testing.assert_close(cache.logits, logits.detach(), rtol=1e-5, atol=1e-5)
    for layer, (got, want) in enumerate(zip(gradients, expected)):
        assert float(want.abs().max()) > 1e-4, "the reference gradient must not vanish"
        torch.testing.assert_close(
            cache[f"blocks.{layer}.attn.probs"], probabilities[layer].detach(), rtol=1e-5, atol=1e-6
        )
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    _assert_no_hooks(vit.model)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_gradient_wrt_the_probabilities_equals_the_unfused_model_on_every_family(family, family_vits):
    vit = family_vits[family]
    pixels = family_pixels(family)
    logits, probabilities = _unfused_reference(vit.model, pixels)
    expected = torch.autograd.grad(_target_logit(logits), probabilities)
    cache, gradients = _engine(vit, pixels)
    torch.testing.assert_close(cache.logits, logits.detach(), rtol=1e-4, atol=1e-5)
    assert max(float(g.abs().max()) for g in expected) > 1e-4, "the reference gradient must not vanish"
    for layer, (got, want) in enumerate(zip(gradients, expected)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6, msg=f"{family}, block {layer}")
    _assert_no_hooks(vit.model)


@pytest.mark.parametrize("kind", ["swin", "swinv2", "sam"])
def test_the_gradient_wrt_the_window_probabilities_equals_the_unfused_model(kind):
    vit = {"swin": lambda: small_swin(bias_seed=1), "swinv2": _live_swinv2, "sam": small_sam}[kind]()
    pixels = small_pixels()
    logits, probabilities = _unfused_reference(vit.model, pixels)
    expected = torch.autograd.grad(logits[:, :4].sum() if logits.ndim == 2 else logits.mean(), probabilities)
    score = (lambda out: out[:, :4].sum()) if logits.ndim == 2 else (lambda out: out.mean())
    layers = vit.spec.num_layers
    cache = run_with_cache(
        vit, pixels, names=[f"blocks.{layer}.attn.probs" for layer in range(layers)], grad_of=score, precision="float32"
    )
    assert max(float(g.abs().max()) for g in expected) > 1e-5
    for layer in range(layers):
        got = cache.grad(f"blocks.{layer}.attn.probs")  # (B, windows, heads, Wt, Wt)
        want = expected[layer].reshape(got.shape)  # (B·windows, heads, Wt, Wt), timm's batch-major window order
        allowed = vit.spec.geometry(layer).allowed()[None, :, None]  # pairs the shift mask keeps
        torch.testing.assert_close(
            got.masked_fill(~allowed, 0),
            want.masked_fill(~allowed, 0),
            rtol=1e-4,
            atol=1e-6,
            msg=f"{kind}, block {layer}",
        )
    _assert_no_hooks(vit.model)


def test_gradients_of_the_stream_and_norm_points_equal_plain_hook_references(family_vits):
    """``∂y/∂resid_pre``, ``∂y/∂ln1.out`` and ``∂y/∂mlp.post`` equal autograd on tensors read by
    plain hooks; ``∂y/∂ln1.scale`` is the gradient holding the centred input fixed,
    ``Σ_D ∂y/∂out · (out − b)/s`` (TransformerLens's ``hook_scale``)."""
    vit = family_vits["vit"]
    pixels = family_pixels("vit")
    block = vit.model.blocks[1]
    seen, handles = {}, []
    handles.append(block.register_forward_pre_hook(lambda m, a: seen.__setitem__("resid_pre", a[0])))
    handles.append(block.norm1.register_forward_hook(lambda m, a, o: seen.__setitem__("ln1.out", o)))
    handles.append(block.mlp.fc2.register_forward_pre_hook(lambda m, a: seen.__setitem__("mlp.post", a[0])))
    try:
        with torch.enable_grad():
            y = _target_logit(vit.model(pixels.clone().requires_grad_(True)))
            expected = dict(zip(seen, torch.autograd.grad(y, list(seen.values()))))
    finally:
        for handle in handles:
            handle.remove()
    names = ["blocks.1.resid_pre", "blocks.1.ln1.scale", "blocks.1.ln1.out", "blocks.1.mlp.post"]
    cache = run_with_cache(vit, pixels, names=names, grad_of=_target_logit, precision="float32")
    for point in ("resid_pre", "ln1.out", "mlp.post"):
        torch.testing.assert_close(cache.grad(f"blocks.1.{point}"), expected[point], rtol=1e-4, atol=1e-6)
    out, scale = cache["blocks.1.ln1.out"], cache["blocks.1.ln1.scale"]
    wanted_scale = (expected["ln1.out"] * (out - block.norm1.bias.detach()) / scale).sum(-1, keepdim=True)
    torch.testing.assert_close(cache.grad("blocks.1.ln1.scale"), wanted_scale, rtol=1e-4, atol=1e-6)
    assert float(wanted_scale.abs().max()) > 1e-4


def test_differentiable_hooks_keep_the_graph_through_a_replacement(family_vits):
    """A replacement made by a hook stays in the graph: the output's gradient with respect to
    the pixels equals that of the same edit made by a plain hook."""
    vit = family_vits["eva02"]
    pixels = family_pixels("eva02")

    def halve(z):  # (B, T, heads, d)
        return z * torch.tensor([0.5, 1.0, 2.0])[: z.shape[2], None]

    def plain_halve(module, args):
        z = args[0].unflatten(-1, (vit.spec.num_heads, -1))
        return (halve(z).flatten(-2),)

    leaf = pixels.clone().requires_grad_(True)
    handle = vit.model.blocks[0].attn.proj.register_forward_pre_hook(plain_halve)
    try:
        with torch.enable_grad():
            reference = vit.model(leaf)
            (expected,) = torch.autograd.grad(_target_logit(reference), [leaf])
    finally:
        handle.remove()
    mine = pixels.clone().requires_grad_(True)
    with torch.no_grad():  # the engine turns autograd on itself
        logits = run_with_hooks(vit, mine, {"blocks.0.attn.hook_z": halve}, precision="float32", differentiable=True)
    assert logits.requires_grad
    (got,) = torch.autograd.grad(_target_logit(logits), [mine])
    torch.testing.assert_close(logits.detach(), reference.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)
    _assert_no_hooks(vit.model)


def test_gradient_mode_from_several_threads_on_one_model_equals_the_serial_run(family_vits):
    vit = family_vits["rope_mixed"]
    inputs = [family_pixels("rope_mixed", seed=seed) for seed in range(4)]
    names = ["blocks.0.attn.probs", "blocks.1.resid_mid", "blocks.1.attn.scores"]

    def run(pixels):
        cache = run_with_cache(vit, pixels, names=names, grad_of=_target_logit, precision="float32")
        return [cache.grad(name) for name in names]

    serial = [run(pixels) for pixels in inputs]
    results, errors = [None] * len(inputs), []

    def worker(index):
        try:
            for _ in range(3):
                results[index] = run(inputs[index])
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(inputs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for got, want in zip(results, serial):
        for a, b in zip(got, want):
            assert torch.equal(a, b)
    _assert_no_hooks(vit.model)


def test_grad_of_must_give_one_number_and_a_plain_cache_has_no_gradients(family_vits):
    from analysis import AnalysisError

    vit = family_vits["vit"]
    pixels = family_pixels("vit")
    with pytest.raises(AnalysisError, match="one number"):
        run_with_cache(vit, pixels, names=["blocks.0.attn.probs"], grad_of=lambda logits: logits)
    with pytest.raises(AnalysisError, match="no gradients"):
        run_with_cache(vit, pixels, names=["blocks.0.attn.probs"]).grad("blocks.0.attn.probs")
    _assert_no_hooks(vit.model)


def test_the_scores_gradient_is_the_softmax_backward_of_the_probabilities_gradient(family_vits):
    """``∂y/∂S = P ⊙ (∂y/∂P − Σ_k P·∂y/∂P)`` (the softmax's Jacobian), on a relative-position family."""
    vit = family_vits["relpos"]
    pixels = family_pixels("relpos")
    cache = run_with_cache(
        vit, pixels, names=["blocks.1.attn.scores", "blocks.1.attn.probs"], grad_of=_target_logit, precision="float32"
    )
    probs, gradient = cache["blocks.1.attn.probs"], cache.grad("blocks.1.attn.probs")
    expected = probs * (gradient - (probs * gradient).sum(-1, keepdim=True))
    torch.testing.assert_close(cache.grad("blocks.1.attn.scores"), expected, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(F.softmax(cache["blocks.1.attn.scores"], -1), probs, rtol=1e-5, atol=1e-7)
