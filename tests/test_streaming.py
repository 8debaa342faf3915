"""Streaming dataset statistics give the same numbers as the plain path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from analysis import AnalysisError, capture_attention, dataset_attention_distance, mean_attention_distance
from conftest import make_vit


def _images(count: int, seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 255, (40 + 7 * i, 50 + 3 * i, 3), dtype=np.uint8)) for i in range(count)]


@pytest.fixture(scope="module")
def vit():
    return make_vit("registers")


def _plain(vit, images) -> torch.Tensor:
    pixels = torch.cat([vit.preprocess(image) for image in images])
    return mean_attention_distance(capture_attention(vit, pixels), per_image=True).mean(0)


@pytest.mark.parametrize("batch_size", [1, 3, 32])
def test_streamed_distance_equals_plain_path(vit, batch_size):
    images = _images(7)
    calls = []
    got = dataset_attention_distance(vit, images, batch_size=batch_size, progress=lambda d, t: calls.append((d, t)))
    torch.testing.assert_close(got, _plain(vit, images), atol=1e-9, rtol=1e-9)
    assert calls[-1] == (7, 7) and len(calls) == -(-7 // batch_size)


def test_streamed_distance_without_renormalising(vit):
    images = _images(3)
    pixels = torch.cat([vit.preprocess(image) for image in images])
    expected = mean_attention_distance(capture_attention(vit, pixels), renormalize=False)
    got = dataset_attention_distance(vit, images, batch_size=2, renormalize=False)
    torch.testing.assert_close(got, expected, atol=1e-9, rtol=1e-9)


def test_paths_bytes_and_generators(vit, tmp_path):
    images = _images(4, seed=3)
    paths = []
    for i, image in enumerate(images):
        path = tmp_path / f"{i}.png"
        image.save(path)
        paths.append(path)
    blobs = [p.read_bytes() for p in paths]
    expected = _plain(vit, images)
    calls = []
    from_paths = dataset_attention_distance(
        vit, (p for p in paths), batch_size=3, progress=lambda d, t: calls.append((d, t))
    )
    torch.testing.assert_close(from_paths, expected, atol=1e-9, rtol=1e-9)
    assert calls == [(3, None), (4, None)]  # no length: total unknown
    torch.testing.assert_close(dataset_attention_distance(vit, blobs, batch_size=2), expected, atol=1e-9, rtol=1e-9)


def test_the_maps_are_never_stored(vit, monkeypatch):
    """Each layer's probabilities are reduced in the hook: one layer of one batch at a time
    (all rows, whose product with v is the layer's output, then the patch-query rows as a
    view), and nothing of shape (L, B, ...) is allocated."""
    import analysis.model.adapters.probabilities as capture_module  # the one softmax rule, and attend_and_record

    seen = []
    original = capture_module.attention_probabilities

    def spy(q, k, scale, rows=None, **kwargs):
        out = original(q, k, scale, rows, **kwargs)
        seen.append(tuple(out.shape))
        return out

    monkeypatch.setattr(capture_module, "attention_probabilities", spy)
    dataset_attention_distance(vit, _images(5), batch_size=2)
    spec = vit.spec
    assert len(seen) == spec.num_layers * 3
    assert all(shape[0] <= 2 and shape[2] == shape[3] == spec.num_tokens for shape in seen)


def test_empty_input_and_bad_batch(vit):
    with pytest.raises(AnalysisError, match="No images"):
        dataset_attention_distance(vit, [])
    with pytest.raises(AnalysisError, match="batch_size"):
        dataset_attention_distance(vit, _images(1), batch_size=0)


def test_a_bad_file_in_the_set_is_reported(vit):
    from analysis import ImageLoadError

    with pytest.raises(ImageLoadError):
        dataset_attention_distance(vit, [b"garbage"], batch_size=2)


def test_out_of_memory_halves_the_batch_then_falls_back_to_cpu():
    from analysis.base.oom import run_with_oom_fallback

    seen = []

    def run(batch):
        seen.append(batch.shape[0])
        if batch.shape[0] > 2 or int(batch[0]) == 6:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return batch.sum(0, keepdim=True)

    batch = torch.arange(8, dtype=torch.float64).view(8, 1)
    with pytest.warns(RuntimeWarning, match="falling back to the CPU"):
        pieces = run_with_oom_fallback(run, batch, cpu_fallback=lambda piece: piece.sum(0, keepdim=True) * 1.0)
    assert [p.item() for p in pieces] == [0 + 1, 2 + 3, 4 + 5, 6, 7]  # batch order kept
    assert seen[:3] == [8, 4, 2]
    with pytest.raises(RuntimeError, match="other"):
        run_with_oom_fallback(lambda b: (_ for _ in ()).throw(RuntimeError("other")), batch, None)


def test_capture_recovers_from_out_of_memory_with_identical_results(out_of_memory_above):
    """A capture whose forward runs out of memory above batch 2 splits the batch: same numbers."""
    vit = make_vit("distilled")
    pixels = torch.randn(5, 3, 64, 64)
    expected = capture_attention(vit, pixels, layers=[1, 0])
    batches = out_of_memory_above(2)
    got = capture_attention(vit, pixels, layers=[1, 0])
    assert batches == [5, 2, 3, 1, 2] and got.layers == expected.layers == (0, 1)
    torch.testing.assert_close(got.attentions, expected.attentions, atol=1e-6, rtol=0)
    torch.testing.assert_close(got.logits, expected.logits, atol=1e-5, rtol=1e-5)
    assert vit.cpu_model() is vit.model  # on the CPU there is no second copy


def test_skip_leaves_bad_images_out_and_says_why(vit):
    images = _images(5, seed=4)
    good = [images[0], images[2], images[4]]
    mixed = [images[0], b"not an image", images[2], b"", images[4]]
    skipped: list = []
    calls = []
    got = dataset_attention_distance(
        vit, mixed, batch_size=2, on_error="skip", skipped=skipped, progress=lambda d, t: calls.append((d, t))
    )
    torch.testing.assert_close(got, _plain(vit, good), atol=1e-9, rtol=1e-9)
    assert [s.index for s in skipped] == [1, 3]
    assert all(isinstance(s.reason, str) and s.reason for s in skipped)
    assert calls[-1] == (5, 5)  # skipped images count as processed for progress
    per_image = dataset_attention_distance(vit, mixed, batch_size=2, on_error="skip", skipped=[], per_image=True)
    assert per_image.shape == (3, vit.spec.num_layers, vit.spec.num_heads)
    torch.testing.assert_close(per_image.mean(0), got, atol=1e-12, rtol=1e-12)
    with pytest.warns(RuntimeWarning, match="2 of 5 images were skipped"):
        dataset_attention_distance(vit, mixed, batch_size=2, on_error="skip")
    with pytest.raises(AnalysisError, match="None of the 2 images"):
        dataset_attention_distance(vit, [b"x", b"y"], on_error="skip", skipped=[])
    with pytest.raises(AnalysisError, match="on_error"):
        dataset_attention_distance(vit, images, on_error="ignore")


def test_streaming_refuses_a_layer_whose_hook_never_fired(vit, monkeypatch):
    """If a block's attention is never reported, the mean must not silently include zeros."""
    import analysis.engine.activations.run as engine

    real_block_hooks, last = engine._block_hooks, vit.spec.num_layers - 1

    def block_hooks_missing_last_layer(layer, *args, **kwargs):
        if layer != last:
            real_block_hooks(layer, *args, **kwargs)

    monkeypatch.setattr(engine, "_block_hooks", block_hooks_missing_last_layer)
    with pytest.raises(AnalysisError, match=rf"layers \[{vit.spec.num_layers - 1}\] was never computed"):
        dataset_attention_distance(vit, _images(2), batch_size=2)
