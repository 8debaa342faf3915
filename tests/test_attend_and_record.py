"""``attend_and_record``, the capture's replacement of a fused attention call, against explicit
loops: ``P = softmax(scale·q·kᵀ + M)`` row by row and ``P·v``, on the strided q, k, v a fused
call receives (views of one permuted qkv tensor), one image at a time and in pieces of several."""

from __future__ import annotations

import math

import pytest
import torch

import analysis.model.adapters.probabilities as probabilities
from analysis.model.adapters.base import AttentionInputs


def _explicit(q, k, v, scale, mask):
    """Loops over images, heads and query rows; softmax written out."""
    batch, heads, tokens, _ = q.shape
    probs = torch.empty(batch, heads, tokens, tokens, dtype=torch.float64)
    output = torch.empty(batch, heads, tokens, v.shape[-1], dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            kv_head = h // (heads // k.shape[1])
            for i in range(tokens):
                scores = [scale * float(q[b, h, i] @ k[b, kv_head, j]) for j in range(tokens)]
                if mask is not None:
                    scores = [s + float(mask[b if mask.shape[0] > 1 else 0, 0, i, j]) for j, s in enumerate(scores)]
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights)
                probs[b, h, i] = torch.tensor([w / total for w in weights], dtype=torch.float64)
                output[b, h, i] = probs[b, h, i] @ v[b, kv_head].double()
    return probs, output


@pytest.mark.parametrize("one_image_bytes", [1, 1 << 40], ids=["one image at a time", "pieces of several images"])
@pytest.mark.parametrize("kv_heads", [4, 2], ids=["multi-head", "grouped-query"])
@pytest.mark.parametrize("with_mask", [False, True], ids=["no mask", "per-image float mask"])
def test_probabilities_and_output_equal_explicit_loops_on_strided_inputs(
    monkeypatch, one_image_bytes, kv_heads, with_mask
):
    monkeypatch.setattr(probabilities, "_ONE_IMAGE_BYTES", one_image_bytes)
    monkeypatch.setattr(probabilities, "_CHUNK_BYTES", 4 * 4 * 7 * 7 * 2)  # two images a piece
    generator = torch.Generator().manual_seed(0)
    batch, tokens, heads, dim = 5, 7, 4, 3
    q = torch.randn(batch, tokens, heads, dim, generator=generator).permute(0, 2, 1, 3)  # strided, as timm's
    kv = torch.randn(batch, tokens, 2, kv_heads, dim, generator=generator).permute(2, 0, 3, 1, 4)
    k, v = kv.unbind(0)
    mask = torch.randn(batch, 1, tokens, tokens, generator=generator) if with_mask else None
    assert not q.is_contiguous() and not k.is_contiguous()
    scale = dim**-0.5
    probs, output = probabilities.attend_and_record(AttentionInputs(q=q, k=k, v=v, mask=mask, scale=scale))
    expected_probs, expected_output = _explicit(q, k, v, scale, mask)
    torch.testing.assert_close(probs.double(), expected_probs, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(output.double(), expected_output, atol=1e-6, rtol=1e-5)
