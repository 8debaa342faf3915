"""One reading of a ``layers`` argument (:func:`analysis.base.arguments.resolve_layers`): every layer
for ``None``, the layers asked in the order asked, each once, negative indices from the end, and
one typed error for the rest. Analyses that need the forward order (a record's layers, which
rollout composes) sort it; the others keep the order asked."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from analysis import AnalysisError, capture_attention, capture_tokens
from analysis.base.arguments import resolve_layers
from analysis.circuits.attribution import head_output_vectors
from conftest import random_pixels


def reference_resolve(layers, num_layers: int) -> tuple[int, ...]:
    """The rule written out: an explicit loop, first occurrence wins."""
    if layers is None:
        return tuple(range(num_layers))
    if not isinstance(layers, (list, tuple)):
        layers = [layers]
    kept: list[int] = []
    for layer in layers:
        index = int(layer) + num_layers if int(layer) < 0 else int(layer)
        if index not in kept:
            kept.append(index)
    return tuple(kept)


@pytest.mark.parametrize(
    "layers", [None, 3, -1, [2, 0], [-1, 0, -1, 2], (1, 1, 1), [np.int64(4), -5], range(5, -1, -2)]
)
def test_the_layers_asked_in_the_order_asked_each_once(layers):
    asked = list(layers) if isinstance(layers, range) else layers
    assert resolve_layers(layers, 6) == reference_resolve(asked, 6)


@pytest.mark.parametrize(
    "layers, message",
    [
        ([], "layers is empty"),
        ("0", "layers must be None"),
        (b"1", "layers must be None"),
        (1.5, "layers must be None"),
        ([6], "layer=6 does not exist"),
        ([-7], "layer=-7 does not exist"),
        ([True], "must be an integer"),
        ([0, "1"], "must be an integer"),
    ],
)
def test_bad_layers_are_one_typed_error(layers, message):
    with pytest.raises(AnalysisError, match=message):
        resolve_layers(layers, 6)


def test_capture_attention_keeps_the_forward_order_and_tokens_the_order_asked(vits):
    """A record's maps run in the forward order (rollout composes them so); captured tokens come
    in the order asked. Both resolve the same layers."""
    vit = vits["class_token"]  # 3 layers
    pixels = random_pixels(vit, batch=1)
    record = capture_attention(vit, pixels, layers=[-1, 0, 2], exact_logits=True)  # the fused kernel elsewhere
    assert record.layers == (0, 2)
    full = capture_attention(vit, pixels, exact_logits=True)
    torch.testing.assert_close(record.attentions, full.attentions[[0, 2]], rtol=0, atol=0)
    tokens = capture_tokens(vit, pixels, kind="token", layers=[-1, 0, 2])
    assert tokens.layers == (2, 0)
    every = capture_tokens(vit, pixels, kind="token")
    torch.testing.assert_close(tokens.tokens, every.tokens[[2, 0]], rtol=0, atol=0)


def test_head_output_vectors_come_in_the_order_asked(vits):
    vit = vits["class_token"]
    pixels = random_pixels(vit, batch=2)
    every = head_output_vectors(vit, pixels)  # (B, L, heads, outputs)
    asked = head_output_vectors(vit, pixels, [-1, 0, 2])
    assert asked.shape[1] == 2
    torch.testing.assert_close(asked, every[:, [2, 0]], rtol=0, atol=0)
    torch.testing.assert_close(head_output_vectors(vit, pixels, 1), every[:, [1]], rtol=0, atol=0)
