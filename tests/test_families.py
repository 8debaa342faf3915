"""Every supported timm ViT family (the matrix in tests/families.py): exact attention,
identical logits, all four analyses.

The reference for each family is the attention module's *own* explicit path: a copy of the
model with ``fused_attn = False`` on every attention module, whose softmax output is read
where the module passes it through ``attn_drop``. The capture runs on the fused original
(``F.scaled_dot_product_attention``), so the two are computed by different code.
"""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from analysis import (
    AnalysisError,
    attention_rollout,
    capture_attention,
    load_vit,
    mean_attention_distance,
    patch_embedding_components,
    position_embedding_similarity,
)
from analysis.embedding.position import position_encoding_kinds
from analysis.model.adapters import block_sites, pool_site
from families import FAMILIES, family_pixels, load_family
from reference import manual_softmax


@torch.no_grad()
def explicit_path_attention(model, pixels: torch.Tensor) -> torch.Tensor:
    """(L, B, heads, T, T): each block's softmax as the module's own unfused code computes it."""
    twin = copy.deepcopy(model)
    maps = {}
    handles = []
    for site in block_sites(twin):
        site.module.fused_attn = False
        handles.append(
            site.module.attn_drop.register_forward_hook(lambda m, a, out, i=site.layer: maps.__setitem__(i, a[0]))
        )
    twin(pixels)
    for handle in handles:
        handle.remove()
    return torch.stack([maps[i] for i in sorted(maps)]).double()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_attention_equals_the_modules_own_explicit_path(family, family_vits):
    vit = family_vits[family]
    assert all(site.module.fused_attn for site in block_sites(vit.model))  # the capture reads the fused path
    pixels = family_pixels(family)
    record = capture_attention(vit, pixels)
    expected = explicit_path_attention(vit.model, pixels)
    assert record.attentions.shape == expected.shape
    assert record.attentions.shape[-1] == record.spec.num_tokens
    torch.testing.assert_close(record.attentions.double(), expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logits_identical_to_an_uncaptured_forward(family, family_vits):
    vit = family_vits[family]
    pixels = family_pixels(family)
    with torch.no_grad():
        plain = vit.model(pixels)
    assert torch.equal(capture_attention(vit, pixels, exact_logits=True).logits, plain)
    torch.testing.assert_close(capture_attention(vit, pixels).logits, plain, rtol=1e-5, atol=1e-5)  # P·v reused


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_explicit_path_capture_equals_fused_capture(family):
    """With fused attention off the adapter reads the module's own softmax (attn_drop)."""
    vit = load_family(family)
    pixels = family_pixels(family)
    fused = capture_attention(vit, pixels)
    for site in block_sites(vit.model):
        site.module.fused_attn = False
    explicit = capture_attention(vit, pixels)
    torch.testing.assert_close(explicit.attentions, fused.attentions, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_all_four_analyses_run(family, family_vits):
    vit = family_vits[family]
    record = capture_attention(vit, family_pixels(family, batch=1))
    spec = record.spec
    rollout = attention_rollout(record)
    assert rollout.shape == (1, *spec.grid_size)
    assert torch.isfinite(rollout).all()
    distance = mean_attention_distance(record)
    assert distance.shape == (spec.num_layers, spec.num_heads) and (distance > 0).all()
    kinds = position_encoding_kinds(vit)
    if kinds:
        for kind in kinds:
            similarity = position_embedding_similarity(vit, kind=kind)
            grid = similarity.shape[:2]
            diagonal = similarity.reshape(grid[0] * grid[1], -1).diagonal()
            torch.testing.assert_close(diagonal, torch.ones_like(diagonal), atol=1e-5, rtol=0)
    else:
        assert "relative" in vit.spec.position_embedding
        with pytest.raises(AnalysisError, match="relative-position bias"):
            position_embedding_similarity(vit)
    if family == "hybrid":  # a CNN stem, not a linear map of pixels: no filters to show
        with pytest.raises(AnalysisError, match="hybrid"):
            patch_embedding_components(vit, n_components=4)
        return
    components, ratio = patch_embedding_components(vit, n_components=4)
    assert components.shape == (4, 3, *spec.patch_size) and float(ratio.sum()) <= 1.0 + 1e-6


def test_prefix_tokens_and_position_kinds_are_read_from_each_model(family_vits):
    spec = {family: vit.spec for family, vit in family_vits.items()}
    assert spec["dinov3"].num_prefix_tokens == 5 and spec["dinov3"].has_class_token  # class + 4 registers
    assert spec["rope_reg1_gap"].num_prefix_tokens == 1 and not spec["rope_reg1_gap"].has_class_token
    assert spec["naflex"].num_prefix_tokens == 4 and not spec["naflex"].has_class_token
    assert spec["relpos"].num_prefix_tokens == 0 and spec["relpos"].grid_size == (3, 4)
    assert spec["dinov3"].position_embedding == "rope"
    assert spec["eva02"].position_embedding == "learned+rope"
    assert spec["beit"].position_embedding == "relative"
    assert spec["srelpos"].position_embedding == "relative"
    assert spec["siglip"].position_embedding == "learned"
    assert spec["dinov3"].head == "none" and spec["siglip"].head == "none"
    assert spec["pe_core"].head == "embedding" and not spec["pe_core"].has_classifier
    assert spec["beit"].has_classifier
    assert spec["hybrid"].patch_size == (32, 32) and spec["hybrid"].grid_size == (3, 3)  # the stem's stride
    assert spec["deit_distilled"].num_prefix_tokens == 2 and spec["dinov2_registers"].num_prefix_tokens == 5
    assert spec["clip"].num_prefix_tokens == 1 and spec["clip"].position_embedding == "learned"


def test_zero_queries_and_keys_leave_exactly_the_relative_position_bias():
    """Analytic case: with q = k = 0 the scores are the bias alone, so P = softmax(B)."""
    vit = load_family("beit")
    attn = vit.model.blocks[0].attn
    with torch.no_grad():
        attn.qkv.weight.zero_()
        attn.q_bias.zero_()
    record = capture_attention(vit, family_pixels("beit", batch=1), layers=[0])
    bias = attn._get_rel_pos_bias().double()  # (1, heads, T, T)
    torch.testing.assert_close(record.attentions[0].double(), manual_softmax(bias), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("family", ["dinov3", "rope_reg1_gap", "eva02"])
def test_rotary_similarity_depends_only_on_the_displacement(family, family_vits):
    """cos-similarity of [sin θp, cos θp] is the mean of cos(θ(p − p′)): shift both patches, same value."""
    similarity = position_embedding_similarity(family_vits[family], kind="rope")
    gh, gw = similarity.shape[:2]
    shifted_pairs = similarity[1:, 1:, 1:, 1:]  # S[i+1, j+1, k+1, l+1]
    torch.testing.assert_close(shifted_pairs, similarity[:-1, :-1, :-1, :-1], atol=1e-5, rtol=0)
    assert similarity.reshape(gh * gw, -1).min() < 0.999  # not a constant grid


@pytest.mark.parametrize("family", ["siglip", "pe_core"])
def test_attention_pooling_head_is_captured_as_its_own_map(family, family_vits):
    vit = family_vits[family]
    pool = pool_site(vit.model).module
    pixels = family_pixels(family)
    seen = {}
    handle = pool.register_forward_pre_hook(lambda m, args: seen.__setitem__("x", args[0]))
    try:
        record = capture_attention(vit, pixels)
    finally:
        handle.remove()
    x = seen["x"].double()  # (B, T, D): the tokens the pool attends over
    batch, tokens, dim = x.shape
    heads, head_dim = pool.num_heads, pool.head_dim
    latent = pool.latent.double()
    q = (latent @ pool.q.weight.double().T + pool.q.bias.double()).reshape(1, -1, heads, head_dim).transpose(1, 2)
    kv = x @ pool.kv.weight.double().T + pool.kv.bias.double()
    k = kv[..., :dim].reshape(batch, tokens, heads, head_dim).transpose(1, 2)
    expected = manual_softmax((q @ k.transpose(-2, -1)) * head_dim**-0.5)  # (B, heads, probes, T)
    assert record.pool_attention.shape == (batch, heads, pool.latent_len, tokens)
    torch.testing.assert_close(record.pool_attention.double(), expected, atol=1e-5, rtol=1e-4)


def test_no_hooks_or_function_modes_survive_a_failing_forward(family_vits):
    vit = family_vits["dinov3"]
    block = vit.model.blocks[1]

    def explode(module, args, kwargs):
        raise RuntimeError("boom")

    handle = block.register_forward_pre_hook(explode, with_kwargs=True)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            capture_attention(vit, family_pixels("dinov3"))
    finally:
        handle.remove()
    assert torch._C._len_torch_function_stack() == 0
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in vit.model.modules()) == 0
    record = capture_attention(vit, family_pixels("dinov3"))  # and the model still works
    assert record.attentions.shape[0] == 2


def test_threads_capturing_a_rope_model_at_once_each_get_their_own_maps(family_vits):
    vit = family_vits["dinov3"]
    inputs = [family_pixels("dinov3", batch=1, seed=s) for s in range(4)]
    expected = [explicit_path_attention(vit.model, x) for x in inputs]
    results: dict[int, torch.Tensor] = {}
    barrier = threading.Barrier(len(inputs))

    def work(index: int) -> None:
        barrier.wait()
        for _ in range(3):
            results[index] = capture_attention(vit, inputs[index]).attentions

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for index, attention in results.items():
        torch.testing.assert_close(attention.double(), expected[index], atol=1e-5, rtol=1e-4)


def test_rotary_features_read_on_one_thread_leave_other_threads_forwards_alone(family_vits):
    """``rotary_position_features`` stops its own forward at block ``layer`` with a pre-hook on the
    shared model; another thread's capture running meanwhile must neither stop nor change (the
    hook is owned by its call's thread). Before the owner check, 26 of 30 captures raised."""
    from analysis import rotary_position_features

    vit = family_vits["dinov3"]
    pixels = family_pixels("dinov3", batch=1, seed=7)
    expected_attention = capture_attention(vit, pixels).attentions
    expected_features = rotary_position_features(vit)
    errors: list[BaseException] = []
    captures: list[torch.Tensor] = []
    features: list[torch.Tensor] = []
    stop = threading.Event()

    def read_features() -> None:
        try:
            while not stop.is_set():
                features.append(rotary_position_features(vit))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def capture() -> None:
        try:
            for _ in range(30):
                captures.append(capture_attention(vit, pixels).attentions)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            stop.set()

    threads = [threading.Thread(target=read_features), threading.Thread(target=capture)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, [repr(e) for e in errors]
    assert len(captures) == 30 and len(features) > 0
    for attention in captures:
        assert torch.equal(attention, expected_attention)
    for value in features:
        assert torch.equal(value, expected_features)


def test_query_tokens_and_layers_select_rows_after_rope(family_vits):
    vit = family_vits["eva02"]
    pixels = family_pixels("eva02")
    full = capture_attention(vit, pixels)
    part = capture_attention(vit, pixels, layers=[1], query_tokens=[0, 5])
    torch.testing.assert_close(part.attentions[0], full.attentions[1][:, :, [0, 5]])
    half = capture_attention(vit, pixels, dtype=torch.float16)
    torch.testing.assert_close(half.attentions.float(), full.attentions, atol=1e-3, rtol=0)


@pytest.mark.parametrize(
    "arch, reason",
    [
        ("mvitv2_tiny", "pooling attention"),
        ("hiera_tiny_224", "mask-unit"),
        ("resnet18", "convolutional network"),
        ("xcit_tiny_12_p16_224", "cross-covariance"),
    ],
)
def test_unsupported_families_are_refused_with_the_real_reason(arch, reason):
    from analysis import UnsupportedModelError

    with pytest.raises(UnsupportedModelError, match=reason) as info:
        load_vit(arch, pretrained=False, device="cpu")
    assert "Supported:" in str(info.value)


def test_rollout_says_when_blocks_are_post_norm(family_vits):
    """ResPost blocks (x + norm(attn(x))) break rollout's ½A + ½I assumption: rollout says so."""
    import warnings

    from analysis.attention.rollout_rules import POST_NORM_WARNING

    post = family_vits["relpos_rpn"]
    assert post.spec.residual_norm == "post"
    with pytest.warns(RuntimeWarning, match="post-norm"):
        attention_rollout(capture_attention(post, family_pixels("relpos_rpn")))
    assert "heuristic" in POST_NORM_WARNING
    eva_post = load_vit(
        "eva02_tiny_patch14_224", pretrained=False, device="cpu", img_size=28, depth=1, use_post_norm=True
    )  # EvaBlockPostNorm: x + norm1(attn(x))
    assert type(eva_post.model.blocks[0]).__name__ == "EvaBlockPostNorm" and eva_post.spec.residual_norm == "post"
    pre = family_vits["relpos"]
    assert pre.spec.residual_norm == "pre" and family_vits["eva02"].spec.residual_norm == "pre"
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        attention_rollout(capture_attention(pre, family_pixels("relpos")))
