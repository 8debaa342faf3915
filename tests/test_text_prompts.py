"""Text prompts for two-tower models (issue 25): loading CLIP / SigLIP, zero-shot, text explanations.

Tiny random Hugging Face ``CLIPModel`` and ``SiglipModel`` are saved with ``save_pretrained`` in
temporary folders with a tiny tokenizer (tests/text_models.py; no network). The references are
the source model itself: its ``logits_per_image``, and Chefer's rule recomputed in this file from
its ``output_attentions=True`` eager attention and autograd on its own score.
"""

from __future__ import annotations

import pytest
import torch

from analysis import AnalysisError, ModelLoadError, NoTextTowerError, TextPromptError, load_clip, load_vit
from analysis.text import explain_text, zero_shot
from ci_skip_check import in_ci

if in_ci():
    import transformers  # noqa: F401
else:
    pytest.importorskip("transformers", reason="transformers is optional: pip install transformers")
pytest.importorskip("tokenizers", reason="the tiny tokenizer is built with the tokenizers library")
import text_models  # noqa: E402

PROMPTS = ["a photo of a red star", "a blue dog on the left", "the green circle"]


@pytest.fixture(scope="module", params=["clip", "siglip"])
def pair(request, tmp_path_factory):
    """``(hf_model, loaded_clip, kind)`` for a tiny random model saved in a temp folder."""
    folder = tmp_path_factory.mktemp(request.param)
    model = text_models.save(request.param, folder)
    return model, load_clip(folder, device="cpu"), request.param


def _pixels(batch: int = 2, seed: int = 1) -> torch.Tensor:
    side = text_models.VISION["image_size"]
    return torch.randn(batch, 3, side, side, generator=torch.Generator().manual_seed(seed))


def _hf_forward(model, kind: str, clip, prompts, pixels, **kwargs):
    """The source model's own forward on the tokenizer's ids (SigLIP: padded to the context, no mask,
    as the model card says)."""
    tokens = clip.tokenizer(
        prompts,
        padding="max_length" if kind == "siglip" else True,
        truncation=True,
        max_length=text_models.CONTEXT,
        return_tensors="pt",
    )
    mask = tokens["attention_mask"] if kind == "clip" else None
    return model(pixel_values=pixels, input_ids=tokens["input_ids"], attention_mask=mask, **kwargs)


# --------------------------------------------------------------------------- loading


def test_loaded_two_tower_model_holds_both_towers_and_the_models_own_scale(pair):
    model, clip, kind = pair
    assert clip.probability == ("softmax" if kind == "clip" else "sigmoid")
    assert clip.logit_scale == pytest.approx(float(model.logit_scale.detach().exp()))
    if kind == "siglip":
        assert clip.logit_bias == pytest.approx(float(model.logit_bias.detach()))
    else:
        assert clip.logit_bias is None
    assert clip.context_length == text_models.CONTEXT
    pixels = _pixels()
    with torch.no_grad():
        expected = model.get_image_features(pixel_values=pixels)
    expected = getattr(expected, "pooler_output", expected)
    torch.testing.assert_close(clip.image.model(pixels), expected, atol=1e-5, rtol=1e-4)
    # the image tower is an ordinary LoadedViT
    assert clip.image.spec.num_prefix_tokens == (1 if kind == "clip" else 0)


def test_text_embeddings_are_the_models_own_text_features(pair):
    model, clip, kind = pair
    encoding = clip.encode_text(PROMPTS)
    assert encoding.prompts == tuple(PROMPTS) and encoding.notices == ()
    out = _hf_forward(model, kind, clip, PROMPTS, _pixels(1))
    torch.testing.assert_close(
        torch.nn.functional.normalize(encoding.embeddings, dim=-1), out.text_embeds, atol=1e-5, rtol=1e-4
    )
    # the same token ids give the same embeddings (CLIP: the padding after the end token is masked
    # causally, so an all-ones mask changes nothing; SigLIP: no mask either way)
    from_ids = clip.encode_text(encoding.token_ids)
    torch.testing.assert_close(from_ids.embeddings, encoding.embeddings, atol=1e-6, rtol=1e-5)
    assert from_ids.prompts is None


