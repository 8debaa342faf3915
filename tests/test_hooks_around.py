"""The engine's points around a call it does not make (:func:`analysis.engine.activations.run.hooks_around`):
``embed.out`` (token drop), ``blocks.{i}.attn.rope`` (rotary features), ``blocks.{i}.attn.probs``
over given sites (the MAE encoder)."""

from __future__ import annotations

import pytest
import torch

from analysis.base.errors import AnalysisError
from analysis.engine.activations.run import AROUND_POINTS, StopForward, hooks_around
from conftest import make_vit, random_pixels
from families import family_pixels, load_family
from reference import reference_attention


@pytest.fixture(scope="module")
def vit():
    return make_vit("class_token")


def _hook_count(model: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_embed_out_sees_the_sequence_after_the_position_embedding_and_may_shorten_it(vit):
    pixels = random_pixels(vit, batch=2)
    model = vit.model
    with torch.no_grad():
        expected_tokens = model.patch_drop(model._pos_embed(model.patch_embed(pixels)))  # (B, T, D)
    seen = []
    with torch.no_grad(), hooks_around(model, {"embed.out": lambda x: seen.append(x.clone())}):
        logits = model(pixels)
    assert torch.equal(seen[0], expected_tokens)
    with torch.no_grad():
        assert torch.equal(logits, model(pixels))  # read only: the forward is unchanged
    keep = [0, 1, 5, 9]  # the class token and three patches

    def shorter(x):
        return x[:, keep]

    with torch.no_grad(), hooks_around(model, {"embed.out": shorter}):
        short = model(pixels)
    with torch.no_grad():  # reference: the blocks, norm and head on those tokens
        x = model.norm_pre(expected_tokens[:, keep])
        for block in model.blocks:
            x = block(x)
        reference = model.forward_head(model.norm(x))
    torch.testing.assert_close(short, reference, atol=1e-5, rtol=1e-5)
    assert _hook_count(model) == 0


def test_attention_probabilities_over_given_sites_equal_the_reference(vit):
    from analysis.model.adapters import block_sites

    pixels = random_pixels(vit, batch=1, seed=4)
    maps = {}
    hooks = {
        f"blocks.{i}.attn.probs": (lambda p, i=i: maps.__setitem__(i, p.clone())) for i in range(vit.spec.num_layers)
    }
    with torch.no_grad(), hooks_around(vit.model, hooks, sites=block_sites(vit.model)):
        vit.model(pixels)
    expected = reference_attention(vit.model, pixels)  # (L, B, heads, T, T) float64
    torch.testing.assert_close(
        torch.stack([maps[i] for i in range(vit.spec.num_layers)]).double(), expected, atol=2e-6, rtol=1e-4
    )
    assert _hook_count(vit.model) == 0


def test_stop_forward_ends_the_pass_and_every_hook_is_removed():
    vit = load_family("rope_reg1_gap")
    ran = []
    handle = vit.model.blocks[1].register_forward_pre_hook(lambda m, a: ran.append(1))
    try:

        def stop(rope):
            raise StopForward

        with torch.no_grad(), hooks_around(vit.model, {"blocks.0.attn.rope": stop}):
            vit.model(family_pixels("rope_reg1_gap", batch=1))
    finally:
        handle.remove()
    assert ran == []  # block 1 never ran
    assert _hook_count(vit.model) == 0


def test_names_and_read_only_points_are_checked(vit):
    pixels = random_pixels(vit, batch=1)
    with (
        pytest.raises(AnalysisError, match="not a point of hooks_around"),
        hooks_around(vit.model, {"blocks.0.resid_pre": print}),
    ):
        pass
    with pytest.raises(AnalysisError, match="blocks 0..2"), hooks_around(vit.model, {"blocks.7.attn.probs": print}):
        pass
    with (
        pytest.raises(AnalysisError, match="returned a tensor"),
        torch.no_grad(),
        hooks_around(vit.model, {"blocks.1.attn.probs": lambda p: p * 0}),
    ):
        vit.model(pixels)
    with pytest.raises(AnalysisError, match="patch_drop"), hooks_around(torch.nn.Linear(2, 2), {"embed.out": print}):
        pass
    assert _hook_count(vit.model) == 0
    assert set(AROUND_POINTS) == {"embed.out", "blocks.{i}.attn.rope", "blocks.{i}.attn.probs"}
