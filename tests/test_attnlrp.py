"""AttnLRP (analysis.explanations.lrp) against conservation, a hand-written relevance pass and LXT.

* Conservation on every family of the matrix with a class head: with every additive constant
  zeroed (biases, position embeddings, prefix tokens, relative-position biases) the pixels'
  relevance plus each softmax's bias term (measured here on the tensors the softmax saw) is the
  explained logit.
* A reference that propagates relevance explicitly, layer by layer, with the published rules
  (each op's backward written as the rule, not as a gradient), on a timm ViT with its biases.
* LXT's own rules (``lxt.explicit``) in the same forward: the optional ``lxt`` tier, run by its
  own step of .ci/run (``pip install --no-deps lxt``; it declares transformers, zennit and more).
"""

from __future__ import annotations

import copy
import threading
from functools import partial
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import analysis
import analysis.explanations.lrp as lrp
from analysis import AnalysisError
from analysis.explanations import attnlrp_relevance, explain, input_x_gradient
from families import FAMILIES

PAPER = {"attention": "attnlrp", "gamma": None}  # the paper's rules throughout (not explain's default recipe)
ADDITIVE = ("bias", "pos_embed", "cls_token", "reg_token", "dist_token", "relative_position_bias_table")


def classifier(family: str, *, zero_additive: bool = False):
    """The family's seeded random-weight model, given a 7-class head when it has none."""
    arch, kwargs, size, _ = FAMILIES[family]
    torch.manual_seed(0)
    vit = analysis.load_vit(arch, pretrained=False, device="cpu", **kwargs)
    if not vit.spec.has_classifier:
        torch.manual_seed(0)
        vit = analysis.load_vit(arch, pretrained=False, device="cpu", **{**kwargs, "num_classes": 7})
    with torch.no_grad():
        for param in vit.model.parameters():
            param.add_(torch.randn_like(param) * 0.02)
    if zero_additive:
        zero_additive_constants(vit.model)
    pixels = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1))
    return vit, pixels


def with_softmax_terms(monkeypatch, compute):
    """``(compute(), Σ softmax bias terms)``: each softmax's ``Σ s⊙ĝ(s) − Σ x⊙ĝ(x)`` (AttnLRP's
    softmax rule passes on ``Σ x⊙ĝ(x)`` of the ``Σ s⊙ĝ(s)`` it receives), read by hooks on the
    very tensors :func:`lrp.softmax_rule` saw during ``compute``."""
    seen = []
    rule = lrp.softmax_rule

    def spy(scores, dim):
        probs = rule(scores, dim)
        entry: dict = {"x": scores, "s": probs}
        scores.register_hook(lambda g: entry.__setitem__("gx", g))
        probs.register_hook(lambda g: entry.__setitem__("gs", g))
        seen.append(entry)
        return probs

    monkeypatch.setattr(lrp, "softmax_rule", spy)
    result = compute()
    monkeypatch.setattr(lrp, "softmax_rule", rule)
    assert seen, "no softmax went through the rule"
    absorbed = 0.0
    for e in seen:
        x = e["x"].detach().double()
        passed = torch.where(torch.isfinite(x), x * e["gx"].double(), torch.zeros_like(x))  # masked pairs: −inf·0
        absorbed += float((e["s"].detach().double() * e["gs"].double()).sum() - passed.sum())
    return result, absorbed


CLASSIFIERS = [f for f in FAMILIES if f not in ("pe_core", "siglip")]  # those two stay embedding towers


@pytest.mark.parametrize("family", CLASSIFIERS)
def test_relevance_is_conserved_up_to_the_softmax_terms_once_biases_are_zeroed(family, monkeypatch):
    vit, pixels = classifier(family, zero_additive=True)
    relevance, absorbed = with_softmax_terms(monkeypatch, lambda: attnlrp_relevance(vit, pixels, [3, 5], **PAPER))
    logit = float(relevance.logits[0, 3] + relevance.logits[1, 5])
    total = float(relevance.pixels.double().sum())
    assert abs(logit) > 1e-2 and abs(total) > 1e-2  # not vacuous
    assert total + absorbed == pytest.approx(logit, abs=1e-4), (total, absorbed, logit)
    # the map and the tokens carry the same total (block 0's input: only the patch embedding's
    # bias and the constants before block 0 lie between, all zero here)
    assert float(relevance.map.double().sum()) == pytest.approx(total, abs=1e-5)
    assert float(relevance.tokens.double().sum()) == pytest.approx(total, abs=1e-4)


@pytest.mark.parametrize("family", CLASSIFIERS)
def test_the_default_recipe_conserves_the_logit_once_biases_are_zeroed(family):
    """CP-LRP absorbs no softmax term and the γ-rule only its (zeroed) biases: on every family with a
    class head the default's pixel relevance is the logit itself."""
    vit, pixels = classifier(family, zero_additive=True)
    relevance = attnlrp_relevance(vit, pixels, [3, 5])
    logit = float(relevance.logits[0, 3] + relevance.logits[1, 5])
    assert abs(logit) > 1e-2  # not vacuous
    assert float(relevance.pixels.double().sum()) == pytest.approx(logit, rel=1e-4, abs=1e-5)