def test_a_prompt_longer_than_the_text_tower_is_truncated_with_a_notice(pair):
    _, clip, _ = pair
    long_prompt = "a photo of the big red star on the left and the small blue dog on the right"
    with pytest.warns(UserWarning, match="truncated"):
        encoding = clip.encode_text(["a red star", long_prompt])
    assert (
        len(encoding.notices) == 1
        and "truncated" in encoding.notices[0]
        and str(text_models.CONTEXT) in encoding.notices[0]
    )
    ids = encoding.token_ids[1]
    assert (
        len(ids) == text_models.CONTEXT and int(ids[-1]) == text_models.END
    )  # the end token, which CLIP pools, is kept


@pytest.mark.parametrize("bad", ["", "   ", [], ["a red star", ""]])
def test_an_empty_prompt_is_a_typed_error(pair, bad):
    _, clip, _ = pair
    with pytest.raises(TextPromptError, match="empty|No prompt"):
        clip.encode_text(bad)


def test_token_ids_longer_than_the_text_tower_are_a_typed_error(pair):
    _, clip, _ = pair
    with pytest.raises(TextPromptError, match="at most"):
        clip.encode_text(torch.ones(1, text_models.CONTEXT + 1, dtype=torch.long))


def test_token_ids_outside_the_vocabulary_are_a_typed_error(pair):
    _, clip, _ = pair
    with pytest.raises(TextPromptError, match="vocabulary"):
        clip.encode_text(torch.tensor([[text_models.START, len(text_models.VOCAB), text_models.END]]))
    with pytest.raises(TextPromptError, match="vocabulary"):
        clip.encode_text([[text_models.START, -1, text_models.END]])


def test_prompts_without_a_tokenizer_say_to_pass_token_ids(tmp_path):
    text_models.save("clip", tmp_path, tokenizer=False)
    clip = load_clip(tmp_path, device="cpu")
    assert clip.tokenizer is None
    with pytest.raises(TextPromptError, match="token ids"):
        clip.encode_text("a red star")
    ids = torch.tensor([[text_models.START, 10, 12, text_models.END]])
    assert clip.encode_text(ids).embeddings.shape == (1, 16)


def test_an_image_only_model_asked_for_text_is_a_typed_error(tmp_path):
    import transformers

    vision = transformers.CLIPVisionModelWithProjection(
        transformers.CLIPVisionConfig(**text_models.VISION, projection_dim=16)
    )
    vision.save_pretrained(str(tmp_path))
    with pytest.raises(NoTextTowerError, match="image-only"):
        load_clip(tmp_path, device="cpu")
    with pytest.raises(NoTextTowerError, match="image-only"):
        load_clip(vision, device="cpu")
    vit = load_vit(tmp_path, device="cpu")  # the same folder opens as an image model
    with pytest.raises(NoTextTowerError, match="image-only"):
        load_clip(vit)
    with pytest.raises(NoTextTowerError):
        load_clip("demo")


def test_open_clip_without_the_package_names_the_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "open_clip", None)  # an import of it fails, installed or not
    with pytest.raises(ModelLoadError, match="pip install open_clip_torch"):
        load_clip("open_clip:ViT-B-32", device="cpu")


# --------------------------------------------------------------------------- zero-shot


def test_zero_shot_is_the_models_own_logits_and_rule(pair):
    model, clip, kind = pair
    pixels = _pixels(3)
    result = zero_shot(clip, pixels, PROMPTS)
    with torch.no_grad():
        expected = _hf_forward(model, kind, clip, PROMPTS, pixels).logits_per_image  # (B, P)
    torch.testing.assert_close(result.logits, expected, atol=1e-5, rtol=1e-4)
    if kind == "clip":
        torch.testing.assert_close(result.probabilities, expected.softmax(-1), atol=1e-6, rtol=1e-5)
        assert result.rule == "softmax"
    else:
        torch.testing.assert_close(result.probabilities, torch.sigmoid(expected), atol=1e-6, rtol=1e-5)
        assert result.rule == "sigmoid" and not torch.allclose(result.probabilities.sum(-1), torch.ones(3))
    assert result.prompts == tuple(PROMPTS)


