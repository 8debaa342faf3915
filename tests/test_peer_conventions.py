"""Each published convention a peer library uses is an argument here, and each value reproduces
its peer to 1e-5 (relative to the largest value compared).

* integrated gradients' ``quadrature`` and convergence delta: captum's ``IntegratedGradients``
  itself (a tool of the test extra);
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
from analysis.base.image_ops import baseline_pixels
from analysis.explanations import attention_gradients, explain, integrated_gradients_result
from analysis.explanations.methods import IG_QUADRATURES
from conftest import random_pixels


def assert_close(ours: torch.Tensor, theirs: torch.Tensor, tolerance: float = 1e-5, scale: float | None = None) -> None:
    """Equal to ``tolerance`` relative to the largest magnitude compared (or to ``scale``)."""
    ours, theirs = ours.double(), theirs.double()
    scale = float(theirs.abs().max()) if scale is None else scale
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
    import captum.attr as captum_attr  # a tool of the test extra: no skip when it is missing

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
        explain(
            vit, pixels, target=targets, method="integrated_gradients", steps=8, baseline="blur", quadrature=quadrature
        ),
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


@pytest.fixture(scope="module")
def layer_scale_vit():
    """A DINOv2-style model with registers and layer scale, its value biases made non-zero."""
    from conftest import make_vit

    vit = make_vit("registers", num_classes=10)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for block in vit.model.blocks:
            block.attn.qkv.bias.add_(torch.randn(block.attn.qkv.bias.shape, generator=generator))
            block.ls1.gamma.add_(torch.rand(block.ls1.gamma.shape, generator=generator))
    return vit


@pytest.mark.parametrize("which", ["demo", "layer_scale"])
def test_direct_logit_attribution_folds_value_biases_as_transformer_lens(demo_vit, layer_scale_vit, which):
    """``fold_value_biases=True`` on the model equals the default on TransformerLens's folded
    weights, term by term; the default keeps each head's value bias in its head; both sum to the logit."""
    from analysis.circuits import direct_logit_attribution

    vit = demo_vit if which == "demo" else layer_scale_vit
    assert float(vit.model.blocks[0].attn.qkv.bias.abs().max()) > 0  # there is a value bias to move
    pixels = random_pixels(vit, batch=2, seed=9)
    folded = direct_logit_attribution(vit, pixels, fold_value_biases=True)
    folded_weights = transformer_lens_folded(vit)
    with torch.no_grad():
        assert_close(folded_weights.model(pixels), vit.model(pixels))
    reference = direct_logit_attribution(folded_weights, pixels, target=folded.targets)
    logit_scale = float(folded.target_logit.abs().max())
    for name in ("heads", "head_bias", "embedding", "mlps", "constant", "target_logit"):
        assert_close(getattr(folded, name), getattr(reference, name), scale=logit_scale)
    kept = direct_logit_attribution(vit, pixels, target=folded.targets)
    assert float((kept.heads - folded.heads).abs().max()) > 1e-3 * float(kept.heads.abs().max())
    for result in (kept, folded):
        assert_close(result.total(), result.target_logit)
    torch.testing.assert_close(
        kept.heads.sum((1, 2, 3)) + kept.head_bias.sum((1, 2)),
        folded.heads.sum((1, 2, 3)) + folded.head_bias.sum((1, 2)),
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
        default,
        explain_text(clip, pixels, "a blue square", method="legrad", readout="class_token").maps,
        rtol=0,
        atol=0,
    )
    mean = explain_text(clip, pixels, "a blue square", method="legrad", readout="mean_tokens").maps
    assert float((mean - default).abs().max()) > 1e-2
    with pytest.raises(AnalysisError, match="readout='patches' is not a LeGrad readout"):
        explain_text(clip, pixels, "a blue square", method="legrad", readout="patches")


# --------------------------------------------------------------------------- TextSpan's head vectors


