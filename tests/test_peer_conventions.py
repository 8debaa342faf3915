"""Each published convention a peer library uses is an argument here, and each value reproduces
its peer to 1e-5 (relative to the largest value compared).

* integrated gradients' ``quadrature`` and convergence delta: captum's ``IntegratedGradients``
  itself (a test tool of requirements.txt);
* Chefer's ``start_layer``: the relevance update of Chefer's published code (Transformer-MM-
  Explainability's notebooks) written out here with explicit loops;
* LeGrad's ``readout``: LeGrad's published rule (each layer's mean token through the final norm
  and projection) written out on a copy of the model with plain hooks;
* TextSpan's ``head_vectors``: the per-part normalisation of TextSpan's ``prs_hook.py`` written
  out on the cached residual parts;
* direct logit attribution's ``fold_value_biases``: TransformerLens's folding of the value
  biases into the output bias, written out from the model's weights.

Each test compares with a number computed without the library's own rule for that convention.
"""

from __future__ import annotations

import copy

import pytest
import torch

import analysis
from analysis import AnalysisError
from analysis.explanations import attention_gradients, explain, integrated_gradients_result
from analysis.explanations.methods import IG_QUADRATURES
from analysis.image_ops import baseline_pixels
from conftest import random_pixels


def assert_close(ours: torch.Tensor, theirs: torch.Tensor, tolerance: float = 1e-5) -> None:
    """Equal to ``tolerance`` relative to the largest magnitude compared."""
    ours, theirs = ours.double(), theirs.double()
    scale = float(theirs.abs().max())
    assert scale > 0, "nothing to compare"
    error = float((ours - theirs).abs().max())
    assert error <= tolerance * scale, f"off by {error:.3g} (scale {scale:.3g}, tolerance {tolerance * scale:.3g})"


@pytest.fixture(scope="module")
def demo_vit():
    return analysis.load_vit("demo", device="cpu")


# --------------------------------------------------------------------------- integrated gradients


@pytest.mark.parametrize("quadrature", IG_QUADRATURES)
def test_integrated_gradients_equal_captums_with_the_same_rule(demo_vit, quadrature):
    """captum's IntegratedGradients with ``method=quadrature`` and the same ``n_steps``, baseline
    and targets: the same per-pixel attributions, the same per-patch sums and the same
    convergence delta (``return_convergence_delta=True``)."""
    captum_attr = pytest.importorskip("captum.attr", reason="captum is a test tool of requirements.txt")
    vit = demo_vit
    pixels = random_pixels(vit, batch=2, seed=4)
    with torch.no_grad():
        targets = vit.model(pixels).argmax(-1)
    ours = integrated_gradients_result(vit, pixels, targets, steps=8, baseline="blur", quadrature=quadrature)
    theirs, delta = captum_attr.IntegratedGradients(vit.model).attribute(
        pixels,
        baselines=baseline_pixels(vit, pixels, "blur"),
        target=targets,
        n_steps=8,
        method=quadrature,
        return_convergence_delta=True,
    )
    assert_close(ours.attributions, theirs.detach())
    gh, gw = vit.spec.grid_size
    ph, pw = vit.spec.patch_size
    pooled = theirs.detach().sum(1).reshape(2, gh, ph, gw, pw).sum((2, 4))
    assert_close(ours.maps, pooled)
    completeness = ours.attributions.double().sum((1, 2, 3)).abs()  # δ is a difference of sums this large
    error = (ours.convergence_delta.double() - delta.detach().double()).abs()
    assert bool((error <= 1e-5 * completeness).all()), (ours.convergence_delta, delta, completeness)
    # the explain() entry point returns the same map for the same rule
    assert_close(
        explain(vit, pixels, target=targets, method="integrated_gradients", steps=8, baseline="blur", quadrature=quadrature),
        pooled,
    )


def test_integrated_gradients_default_rule_is_unchanged_and_rules_differ(demo_vit):
    """The default stays the midpoint rule; the rules are not all one (the parity above can fail)."""
    vit = demo_vit
    pixels = random_pixels(vit, batch=1, seed=5)
    default = explain(vit, pixels, method="integrated_gradients", steps=4)
    middle = explain(vit, pixels, method="integrated_gradients", steps=4, quadrature="riemann_middle")
    torch.testing.assert_close(default, middle, rtol=0, atol=0)
    left = explain(vit, pixels, method="integrated_gradients", steps=4, quadrature="riemann_left")
    assert float((left - middle).abs().max()) > 1e-3 * float(middle.abs().max())
    with pytest.raises(AnalysisError, match="quadrature='simpson' is not a rule"):
        explain(vit, pixels, method="integrated_gradients", quadrature="simpson")
    with pytest.raises(AnalysisError, match="needs steps >= 2"):
        explain(vit, pixels, method="integrated_gradients", quadrature="riemann_left", steps=1)