def test_zero_shot_returns_the_truncation_notice(pair):
    _, clip, _ = pair
    with pytest.warns(UserWarning):
        result = zero_shot(clip, _pixels(1), ["a red star", "a photo of the big red star on the left of the small dog"])
    assert len(result.notices) == 1 and "truncated" in result.notices[0]


@pytest.mark.parametrize("method", ["zero_shot", "explain_text"])
def test_an_image_only_model_asked_for_text_scores_is_a_typed_error(method):
    vit = load_vit("demo", device="cpu")
    pixels = torch.zeros(1, 3, *vit.spec.img_size)
    call = (
        (lambda: zero_shot(vit, pixels, ["a star"]))
        if method == "zero_shot"
        else (lambda: explain_text(vit, pixels, "a star"))
    )
    with pytest.raises(NoTextTowerError, match="image-only"):
        call()


# --------------------------------------------------------------------------- explanations


def _hf_score_graph(model, kind, clip, prompt, pixels, **kwargs):
    """The source model's forward with ``output_attentions`` / ``output_hidden_states``, in autograd."""
    with torch.enable_grad():
        return _hf_forward(
            model, kind, clip, [prompt], pixels, output_attentions=True, output_hidden_states=True, **kwargs
        )


def test_chefer_equals_the_published_rule_on_the_source_models_own_score(pair):
    """Transformer-MM-Explainability's rule, from the Hugging Face model's eager attention and
    autograd on its own ``logits_per_image``: R = I; R += mean_h (∇A ⊙ A)⁺ · R per block. The
    map is the class token's row over the patches (CLIP), or the mean over every row (SigLIP:
    no class token, every token a patch)."""
    model, clip, kind = pair
    pixels, prompt = _pixels(2), PROMPTS[0]
    out = _hf_score_graph(model, kind, clip, prompt, pixels)
    attentions = out.vision_model_output.attentions  # L × (B, heads, T, T)
    gradients = torch.autograd.grad(out.logits_per_image[:, 0].sum(), attentions)
    got = explain_text(clip, pixels, prompt, method="chefer")
    torch.testing.assert_close(got.scores, out.logits_per_image[:, 0].detach(), atol=1e-5, rtol=1e-4)
    prefix = 1 if kind == "clip" else 0
    for b in range(pixels.shape[0]):
        tokens = attentions[0].shape[-1]
        relevance = torch.eye(tokens, dtype=torch.float64)
        for attention, gradient in zip(attentions, gradients):
            fused = torch.zeros(tokens, tokens, dtype=torch.float64)
            for head in range(attention.shape[1]):
                fused += (gradient[b, head].double() * attention[b, head].detach().double()).clamp(min=0)
            relevance = relevance + (fused / attention.shape[1]) @ relevance
        row = relevance[0, prefix:] if kind == "clip" else relevance.mean(0)
        torch.testing.assert_close(got.maps[b].reshape(-1).double(), row, atol=1e-5, rtol=1e-4)
    assert got.readout.startswith("the class token") == (kind == "clip")


def test_gradcam_of_the_score_equals_grad_cam_on_the_source_models_last_attention_input(pair):
    model, clip, kind = pair
    pixels, prompt = _pixels(2), PROMPTS[1]
    seen = []
    norm = model.vision_model.encoder.layers[-1].layer_norm1
    handle = norm.register_forward_hook(lambda module, args, output: seen.append(output))
    try:
        out = _hf_score_graph(model, kind, clip, prompt, pixels)
    finally:
        handle.remove()
    (gradient,) = torch.autograd.grad(out.logits_per_image[:, 0].sum(), seen)
    got = explain_text(clip, pixels, prompt, method="gradcam")
    prefix = 1 if kind == "clip" else 0
    activations = seen[0].detach()[:, prefix:]  # (B, N, D)
    gradient = gradient[:, prefix:]
    for b in range(pixels.shape[0]):
        weights = gradient[b].mean(0)  # (D,)
        expected = torch.stack([torch.relu((activations[b, p] * weights).sum()) for p in range(activations.shape[1])])
        torch.testing.assert_close(got.maps[b].reshape(-1), expected, atol=1e-5, rtol=1e-4)