def test_embedding_towers_are_refused_with_the_reason():
    vit, pixels = classifier("siglip")
    with pytest.raises(AnalysisError, match="no class to explain"):
        explain(vit, pixels, method="attnlrp")


WINDOWED = ["swin_tiny_patch4_window7_224", "swinv2_tiny_window8_256", "swinv2_cr_tiny_ns_224"]


@pytest.mark.parametrize("arch", WINDOWED, ids=["swin", "swinv2", "swinv2_cr"])
def test_a_windowed_models_relevance_is_conserved_up_to_the_softmax_terms(arch, monkeypatch):
    """Shifted windows, their masks, relative-position biases (a table or a meta-network) and patch
    merging: the same rules, the same conservation, on the stem's patch grid."""
    from windowed_models import small_swin

    vit = small_swin(arch, num_classes=7)
    with torch.no_grad():
        for param in vit.model.parameters():
            param.add_(torch.randn_like(param) * 0.02)
    zero_additive_constants(vit.model)
    pixels = torch.randn(2, 3, *vit.spec.img_size, generator=torch.Generator().manual_seed(1))
    relevance, absorbed = with_softmax_terms(monkeypatch, lambda: attnlrp_relevance(vit, pixels, [3, 5], **PAPER))
    logit = float(relevance.logits[0, 3] + relevance.logits[1, 5])
    total = float(relevance.pixels.double().sum())
    assert abs(logit) > 1e-2 and abs(total) > 1e-2 and abs(absorbed) > 1e-4  # not vacuous: windows' softmaxes count
    assert total + absorbed == pytest.approx(logit, abs=1e-5), (total, absorbed, logit)
    grid = vit.spec.grid_size
    assert relevance.map.shape == (2, *grid) and relevance.tokens.shape == (2, grid[0] * grid[1])
    assert float(relevance.map.double().sum()) == pytest.approx(total, abs=1e-5)
    assert float(relevance.tokens.double().sum()) == pytest.approx(total, abs=1e-5)


def test_a_windowed_model_is_explained_on_its_stem_grid():
    swin = analysis.load_vit("demo_swin", device="cpu")
    assert "attnlrp" in analysis.explanations.methods_for(swin)
    pixels = torch.randn(2, 3, *swin.spec.img_size, generator=torch.Generator().manual_seed(2))
    relevance = attnlrp_relevance(swin, pixels, [0, 2])
    maps = explain(swin, pixels, target=[0, 2], method="attnlrp")
    assert maps.shape[1:] == analysis.explanations.explanation_grid(swin, "attnlrp")[0] == tuple(swin.spec.grid_size)
    torch.testing.assert_close(maps, relevance.map)
    (gh, gw), (ph, pw) = swin.spec.grid_size, swin.spec.patch_size
    by_hand = relevance.pixels.sum(1)[:, : gh * ph, : gw * pw].reshape(2, gh, ph, gw, pw).sum((2, 4))
    torch.testing.assert_close(relevance.map, by_hand)
    plain, _ = input_x_gradient(swin, pixels, [0, 2])  # the rules change the backward pass
    assert (plain - relevance.map).abs().max() > 1e-3 * relevance.map.abs().max()


def test_explain_returns_the_relevance_map_and_the_fused_and_explicit_paths_agree():
    vit, pixels = classifier("vit")
    relevance = attnlrp_relevance(vit, pixels, [1, 4])
    torch.testing.assert_close(explain(vit, pixels, target=[1, 4], method="attnlrp"), relevance.map)
    assert relevance.map.shape == (2, *vit.spec.grid_size)
    assert relevance.tokens.shape == (2, vit.spec.num_prefix_tokens + vit.spec.num_patches)
    unfused = copy.deepcopy(vit)
    for block in unfused.model.blocks:
        block.attn.fused_attn = False  # q·kᵀ, softmax and P·v as separate ops: the uniform rule on matmul
    torch.testing.assert_close(
        attnlrp_relevance(unfused, pixels, [1, 4]).pixels, relevance.pixels, atol=1e-6, rtol=1e-4
    )
    # not input × gradient: the rules change the backward pass
    plain, _ = input_x_gradient(vit, pixels, [1, 4])
    assert (plain - relevance.map).abs().max() > 1e-3 * relevance.map.abs().max()


def test_rules_stay_on_their_thread():
    """One model, two threads: AttnLRP in one never changes another thread's plain gradients."""
    vit, pixels = classifier("vit")
    expected_lrp = attnlrp_relevance(vit, pixels, [0, 1]).pixels
    expected_plain, _ = input_x_gradient(vit, pixels, [0, 1])
    results: dict[str, list] = {"lrp": [], "plain": []}
    errors = []

    def work(kind):
        try:
            for _ in range(4):
                if kind == "lrp":
                    results[kind].append(attnlrp_relevance(vit, pixels, [0, 1]).pixels)
                else:
                    results[kind].append(input_x_gradient(vit, pixels, [0, 1])[0])
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(kind,)) for kind in ("lrp", "plain", "lrp", "plain")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for value in results["lrp"]:
        torch.testing.assert_close(value, expected_lrp)
    for value in results["plain"]:
        torch.testing.assert_close(value, expected_plain)
    for module in vit.model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks


