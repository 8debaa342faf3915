"""Class-specific explanations against independently written references.

The references never use our capture: they deep-copy the model, switch every attention
module to timm's own explicit path (``fused_attn = False``), read tensors with plain
forward hooks and ``retain_grad``, and then apply each method's rule with explicit loops.
"""

from __future__ import annotations

import copy
import threading

import numpy as np
import pytest
import torch

import analysis
from analysis import AnalysisError, capture_attention
from analysis.explanations import attention_gradients, explain
from conftest import make_vit, random_pixels

REFERENCE_KINDS = ["demo", "registers", "no_class_token", "distilled"]


@pytest.fixture(scope="module")
def models():
    """Every token layout with a 10-class head (some timm defaults are headless)."""
    out = {kind: make_vit(kind, num_classes=10) for kind in ("registers", "no_class_token", "distilled", "non_square")}
    out["demo"] = analysis.load_vit("demo", device="cpu")
    return out


def pixels_for(vit, batch=2, seed=0):
    return random_pixels(vit, batch=batch, seed=seed)


def reference_pass(vit, pixels, targets, *, tap_block_input=False):
    """Independent: explicit attention on a copy, hooks on attn_drop (and norm1 of the last
    block), one backward of Σ_b logits[b, target_b]."""
    model = copy.deepcopy(vit.model)
    attentions, inputs = [], []
    handles = []
    for block in model.blocks:
        block.attn.fused_attn = False

        def keep(module, args, output):
            output.retain_grad()
            attentions.append(output)

        handles.append(block.attn.attn_drop.register_forward_hook(keep))
    if tap_block_input:

        def keep_input(module, args, output):
            output.retain_grad()
            inputs.append(output)

        handles.append(model.blocks[-1].norm1.register_forward_hook(keep_input))
    x = pixels.clone().requires_grad_(True)
    logits = model(x)
    score = sum(logits[b, int(targets[b])] for b in range(len(targets)))
    score.backward()
    for handle in handles:
        handle.remove()
    return logits.detach(), attentions, inputs


@pytest.mark.parametrize("kind", REFERENCE_KINDS)
def test_attention_gradients_are_the_gradients_of_the_attention_the_model_used(models, kind):
    vit = models[kind]
    pixels = pixels_for(vit)
    record = attention_gradients(vit, pixels, target=[1, 2])
    logits, attentions, _ = reference_pass(vit, pixels, record.targets)
    with torch.no_grad():
        plain = vit.model(pixels)
    torch.testing.assert_close(record.logits, plain, rtol=1e-5, atol=1e-5)  # the explicit path changes nothing
    torch.testing.assert_close(record.logits, logits, rtol=1e-5, atol=1e-5)
    assert record.attentions.shape[0] == len(attentions) == vit.spec.num_layers
    for layer, reference in enumerate(attentions):
        torch.testing.assert_close(record.attentions[layer], reference.detach(), rtol=1e-5, atol=1e-6)
        scale = reference.grad.abs().max()
        torch.testing.assert_close(record.gradients[layer], reference.grad, rtol=1e-4, atol=1e-5 * scale)
    assert any(g.abs().max() > 0 for g in record.gradients)


def chefer_loops(attentions, spec, batch_index):
    """R = I; R += mean_h max(0, ∇A ⊙ A) · R, every entry by explicit loops."""
    tokens = attentions[0].shape[-1]
    relevance = np.eye(tokens)
    for attention in attentions:
        a = attention.detach()[batch_index].double().numpy()
        g = attention.grad[batch_index].double().numpy()
        heads = a.shape[0]
        fused = np.zeros((tokens, tokens))
        for i in range(tokens):
            for j in range(tokens):
                fused[i, j] = sum(max(0.0, g[h, i, j] * a[h, i, j]) for h in range(heads)) / heads
        update = np.zeros((tokens, tokens))
        for i in range(tokens):
            for j in range(tokens):
                update[i, j] = sum(fused[i, m] * relevance[m, j] for m in range(tokens))
        relevance = relevance + update
    prefix = spec.num_prefix_tokens
    if spec.has_class_token:
        row = relevance[0, prefix:]
    else:
        row = relevance[prefix:, prefix:].mean(0)
    return row.reshape(spec.grid_size)


@pytest.mark.parametrize("kind", REFERENCE_KINDS)
def test_chefer_equals_the_loop_reference(models, kind):
    vit = models[kind]
    pixels = pixels_for(vit)
    maps = explain(vit, pixels, target=None, method="chefer")
    predicted = vit.model(pixels).argmax(-1)
    _, attentions, _ = reference_pass(vit, pixels, predicted)
    assert maps.shape == (2, *vit.spec.grid_size)
    for b in range(2):
        np.testing.assert_allclose(maps[b].numpy(), chefer_loops(attentions, vit.spec, b), rtol=2e-4, atol=1e-7)