def test_patch_text_is_each_patch_through_the_source_models_own_readout(pair):
    model, clip, kind = pair
    pixels, prompt = _pixels(2), PROMPTS[2]
    with torch.no_grad():
        out = _hf_forward(model, kind, clip, [prompt], pixels, output_hidden_states=True)
        final = model.vision_model.post_layernorm(out.vision_model_output.hidden_states[-1])  # (B, T, D)
        prefix = 1 if kind == "clip" else 0
        patches = final[:, prefix:]
        if kind == "clip":
            embeddings = model.visual_projection(patches)
        else:  # the pooling head on one token at a time
            embeddings = torch.stack(
                [model.vision_model.head(patches[:, p : p + 1]) for p in range(patches.shape[1])], 1
            )
    expected = torch.nn.functional.cosine_similarity(embeddings, out.text_embeds[0], dim=-1)  # (B, N)
    got = explain_text(clip, pixels, prompt, method="patch_text")
    torch.testing.assert_close(got.maps.reshape(2, -1), expected, atol=1e-5, rtol=1e-4)


def test_the_decomposition_sums_to_the_models_score(pair):
    """Heads plus the named remainder terms equal the Hugging Face model's own score to 1e-4."""
    model, clip, kind = pair
    pixels, prompt = _pixels(2), PROMPTS[0]
    with torch.no_grad():
        score = _hf_forward(model, kind, clip, [prompt], pixels).logits_per_image[:, 0]
    explanation = explain_text(clip, pixels, prompt, method="decomposition")
    decomposition = explanation.decomposition
    remainder = decomposition.remainder()
    named = {"embedding", "mlps", "head_bias", "constant", "logit_bias"}
    assert set(remainder) == (named | {"pool_mlp"} if kind == "siglip" else named)
    heads = decomposition.heads()  # (B, L, heads)
    assert heads.shape == (2, 2, 2)
    torch.testing.assert_close(heads.sum((1, 2)) + sum(remainder.values()), score, atol=1e-4, rtol=0)
    torch.testing.assert_close(decomposition.total(), score, atol=1e-4, rtol=0)
    torch.testing.assert_close(explanation.scores, score, atol=1e-5, rtol=1e-4)
    if kind == "siglip":
        assert float(remainder["logit_bias"][0]) == pytest.approx(float(model.logit_bias.detach()))
    # by source token: the same head terms, spread over the tokens each head read
    by_source = decomposition.terms.heads_by_source  # (B, L, heads, T)
    torch.testing.assert_close(by_source.sum(-1), heads, atol=1e-5, rtol=1e-4)
    prefix_share = by_source[..., : clip.spec.num_prefix_tokens].sum((1, 2, 3))
    torch.testing.assert_close(explanation.maps.sum((1, 2)) + prefix_share, heads.sum((1, 2)), atol=1e-5, rtol=1e-4)
    assert explanation.maps.abs().max() > 1e-3


