"""The open_clip loader against the real ``open_clip`` package: a tiny random open_clip ViT-CLIP,
registered from a config written here, saved to a local checkpoint and loaded through
``load_clip("open_clip:<arch>", checkpoint=...)``. No network: the tokenizer is open_clip's own, with
the BPE vocabulary the package bundles.

References are open_clip's own outputs (``model(image, text)``, ``encode_image``) and, for the
attention, softmax(QKᵀ/√d) computed here from the open_clip block's own ``in_proj`` weights.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

open_clip = pytest.importorskip("open_clip", reason='a tool of the test extra: pip install -e ".[test]"')

from analysis import capture_attention  # noqa: E402
from analysis.model.loading.two_tower import load_clip  # noqa: E402
from analysis.text.explain import explain_text  # noqa: E402
from analysis.text.prompts import image_embeddings  # noqa: E402
from analysis.text.zero_shot import zero_shot  # noqa: E402

ARCH = "vit-explorer-tiny-clip"
PROMPTS = ["a photo of a red star", "a blue circle on grass"]
CONFIG = {
    "embed_dim": 32,
    "vision_cfg": {
        "image_size": 32,
        "layers": 2,
        "width": 64,
        "head_width": 32,
        "patch_size": 8,
        "ls_init_value": 0.5,
    },  # open_clip's LayerScale (ls_1, ls_2) in the path
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(open_clip model, its tokenizer, the checkpoint file): random weights, eval mode."""
    folder = tmp_path_factory.mktemp("open_clip")
    (folder / f"{ARCH}.json").write_text(json.dumps(CONFIG))
    open_clip.add_model_config(folder / f"{ARCH}.json")
    torch.manual_seed(0)
    model = open_clip.create_model(ARCH, pretrained=None).eval()
    with torch.no_grad():  # a non-trivial temperature, so the scale is checked
        model.logit_scale.fill_(math.log(20.0))
    checkpoint = folder / "tiny.pt"
    torch.save(model.state_dict(), checkpoint)
    return model, open_clip.get_tokenizer(ARCH), checkpoint


@pytest.fixture(scope="module")
def loaded(tiny):
    return load_clip(f"open_clip:{ARCH}", checkpoint=str(tiny[2]), device="cpu")


def _pixels(batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def test_zero_shot_is_open_clips_own_softmax(tiny, loaded):
    model, tokenizer, _ = tiny
    pixels = _pixels()
    with torch.no_grad():
        image_features, text_features, scale = model(pixels, tokenizer(PROMPTS))[:3]
        expected = scale * image_features @ text_features.T  # (B, P); model() returns normalised features
    result = zero_shot(loaded, pixels, PROMPTS)
    assert loaded.probability == "softmax"
    torch.testing.assert_close(result.logits, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(result.probabilities, expected.softmax(-1), atol=1e-5, rtol=1e-5)


def test_the_image_tower_gives_encode_images_features(tiny, loaded):
    model, _, _ = tiny
    pixels = _pixels()
    with torch.no_grad():
        expected = model.encode_image(pixels)  # (B, E), unnormalised
        ours = loaded.image.model(pixels)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(image_embeddings(loaded, pixels), expected, atol=1e-5, rtol=1e-5)


def _last_layer_attention(model, pixels: torch.Tensor) -> torch.Tensor:
    """(B, heads, T, T): softmax(QKᵀ/√d) of open_clip's last block, from its own in_proj, by hand."""
    visual = model.visual
    captured = {}
    last = visual.transformer.resblocks[-1]
    handle = last.ln_1.register_forward_hook(lambda module, args, out: captured.__setitem__("x", out))
    with torch.no_grad():
        model.encode_image(pixels)
    handle.remove()
    x = captured["x"]  # (B, T, D) (open_clip runs batch-first)
    if x.shape[0] != pixels.shape[0]:
        x = x.transpose(0, 1)
    attention = last.attn
    heads, width = attention.num_heads, x.shape[-1]
    q, k, _ = torch.nn.functional.linear(x, attention.in_proj_weight, attention.in_proj_bias).split(width, dim=-1)
    q = q.reshape(*x.shape[:2], heads, -1).transpose(1, 2)
    k = k.reshape(*x.shape[:2], heads, -1).transpose(1, 2)
    scores = torch.zeros(x.shape[0], heads, x.shape[1], x.shape[1])
    for b in range(x.shape[0]):
        for h in range(heads):
            scores[b, h] = q[b, h] @ k[b, h].T / math.sqrt(q.shape[-1])
    return scores.softmax(-1)


def test_capture_attention_is_open_clips_own_attention(tiny, loaded):
    model, _, _ = tiny
    pixels = _pixels()
    record = capture_attention(loaded.image, pixels, layers=[1])
    expected = _last_layer_attention(model, pixels)
    assert expected.shape == (2, 2, 1 + 16, 1 + 16)  # 64 / 32 heads; a class token and 4x4 patches
    torch.testing.assert_close(record.attentions[0].float(), expected, atol=1e-5, rtol=1e-5)


def test_chefer_runs_on_the_real_open_clip(loaded):
    explanation = explain_text(loaded, _pixels(1), PROMPTS[0], method="chefer")
    assert explanation.maps.shape == (1, 4, 4)
    assert torch.isfinite(explanation.maps).all()
    assert explanation.maps.abs().sum() > 0


def test_the_model_object_itself_loads_the_same(tiny, loaded):
    """``load_clip(model)`` (an open_clip object, no tokenizer): the same image embeddings."""
    model, tokenizer, _ = tiny
    pixels = _pixels()
    from_object = load_clip(model, device="cpu")
    torch.testing.assert_close(
        image_embeddings(from_object, pixels), image_embeddings(loaded, pixels), atol=1e-6, rtol=1e-6
    )
    ids = tokenizer(PROMPTS)
    torch.testing.assert_close(
        zero_shot(from_object, pixels, ids).logits, zero_shot(loaded, pixels, PROMPTS).logits, atol=1e-5, rtol=1e-5
    )


def test_an_unknown_open_clip_architecture_is_a_typed_error():
    from analysis.base.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="open_clip could not build 'no-such-architecture'"):
        load_clip("open_clip:no-such-architecture", device="cpu")
