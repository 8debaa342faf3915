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
    tokens = clip.tokenizer(prompts, padding="max_length" if kind == "siglip" else True, truncation=True,
                            max_length=text_models.CONTEXT, return_tensors="pt")
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
    torch.testing.assert_close(torch.nn.functional.normalize(encoding.embeddings, dim=-1), out.text_embeds,
                               atol=1e-5, rtol=1e-4)
    # token ids give the same embeddings without a tokenizer
    from_ids = clip.encode_text(encoding.token_ids) if kind == "siglip" else None
    if from_ids is not None:
        torch.testing.assert_close(from_ids.embeddings, encoding.embeddings)
        assert from_ids.prompts is None


def test_a_prompt_longer_than_the_text_tower_is_truncated_with_a_notice(pair):
    _, clip, _ = pair
    long_prompt = "a photo of the big red star on the left and the small blue dog on the right"
    with pytest.warns(UserWarning, match="truncated"):
        encoding = clip.encode_text(["a red star", long_prompt])
    assert len(encoding.notices) == 1 and "truncated" in encoding.notices[0] and str(text_models.CONTEXT) in encoding.notices[0]
    ids = encoding.token_ids[1]
    assert len(ids) == text_models.CONTEXT and int(ids[-1]) == text_models.END  # the end token, which CLIP pools, is kept


@pytest.mark.parametrize("bad", ["", "   ", [], ["a red star", ""]])
def test_an_empty_prompt_is_a_typed_error(pair, bad):
    _, clip, _ = pair
    with pytest.raises(TextPromptError, match="empty|No prompt"):
        clip.encode_text(bad)


def test_token_ids_longer_than_the_text_tower_are_a_typed_error(pair):
    _, clip, _ = pair
    with pytest.raises(TextPromptError, match="at most"):
        clip.encode_text(torch.ones(1, text_models.CONTEXT + 1, dtype=torch.long))


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

    vision = transformers.CLIPVisionModelWithProjection(transformers.CLIPVisionConfig(**text_models.VISION, projection_dim=16))
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