def test_a_siglip_head_term_is_its_share_through_the_frozen_pooling_head(tmp_path):
    """One head's term by an independent route, from the Hugging Face model's own modules: the
    head's output (attention-weighted values through its columns of ``out_proj``) through the
    post-layernorm with the clean run's scale and no shift, the pooling head's values, its own
    probe probabilities (``nn.MultiheadAttention(need_weights=True)``) and ``out_proj``, along
    ``exp(t)·v̂/‖u‖``."""
    model = text_models.save("siglip", tmp_path)
    clip = load_clip(tmp_path, device="cpu")
    pixels, prompt = _pixels(1), PROMPTS[1]
    decomposition = explain_text(clip, pixels, prompt, method="decomposition").decomposition
    vision = model.vision_model
    with torch.no_grad():
        out = _hf_forward(model, "siglip", clip, [prompt], pixels, output_hidden_states=True, output_attentions=True)
        text = torch.nn.functional.normalize(out.text_embeds[0], dim=-1)
        last = out.vision_model_output.hidden_states[-1]  # (1, T, D) before post_layernorm
        layer = vision.encoder.layers[-1]
        dim = last.shape[-1]
        heads, width = 2, dim // 2
        before = out.vision_model_output.hidden_states[-2]
        values = layer.self_attn.v_proj(layer.layer_norm1(before)).unflatten(-1, (heads, width))  # (1, T, heads, d)
        attention = out.vision_model_output.attentions[-1]  # (1, heads, T, T)
        for head in range(heads):
            z = attention[0, head] @ values[0, :, head]  # (T, d)
            written = z @ layer.self_attn.out_proj.weight[:, head * width : (head + 1) * width].T  # (T, D)
            sigma = (last[0].var(-1, unbiased=False, keepdim=True) + vision.post_layernorm.eps).sqrt()
            normed = (written - written.mean(-1, keepdim=True)) / sigma * vision.post_layernorm.weight
            pool = vision.head
            final = vision.post_layernorm(last)
            probe = pool.attention(pool.probe, final, final, need_weights=True, average_attn_weights=False)[1][
                0, :, 0
            ]  # (heads, T)
            pooled_values = normed @ pool.attention.in_proj_weight[2 * dim :].T  # (T, D), no bias
            mixed = (pooled_values.unflatten(-1, (heads, width)) * probe.T[..., None]).sum(0).flatten()  # (D,)
            moved = pool.attention.out_proj.weight @ mixed  # (D,)
            u = out.vision_model_output.pooler_output[0]
            expected = float(model.logit_scale.exp() * (moved @ text) / u.norm())
            assert float(decomposition.heads()[0, -1, head]) == pytest.approx(expected, rel=1e-4, abs=1e-6)


def test_explain_text_refuses_an_empty_prompt_and_an_unknown_method(pair):
    _, clip, _ = pair
    with pytest.raises(TextPromptError, match="empty"):
        explain_text(clip, _pixels(1), " ", method="chefer")
    with pytest.raises(AnalysisError, match="Unknown text explanation method"):
        explain_text(clip, _pixels(1), "a star", method="rollout")
    with pytest.raises(TextPromptError, match="one prompt"):
        explain_text(clip, _pixels(1), ["a star", "a dog"])
    with pytest.raises(AnalysisError, match="does not accept steps: it takes no options"):
        explain_text(clip, _pixels(1), "a star", method="gradcam", steps=3)
    with pytest.raises(AnalysisError, match="layers=3, but the image tower has 2 blocks"):
        explain_text(clip, _pixels(1), "a star", method="legrad", layers=3)


def test_legrad_equals_its_rule_on_the_source_models_own_layers(pair):
    """LeGrad from the Hugging Face model: each of the last two layers' hidden state read out by
    the model's own post-layernorm and projection (CLIP: class token; SigLIP: its pooling head),
    scored against the text, differentiated with respect to that layer's eager attention; ReLU,
    mean over heads and query rows, summed over the layers, min-max per image."""
    model, clip, kind = pair
    pixels, prompt = _pixels(2), PROMPTS[0]
    out = _hf_score_graph(model, kind, clip, prompt, pixels)
    text = out.text_embeds[0].detach()
    vision = model.vision_model
    prefix = 1 if kind == "clip" else 0
    total, terms = 0, []
    layers = len(out.vision_model_output.attentions)
    for layer in range(layers - 2, layers):
        hidden = vision.post_layernorm(out.vision_model_output.hidden_states[layer + 1])
        embedding = model.visual_projection(hidden[:, 0]) if kind == "clip" else vision.head(hidden)
        score = (torch.nn.functional.normalize(embedding, dim=-1) @ text).sum()
        (gradient,) = torch.autograd.grad(score, [out.vision_model_output.attentions[layer]], retain_graph=True)
        terms.append(gradient.clamp(min=0).mean((1, 2))[:, prefix:])
        total = total + terms[-1]
    expected = torch.stack([(m - m.min()) / (m.max() - m.min()) for m in total])
    got = explain_text(clip, pixels, prompt, method="legrad")
    torch.testing.assert_close(got.maps.reshape(2, -1), expected.float(), atol=1e-4, rtol=1e-3)
    assert float(got.maps.min()) == 0.0 and float(got.maps.max()) == 1.0
    last_only = explain_text(clip, pixels, prompt, method="legrad", layers=1)  # the last block alone
    expected_last = torch.stack([(m - m.min()) / (m.max() - m.min()) for m in terms[-1]])
    torch.testing.assert_close(last_only.maps.reshape(2, -1), expected_last.float(), atol=1e-4, rtol=1e-3)