@pytest.mark.parametrize("kind", REFERENCE_KINDS)
def test_gradcam_equals_the_loop_reference(models, kind):
    vit = models[kind]
    pixels = pixels_for(vit)
    maps = explain(vit, pixels, target=[0, 1], method="gradcam")
    _, _, inputs = reference_pass(vit, pixels, [0, 1], tap_block_input=True)
    (activation,) = inputs
    prefix = vit.spec.num_prefix_tokens
    for b in range(2):
        a = activation.detach()[b, prefix:].double().numpy()  # (N, D)
        g = activation.grad[b, prefix:].double().numpy()
        n, d = a.shape
        weights = [sum(g[p, c] for p in range(n)) / n for c in range(d)]
        expected = np.array([max(0.0, sum(weights[c] * a[p, c] for c in range(d))) for p in range(n)])
        np.testing.assert_allclose(maps[b].numpy().ravel(), expected, rtol=1e-4, atol=1e-6 * max(expected.max(), 1e-12))


def test_input_x_gradient_sums_each_patch_of_the_pixel_attribution(models):
    vit = models["non_square"]
    pixels = pixels_for(vit)
    maps = explain(vit, pixels, target=3, method="input_x_gradient")
    x = pixels.clone().requires_grad_(True)
    vit.model(x)[:, 3].sum().backward()
    attribution = (pixels * x.grad).sum(1)  # (B, H, W)
    (gh, gw), (ph, pw) = vit.spec.grid_size, vit.spec.patch_size
    assert (gh, gw) != (gw, gh)
    for b in range(2):
        for r in range(gh):
            for c in range(gw):
                expected = attribution[b, r * ph : (r + 1) * ph, c * pw : (c + 1) * pw].sum()
                torch.testing.assert_close(maps[b, r, c], expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("baseline", ["black", "mean", "blur"])
def test_integrated_gradients_complete_the_score_difference(models, baseline):
    """Completeness: Σ IG = y(x) − y(x′) up to the midpoint rule's error."""
    from analysis.base.image_ops import baseline_pixels

    vit = models["demo"]
    pixels = pixels_for(vit, batch=1, seed=3)
    target = int(vit.model(pixels).argmax())
    maps = explain(vit, pixels, target=target, method="integrated_gradients", steps=128, baseline=baseline)
    reference = baseline_pixels(vit, pixels, baseline)
    with torch.no_grad():
        difference = float(vit.model(pixels)[0, target] - vit.model(reference)[0, target])
    assert abs(float(maps.sum()) - difference) <= 0.02 * abs(difference) + 1e-3, (float(maps.sum()), difference)


def test_attention_and_rollout_methods_are_the_capture_views(models):
    vit = models["registers"]
    pixels = pixels_for(vit)
    record = capture_attention(vit, pixels)
    expected = analysis.attention_map(record, -1, head=None, query="cls")
    torch.testing.assert_close(explain(vit, pixels, method="attention"), expected)
    torch.testing.assert_close(explain(vit, pixels, method="rollout"), analysis.attention_rollout(record))
    # without a class token both follow the one query rule: the mean over every patch query
    pooled = models["no_class_token"]
    pixels = pixels_for(pooled)
    record = capture_attention(pooled, pixels)
    spec = record.spec
    rows = record.attentions[-1, :, :, spec.num_prefix_tokens :, spec.num_prefix_tokens :]  # (B, heads, N, N)
    by_hand = rows.float().mean(dim=2).mean(dim=1).reshape(-1, *spec.grid_size)  # mean over queries, then heads
    torch.testing.assert_close(explain(pooled, pixels, method="attention"), by_hand)
    torch.testing.assert_close(explain(pooled, pixels, method="rollout"), analysis.attention_rollout(record))


def test_explaining_leaves_nothing_behind(models):
    vit = models["demo"]
    model = vit.model
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    flags = [getattr(b.attn, "fused_attn", None) for b in model.blocks]
    for method in ("chefer", "gradcam", "input_x_gradient"):
        explain(vit, pixels_for(vit), method=method)
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks
    for name, p in model.named_parameters():
        assert p.grad is None and not p.requires_grad
        assert torch.equal(p, before[name])
    assert flags == [getattr(b.attn, "fused_attn", None) for b in model.blocks]


def test_explanations_and_captures_in_parallel_threads_do_not_mix(models):
    """One model, several sessions: a thread's explicit path never reaches another thread."""
    vit = models["demo"]
    inputs = [pixels_for(vit, batch=1, seed=s) for s in range(4)]
    expected = [explain(vit, x, method="chefer") for x in inputs]
    with torch.no_grad():
        plain = [vit.model(x) for x in inputs]
    results: dict[int, tuple] = {}
    errors = []

    def work(i):
        try:
            for _ in range(3):
                chefer = explain(vit, inputs[i], method="chefer")
                record = capture_attention(vit, inputs[i], exact_logits=True)
                results[i] = (chefer, record.logits)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i in range(4):
        torch.testing.assert_close(results[i][0], expected[i])
        assert torch.equal(results[i][1], plain[i])  # the fused path, bit-identical


def test_bad_requests_are_typed_errors(models):
    demo = models["demo"]
    pixels = pixels_for(demo, batch=2)
    classes = demo.spec.num_outputs
    cases = [
        (lambda: explain(demo, pixels, method="lrp"), "Unknown explanation method"),
        (lambda: explain(demo, pixels, target=classes, method="chefer"), f"{classes} classes"),
        (lambda: explain(demo, pixels, target=-1, method="gradcam"), "not a class"),
        (lambda: explain(demo, pixels, target=[0, 1, 2], method="chefer"), "batch of 2"),
        (lambda: explain(demo, pixels, target=1, method="rollout"), "not class-specific"),
        (lambda: explain(demo, pixels, method="integrated_gradients", baseline="white"), "baseline"),
        (lambda: explain(demo, pixels, method="integrated_gradients", steps=0), "steps"),
        (lambda: explain(demo, pixels[:, :, :8], method="chefer"), "expects"),
    ]
    for call, message in cases:
        with pytest.raises(AnalysisError, match=message):
            call()
    headless = make_vit("class_token", num_classes=0)
    for method in ("chefer", "gradcam", "input_x_gradient", "integrated_gradients"):
        with pytest.raises(AnalysisError, match=r"no class to explain\. Use method='attention' or 'rollout', or load"):
            explain(headless, pixels_for(headless), method=method)
    assert explain(headless, pixels_for(headless), method="rollout").shape[1:] == headless.spec.grid_size


# --------------------------------------------------------------------------- every family


@pytest.fixture(scope="module")
def family_classifiers():
    """Every timm family of the matrix (tests/families.py), with a 7-class head (some are headless)."""
    from families import FAMILIES

    out = {}
    for family, (arch, kwargs, size, _since_timm) in FAMILIES.items():
        torch.manual_seed(0)
        vit = analysis.load_vit(arch, pretrained=False, device="cpu", **{**kwargs, "num_classes": 7})
        with torch.no_grad():
            for param in vit.model.parameters():
                param.add_(torch.randn_like(param) * 0.02)
        out[family] = (vit, size)
    return out


def test_every_family_is_explained_through_the_attention_it_used(family_classifiers):
    """Gradients w.r.t. the substituted explicit attention equal those of each module's own
    unfused path (RoPE, relative-position bias, EVA's SwiGLU blocks, SigLIP's MAP head, ...)."""
    from analysis.model.adapters import block_sites

    checked = []
    for family, (vit, (height, width)) in family_classifiers.items():
        pixels = torch.randn(2, 3, height, width, generator=torch.Generator().manual_seed(1))
        if not vit.spec.has_classifier:  # PE and SigLIP towers are read as image-embedding heads
            assert vit.spec.head == "embedding", family
            with pytest.raises(AnalysisError, match="no class to explain"):
                explain(vit, pixels, method="chefer")
            continue
        record = attention_gradients(vit, pixels, target=[2, 5])
        twin = copy.deepcopy(vit.model)
        kept = []
        for site in block_sites(twin):
            site.module.fused_attn = False

            def keep(module, args, output, kept=kept):
                output.retain_grad()
                kept.append(output)

            site.module.attn_drop.register_forward_hook(keep)
        x = pixels.clone().requires_grad_(True)
        logits = twin(x)
        (logits[0, 2] + logits[1, 5]).backward()
        torch.testing.assert_close(record.logits, logits.detach(), rtol=1e-4, atol=1e-4, msg=family)
        assert len(kept) == vit.spec.num_layers, family
        for layer, reference in enumerate(kept):
            torch.testing.assert_close(record.attentions[layer], reference.detach(), rtol=1e-4, atol=1e-5, msg=family)
            scale = float(reference.grad.abs().max())
            torch.testing.assert_close(
                record.gradients[layer], reference.grad, rtol=1e-3, atol=1e-4 * scale + 1e-12, msg=family
            )
        for method in ("chefer", "gradcam"):
            maps = explain(vit, pixels, target=[2, 5], method=method)
            assert maps.shape == (2, *record.spec.grid_size) and torch.isfinite(maps).all(), (family, method)
        checked.append(family)
    assert set(family_classifiers) - set(checked) == {"pe_core", "siglip", "clip"}, checked  # embedding towers
