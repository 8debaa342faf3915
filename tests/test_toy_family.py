"""A new attention family in one module: every analysis runs on it, with the values of the family it copies.

``TOY_FAMILY`` below is written to a temporary file and imported as its own module, as a user's
``my_family.py`` would be: an attention class laid out unlike timm's (separate ``to_q``/``to_k``/``to_v``
projections, a per-head temperature, the output projection named ``to_out``) and its adapter, registered
by the module that defines it. Nothing else in the project is edited. The toy blocks are built from a
timm ViT's own weights (temperature 1), so each analysis must give the timm model's values; with other
temperatures the captured probabilities must be ``softmax(t_h·q·kᵀ/√d)`` computed here by hand.
docs/contributing/add-a-family.md walks through this file.
"""

from __future__ import annotations

import copy
import importlib.util
import sys
import textwrap

import pytest
import torch

import analysis
from analysis.circuits import activation_patching, direct_logit_attribution, head_ablation
from analysis.engine.activations import run_with_cache
from analysis.model.adapters.registry import registered_adapters
from conftest import make_vit, random_pixels

TOY_FAMILY = textwrap.dedent('''
    """A toy attention family: separate q/k/v projections, a learned temperature per head, ``to_out``."""

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    from analysis.model.adapters import AttentionAdapter, register_adapter


    class ToyAttention(nn.Module):
        def __init__(self, dim: int, num_heads: int) -> None:
            super().__init__()
            self.num_heads, self.head_dim = num_heads, dim // num_heads
            self.to_q, self.to_k, self.to_v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
            self.temperature = nn.Parameter(torch.ones(num_heads))
            self.to_out = nn.Linear(dim, dim)

        def forward(self, x: torch.Tensor, attn_mask=None, is_causal: bool = False) -> torch.Tensor:
            B, T, D = x.shape
            heads = lambda t: t.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # noqa: E731
            q = heads(self.to_q(x)) * self.temperature.view(1, -1, 1, 1)
            out = F.scaled_dot_product_attention(q, heads(self.to_k(x)), heads(self.to_v(x)), attn_mask=attn_mask,
                                                 is_causal=is_causal)
            return self.to_out(out.transpose(1, 2).reshape(B, T, D))


    class ToyAttentionAdapter(AttentionAdapter):
        name = "toy attention"
        module_types = (ToyAttention,)
        includes = "softmax(t_h·q·kᵀ/√d), a learned temperature t_h per head"

        def output_projection(self, module: nn.Module) -> nn.Module:
            return module.to_out


    ADAPTER = register_adapter(ToyAttentionAdapter())


    def from_timm(attention: nn.Module) -> ToyAttention:
        """A ToyAttention with a timm Attention's weights (temperature 1): the same function."""
        dim = attention.qkv.in_features
        toy = ToyAttention(dim, attention.num_heads)
        with torch.no_grad():
            for index, linear in enumerate((toy.to_q, toy.to_k, toy.to_v)):
                linear.weight.copy_(attention.qkv.weight[index * dim:(index + 1) * dim])
                linear.bias.copy_(attention.qkv.bias[index * dim:(index + 1) * dim])
            toy.to_out.load_state_dict(attention.proj.state_dict())
        return toy
''')