def test_convergence_delta_shrinks_with_steps(demo_vit):
    """``δ = Σ IG − (y(x) − y(x′))`` is the completeness error: Gauss–Legendre converges."""
    vit = demo_vit
    pixels = random_pixels(vit, batch=1, seed=6)
    coarse = integrated_gradients_result(vit, pixels, steps=2, quadrature="gausslegendre").convergence_delta.abs()
    fine = integrated_gradients_result(vit, pixels, steps=32, quadrature="gausslegendre").convergence_delta.abs()
    assert float(fine) < float(coarse)


# --------------------------------------------------------------------------- Chefer's start_layer


def chefer_published(attentions: torch.Tensor, gradients: torch.Tensor, start_layer: int) -> torch.Tensor:
    """Transformer-MM-Explainability's CLIP notebook ``interpret``, written out: blocks before
    ``start_layer`` are skipped (``-1``: the last block only), then for each block
    ``cam = (grad ⊙ attn).clamp(min=0).mean(heads)``, ``R = R + cam @ R``, and the map is
    ``R[:, 0, 1:]``. Loops over images and blocks; float64."""
    layers, batch, _, tokens, _ = attentions.shape
    if start_layer == -1:
        start_layer = layers - 1
    out = []
    for b in range(batch):
        relevance = torch.eye(tokens, dtype=torch.float64)
        for i in range(layers):
            if i < start_layer:
                continue
            cam = (gradients[i, b].double() * attentions[i, b].double()).clamp(min=0).mean(0)
            relevance = relevance + cam @ relevance
        out.append(relevance[0, 1:])
    return torch.stack(out)


@pytest.mark.parametrize("start_layer", [0, -1, 1])
def test_chefer_start_layer_follows_the_published_update(demo_vit, start_layer):
    vit = demo_vit
    pixels = random_pixels(vit, batch=2, seed=7)
    record = attention_gradients(vit, pixels)
    assert vit.spec.num_prefix_tokens == 1  # the published code reads R[:, 0, 1:]
    expected = chefer_published(record.attentions, record.gradients, start_layer).reshape(2, *vit.spec.grid_size)
    got = explain(vit, pixels, method="chefer", start_layer=start_layer)
    assert_close(got, expected)


def test_chefer_default_reads_every_block_and_start_layer_is_checked(demo_vit):
    vit = demo_vit
    pixels = random_pixels(vit, batch=1, seed=8)
    default = explain(vit, pixels, method="chefer")
    torch.testing.assert_close(default, explain(vit, pixels, method="chefer", start_layer=0), rtol=0, atol=0)
    last = explain(vit, pixels, method="chefer", start_layer=-1)
    assert float((last - default).abs().max()) > 1e-3 * float(default.abs().max())
    layers = vit.spec.num_layers
    with pytest.raises(AnalysisError, match=f"start_layer={layers} is not a block"):
        explain(vit, pixels, method="chefer", start_layer=layers)


# --------------------------------------------------------------------------- direct logit attribution


def transformer_lens_folded(vit):
    """TransformerLens's ``fold_value_biases``, written out on a copy of the weights: each block's
    output bias becomes ``b_O + Σ_h W_O[:, h] b_V,h`` and the value bias becomes 0. The model's
    output is unchanged (each row of the attention sums to 1)."""
    model = copy.deepcopy(vit.model)
    with torch.no_grad():
        for block in model.blocks:
            width = block.attn.proj.in_features
            value_bias = block.attn.qkv.bias[2 * width :].clone()
            block.attn.proj.bias += block.attn.proj.weight @ value_bias
            block.attn.qkv.bias[2 * width :] = 0
    return analysis.load_vit(model, device="cpu")