# --------------------------------------------------------------------------- explicit reference


class _Linear(torch.autograd.Function):
    """ε-rule (ε → 0): ``R_x = x ⊙ Wᵀ(R_y / y)``; the bias keeps its share."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        y = F.linear(x, weight, bias)
        ctx.save_for_backward(x, weight, y)
        return y

    @staticmethod
    def backward(ctx, relevance):
        x, weight, y = ctx.saved_tensors
        return x * ((relevance / y) @ weight), None, None


class _LayerNorm(torch.autograd.Function):
    """LN rule: ``σ`` constant, so ``y = (x − mean x)·w/σ + b`` is linear: the ε-rule through it."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        sigma = (x.var(-1, unbiased=False, keepdim=True) + eps).sqrt()
        y = (x - x.mean(-1, keepdim=True)) / sigma * weight + bias
        ctx.save_for_backward(x, y, sigma, weight)
        return y

    @staticmethod
    def backward(ctx, relevance):
        x, y, sigma, weight = ctx.saved_tensors
        scaled = relevance / y * weight / sigma
        return x * (scaled - scaled.mean(-1, keepdim=True)), None, None, None


class _Add(torch.autograd.Function):
    """ε-rule on a sum: each term its share ``R_a = a/(a + b)·R``."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a + b

    @staticmethod
    def backward(ctx, relevance):
        a, b = ctx.saved_tensors
        share = relevance / (a + b)
        return a * share, b * share


class _MatMul(torch.autograd.Function):
    """ε-rule then the uniform rule (Proposition 3.3): ``R_a = ½ a ⊙ (R/y)·bᵀ``, ``R_b = ½ b ⊙ aᵀ·(R/y)``."""

    @staticmethod
    def forward(ctx, a, b):
        y = a @ b
        ctx.save_for_backward(a, b, y)
        return y

    @staticmethod
    def backward(ctx, relevance):
        a, b, y = ctx.saved_tensors
        share = relevance / y / 2
        return a * (share @ b.transpose(-1, -2)), b * (a.transpose(-1, -2) @ share)


class _Softmax(torch.autograd.Function):
    """Proposition 3.1: ``R_x = x ⊙ (R − s·Σ R)``."""

    @staticmethod
    def forward(ctx, x):
        s = x.softmax(-1)
        ctx.save_for_backward(x, s)
        return s

    @staticmethod
    def backward(ctx, relevance):
        x, s = ctx.saved_tensors
        return x * (relevance - s * relevance.sum(-1, keepdim=True))


class _Identity(torch.autograd.Function):
    """Identity rule (eq. 9) for a one-input element-wise function ``fn``: ``R_x = R_y``."""

    @staticmethod
    def forward(ctx, fn, x):
        return fn(x)

    @staticmethod
    def backward(ctx, relevance):
        return None, relevance


HAND_RULES = SimpleNamespace(
    linear=_Linear.apply,
    layer_norm=lambda x, norm: _LayerNorm.apply(x, norm.weight, norm.bias, norm.eps),
    add=_Add.apply,
    matmul=_MatMul.apply,
    softmax=_Softmax.apply,
    identity=_Identity.apply,
)


def relevance_pass(model, pixels, target, rules):
    """Pixel relevance of ``logits[b, target[b]]`` for timm's plain ViT (patch embedding, class
    token, blocks of LN–attention–LN–GELU MLP, final LN, class token's head), computed by
    relevance-propagating ops: each op's backward receives relevance and returns relevance (no
    gradient × input anywhere). Reshapes, permutations and selections pass relevance as they are."""
    x = pixels.double().clone().requires_grad_(True)
    conv = model.patch_embed.proj
    patches = F.unfold(x, conv.kernel_size, stride=conv.stride).transpose(1, 2)  # (B, N, 3·ph·pw)
    patch_rule = getattr(rules, "patch", rules.linear)  # the convolution written as a linear layer on its patches
    tokens = patch_rule(patches, conv.weight.double().flatten(1), conv.bias.double())  # (B, N, D)
    batch = tokens.shape[0]
    cls = model.cls_token.double().expand(batch, -1, -1)
    stream = torch.cat([cls, tokens], 1)
    stream = rules.add(stream, model.pos_embed.double().expand(batch, -1, -1))
    for block in model.blocks:
        normed = rules.layer_norm(stream, block.norm1)
        stream = rules.add(stream, getattr(rules, "attention", paper_attention)(rules, block.attn, normed))
        normed = rules.layer_norm(stream, block.norm2)
        hidden = rules.identity(F.gelu, rules.linear(normed, block.mlp.fc1.weight, block.mlp.fc1.bias))
        stream = rules.add(stream, rules.linear(hidden, block.mlp.fc2.weight, block.mlp.fc2.bias))
    pooled = rules.layer_norm(stream, model.norm)[:, 0]
    logits = rules.linear(pooled, model.head.weight, model.head.bias)
    chosen = torch.zeros_like(logits)
    chosen[torch.arange(batch), target] = 1.0
    logits.backward(chosen * logits.detach())  # the output relevance: the explained logits
    return x.grad, logits.detach()


def paper_attention(rules, attn, normed):
    """timm's attention written out with the paper's rules: uniform rule on both products, softmax rule."""
    batch = normed.shape[0]
    qkv = rules.linear(normed, attn.qkv.weight, attn.qkv.bias)
    q, k, v = qkv.reshape(batch, -1, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q = rules.identity(lambda t, scale=attn.scale: t * scale, q)  # a constant factor: one input, one output
    probs = rules.softmax(rules.matmul(q, k.transpose(-1, -2)))
    heads = rules.matmul(probs, v).transpose(1, 2).reshape(batch, -1, attn.qkv.in_features)
    return rules.linear(heads, attn.proj.weight, attn.proj.bias)


class _ValuePath(torch.autograd.Function):
    """CP-LRP's ``P·v`` with ``P`` a constant: the ε-rule, ``R_v = v ⊙ Pᵀ(R/y)``, all of it to ``v``."""

    @staticmethod
    def forward(ctx, probs, v):
        y = probs @ v
        ctx.save_for_backward(probs, v, y)
        return y

    @staticmethod
    def backward(ctx, relevance):
        probs, v, y = ctx.saved_tensors
        return None, v * (probs.transpose(-1, -2) @ (relevance / y))


