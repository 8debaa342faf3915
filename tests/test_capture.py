"""Attention capture: exact against a hand-computed reference, for every token layout."""

from __future__ import annotations

import copy
import threading
from unittest import mock

import pytest
import torch

from analysis import AnalysisError, capture_attention, load_vit
from conftest import make_vit, random_pixels
from reference import reference_attention


def _hooks_everywhere(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_capture_matches_manual_softmax_for_every_layout(any_vit):
    pixels = random_pixels(any_vit)
    record = capture_attention(any_vit, pixels)
    expected = reference_attention(any_vit.model, pixels)  # (L, B, heads, T, T)
    spec = any_vit.spec
    assert record.attentions.shape == (spec.num_layers, 2, spec.num_heads, spec.num_tokens, spec.num_tokens)
    torch.testing.assert_close(record.attentions.double(), expected, atol=2e-6, rtol=1e-4)


def test_rows_are_probabilities(any_vit):
    record = capture_attention(any_vit, random_pixels(any_vit))
    assert (record.attentions >= 0).all()
    torch.testing.assert_close(record.attentions.sum(-1), torch.ones(record.attentions.shape[:-1]), atol=1e-5, rtol=0)


def test_logits_identical_to_uncaptured_forward(any_vit):
    """Default: the output of every attention call is P·v from the recorded P (the scores
    computed once), equal to the fused kernel's to float rounding; exact_logits=True runs the
    fused kernel beside the capture and is bit-identical. The maps are the same either way."""
    pixels = random_pixels(any_vit)
    with torch.no_grad():
        plain = any_vit.model(pixels)
    record = capture_attention(any_vit, pixels)
    torch.testing.assert_close(record.logits, plain, rtol=1e-5, atol=1e-5)
    exact = capture_attention(any_vit, pixels, exact_logits=True)
    assert torch.equal(exact.logits, plain)
    torch.testing.assert_close(exact.attentions, record.attentions, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fused", [True, False])
def test_correct_whatever_the_fused_attention_setting(fused):
    vit = make_vit("class_token")
    for block in vit.model.blocks:  # per-module flag: the global set_fused_attn cannot change built models
        block.attn.fused_attn = fused
    pixels = random_pixels(vit)
    record = capture_attention(vit, pixels)
    torch.testing.assert_close(record.attentions.double(), reference_attention(vit.model, pixels), atol=2e-6, rtol=1e-4)


def test_token_layouts_are_read_from_the_model(vits):
    assert vits["registers"].spec.num_prefix_tokens == 5  # class + 4 registers
    assert vits["distilled"].spec.num_prefix_tokens == 2  # class + distillation
    assert vits["no_class_token"].spec.num_prefix_tokens == 0
    assert not vits["no_class_token"].spec.has_class_token
    assert vits["non_square"].spec.grid_size == (3, 5)
    assert vits["registers"].spec.patch_size == (14, 14)
    assert vits["registers"].spec.grid_size == (4, 4)


def test_dynamic_img_size_uses_the_input_grid():
    vit = make_vit("class_token", dynamic_img_size=True)
    pixels = torch.randn(1, 3, 48, 96)
    record = capture_attention(vit, pixels)
    assert record.spec.grid_size == (3, 6)
    assert record.attentions.shape[-1] == 1 + 18
    torch.testing.assert_close(record.attentions.double(), reference_attention(vit.model, pixels), atol=2e-6, rtol=1e-4)


def test_dynamic_img_size_refuses_partial_patches_and_pads_when_asked():
    vit = make_vit("class_token", dynamic_img_size=True)
    with pytest.raises(AnalysisError, match="whole number"):
        capture_attention(vit, torch.randn(1, 3, 48, 50))
    padded = make_vit("class_token", dynamic_img_size=True, dynamic_img_pad=True)
    pixels = torch.randn(1, 3, 40, 50)  # padded by timm to 48 x 64: a 3 x 4 grid
    record = capture_attention(padded, pixels)
    assert record.spec.grid_size == (3, 4) and record.attentions.shape[-1] == 13
    torch.testing.assert_close(
        record.attentions.double(), reference_attention(padded.model, pixels), atol=2e-6, rtol=1e-4
    )


def test_bad_precision_is_typed(vits):
    with pytest.raises(AnalysisError, match="precision"):
        capture_attention(vits["class_token"], random_pixels(vits["class_token"]), precision="fp8")


def test_wrong_input_size_is_a_clear_error(vits):
    with pytest.raises(AnalysisError, match="expects 64x64"):
        capture_attention(vits["class_token"], torch.randn(1, 3, 32, 32))


def test_layer_subset_and_query_rows(vits):
    vit = vits["registers"]
    pixels = random_pixels(vit)
    full = capture_attention(vit, pixels)
    subset = capture_attention(vit, pixels, layers=[-1], query_tokens=[0, 7], dtype=torch.float16)
    assert subset.layers == (1,)
    assert subset.attentions.dtype == torch.float16
    assert subset.attentions.shape == (1, 2, vit.spec.num_heads, 2, vit.spec.num_tokens)
    torch.testing.assert_close(subset.attentions.float(), full.attentions[1:, :, :, [0, 7]], atol=1e-3, rtol=0)
    torch.testing.assert_close(subset.logits, full.logits, rtol=1e-5, atol=1e-5)


def test_hooks_are_removed_after_success_and_failure(vits):
    vit = vits["class_token"]
    before = _hooks_everywhere(vit.model)
    capture_attention(vit, random_pixels(vit))
    assert _hooks_everywhere(vit.model) == before
    with mock.patch.object(vit.model.blocks[1], "forward", side_effect=RuntimeError("boom")):
        with pytest.raises(RuntimeError, match="boom"):
            capture_attention(vit, random_pixels(vit))
    assert _hooks_everywhere(vit.model) == before == 0
    assert not any("capture" in name for m in vit.model.modules() for name in vars(m))


def test_eight_threads_on_one_shared_model_get_their_own_attention(vits):
    vit = vits["distilled"]
    inputs = [random_pixels(vit, batch=1, seed=seed) for seed in range(8)]
    expected = [capture_attention(vit, x) for x in inputs]
    results: list = [None] * 8
    errors: list = []
    barrier = threading.Barrier(8)

    def work(index: int) -> None:
        try:
            barrier.wait()
            for _ in range(3):
                results[index] = capture_attention(vit, inputs[index])
                # an uncaptured forward from this thread must not disturb anyone's capture
                with torch.no_grad():
                    vit.model(inputs[index])
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for got, want in zip(results, expected):
        torch.testing.assert_close(got.attentions, want.attentions, atol=1e-6, rtol=0)
        torch.testing.assert_close(got.logits, want.logits)
    assert _hooks_everywhere(vit.model) == 0


def test_attention_differs_between_inputs(vits):
    """Guards the thread test: different inputs really give different maps."""
    vit = vits["distilled"]
    a = capture_attention(vit, random_pixels(vit, batch=1, seed=0)).attentions
    b = capture_attention(vit, random_pixels(vit, batch=1, seed=1)).attentions
    assert (a - b).abs().max() > 1e-3


def test_non_vit_is_refused_with_an_explanation():
    from analysis import UnsupportedModelError

    with pytest.raises(UnsupportedModelError, match="not a Vision Transformer"):
        load_vit("resnet18", pretrained=False)


def test_capture_does_not_modify_the_model(vits):
    vit = vits["no_embed_class"]
    snapshot = copy.deepcopy(vit.model.state_dict())
    capture_attention(vit, random_pixels(vit))
    for key, value in vit.model.state_dict().items():
        assert torch.equal(value, snapshot[key])


def test_a_layer_whose_tap_never_fired_is_refused(vits, monkeypatch):
    """After every capture, a layer the taps never reported must not come back as zeros: the
    activation engine (capture_attention, capture_tokens, run_with_cache, and its gradient mode
    behind explain) refuses it, naming the layer."""
    import analysis
    import analysis.engine.activations.run as engine

    vit = vits["class_token"]
    last = vit.spec.num_layers - 1
    pixels = random_pixels(vit)
    real_block_hooks = engine._block_hooks

    def block_hooks_missing_last_layer(layer, *args, **kwargs):
        if layer != last:
            real_block_hooks(layer, *args, **kwargs)

    monkeypatch.setattr(engine, "_block_hooks", block_hooks_missing_last_layer)
    with pytest.raises(AnalysisError, match=rf"never reached \['blocks\.{last}\.attn\.probs'\]"):
        capture_attention(vit, pixels)
    with pytest.raises(AnalysisError, match=rf"never reached \['blocks\.{last}\.resid_post'\]"):
        analysis.capture_tokens(vit, pixels)
    with pytest.raises(AnalysisError, match=rf"never reached \['blocks\.{last}\.attn\.probs'\]"):
        analysis.explain(vit, pixels, method="chefer")