# --------------------------------------------------------------------------- head texts (TextSpan)


def _text_span_by_loops(data, texts, count, rank):
    """TextSpan with explicit loops over images, texts and coordinates (float64 lists)."""
    data = data.double()
    texts = texts.double()
    if rank is not None:
        _, _, vh = torch.linalg.svd(data, full_matrices=False)
        texts = torch.stack([sum(float(t @ vh[r]) * vh[r] for r in range(min(rank, vh.shape[0]))) for t in texts])
    images, dim = data.shape
    rows = [[float(data[k, e]) for e in range(dim)] for k in range(images)]
    mean = [sum(rows[k][e] for k in range(images)) / images for e in range(dim)]
    rows = [[rows[k][e] - mean[e] for e in range(dim)] for k in range(images)]
    candidates = [[float(t[e]) for e in range(dim)] for t in texts]
    total = sum(sum(v * v for v in row) for row in rows) / images
    picked, shares = [], []
    for _ in range(count):
        best, best_variance = None, -1.0
        for j, t in enumerate(candidates):
            projections = [sum(row[e] * t[e] for e in range(dim)) for row in rows]
            average = sum(projections) / images
            variance = sum((p - average) ** 2 for p in projections) / images
            if variance > best_variance:
                best, best_variance = j, variance
        if best_variance <= 1e-12 * total:  # nothing left to explain (the texts' span is exhausted): stop
            break
        t = candidates[best]
        norm2 = sum(v * v for v in t)
        unit_projections = [sum(row[e] * t[e] for e in range(dim)) / norm2**0.5 for row in rows]
        shares.append(sum(p * p for p in unit_projections) / images / total)
        picked.append(best)
        rows = [[row[e] - sum(row[i] * t[i] for i in range(dim)) / norm2 * t[e] for e in range(dim)] for row in rows]
        candidates = [
            [c[e] - sum(c[i] * t[i] for i in range(dim)) / norm2 * t[e] for e in range(dim)] for c in candidates
        ]
    return picked, shares, total


@pytest.mark.parametrize("rank", [None, 3])
def test_text_span_equals_the_greedy_search_done_by_loops(rank):
    from analysis.text import text_span

    generator = torch.Generator().manual_seed(3)
    data = torch.randn(7, 5, generator=generator) * torch.tensor([3.0, 1.0, 0.5, 2.0, 0.2]) + 1.5  # (K, E)
    texts = torch.nn.functional.normalize(torch.randn(9, 5, generator=generator), dim=-1)  # (M, E)
    picked, shares, total = text_span(data, texts, 4, rank)
    assert len(picked) == (4 if rank is None else 3)  # rank 3: three texts span all there is
    expected_picked, expected_shares, expected_total = _text_span_by_loops(data, texts, 4, rank)
    assert picked == expected_picked
    assert shares == pytest.approx(expected_shares, rel=1e-9, abs=1e-12)
    assert total == pytest.approx(expected_total, rel=1e-9)
    # the shares add up to the variance the picked texts' span explains (a projection by least squares)
    centred = data.double() - data.double().mean(0)
    basis = texts.double()[picked]
    if rank is not None:
        _, _, vh = torch.linalg.svd(data.double(), full_matrices=False)
        basis = basis @ vh[:rank].T @ vh[:rank]
    coefficients = torch.linalg.lstsq(basis.T, centred.T).solution  # (picked, K)
    explained = float(((basis.T @ coefficients) ** 2).sum(0).mean()) / total
    assert sum(shares) == pytest.approx(explained, rel=1e-9)
    assert 0 < sum(shares) <= 1 + 1e-12