def cp_attention(rules, attn, normed):
    """timm's attention written out with CP-LRP: ``q``, ``k`` and the softmax see no relevance."""
    batch = normed.shape[0]
    qkv = rules.linear(normed, attn.qkv.weight, attn.qkv.bias)
    q, k, v = qkv.reshape(batch, -1, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    probs = (q.detach() * attn.scale @ k.detach().transpose(-1, -2)).softmax(-1)  # constants
    heads = _ValuePath.apply(probs, v).transpose(1, 2).reshape(batch, -1, attn.qkv.in_features)
    return rules.linear(heads, attn.proj.weight, attn.proj.bias)


def gamma_relevance(x, weight, bias, relevance, gamma):
    """The generalised γ-rule as zennit defines it (``zennit.rules.Gamma``), written as the formula:
    for ``z_j > 0``, ``R_i = Σ_j (x_i⁺ w⁺⁺_ij + x_i⁻ w⁻⁻_ij) / (Σ_i' (x_i'⁺ w⁺⁺_i'j + x_i'⁻ w⁻⁻_i'j) + b_j + γb_j⁺) · R_j``
    with ``w⁺⁺ = w + γ·max(w, 0)``, ``w⁻⁻ = w + γ·min(w, 0)``; for ``z_j < 0`` the two swapped (and
    ``b + γ·min(b, 0)``); ``z_j = 0`` passes nothing. ``x`` ``(..., in)``, ``weight`` ``(out, in)``."""
    z = x @ weight.T + bias
    up, down = weight + gamma * weight.clamp(min=0), weight + gamma * weight.clamp(max=0)  # (out, in)
    xp, xn = x.clamp(min=0)[..., None, :], x.clamp(max=0)[..., None, :]  # (..., 1, in)
    raise_ = xp * up + xn * down  # (..., out, in): each contribution where z_j > 0
    lower = xp * down + xn * up
    share_pos = raise_ / (raise_.sum(-1, keepdim=True) + (bias + gamma * bias.clamp(min=0))[:, None])
    share_neg = lower / (lower.sum(-1, keepdim=True) + (bias + gamma * bias.clamp(max=0))[:, None])
    share = torch.where((z > 0)[..., None], share_pos, torch.where((z < 0)[..., None], share_neg, 0.0))
    return (share * relevance[..., None]).sum(-2)  # (..., in)


def gamma_linear(gamma):
    """A linear layer whose backward is :func:`gamma_relevance` (relevance in, relevance out)."""

    class _Gamma(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, bias):
            ctx.save_for_backward(x, weight, bias)
            return F.linear(x, weight, bias)

        @staticmethod
        def backward(ctx, relevance):
            x, weight, bias = ctx.saved_tensors
            return gamma_relevance(x, weight, bias, relevance, gamma), None, None

    return _Gamma.apply


def double_model(family: str):
    vit, pixels = classifier(family)
    model = copy.deepcopy(vit.model).double()
    return vit, model, pixels


def test_relevance_equals_the_explicit_layer_by_layer_propagation():
    vit, model, pixels = double_model("vit")
    assert type(model.blocks[0].mlp.act) is torch.nn.GELU and model.global_pool == "token"  # what the pass writes out
    target = torch.tensor([2, 6])
    expected, logits = relevance_pass(model, pixels, target, HAND_RULES)
    ours = attnlrp_relevance(vit, pixels, target, **PAPER)
    torch.testing.assert_close(logits.float(), ours.logits, atol=1e-5, rtol=1e-5)  # the same model, written out
    scale = float(expected.abs().max())
    assert (ours.pixels.double() - expected).abs().max() <= 1e-5 * scale


LXT_VIT = {"conv": 0.25, "linear": 0.1}  # the default γ (lrp.DEFAULT_GAMMA), a point of LXT's ViT grid


def test_the_gamma_rule_on_one_linear_layer_and_one_convolution_is_the_formula():
    """``x ⊙ ĝ(x)`` through :func:`lrp.gamma_rule` equals :func:`gamma_relevance` written out, for
    inputs and biases of both signs, outputs of both signs (and one exactly 0); a convolution equals
    the formula on its unfolded patches."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 6, 10, generator=g, dtype=torch.float64)
    weight = torch.randn(7, 10, generator=g, dtype=torch.float64)
    bias = torch.randn(7, generator=g, dtype=torch.float64)
    bias[2] = -float(x[0, 0] @ weight[2])  # z = 0 at one output: it passes nothing
    upstream = torch.randn(3, 6, 7, generator=g, dtype=torch.float64)  # ĝ(y)
    for gamma in (0.0, 0.25, 2.0):
        inputs = x.clone().requires_grad_(True)
        y = lrp.gamma_rule(F.linear, inputs, weight, bias, gamma)
        torch.testing.assert_close(y, F.linear(x, weight, bias))  # values unchanged
        (gradient,) = torch.autograd.grad(y, inputs, upstream)
        expected = gamma_relevance(x, weight, bias, upstream * y.detach(), gamma)
        torch.testing.assert_close(inputs.detach() * gradient, expected, atol=1e-12, rtol=1e-9)
    plain = torch.autograd.grad(F.linear(inputs, weight, bias), inputs, upstream)[0]
    torch.testing.assert_close(inputs.detach() * gradient, gamma_relevance(x, weight, bias, upstream * y.detach(), 2.0))
    assert (gradient - plain).abs().max() > 1e-3  # γ = 2 is not the plain gradient
    pixels = torch.randn(2, 3, 8, 8, generator=g, dtype=torch.float64).requires_grad_(True)
    kernel = torch.randn(5, 3, 4, 4, generator=g, dtype=torch.float64)
    conv_bias = torch.randn(5, generator=g, dtype=torch.float64)
    out = lrp.gamma_rule(F.conv2d, pixels, kernel, conv_bias, 0.25, stride=4)  # (2, 5, 2, 2)
    upstream = torch.randn(out.shape, generator=g, dtype=torch.float64)
    (gradient,) = torch.autograd.grad(out, pixels, upstream)
    patches = F.unfold(pixels.detach(), 4, stride=4).transpose(1, 2)  # (2, 4, 48)
    on_patches = gamma_relevance(patches, kernel.flatten(1), conv_bias, (upstream * out.detach()).flatten(2).mT, 0.25)
    expected = F.fold(on_patches.mT, (8, 8), 4, stride=4)
    torch.testing.assert_close(pixels.detach() * gradient, expected, atol=1e-12, rtol=1e-9)


CP_RULES = SimpleNamespace(**{**vars(HAND_RULES), "attention": cp_attention})
CP_GAMMA_RULES = SimpleNamespace(
    **{
        **vars(HAND_RULES),
        "attention": cp_attention,
        "linear": gamma_linear(LXT_VIT["linear"]),
        "patch": gamma_linear(LXT_VIT["conv"]),
    }
)


@pytest.mark.parametrize(
    "options, rules",
    [({"attention": "cp", "gamma": None}, CP_RULES), ({"attention": "cp", "gamma": LXT_VIT}, CP_GAMMA_RULES)],
    ids=["cp", "cp_gamma"],
)
def test_each_variant_equals_its_explicit_layer_by_layer_propagation(options, rules):
    """CP-LRP (probabilities constant, ``P·v``'s relevance all to ``v``), and with it the γ-rule on
    the patch embedding (γ 0.25) and every linear layer (γ 0.1), written out as relevance passes."""
    vit, model, pixels = double_model("vit")
    target = torch.tensor([2, 6])
    expected, _ = relevance_pass(model, pixels, target, rules)
    ours = attnlrp_relevance(vit, pixels, target, **options)
    scale = float(expected.abs().max())
    assert (ours.pixels.double() - expected).abs().max() <= 1e-5 * scale
    paper, _ = relevance_pass(model, pixels, target, HAND_RULES)
    assert (paper - expected).abs().max() > 1e-2 * scale  # the variant is not the paper's rules


def test_cp_is_gradient_times_input_with_the_attention_probabilities_detached(monkeypatch):
    """CP-LRP on the unfused path equals the paper's rules run on a model whose softmax output is a
    constant the rules never see (timm's explicit ``attn.softmax(dim=-1)`` computed outside the rules'
    mode and detached): the same forward, ``P`` a constant, so ``P·v`` is linear in ``v``."""
    vit, pixels = classifier("vit")
    unfused = copy.deepcopy(vit)
    for block in unfused.model.blocks:
        block.attn.fused_attn = False
    cp = attnlrp_relevance(unfused, pixels, [1, 4], attention="cp", gamma=None)
    torch.testing.assert_close(attnlrp_relevance(vit, pixels, [1, 4], attention="cp", gamma=None).pixels, cp.pixels)
    original = torch.Tensor.softmax

    def constant_softmax(self, *args, **kwargs):
        with torch._C.DisableTorchFunction():  # outside the rules: the probabilities are not "from the input"
            return original(self, *args, **kwargs).detach()

    monkeypatch.setattr(torch.Tensor, "softmax", constant_softmax)
    detached = attnlrp_relevance(unfused, pixels, [1, 4], **PAPER)
    monkeypatch.setattr(torch.Tensor, "softmax", original)
    torch.testing.assert_close(detached.pixels, cp.pixels, atol=1e-7, rtol=1e-5)
    paper = attnlrp_relevance(unfused, pixels, [1, 4], **PAPER)
    assert (paper.pixels - cp.pixels).abs().max() > 1e-2 * cp.pixels.abs().max()


@pytest.mark.parametrize(
    "options",
    [{"attention": "cp", "gamma": None}, {}, {"attention": "cp", "gamma": 1.0}],
    ids=["cp", "default", "cp_gamma_1"],
)
def test_cp_and_gamma_conserve_the_logit_on_the_demo_vit_once_biases_are_zeroed(options):
    """No softmax term under CP-LRP, and the γ-rule conservative but for its biases: with every
    additive constant zeroed the pixels' relevance is the explained logit."""
    vit = copy.deepcopy(analysis.load_vit("demo", device="cpu"))
    with torch.no_grad():
        for param in vit.model.parameters():
            param.add_(torch.randn_like(param) * 0.02)  # no exact zeros
    zero_additive_constants(vit.model)
    pixels = torch.randn(2, 3, *vit.spec.img_size, generator=torch.Generator().manual_seed(5))
    relevance = attnlrp_relevance(vit, pixels, [0, 2], **options)
    logit = float(relevance.logits[0, 0] + relevance.logits[1, 2])
    total = float(relevance.pixels.double().sum())
    assert abs(logit) > 1e-1, logit  # not vacuous
    assert total == pytest.approx(logit, rel=1e-4, abs=1e-4), (total, logit)
    paper = float(attnlrp_relevance(vit, pixels, [0, 2], **PAPER).pixels.double().sum())
    assert abs(paper - logit) > 1e-3 * abs(logit)  # the paper's rules do absorb softmax terms here


def test_with_biases_the_gamma_rule_absorbs_its_modified_bias():
    """One linear layer with a bias: ``Σ R(x) = Σ_j R_j·(1 − b′_j/D_j)`` (module docstring)."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(4, 9, generator=g, dtype=torch.float64).requires_grad_(True)
    weight, bias = torch.randn(5, 9, generator=g, dtype=torch.float64), torch.randn(5, generator=g, dtype=torch.float64)
    y = lrp.gamma_rule(F.linear, x, weight, bias, 0.5)
    upstream = torch.randn(4, 5, generator=g, dtype=torch.float64)
    (gradient,) = torch.autograd.grad(y, x, upstream)
    xd, relevance = x.detach(), upstream * y.detach()
    up, down = weight + 0.5 * weight.clamp(min=0), weight + 0.5 * weight.clamp(max=0)
    positive = y.detach() > 0
    modified = torch.where(positive, bias + 0.5 * bias.clamp(min=0), bias + 0.5 * bias.clamp(max=0))
    denominator = (
        torch.where(
            positive,
            xd.clamp(min=0) @ up.T + xd.clamp(max=0) @ down.T,
            xd.clamp(min=0) @ down.T + xd.clamp(max=0) @ up.T,
        )
        + modified
    )
    expected = float((relevance * (1 - modified / denominator)).sum())
    assert float((xd * gradient).sum()) == pytest.approx(expected, rel=1e-10)
    assert abs(expected - float(relevance.sum())) > 1e-3  # the bias does absorb some


def test_the_variants_are_options_of_explain_and_are_checked():
    vit, pixels = classifier("vit")
    assert analysis.explanations.method_options("attnlrp") == ("attention", "gamma")
    torch.testing.assert_close(
        explain(vit, pixels, target=[1, 4], method="attnlrp", attention="attnlrp", gamma=None),
        attnlrp_relevance(vit, pixels, [1, 4], **PAPER).map,
    )
    default = explain(vit, pixels, target=[1, 4], method="attnlrp")
    torch.testing.assert_close(default, attnlrp_relevance(vit, pixels, [1, 4], attention="cp", gamma=LXT_VIT).map)
    assert lrp.DEFAULT_ATTENTION == "cp" and dict(lrp.DEFAULT_GAMMA) == LXT_VIT
    for bad in ({"attention": "softmax"}, {"gamma": -0.1}, {"gamma": {"mlp": 0.1}}, {"gamma": float("nan")}):
        with pytest.raises(AnalysisError, match="attention|gamma"):
            explain(vit, pixels, target=[1, 4], method="attnlrp", **bad)
    assert lrp.gamma_values(0.5) == {"linear": 0.5, "conv": 0.5}
    assert lrp.gamma_values({"conv": 0.25}) == {"linear": None, "conv": 0.25}


def test_the_benchmark_reads_a_method_with_options():
    from analysis.faithfulness.benchmark import method_maps, parse_method

    assert parse_method("attnlrp") == ("attnlrp", {})
    assert parse_method("attnlrp(attention=cp, gamma={'conv': 0.25, 'linear': None})") == (
        "attnlrp",
        {"attention": "cp", "gamma": {"conv": 0.25, "linear": None}},
    )
    with pytest.raises(AnalysisError, match="Cannot read"):
        parse_method("attnlrp(cp)")
    from analysis.faithfulness.__main__ import _methods

    assert _methods("chefer,rollout", ()) == ["chefer", "rollout"]
    assert _methods("chefer;rollout", ()) == ["chefer", "rollout"]
    assert _methods("chefer;attnlrp(attention='cp', gamma={'conv': 0.1, 'linear': 0.0})", ()) == [
        "chefer",
        "attnlrp(attention='cp', gamma={'conv': 0.1, 'linear': 0.0})",
    ]
    vit, pixels = classifier("vit")
    torch.testing.assert_close(
        method_maps(vit, pixels, "attnlrp(attention='attnlrp', gamma=None)", 3),
        attnlrp_relevance(vit, pixels, 3, **PAPER).map[0],
    )


@pytest.mark.lxt
def test_relevance_equals_lxt():
    """LXT's own rules (``lxt.explicit``: ε-LRP linear, its LayerNorm rule, uniform-ε matmul, softmax
    Taylor rule, identity rule) in the same written-out forward."""
    lxt_functional = pytest.importorskip("lxt.explicit.functional")
    lxt_rules = pytest.importorskip("lxt.explicit.rules")
    lxt = SimpleNamespace(
        linear=lambda x, w, b: lxt_functional.linear_epsilon(x, w, b, epsilon=1e-12),
        layer_norm=lambda x, norm: lxt_functional.layer_norm_grad_fn.apply(x, norm.weight, norm.bias, norm.eps, 1e-12),
        add=lambda a, b: lxt_functional.add2(a, b, epsilon=1e-12),
        matmul=lambda a, b: lxt_functional.matmul(a, b, epsilon=1e-12),
        softmax=lambda x: lxt_functional.softmax(x, -1),
        identity=lxt_rules.identity,
    )
    vit, model, pixels = double_model("vit")
    target = torch.tensor([2, 6])
    expected, _ = relevance_pass(model, pixels, target, lxt)
    ours = attnlrp_relevance(vit, pixels, target, **PAPER)
    scale = float(expected.abs().max())
    assert (ours.pixels.double() - expected).abs().max() <= 1e-5 * scale


@pytest.mark.lxt
@pytest.mark.parametrize("gamma", [None, LXT_VIT], ids=["cp", "cp_gamma"])
def test_the_vit_recipe_equals_lxt_and_zennit(gamma, monkeypatch):
    """LXT's ViT recipe by its own code: CP-LRP inside attention (``lxt.explicit.special.multi_head_attention_cp``:
    probabilities computed without gradient, the ε-rule on ``P·v``), LXT's LayerNorm, add, identity and
    ε rules elsewhere, and the γ-rule of zennit's ``rules.Gamma`` (what LXT's ViT example registers on
    ``Conv2d`` and ``Linear``) hooked on real ``nn.Linear`` / ``nn.Conv2d`` modules (stabiliser 1e-12
    where LXT's default is 1e-6, to compare the rule rather than its stabiliser; likewise the ε of
    ``P·v``, which ``multi_head_attention_cp`` fixes at 1e-6, is set to 1e-12 as in every rule here)."""
    lxt_functional = pytest.importorskip("lxt.explicit.functional")
    lxt_rules = pytest.importorskip("lxt.explicit.rules")
    lxt_special = pytest.importorskip("lxt.explicit.special")
    epsilon_lrp = lxt_special.rules.epsilon_lrp
    monkeypatch.setattr(lxt_special.rules, "epsilon_lrp", lambda fn, _epsilon, *args: epsilon_lrp(fn, 1e-12, *args))
    zennit_rules = pytest.importorskip("zennit.rules") if gamma is not None else None
    handles = []

    def module_rule(kind, weight, bias):
        """An ε-rule linear of LXT's, or a zennit-hooked module with the γ-rule."""
        if gamma is None:
            return lambda x: lxt_functional.linear_epsilon(x, weight, bias, epsilon=1e-12)
        layer = torch.nn.Linear(weight.shape[1], weight.shape[0], dtype=torch.float64)
        with torch.no_grad():
            layer.weight.copy_(weight)
            layer.bias.copy_(bias)
        handles.append(zennit_rules.Gamma(gamma[kind], stabilizer=1e-12).register(layer))
        return layer

    def lxt_attention(rules, attn, normed):
        dim = attn.qkv.in_features
        w, b = attn.qkv.weight, attn.qkv.bias
        out, _ = lxt_special.multi_head_attention_cp(
            normed, normed, normed, True, attn.num_heads, attn.head_dim,
            w[:dim], b[:dim], w[dim : 2 * dim], b[dim : 2 * dim],
            module_rule("linear", w[2 * dim :], b[2 * dim :]),
            module_rule("linear", attn.proj.weight, attn.proj.bias),
            need_weights=False,
        )  # fmt: skip
        return out

    lxt = SimpleNamespace(
        linear=lambda x, w, b: module_rule("linear", w, b)(x),
        patch=lambda x, w, b: module_rule("conv", w, b)(x),
        layer_norm=lambda x, norm: lxt_functional.layer_norm_grad_fn.apply(x, norm.weight, norm.bias, norm.eps, 1e-12),
        add=lambda a, b: lxt_functional.add2(a, b, epsilon=1e-12),
        matmul=lambda a, b: lxt_functional.matmul(a, b, epsilon=1e-12),
        softmax=lambda x: lxt_functional.softmax(x, -1),
        identity=lxt_rules.identity,
        attention=lxt_attention,
    )
    vit, model, pixels = double_model("vit")
    target = torch.tensor([2, 6])
    try:
        expected, _ = relevance_pass(model, pixels, target, lxt)
    finally:
        for handle in handles:
            handle.remove()
    ours = attnlrp_relevance(vit, pixels, target, attention="cp", gamma=gamma)
    scale = float(expected.abs().max())
    assert (ours.pixels.double() - expected).abs().max() <= 1e-5 * scale
    if gamma is not None:
        cp_only = attnlrp_relevance(vit, pixels, target, attention="cp", gamma=None).pixels.double()
        assert (cp_only - expected).abs().max() > 1e-2 * scale  # the γ-rule changes the relevance