def textspan_published(clip, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """TextSpan's ``PRSLogger`` (``prs_hook.py``) written out from the image tower's weights: per
    head, its output at the class token ``Σ_s A[h, 0, s] v[h, s] W_O[:, h]`` (explicit softmax of
    ``q·kᵀ/√d``) plus ``b_O/H``; the embeddings (``ln_pre``'s output) and every MLP's output at the
    class token; then ``_normalize_attentions`` / ``_normalize_mlps`` with ``len_intermediates =
    2L + 1`` and ``finalize``'s division by the embedding's norm. Returns ``(heads (B, L, H, E),
    mlps (B, L + 1, E), embedding (B, E))``, mlps[:, 0] the embeddings as in that code."""
    model = clip.image.model
    x = model.patch_embed(pixels)
    x = model._pos_embed(x)
    x = model.norm_pre(x)  # ln_pre
    mlps, attentions = [x[:, 0]], []
    for block in model.blocks:
        attn = block.attn
        heads, width = attn.num_heads, x.shape[-1]
        d = width // heads
        h_in = block.norm1(x)
        q, k, v = attn.qkv(h_in).reshape(x.shape[0], x.shape[1], 3, heads, d).unbind(2)
        q, k = attn.q_norm(q.transpose(1, 2)), attn.k_norm(k.transpose(1, 2))
        probs = torch.softmax(q @ k.transpose(-1, -2) / d**0.5, dim=-1)  # (B, H, T, T)
        z = probs @ v.transpose(1, 2)  # (B, H, T, d)
        w_o = attn.proj.weight.reshape(width, heads, d)
        per_head = torch.stack([z[:, h, 0] @ w_o[:, h].T for h in range(heads)], 1)  # (B, H, D) at the class token
        attentions.append(per_head + attn.proj.bias / heads)
        branch = attn.proj(z.transpose(1, 2).reshape(x.shape[0], x.shape[1], width))
        x = x + block.ls1(branch)
        mlp = block.ls2(block.mlp(block.norm2(x)))
        mlps.append(mlp[:, 0])
        x = x + mlp
    attentions, mlps = torch.stack(attentions, 1), torch.stack(mlps, 1)  # (B, L, H, D), (B, L + 1, D)
    cls = x[:, 0]
    mean, std = cls.mean(-1), (cls.var(-1, unbiased=False) + model.norm.eps).sqrt()  # ln_post.mean / .sqrt_var
    intermediates = attentions.shape[1] + mlps.shape[1]
    ln, proj = model.norm, model.head.weight.T
    heads_count = attentions.shape[2]
    centred = attentions - mean[:, None, None, None] / (intermediates * heads_count)
    post = ln.weight * centred / std[:, None, None, None] + ln.bias / (intermediates * heads_count)
    projected_heads = post @ proj
    post_mlps = ln.weight * (mlps - mean[:, None, None] / intermediates) / std[:, None, None] + ln.bias / intermediates
    projected_mlps = post_mlps @ proj
    representation = model(pixels)
    norm = representation.norm(dim=-1)
    return (
        projected_heads / norm[:, None, None, None],
        projected_mlps[:, 1:] / norm[:, None, None],
        projected_mlps[:, 0] / norm[:, None],
    )


def test_textspan_head_vectors_follow_textspans_code(demo_clip):
    from analysis.circuits.attribution import head_output_vectors, output_vector_parts

    clip = demo_clip
    model = clip.image.model
    assert model.head.bias is None and model.global_pool == "token"  # CLIP's readout, as that code reads it
    pixels = random_pixels(clip.image, batch=2, seed=12)
    with torch.no_grad():
        heads, mlps, embedding = textspan_published(clip, pixels)
    parts = output_vector_parts(clip.image, pixels, head_vectors="textspan")
    assert_close(parts.heads, heads)
    assert_close(parts.mlps, mlps)
    assert_close(parts.embedding, embedding)
    assert_close(head_output_vectors(clip.image, pixels, [-1, 0], head_vectors="textspan"), heads[:, [-1, 0]])


@pytest.mark.parametrize("head_vectors", ["centred", "textspan"])
def test_the_parts_sum_to_the_image_embedding_in_both_conventions(demo_clip, head_vectors):
    """``"centred"``: the parts sum to the embedding ``u``; ``"textspan"``: to ``u/‖u‖`` (that
    code's ``finalize`` divides every part by ``‖u‖``). The centred heads are head_output_vectors'
    default, unchanged."""
    from analysis.circuits.attribution import head_output_vectors, output_vector_parts

    clip = demo_clip
    pixels = random_pixels(clip.image, batch=2, seed=13)
    parts = output_vector_parts(clip.image, pixels, head_vectors=head_vectors)
    with torch.no_grad():
        embedding = clip.image.model(pixels)
    expected = embedding if head_vectors == "centred" else embedding / embedding.norm(dim=-1, keepdim=True)
    assert_close(parts.output, expected)
    assert_close(parts.total(), expected)
    if head_vectors == "centred":
        torch.testing.assert_close(parts.heads, head_output_vectors(clip.image, pixels), rtol=1e-5, atol=1e-6)


def test_textspan_convention_differs_and_is_refused_where_undefined(demo_clip):
    from analysis.circuits.attribution import head_output_vectors
    from conftest import make_vit

    pixels = random_pixels(demo_clip.image, batch=1, seed=14)
    centred = head_output_vectors(demo_clip.image, pixels)
    textspan = head_output_vectors(demo_clip.image, pixels, head_vectors="textspan")
    scaled = centred / demo_clip.image.model(pixels).norm(dim=-1)[:, None, None, None]  # same scale, other centring
    assert float((textspan - scaled).abs().max()) > 1e-3 * float(scaled.abs().max())
    with pytest.raises(AnalysisError, match="head_vectors='raw' is not a convention"):
        head_output_vectors(demo_clip.image, pixels, head_vectors="raw")
    pooled = make_vit("no_class_token", num_classes=10)  # mean pooling: not TextSpan's readout
    with pytest.raises(AnalysisError, match="follows TextSpan's code for CLIP"):
        head_output_vectors(pooled, random_pixels(pooled, batch=1), head_vectors="textspan")


def test_head_texts_search_the_convention_asked_for(demo_clip):
    """head_texts(head_vectors="textspan") runs TextSpan's search on TextSpan's vectors."""
    import torch.nn.functional as F

    from analysis.circuits.attribution import head_output_vectors
    from analysis.text import head_texts, text_span

    clip = demo_clip
    pixels = random_pixels(clip.image, batch=4, seed=15)
    vocabulary = ["a red circle", "a blue square", "a green star", "a big dog", "a small cat"]
    result = head_texts(clip, pixels, vocabulary, layers=[-1], texts_per_head=2, rank=None, head_vectors="textspan")
    vectors = head_output_vectors(clip.image, pixels, [-1], head_vectors="textspan")  # (B, 1, heads, E)
    texts = F.normalize(clip.encode_text(vocabulary).embeddings, dim=-1)
    for head in range(vectors.shape[2]):
        picked, shares, total = text_span(vectors[:, 0, head], texts, 2, None)
        description = result.of(clip.spec.num_layers - 1, head)
        assert description.texts == tuple(vocabulary[i] for i in picked)
        assert description.variance == pytest.approx(total, rel=1e-6)


def test_legrad_mean_tokens_and_textspan_are_refused_for_an_attention_pooling_tower(tmp_path):
    """LeGrad's mean-token readout and TextSpan's vectors are CLIP's (class token, linear
    projection); a SigLIP tower pools with attention: both say so and name the default."""
    pytest.importorskip("transformers", reason="the tiny SigLIP is a transformers model")
    pytest.importorskip("tokenizers", reason="the tiny tokenizer is built with the tokenizers library")
    import text_models
    from analysis.circuits.attribution import head_output_vectors
    from analysis.text import explain_text

    text_models.save("siglip", tmp_path)
    siglip = analysis.load_clip(tmp_path, device="cpu")
    pixels = random_pixels(siglip.image, batch=1, seed=16)
    with pytest.raises(AnalysisError, match="use readout='class_token'"):
        explain_text(siglip, pixels, "a red star", method="legrad", readout="mean_tokens")
    with pytest.raises(AnalysisError, match="use head_vectors='centred'"):
        head_output_vectors(siglip.image, pixels, attention_pool=True, head_vectors="textspan")