def test_head_texts_describe_every_head_by_its_own_direct_contributions(pair):
    """The head vectors head_texts searches are the decomposition's head terms (tested above
    against the source model) before their reading along the text: along ``exp(t)·v̂/‖u‖``
    they equal ``decomposition.heads()``; and each head's texts are text_span's on them."""
    from analysis.circuits.attribution import head_output_vectors
    from analysis.text import HeadTexts, head_texts, text_span

    _, clip, kind = pair
    pixels = _pixels(4, seed=5)
    vocabulary = ["a red star", "a blue dog", "the green circle on the left", "a small cat", "a big square"]
    result = head_texts(clip, pixels, vocabulary, texts_per_head=2, rank=None)
    assert isinstance(result, HeadTexts) and result.images == 4 and result.vocabulary_size == 5
    assert [(d.layer, d.head) for d in result.heads] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    vectors = head_output_vectors(clip.image, pixels, attention_pool=True)  # (B, L, heads, E)
    text = clip.encode_text(PROMPTS[0]).embeddings
    with torch.no_grad():
        u = clip.image.model(pixels)
    weights = clip.logit_scale * torch.nn.functional.normalize(text, dim=-1) / u.norm(dim=-1, keepdim=True)  # (B, E)
    decomposition = explain_text(clip, pixels, PROMPTS[0], method="decomposition").decomposition
    torch.testing.assert_close(
        torch.einsum("blhe,be->blh", vectors, weights), decomposition.heads(), atol=1e-5, rtol=1e-4
    )
    embeddings = torch.nn.functional.normalize(clip.encode_text(vocabulary).embeddings, dim=-1)
    for description in result.heads:
        picked, shares, total = text_span(vectors[:, description.layer, description.head], embeddings, 2)
        assert description.texts == tuple(vocabulary[i] for i in picked)
        assert description.shares == pytest.approx(shares) and description.variance == pytest.approx(total)
        assert 0 < description.explained <= 1 + 1e-9
    assert result.of(1, 1).layer == 1


def test_head_texts_default_vocabulary_and_bad_input(pair):
    from analysis.text import default_vocabulary, head_texts

    _, clip, _ = pair
    vocabulary = default_vocabulary()
    assert len(vocabulary) >= 50 and len(set(vocabulary)) == len(vocabulary)
    result = head_texts(clip, _pixels(3), layers=[-1], texts_per_head=1)
    assert {d.layer for d in result.heads} == {1} and result.vocabulary_size == len(vocabulary)
    assert all(text in vocabulary for d in result.heads for text in d.texts)
    with pytest.raises(AnalysisError, match="at least 2 images"):
        head_texts(clip, _pixels(1), ["a star"])
    with pytest.raises(TextPromptError, match="vocabulary is empty"):
        head_texts(clip, _pixels(2), ["", "  "])
    with pytest.raises(NoTextTowerError):
        head_texts(load_vit("demo", device="cpu"), torch.zeros(2, 3, 64, 64), ["a star"])


# --------------------------------------------------------------------------- open_clip (without the package)


class _OpenCLIPBlock(torch.nn.Module):
    """open_clip's ``ResidualAttentionBlock`` layout: ln_1, attn (nn.MultiheadAttention), ls_1, ln_2, mlp, ls_2."""

    def __init__(self, width: int, heads: int) -> None:
        from collections import OrderedDict

        super().__init__()
        self.ln_1, self.ln_2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.attn = torch.nn.MultiheadAttention(width, heads, batch_first=True)
        self.ls_1, self.ls_2 = torch.nn.Identity(), torch.nn.Identity()
        self.mlp = torch.nn.Sequential(
            OrderedDict(
                c_fc=torch.nn.Linear(width, 2 * width), gelu=torch.nn.GELU(), c_proj=torch.nn.Linear(2 * width, width)
            )
        )

    def forward(self, x):
        y = self.ln_1(x)
        x = x + self.ls_1(self.attn(y, y, y, need_weights=False)[0])
        return x + self.ls_2(self.mlp(self.ln_2(x)))


