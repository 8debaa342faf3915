"""The contract every registered attention adapter keeps with the engine, on every family the tests build.

An adapter names, for each block that holds its attention, the block's two norms, the modules through
which its two branches join the residual stream and its MLP's first and output layers
(:mod:`analysis.model.adapters.blocks`). Here, for every block of every family (tests/families.py, the
windowed Swin v1/v2/swinv2_cr and SAM models, transformers' ViTMAE):

* each named module exists, belongs to the block and is called exactly once per forward;
* the branch outputs, read with plain hooks on those modules, sum into the block's output:
  ``resid_post = resid_pre + attn.out + mlp.out`` (SAM's windowed blocks add their attention branch
  per window: un-partitioned first, as the block does; ``swinv2_cr``'s blocks with a ``norm3``
  normalise that sum);
* :func:`~analysis.engine.activations.run_with_cache` gives those same tensors at ``ln1.out``, ``ln2.out``,
  ``attn.out``, ``mlp.out``, ``mlp.pre``, ``mlp.post``, ``resid_pre``/``resid_post``, and
  ``resid_mid = resid_pre + attn.out`` wherever the block defines ``resid_mid``;

and every adapter the library registers is met by at least one of these models.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn as nn
from timm.models.vision_transformer_sam import window_unpartition

from analysis.engine.activations import run_with_cache
from analysis.model.adapters.registry import block_sites, pool_site, registered_adapters
from families import FAMILIES, family_pixels, load_family
from windowed_models import small_pixels, small_sam, small_swin

WINDOWED = {
    "swin": lambda: small_swin(),
    "swinv2": lambda: small_swin("swinv2_tiny_window8_256"),
    "swinv2_cr": lambda: small_swin("swinv2_cr_tiny_ns_224"),
    "sam": small_sam,
}
MODELS = sorted(FAMILIES) + sorted(WINDOWED)
PLAIN = ("ln1.out", "ln2.out", "attn.out", "mlp.out", "mlp.pre", "mlp.post")


@functools.cache
def _model(name: str):
    return WINDOWED[name]() if name in WINDOWED else load_family(name)


def _pixels(name: str) -> torch.Tensor:
    return small_pixels() if name in WINDOWED else family_pixels(name)


def _named_modules(site) -> dict[str, nn.Module | None]:
    """The modules the adapter names for the block at ``site``, keyed by the point read on each."""
    adapter, block = site.adapter, site.block
    layers = adapter.mlp_layers(block)
    return {
        "ln1.out": adapter.block_norm(block, "ln1"),
        "ln2.out": adapter.block_norm(block, "ln2"),
        "attn.out": adapter.branch_output(block, "attn"),
        "mlp.out": adapter.branch_output(block, "mlp"),
        "mlp.pre": None if layers is None else layers[0],
        "mlp.post": None if layers is None else layers[1],
    }


def _read_plainly(model: nn.Module, sites, forward) -> list[dict[str, list[torch.Tensor]]]:
    """Per block ``{point: [tensor per call]}`` from plain hooks on the named modules (``mlp.post``:
    the output layer's input), with ``resid_pre``/``resid_post`` the block's input and output."""
    seen: list[dict[str, list[torch.Tensor]]] = []
    handles = []

    def keep(store, key, use_input=False):
        def hook(module, args, output=None):
            store.setdefault(key, []).append((args[0] if use_input else output).detach().clone())

        return hook

    try:
        for site in sites:
            store: dict[str, list[torch.Tensor]] = {}
            seen.append(store)
            for key, module in _named_modules(site).items():
                if key == "mlp.post":
                    handles.append(module.register_forward_pre_hook(keep(store, key, use_input=True)))
                else:
                    handles.append(module.register_forward_hook(keep(store, key)))
            handles.append(site.block.register_forward_pre_hook(keep(store, "resid_pre", use_input=True)))
            handles.append(site.block.register_forward_hook(keep(store, "resid_post")))
        with torch.no_grad():
            forward()
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _on_stream(site, attention: torch.Tensor, resid_pre: torch.Tensor) -> torch.Tensor:
    """The attention branch as the block adds it to ``resid_pre``: SAM's windowed blocks un-partition it."""
    window = int(getattr(site.block, "window_size", 0) or 0) if "SAM" in site.adapter.name else 0
    if window == 0:
        return attention
    height, width = resid_pre.shape[1:3]
    padded = (-(-height // window) * window, -(-width // window) * window)
    return window_unpartition(attention, window, (height, width), padded)


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(x.shape[0], -1, x.shape[-1])  # NHWC maps and token sequences alike: (B, tokens, C)


def _check_blocks(sites, seen) -> None:
    for site, store in zip(sites, seen, strict=True):
        for key, module in _named_modules(site).items():
            assert module is not None, f"block {site.layer}: {site.adapter.name} names no module for {key}"
            assert any(module is m for m in site.block.modules()), f"block {site.layer}: {key}'s module is not in it"
        for key in (*PLAIN, "resid_pre", "resid_post"):
            assert len(store.get(key, [])) == 1, f"block {site.layer}: {key} called {len(store.get(key, []))} times"
        pre, post = store["resid_pre"][0], store["resid_post"][0]
        attention = _on_stream(site, store["attn.out"][0], pre)
        summed = _flat(pre + attention) + _flat(store["mlp.out"][0])
        stream_norm = site.adapter.block_layout.post_norm(site.block)  # swinv2_cr's norm3
        if stream_norm is not None:
            summed = stream_norm(summed)
        torch.testing.assert_close(_flat(post), summed, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_every_blocks_modules_are_called_once_sum_into_the_stream_and_are_what_the_engine_reads(name):
    vit, pixels = _model(name), _pixels(name)
    sites = block_sites(vit.model)
    seen = _read_plainly(vit.model, sites, lambda: vit.model(pixels))
    _check_blocks(sites, seen)
    names = [
        f"blocks.{site.layer}.{point}"
        for site in sites
        for point in (*PLAIN, "resid_pre", "resid_post")
        + (("resid_mid",) if site.adapter.defines(site, "resid_mid") else ())
    ]
    cache = run_with_cache(vit, pixels, names)
    for site, store in zip(sites, seen, strict=True):
        for point in (*PLAIN, "resid_pre", "resid_post"):
            torch.testing.assert_close(cache[f"blocks.{site.layer}.{point}"], store[point][0], rtol=0, atol=0)
        if site.adapter.defines(site, "resid_mid"):
            mid = store["resid_pre"][0] + store["attn.out"][0]
            torch.testing.assert_close(cache[f"blocks.{site.layer}.resid_mid"], mid, rtol=0, atol=0)


def test_the_vit_mae_layers_keep_the_contract():
    """transformers' ViTMAE encoder layers (read in place, not converted to timm's): the norms,
    branches and MLP its adapter names, with plain hooks (the MAE runs its own forward)."""
    transformers = pytest.importorskip("transformers")
    from analysis.model.adapters.hf_vit_mae import encoder_sites

    torch.manual_seed(0)
    config = transformers.ViTMAEConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64
    )
    model = transformers.ViTMAEModel(config).eval()
    sites = encoder_sites(model)
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    seen = _read_plainly(model, sites, lambda: model(pixel_values=pixels))
    _check_blocks(sites, seen)


def test_every_registered_adapter_is_met_by_a_model_here():
    """Each adapter the library registers (not a test's own) holds the attention of some model
    above, or (a pooling head's) the model's attention pool: a new family needs a model here."""
    met = {site.adapter for name in MODELS for site in block_sites(_model(name).model)}
    met |= {site.adapter for name in MODELS if (site := pool_site(_model(name).model)) is not None}
    from analysis.model.adapters import hf_vit_mae

    met.add(hf_vit_mae.ADAPTER)  # test_the_vit_mae_layers_keep_the_contract (None without transformers)
    library = [a for a in registered_adapters() if type(a).__module__.startswith("analysis.")]
    missing = [a for a in library if a not in met]
    assert missing == [], f"adapters no test model uses: {missing}"