@pytest.fixture(scope="module")
def toy_module(tmp_path_factory):
    path = tmp_path_factory.mktemp("family") / "toy_family.py"
    path.write_text(TOY_FAMILY)
    spec = importlib.util.spec_from_file_location("toy_family", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["toy_family"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("toy_family", None)


@pytest.fixture(scope="module")
def pair(toy_module):
    """(timm ViT, the same ViT with every block's attention a ToyAttention), both LoadedViT."""
    timm_vit = make_vit("class_token")
    model = copy.deepcopy(timm_vit.model)
    for block in model.blocks:
        block.attn = toy_module.from_timm(block.attn)
    return timm_vit, analysis.load_vit(model.eval())


def test_the_toy_family_is_registered_by_its_own_module_and_read_from_the_model(toy_module, pair):
    timm_vit, toy_vit = pair
    assert toy_module.ADAPTER in registered_adapters()
    assert toy_vit.spec.num_heads == timm_vit.spec.num_heads and toy_vit.spec.grid_size == timm_vit.spec.grid_size
    pixels = random_pixels(timm_vit)
    with torch.no_grad():
        torch.testing.assert_close(toy_vit.model(pixels), timm_vit.model(pixels), rtol=0, atol=1e-5)


def test_its_probabilities_are_the_softmax_written_out(toy_module, pair):
    """Temperatures other than 1: the captured probabilities equal softmax(t_h·q·kᵀ/√d) by loops."""
    _, toy_vit = pair
    model = copy.deepcopy(toy_vit.model)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.temperature.copy_(torch.linspace(0.5, 2.0, block.attn.num_heads))
    vit = analysis.load_vit(model.eval())
    pixels = random_pixels(vit, batch=1)
    record = analysis.capture_attention(vit, pixels)
    layer, attention = 1, model.blocks[1].attn
    cache = run_with_cache(vit, pixels, ["blocks.1.ln1.out"])
    x = cache["blocks.1.ln1.out"][0]  # (T, D)
    T, heads, d = x.shape[0], attention.num_heads, attention.head_dim
    with torch.no_grad():
        q, k = attention.to_q(x), attention.to_k(x)
    for h in range(heads):
        for i in range(T):
            scores = [
                float(attention.temperature[h].detach())
                * float(q[i, h * d : (h + 1) * d] @ k[j, h * d : (h + 1) * d])
                / d**0.5
                for j in range(T)
            ]
            top = max(scores)
            weights = torch.tensor([pow(2.718281828459045, s - top) for s in scores])
            torch.testing.assert_close(
                record.attentions[layer][0, h, i], (weights / weights.sum()).float(), rtol=0, atol=2e-5
            )


def _equal(a, b):
    torch.testing.assert_close(a, b, rtol=0, atol=1e-4)


def test_every_analysis_gives_the_copied_familys_values(pair):
    """Capture, rollout, distance, every hook point, every explanation method, the circuits and
    the tokens: the toy model's results equal the timm model's."""
    timm_vit, toy_vit = pair
    pixels = random_pixels(timm_vit)
    ours, theirs = analysis.capture_attention(toy_vit, pixels), analysis.capture_attention(timm_vit, pixels)
    for layer in range(timm_vit.spec.num_layers):
        _equal(ours.attentions[layer], theirs.attentions[layer])
    _equal(analysis.attention_rollout(ours), analysis.attention_rollout(theirs))
    _equal(analysis.mean_attention_distance(ours), analysis.mean_attention_distance(theirs))
    toy_cache, timm_cache = run_with_cache(toy_vit, pixels), run_with_cache(timm_vit, pixels)
    assert list(toy_cache.keys()) == list(timm_cache.keys())
    for name in timm_cache.keys():
        _equal(toy_cache[name], timm_cache[name])
    for method in analysis.EXPLANATION_METHODS:
        _equal(analysis.explain(toy_vit, pixels, method=method), analysis.explain(timm_vit, pixels, method=method))
    ablation = head_ablation(toy_vit, pixels[:1]), head_ablation(timm_vit, pixels[:1])
    _equal(torch.as_tensor(ablation[0].delta_logit), torch.as_tensor(ablation[1].delta_logit))
    dla = direct_logit_attribution(toy_vit, pixels[:1]), direct_logit_attribution(timm_vit, pixels[:1])
    _equal(torch.as_tensor(dla[0].heads), torch.as_tensor(dla[1].heads))
    patched = (
        activation_patching(toy_vit, pixels[:1], pixels[1:], point="attn.z"),
        activation_patching(timm_vit, pixels[:1], pixels[1:], point="attn.z"),
    )
    _equal(torch.as_tensor(patched[0].effect), torch.as_tensor(patched[1].effect))
    tokens = analysis.capture_tokens(toy_vit, pixels), analysis.capture_tokens(timm_vit, pixels)
    _equal(analysis.token_norms(tokens[0]), analysis.token_norms(tokens[1]))