class _OpenCLIPVisual(torch.nn.Module):
    """open_clip's ``VisionTransformer`` attribute names and forward (token pooling, no attention pool)."""

    def __init__(self, width=32, heads=2, layers=2, image=32, patch=8, output=16) -> None:
        super().__init__()
        self.image_size, self.patch_size = (image, image), (patch, patch)
        self.conv1 = torch.nn.Conv2d(3, width, patch, patch, bias=False)
        self.class_embedding = torch.nn.Parameter(torch.randn(width) * 0.2)
        self.positional_embedding = torch.nn.Parameter(torch.randn((image // patch) ** 2 + 1, width) * 0.2)
        self.ln_pre, self.ln_post = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.transformer = torch.nn.Module()
        self.transformer.resblocks = torch.nn.ModuleList(_OpenCLIPBlock(width, heads) for _ in range(layers))
        self.attn_pool, self.pool_type, self.final_ln_after_pool = None, "tok", False
        self.proj = torch.nn.Parameter(torch.randn(width, output) * 0.2)

    def forward(self, x):
        x = self.conv1(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_embedding.expand(x.shape[0], 1, -1), x], 1) + self.positional_embedding
        x = self.ln_pre(x)
        for block in self.transformer.resblocks:
            x = block(x)
        return self.ln_post(x)[:, 0] @ self.proj


class _OpenCLIPModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.visual = _OpenCLIPVisual()
        self.token_embedding = torch.nn.Embedding(20, 16)
        self.logit_scale = torch.nn.Parameter(torch.tensor(2.0))
        self.context_length, self.vocab_size = 6, 20

    def encode_text(self, ids):
        return self.token_embedding(ids).mean(1)


def test_an_open_clip_image_tower_becomes_the_same_timm_vit():
    """Without the package (tests/test_open_clip_real.py checks the real one): its ViT image tower's
    layout, rebuilt in this file with its forward, converts into a timm ViT that gives the same embedding and sees the same attention."""
    from analysis.model.loading.open_clip_source import wrap_open_clip

    torch.manual_seed(0)
    model = _OpenCLIPModel().eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    clip = wrap_open_clip(model, "open_clip:fake", torch.device("cpu"), tokenizer=None)
    pixels = _pixels(2)
    with torch.no_grad():
        torch.testing.assert_close(clip.image.model(pixels), model.visual(pixels), atol=1e-5, rtol=1e-4)
        block = model.visual.transformer.resblocks[0]
        x = model.visual.conv1(pixels).flatten(2).transpose(1, 2)
        x = model.visual.ln_pre(
            torch.cat([model.visual.class_embedding.expand(2, 1, -1), x], 1) + model.visual.positional_embedding
        )
        y = block.ln_1(x)
        expected = block.attn(y, y, y, need_weights=True, average_attn_weights=False)[1]  # (B, heads, T, T)
    from analysis import capture_attention

    record = capture_attention(clip.image, pixels, layers=[0])
    torch.testing.assert_close(record.attentions[0], expected, atol=1e-5, rtol=1e-4)
    assert clip.probability == "softmax" and clip.logit_scale == pytest.approx(float(model.logit_scale.detach().exp()))
    result = zero_shot(clip, pixels, torch.tensor([[1, 2, 3], [4, 5, 6]]))
    with torch.no_grad():
        u = torch.nn.functional.normalize(model.visual(pixels), dim=-1)
        v = torch.nn.functional.normalize(model.encode_text(torch.tensor([[1, 2, 3], [4, 5, 6]])), dim=-1)
    torch.testing.assert_close(result.logits, model.logit_scale.detach().exp() * u @ v.T, atol=1e-5, rtol=1e-4)