def test_direct_logit_attribution_folds_value_biases_as_transformer_lens(demo_vit):
    """``fold_value_biases=True`` on the model equals the default on TransformerLens's folded
    weights, term by term; the default keeps each head's value bias in its head; both sum to the logit."""
    from analysis.circuits import direct_logit_attribution

    vit = demo_vit
    assert float(vit.model.blocks[0].attn.qkv.bias.abs().max()) > 0  # there is a value bias to move
    pixels = random_pixels(vit, batch=2, seed=9)
    folded = direct_logit_attribution(vit, pixels, fold_value_biases=True)
    folded_weights = transformer_lens_folded(vit)
    with torch.no_grad():
        assert_close(folded_weights.model(pixels), vit.model(pixels))
    reference = direct_logit_attribution(folded_weights, pixels, target=folded.targets)
    for name in ("heads", "head_bias", "embedding", "mlps", "constant", "target_logit"):
        assert_close(getattr(folded, name), getattr(reference, name))
    kept = direct_logit_attribution(vit, pixels, target=folded.targets)
    assert float((kept.heads - folded.heads).abs().max()) > 1e-3 * float(kept.heads.abs().max())
    for result in (kept, folded):
        assert_close(result.total(), result.target_logit)
    torch.testing.assert_close(
        kept.heads.sum((1, 2, 3)) + kept.head_bias.sum((1, 2)), folded.heads.sum((1, 2, 3)) + folded.head_bias.sum((1, 2))
    )


# --------------------------------------------------------------------------- LeGrad's readout


@pytest.fixture(scope="module")
def demo_clip():
    return analysis.load_clip("demo_clip", device="cpu")


def legrad_published(clip, pixels: torch.Tensor, text: torch.Tensor, layers: int, mean_tokens: bool) -> torch.Tensor:
    """LeGrad's ``compute_legrad_clip`` written out on a copy of the image tower with plain hooks:
    for each of the last ``layers`` blocks, its output's mean token (``mean_tokens``; else its
    class token) through ``ln_post`` and ``proj``, normalised, dotted with the normalised text
    embedding; the positive gradient of the sum with respect to that block's attention, mean over
    heads and query rows, patches only; summed over the blocks and min–max per image (on the patch
    grid: before that code's bilinear upsampling)."""
    model = copy.deepcopy(clip.image.model).eval()
    probs: dict[int, torch.Tensor] = {}
    streams: dict[int, torch.Tensor] = {}
    for i, block in enumerate(model.blocks):
        block.attn.fused_attn = False
        block.attn.attn_drop.register_forward_hook(lambda m, a, out, i=i: probs.__setitem__(i, out))
        block.register_forward_hook(lambda m, a, out, i=i: streams.__setitem__(i, out))
    model(pixels.clone().requires_grad_(True))
    text = torch.nn.functional.normalize(text.float(), dim=-1)  # (1, E)
    total = 0
    depth = len(model.blocks)
    for layer in range(depth - layers, depth):
        feature = streams[layer].mean(1) if mean_tokens else streams[layer][:, 0]  # (B, D)
        feature = torch.nn.functional.normalize(model.norm(feature) @ model.head.weight.T, dim=-1)  # (B, E)
        similarity = (text @ feature.T).sum()
        (gradient,) = torch.autograd.grad(similarity, [probs[layer]], retain_graph=True)
        total = total + gradient.clamp(min=0).mean(1).mean(1)[:, 1:]  # (B, N)
    low, high = total.min(1, keepdim=True).values, total.max(1, keepdim=True).values
    return (total - low) / (high - low)


@pytest.mark.parametrize("readout", ["class_token", "mean_tokens"])
@pytest.mark.parametrize("layers", [1, 2])
def test_legrad_readout_follows_legrads_code(demo_clip, readout, layers):
    from analysis.text import explain_text

    clip = demo_clip
    assert clip.image.model.head.bias is None  # open_clip's proj has no bias, as the code assumes
    pixels = random_pixels(clip.image, batch=2, seed=10)
    prompt = "a red circle"
    expected = legrad_published(
        clip, pixels, clip.encode_text([prompt]).embeddings, layers, mean_tokens=readout == "mean_tokens"
    )
    got = explain_text(clip, pixels, prompt, method="legrad", layers=layers, readout=readout)
    assert_close(got.maps.reshape(2, -1), expected)


def test_legrad_default_readout_is_the_class_token_and_the_readouts_differ(demo_clip):
    from analysis.text import explain_text

    clip = demo_clip
    pixels = random_pixels(clip.image, batch=1, seed=11)
    default = explain_text(clip, pixels, "a blue square", method="legrad").maps
    torch.testing.assert_close(
        default, explain_text(clip, pixels, "a blue square", method="legrad", readout="class_token").maps, rtol=0, atol=0
    )
    mean = explain_text(clip, pixels, "a blue square", method="legrad", readout="mean_tokens").maps
    assert float((mean - default).abs().max()) > 1e-2
    with pytest.raises(AnalysisError, match="readout='patches' is not a LeGrad readout"):
        explain_text(clip, pixels, "a blue square", method="legrad", readout="patches")