# --------------------------------------------------------------------------- image–text score


def zero_additive_constants(model):
    """Every bias, position embedding, prefix token and relative-position bias of ``model`` set to 0
    (a relative-position network zeroed whole, SwinV2's ``cpb_mlp`` and V2-CR's ``meta_mlp``: its
    bias on the scores is 0)."""
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            last = name.split(".")[-1]
            position_network = any(part in name for part in ("rel_pos.", "cpb_mlp.", "meta_mlp."))
            if tensor.is_floating_point() and (any(last.endswith(a) for a in ADDITIVE) or position_network):
                tensor.zero_()


def clips(tmp_path_factory):
    """The demo CLIP, and the tiny random HF CLIP and SigLIP of the text tests (with transformers)."""
    out = {"demo_clip": analysis.load_clip("demo_clip", device="cpu")}
    try:
        import text_models
    except ImportError:  # transformers or tokenizers missing: the demo alone
        return out
    for kind in ("clip", "siglip"):
        folder = tmp_path_factory.mktemp(kind)
        text_models.save(kind, folder)
        out[kind] = analysis.load_clip(folder, device="cpu")
    return out


def test_text_relevance_is_conserved_up_to_the_softmax_terms_and_the_logit_bias(tmp_path_factory, monkeypatch):
    """``explain_text(..., method="attnlrp")``: the score ``exp(t)·cos(u, v) + b`` with the cosine's norm
    detached is ``exp(t)·u·v/‖u‖ + b``, linear in ``u``: the pixels' relevance plus the softmax terms is ``s − b``."""
    from analysis.text import explain_text
    from analysis.text.prompts import one_prompt, score_value

    checked = []
    for name, clip in clips(tmp_path_factory).items():
        clip = copy.deepcopy(clip)
        zero_additive_constants(clip.image.model)
        size = clip.image.spec.img_size
        pixels = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(3))
        if clip.tokenizer is None:
            continue
        shown = explain_text(clip, pixels, "a red star", method="attnlrp")
        embedding = one_prompt(clip, "a red star").embeddings
        compute = partial(lrp.score_relevance, clip.image, pixels, score_value(clip, embedding))
        relevance, absorbed = with_softmax_terms(monkeypatch, compute)
        bias = 0.0 if clip.logit_bias is None else float(clip.logit_bias)
        score = float(relevance.targets.double().sum()) - 2 * bias
        torch.testing.assert_close(shown.maps, relevance.map)
        torch.testing.assert_close(shown.scores, relevance.targets)
        assert float(relevance.pixels.abs().sum()) > 1e-2, name  # not vacuous
        assert float(relevance.pixels.double().sum()) + absorbed == pytest.approx(score, abs=1e-4), name
        checked.append(name)
    assert "demo_clip" in checked
