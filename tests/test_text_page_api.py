"""What the Text prompts page reads from ``analysis.text`` beyond the issue's API: each head's own
patch map of the decomposition, the image–text score as a perturbation curve's value, prompts
from a template and head_texts' progress. Tiny random CLIP / SigLIP (tests/text_models.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from analysis import TextPromptError
from analysis.base.image_ops import baseline_pixels
from analysis.faithfulness import perturbation_curve
from analysis.text import explain_text, head_texts, prompts_from_template, score_value, text_decomposition
from test_text_prompts import PROMPTS, _pixels, pair  # noqa: F401 - fixture


def test_each_heads_patch_map_is_its_term_by_source_patch_and_they_sum_to_the_decomposition_map(pair):
    _, clip, _ = pair
    pixels = _pixels(2, seed=3)
    decomposition = text_decomposition(clip, pixels, PROMPTS[1])
    maps = decomposition.head_maps()  # (B, L, heads, gh, gw)
    spec = clip.spec
    gh, gw = spec.grid_size
    prefix = spec.num_prefix_tokens
    by_source = decomposition.terms.heads_by_source
    batch, layers, heads, _ = by_source.shape
    assert maps.shape == (batch, layers, heads, gh, gw)
    for b in range(batch):  # the slow reading: token prefix + r·gw + c is patch (r, c)
        for layer in range(layers):
            for head in range(heads):
                for r in range(gh):
                    for c in range(gw):
                        assert float(maps[b, layer, head, r, c]) == pytest.approx(
                            float(by_source[b, layer, head, prefix + r * gw + c]), abs=1e-7
                        )
    explanation = explain_text(clip, pixels, PROMPTS[1], method="decomposition")
    torch.testing.assert_close(maps.sum((1, 2)), explanation.maps, atol=1e-5, rtol=1e-4)
    # a head's map plus its share read from the prefix tokens is its term in the heads x layers table
    torch.testing.assert_close(
        maps.sum((-2, -1)) + by_source[..., :prefix].sum(-1), decomposition.heads(), atol=1e-5, rtol=1e-4
    )


def test_score_value_makes_perturbation_curves_of_the_image_text_score(pair):
    """Each point of the curve is the model's own score of the perturbed image, recomputed here
    from the perturbed pixels with the logits rule written out."""
    _, clip, _ = pair
    pixels = _pixels(1, seed=4)
    text = clip.encode_text(PROMPTS[0]).embeddings
    saliency = torch.rand(clip.spec.grid_size, generator=torch.Generator().manual_seed(0))
    fractions, deletion = perturbation_curve(
        clip.image, pixels, saliency, 0, mode="deletion", steps=4, value=score_value(clip, text)
    )
    order = torch.argsort(saliency.reshape(-1), descending=True, stable=True)  # most salient first
    reference = baseline_pixels(clip.image, pixels, "mean")[0]
    (ph, pw), (_, gw) = clip.spec.patch_size, clip.spec.grid_size
    batch = []
    for fraction in fractions:  # the perturbed images by hand: the first round(f·N) patches replaced
        image = pixels[0].clone()
        for patch in order[: round(fraction * clip.spec.num_patches)].tolist():
            r, c = divmod(patch, gw)
            cell = (slice(None), slice(r * ph, (r + 1) * ph), slice(c * pw, (c + 1) * pw))
            image[cell] = reference[cell]
        batch.append(image)
    batch = torch.stack(batch)
    with torch.no_grad():
        u = clip.image.model(batch)
    v = text[0]
    expected = clip.logit_scale * (u @ v) / (u.norm(dim=-1) * v.norm()) + (clip.logit_bias or 0.0)
    np.testing.assert_allclose(deletion, expected.numpy(), rtol=1e-4, atol=1e-4)
    unperturbed = explain_text(clip, pixels, PROMPTS[0], method="patch_text").scores
    assert deletion[0] == pytest.approx(float(unperturbed[0]), abs=1e-4)


def test_prompts_from_a_template_and_bad_templates():
    assert prompts_from_template("a photo of a {}", ["star", " ring ", "", "bar"]) == [
        "a photo of a star",
        "a photo of a ring",
        "a photo of a bar",
    ]
    with pytest.raises(TextPromptError, match="exactly one"):
        prompts_from_template("a photo", ["star"])
    with pytest.raises(TextPromptError, match="exactly one"):
        prompts_from_template("{} and {}", ["star"])
    with pytest.raises(TextPromptError, match="No class name"):
        prompts_from_template("a {}", [" ", ""])


def test_head_texts_reports_progress_by_batches_and_gives_the_same_result(pair):
    _, clip, _ = pair
    pixels = _pixels(5, seed=6)
    vocabulary = ["a red star", "a blue dog", "the green circle", "a small cat"]
    calls = []
    reported = head_texts(
        clip,
        pixels,
        vocabulary,
        texts_per_head=2,
        batch_size=2,
        progress=lambda done, total: calls.append((done, total)),
    )
    assert calls == [(2, 5), (4, 5), (5, 5)]
    plain = head_texts(clip, pixels, vocabulary, texts_per_head=2, batch_size=5)
    assert [d.texts for d in reported.heads] == [d.texts for d in plain.heads]
    np.testing.assert_allclose([d.shares for d in reported.heads], [d.shares for d in plain.heads], rtol=1e-6)
