"""Named hook points, the activation cache and interventions (issue 26, step 1).

References are independent of the code under test: plain forward hooks written here, the
block's own pieces run by hand, a deep copy with a head's projection weights zeroed, the
existing captures (computed by other code paths), and analytic cases.
"""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from analysis import AnalysisError, capture_attention, capture_tokens
from analysis.engine.activations import HOOK_POINTS, hook_point_names, run_with_cache, run_with_hooks
from analysis.model.adapters import block_sites
from families import FAMILIES, family_pixels
from windowed_models import no_hooks_left, small_pixels, small_sam, small_swin


def _plain_block_io(model, pixels):
    """Each block's input and output by plain forward hooks, and the logits of that forward."""
    inputs, outputs, handles = {}, {}, []
    for layer, block in enumerate(model.blocks):
        handles.append(
            block.register_forward_pre_hook(lambda m, a, layer=layer: inputs.__setitem__(layer, a[0].clone()))
        )
        handles.append(block.register_forward_hook(lambda m, a, o, layer=layer: outputs.__setitem__(layer, o.clone())))
    try:
        with torch.no_grad():
            logits = model(pixels)
    finally:
        for handle in handles:
            handle.remove()
    return inputs, outputs, logits


def _assert_no_hooks(model):
    for name, module in model.named_modules():
        assert not module._forward_hooks and not module._forward_pre_hooks, f"hook left on {name or 'model'}"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_cache_equals_plain_hooks_and_the_existing_captures(family, family_vits):
    vit = family_vits[family]
    pixels = family_pixels(family)
    cache = run_with_cache(vit, pixels)
    spec = cache.spec
    record = capture_attention(vit, pixels, exact_logits=True)  # the fused kernel runs untouched beside it
    pooled = record.pool_attention is not None  # SigLIP and PE: an attention-pooling head
    final_norm = not isinstance(vit.model.norm, torch.nn.Identity)  # models that pool first have fc_norm instead
    assert list(cache) == (
        hook_point_names(spec.num_layers)
        + (["ln_final.scale", "ln_final.out"] if final_norm else [])
        + (["pool.probs"] if pooled else [])
    )
    assert pooled == (family in ("siglip", "pe_core"))
    if pooled:
        torch.testing.assert_close(cache["pool.probs"], record.pool_attention, rtol=1e-5, atol=1e-6)
    inputs, outputs, logits = _plain_block_io(vit.model, pixels)
    torch.testing.assert_close(cache.logits, logits.float(), rtol=1e-5, atol=1e-5)
    queries = capture_tokens(vit, pixels, kind="query").tokens  # (L, B, T, heads·d)
    values = capture_tokens(vit, pixels, kind="value").tokens
    for layer in range(spec.num_layers):
        at = lambda point, layer=layer: cache[f"blocks.{layer}.{point}"]  # noqa: E731
        torch.testing.assert_close(at("resid_pre"), inputs[layer], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(at("resid_post"), outputs[layer], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(at("attn.probs"), record.attentions[layer], rtol=1e-5, atol=1e-6)
        batch, heads, tokens, dim = at("attn.q").shape
        torch.testing.assert_close(
            at("attn.q").permute(0, 2, 1, 3).reshape(batch, tokens, -1), queries[layer], rtol=1e-5, atol=1e-5
        )
        torch.testing.assert_close(at("attn.v").permute(0, 2, 1, 3).flatten(2), values[layer], rtol=1e-5, atol=1e-5)
        # z = P·v, each head's output (grouped-query values repeated per head)
        v = at("attn.v").repeat_interleave(heads // at("attn.v").shape[1], dim=1)
        torch.testing.assert_close(at("attn.z"), (at("attn.probs") @ v).transpose(1, 2), rtol=1e-4, atol=1e-5)
        # the two branches add up to the block's output exactly as the block adds them
        assert torch.equal(at("resid_mid"), at("resid_pre") + at("attn.out"))
        assert torch.equal(at("resid_post"), at("resid_mid") + at("mlp.out"))
        if layer + 1 < spec.num_layers:
            assert torch.equal(at("resid_post"), cache[f"blocks.{layer + 1}.resid_pre"])
    _assert_no_hooks(vit.model)


@pytest.mark.parametrize("family", ["vit", "eva02", "beit", "relpos_rpn"])
def test_attention_branch_output_equals_the_block_pieces_run_by_hand(family, family_vits):
    """attn.out is what the block adds: ls1(attn(norm1(x))) (ViT), gamma_1·attn(norm1(x)) (EVA,
    BEiT), norm1(attn(x)) (post-norm), recomputed here from the block's own submodules."""
    vit = family_vits[family]
    pixels = family_pixels(family)
    cache = run_with_cache(vit, pixels, names=["blocks.1.attn.out"])
    block, captured = vit.model.blocks[1], {}
    handle = block.attn.register_forward_hook(lambda m, a, o: captured.setdefault("attn", o))  # a plain hook
    try:
        with torch.no_grad():
            vit.model(pixels)
    finally:
        handle.remove()
    attended = captured["attn"]
    if family == "vit":
        expected = block.ls1(attended)
    elif family == "relpos_rpn":
        expected = block.norm1(attended)
    else:
        expected = block.gamma_1 * attended if block.gamma_1 is not None else attended
    torch.testing.assert_close(cache["blocks.1.attn.out"], expected, rtol=1e-5, atol=1e-6)


def test_names_keep_the_order_asked_and_the_prefix_split(family_vits):
    vit = family_vits["dinov2_registers"]  # class token + 4 registers
    pixels = family_pixels("dinov2_registers")
    names = ["blocks.1.resid_post", "blocks.0.attn.probs", "blocks.0.resid_post"]
    cache = run_with_cache(vit, pixels, names=names)
    assert list(cache) == names
    tokens = cache["blocks.1.resid_post"]
    assert torch.equal(cache.prefix("blocks.1.resid_post"), tokens[:, :5])
    assert torch.equal(cache.patches("blocks.1.resid_post"), tokens[:, 5:])
    probs = cache["blocks.0.attn.probs"]  # the query axis by default, the key axis on request
    assert torch.equal(cache.patches("blocks.0.attn.probs"), probs[:, :, 5:])
    assert torch.equal(cache.prefix("blocks.0.attn.probs", axis=-1), probs[..., :5])
    with pytest.raises(KeyError, match="blocks.0.mlp.out"):
        cache["blocks.0.mlp.out"]
    only_z = run_with_cache(vit, pixels, names=lambda name: name.endswith("attn.z"))
    assert list(only_z) == ["blocks.0.attn.z", "blocks.1.attn.z"]


def test_stack_keeps_the_order_asked_and_pieces_join(family_vits, monkeypatch, out_of_memory_above):
    """cache.stack(point) is the cached layers in the order asked; a batch split by an
    out-of-memory fallback joins into the same cache (one tensor per name, and stacked)."""
    import analysis.engine.activations.run as engine

    vit = family_vits["dinov2_registers"]
    pixels = family_pixels("dinov2_registers", batch=3)
    names = ["blocks.1.resid_post", "blocks.0.attn.probs", "blocks.0.resid_post"]
    cache = run_with_cache(vit, pixels, names=names)
    assert cache.layers_of("resid_post") == (1, 0)
    stacked = cache.stack("resid_post")
    assert torch.equal(stacked[0], cache["blocks.1.resid_post"]) and torch.equal(
        stacked[1], cache["blocks.0.resid_post"]
    )
    with pytest.raises(KeyError, match="attn.z"):
        cache.stack("attn.z")
    original = engine._hooked_forward
    out_of_memory_above(1)
    joined = run_with_cache(vit, pixels, names=names)
    assert list(joined) == names
    for name in names:
        torch.testing.assert_close(joined[name], cache[name], rtol=1e-6, atol=1e-6)
    record = capture_attention(vit, pixels, layers=[1, 0])  # stacked pieces
    monkeypatch.setattr(engine, "_hooked_forward", original)
    whole = capture_attention(vit, pixels, layers=[1, 0])
    torch.testing.assert_close(record.attentions, whole.attentions, rtol=1e-6, atol=1e-6)
    assert torch.equal(record.attentions[0], record.attentions[record.layer_position(0)])


def test_an_empty_cache_is_a_plain_forward(family_vits):
    vit = family_vits["vit"]
    pixels = family_pixels("vit")
    with torch.no_grad():
        plain = vit.model(pixels)
    cache = run_with_cache(vit, pixels, names=[])
    assert len(cache) == 0 and torch.equal(cache.logits, plain.float())
    assert torch.equal(run_with_hooks(vit, pixels, {}), plain.float())
    # hooks that keep every activation leave the logits as a plain forward's (to the P·v rounding)
    keep = {name: (lambda t: None) for name in hook_point_names(vit.spec.num_layers)}
    torch.testing.assert_close(run_with_hooks(vit, pixels, keep), plain.float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_zeroing_a_heads_z_equals_zeroing_its_projection_weights(family, family_vits):
    """The acceptance reference of issue 26: ablating head h equals a deep copy whose output
    projection ignores h's slice of its input."""
    vit = family_vits[family]
    pixels = family_pixels(family)
    layer, head = vit.spec.num_layers - 1, 1
    site = block_sites(vit.model)[layer]
    heads = site.adapter.num_heads(site.module)
    dim = site.module.proj.in_features // heads

    def ablate(z):  # (B, T, heads, d)
        z = z.clone()
        z[:, :, head] = 0
        return z

    ablated = run_with_hooks(vit, pixels, {f"blocks.{layer}.attn.z": ablate})
    twin = copy.deepcopy(vit.model)
    with torch.no_grad():
        block_sites(twin)[layer].module.proj.weight[:, head * dim : (head + 1) * dim] = 0
        expected = twin(pixels).float()
    torch.testing.assert_close(ablated, expected, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        assert (ablated - vit.model(pixels).float()).abs().max() > 1e-4  # the ablation changed something


def test_patching_resid_pre_from_a_clean_run_restores_its_logits(family_vits):
    vit = family_vits["deit_distilled"]
    clean, corrupted = family_pixels("deit_distilled", seed=1), family_pixels("deit_distilled", seed=2)
    clean_cache = run_with_cache(vit, clean, names=["blocks.0.resid_pre"])
    with torch.no_grad():
        corrupted_logits = vit.model(corrupted).float()
    patched = run_with_hooks(vit, corrupted, {"blocks.0.resid_pre": lambda x: clean_cache["blocks.0.resid_pre"]})
    torch.testing.assert_close(patched, clean_cache.logits, rtol=1e-5, atol=1e-5)
    untouched = run_with_hooks(vit, corrupted, {"blocks.0.resid_pre": lambda x: None})
    torch.testing.assert_close(untouched, corrupted_logits, rtol=1e-6, atol=1e-6)
    assert (patched - corrupted_logits).abs().max() > 1e-3
    # resid_mid patched from the clean run: from that layer on the stream is the clean one
    mid = run_with_cache(vit, clean, names=["blocks.1.resid_mid"])["blocks.1.resid_mid"]
    torch.testing.assert_close(
        run_with_hooks(vit, corrupted, {"blocks.1.resid_mid": lambda x: mid}), clean_cache.logits, rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("fused", [True, False])
def test_replaced_probabilities_are_the_ones_multiplied_with_v(fused, family_vits):
    """Uniform attention over the keys makes every query's head output the mean of the
    values, on the fused path (P·v from the replaced P) and on the explicit one (the
    replacement is what attn_drop passes on)."""
    vit = family_vits["vit"]
    if not fused:
        vit = copy.copy(vit)
        vit.model = copy.deepcopy(vit.model)
        for site in block_sites(vit.model):
            site.module.fused_attn = False
    pixels = family_pixels("vit")
    uniform = {"blocks.0.attn.probs": lambda p: torch.full_like(p, 1.0 / p.shape[-1])}
    cache = run_with_cache(
        vit, pixels, names=["blocks.0.attn.probs", "blocks.0.attn.z", "blocks.0.resid_pre"], hooks=uniform
    )
    assert torch.allclose(cache["blocks.0.attn.probs"], torch.tensor(1.0 / cache.spec.num_tokens))
    block = vit.model.blocks[0]
    with torch.no_grad():  # the values, by hand from the block's own qkv projection
        qkv = block.attn.qkv(block.norm1(cache["blocks.0.resid_pre"]))
        heads = block.attn.num_heads
        v = qkv.unflatten(-1, (3, heads, -1))[:, :, 2]  # (B, T, heads, d)
    expected = v.mean(dim=1, keepdim=True).expand_as(v)
    torch.testing.assert_close(cache["blocks.0.attn.z"], expected, rtol=1e-5, atol=1e-6)


def test_q_k_v_need_the_fused_path_and_say_so(family_vits):
    vit = copy.copy(family_vits["vit"])
    vit.model = copy.deepcopy(vit.model)
    for site in block_sites(vit.model):
        site.module.fused_attn = False
    with pytest.raises(AnalysisError, match="compute their softmax themselves"):
        run_with_cache(vit, family_pixels("vit"), names=["blocks.0.attn.q"])
    everything = run_with_cache(vit, family_pixels("vit"))  # names=None: the points this model has
    assert list(everything) == [
        n
        for n in hook_point_names(vit.spec.num_layers) + ["ln_final.scale", "ln_final.out"]
        if not n.endswith((".q", ".k", ".v", ".scores"))
    ]
    _assert_no_hooks(vit.model)


def test_a_replacement_that_is_a_view_of_the_maps_is_cached_as_replaced(family_vits):
    """A hook may return another view of the very buffer it was given (every query attends
    like the class token): the cache holds what the model continued with."""
    vit, pixels = family_vits["vit"], family_pixels("vit")
    name = "blocks.0.attn.probs"
    like_class_token = lambda p: p[:, :, :1].expand_as(p)  # noqa: E731
    plain = run_with_cache(vit, pixels, names=[name])[name]
    hooked = run_with_cache(vit, pixels, names=[name], hooks={name: like_class_token})
    torch.testing.assert_close(hooked[name], plain[:, :, :1].expand_as(plain), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(
        hooked.logits, run_with_hooks(vit, pixels, {name: like_class_token}), rtol=1e-6, atol=1e-6
    )


@pytest.mark.parametrize("family", ["siglip", "pe_core"])
def test_a_pooling_head_replacement_acts_on_both_paths(family, family_vits):
    """pool.probs replaced by uniform attention: the explicit path (fused_attn=False) gives the
    logits of the fused path, and both differ from the untouched model."""
    vit, pixels = family_vits[family], family_pixels(family)
    uniform = lambda p: torch.full_like(p, 1.0 / p.shape[-1])  # noqa: E731
    fused = run_with_hooks(vit, pixels, {"pool.probs": uniform})
    explicit = copy.copy(vit)
    explicit.model = copy.deepcopy(vit.model)
    explicit.model.attn_pool.fused_attn = False
    torch.testing.assert_close(run_with_hooks(explicit, pixels, {"pool.probs": uniform}), fused, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(fused, run_with_hooks(vit, pixels, {}), atol=1e-6)


def test_bad_names_and_replacements_are_typed_errors_and_leave_no_hooks(family_vits):
    vit = family_vits["vit"]
    pixels = family_pixels("vit")
    with pytest.raises(AnalysisError, match="not a hook point"):
        run_with_cache(vit, pixels, names=["blocks.0.attn.pattern"])
    with pytest.raises(AnalysisError, match="blocks 0..1"):
        run_with_cache(vit, pixels, names=["blocks.7.resid_pre"])
    with pytest.raises(AnalysisError, match="not callable"):
        run_with_hooks(vit, pixels, {"blocks.0.attn.z": 3})
    with pytest.raises(AnalysisError, match=r"activation's shape \(2, 10, 3, 64\)"):
        run_with_hooks(vit, pixels, {"blocks.0.attn.z": lambda z: z[:, :1]})
    _assert_no_hooks(vit.model)

    def fails(x):
        raise RuntimeError("user hook failed")

    with pytest.raises(RuntimeError, match="user hook failed"):
        run_with_hooks(vit, pixels, {"blocks.1.mlp.out": fails})
    _assert_no_hooks(vit.model)
    assert [p.suffix for p in HOOK_POINTS][0] == "resid_pre"


def _windowed_block_io(vit, pixels):
    """Plain forward hooks on every windowed block: its NHWC input and output, and what its
    two branches add (drop_path1 / drop_path2 outputs)."""
    sites = block_sites(vit.model)
    seen, handles = {}, []
    for site in sites:
        layer, block = site.layer, site.block
        handles += [
            block.register_forward_pre_hook(lambda m, a, layer=layer: seen.__setitem__((layer, "in"), a[0].clone())),
            block.register_forward_hook(lambda m, a, o, layer=layer: seen.__setitem__((layer, "out"), o.clone())),
            block.drop_path1.register_forward_hook(
                lambda m, a, o, layer=layer: seen.__setitem__((layer, "attn"), o.clone())
            ),
            block.drop_path2.register_forward_hook(
                lambda m, a, o, layer=layer: seen.__setitem__((layer, "mlp"), o.clone())
            ),
        ]
    try:
        with torch.no_grad():
            logits = vit.model(pixels)
    finally:
        for handle in handles:
            handle.remove()
    return seen, logits


@pytest.mark.parametrize("kind", ["swin", "swinv2", "sam"])
def test_the_cache_of_a_windowed_model_equals_plain_hooks_and_its_captures(kind):
    vit = {"swin": lambda: small_swin(bias_seed=1), "swinv2": _live_swinv2, "sam": small_sam}[kind]()
    pixels = small_pixels()
    spec = vit.spec
    points = ["resid_pre", "attn.probs", "attn.z", "attn.out", "mlp.out", "resid_post"]
    cache = run_with_cache(
        vit, pixels, names=[f"blocks.{layer}.{p}" for layer in range(spec.num_layers) for p in points]
    )
    seen, logits = _windowed_block_io(vit, pixels)
    torch.testing.assert_close(cache.logits, logits.float(), rtol=1e-5, atol=1e-5)
    tokens = capture_tokens(vit, pixels)  # its own block hooks, not the cache (SAM's fused calls become P·v: 1e-5)
    record = capture_attention(vit, pixels)
    for layer in range(spec.num_layers):
        at = lambda point, layer=layer: cache[f"blocks.{layer}.{point}"]  # noqa: E731
        grid = spec.geometry(layer).grid_size
        assert at("resid_post").shape[:3] == (2, *grid)  # NHWC on the layer's stage grid
        torch.testing.assert_close(at("resid_pre"), seen[layer, "in"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(at("resid_post"), seen[layer, "out"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(at("resid_post"), tokens.grid_tokens(layer), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(at("attn.out"), seen[layer, "attn"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(at("mlp.out"), seen[layer, "mlp"], rtol=1e-5, atol=1e-5)
        assert at("attn.probs").shape == record.layer_windows(layer).shape
        torch.testing.assert_close(at("attn.probs"), record.layer_windows(layer), rtol=0, atol=0)
        windows, heads, wt = (
            at("attn.probs").shape[1],
            spec.geometry(layer).num_heads,
            spec.geometry(layer).window_tokens,
        )
        assert at("attn.z").shape[:3] == (2 * windows, wt, heads)
    with pytest.raises(AnalysisError, match="no prefix tokens"):
        cache.patches("blocks.0.resid_post")
    everything = run_with_cache(vit, pixels)  # names=None: every point these blocks define
    explicit = {"attn.q", "attn.k", "attn.v", "attn.scores"}  # the module computes its softmax itself
    missing = {"swin": explicit, "swinv2": explicit}.get(kind, set())
    for name in hook_point_names(spec.num_layers):
        layer, point = name.split(".", 2)[1:]
        undefined = point in missing or (kind == "sam" and point == "resid_mid" and int(layer) not in (1, 3))
        assert (name in everything) != undefined, name
    no_hooks_left(vit.model)


def test_swin_resid_mid_adds_up_and_sam_refuses_it_per_window():
    swin, pixels = small_swin(bias_seed=1), small_pixels()
    names = [f"blocks.2.{p}" for p in ("resid_pre", "attn.out", "resid_mid", "mlp.out", "resid_post")]
    cache = run_with_cache(swin, pixels, names=names)
    at = lambda point: cache[f"blocks.2.{point}"]  # noqa: E731
    assert torch.equal(at("resid_mid"), at("resid_pre") + at("attn.out"))
    assert torch.equal(
        at("resid_post").flatten(1, 2), at("resid_mid").flatten(1, 2) + at("mlp.out")
    )  # Swin adds its MLP on (B, gh·gw, C)
    sam = small_sam()
    with pytest.raises(AnalysisError, match="resid_mid is not defined"):
        run_with_cache(sam, pixels, names=["blocks.0.resid_mid"])  # block 0 is windowed: attn.out per window
    cache = run_with_cache(sam, pixels, names=["blocks.1.resid_pre", "blocks.1.attn.out", "blocks.1.resid_mid"])
    assert torch.equal(
        cache["blocks.1.resid_mid"], cache["blocks.1.resid_pre"] + cache["blocks.1.attn.out"]
    )  # global block
    with pytest.raises(AnalysisError, match="compute their softmax themselves"):
        run_with_cache(swin, pixels, names=["blocks.0.attn.q"])  # timm's Swin computes P itself: q, k, v never leave it
    explicit_sam = copy.copy(sam)  # SAM's explicit path: a replacement goes back in the module's layout
    explicit_sam.model = copy.deepcopy(sam.model)
    for site in block_sites(explicit_sam.model):
        site.module.fused_attn = False
    halved = lambda p: p * 0.5  # noqa: E731
    torch.testing.assert_close(
        run_with_hooks(explicit_sam, pixels, {"blocks.0.attn.probs": halved}),
        run_with_hooks(sam, pixels, {"blocks.0.attn.probs": halved}),
        rtol=1e-5,
        atol=1e-5,
    )
    no_hooks_left(swin.model)
    no_hooks_left(sam.model)


def _live_swinv2():
    """A small Swin v2 whose residual branches count: timm starts its post-norms at weight 0
    (every block the identity), where zeroing a head could not change anything."""
    vit = small_swin("swinv2_tiny_window8_256", bias_seed=1)
    with torch.no_grad():
        for name, parameter in vit.model.named_parameters():
            if name.endswith(("norm1.weight", "norm2.weight")):
                parameter.fill_(1.0)
    return vit


@pytest.mark.parametrize("kind", ["swin", "swinv2", "sam"])
def test_zeroing_a_windowed_head_equals_zeroing_its_projection_columns(kind):
    """Ablation on a windowed model: z's head h set to 0 equals a deep copy whose output
    projection ignores head h (its input columns zeroed)."""
    vit = {"swin": lambda: small_swin(bias_seed=1), "swinv2": _live_swinv2, "sam": small_sam}[kind]()
    pixels = small_pixels()
    layer, head = 2, 1
    site = block_sites(vit.model)[layer]
    heads = site.adapter.num_heads(site.module)

    def zero_head(z):  # (B·windows, Wt, heads, d); a SAM global block: one window
        z = z.clone()
        z[..., head, :] = 0
        return z

    got = run_with_hooks(vit, pixels, {f"blocks.{layer}.attn.z": zero_head})
    reference = copy.deepcopy(vit.model)
    projection = block_sites(reference)[layer].module.proj
    d = projection.in_features // heads
    with torch.no_grad():
        projection.weight[:, head * d : (head + 1) * d] = 0
        expected = reference(pixels)
    torch.testing.assert_close(got, expected.float(), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, run_with_hooks(vit, pixels, {}), atol=1e-4)
    no_hooks_left(vit.model)


def test_other_threads_keep_the_untouched_model_while_a_hook_runs(family_vits):
    """A hook that zeroes every head waits, mid-forward, until another thread has run the same
    model: that thread's logits are bit-identical to an unhooked forward."""
    vit = family_vits["vit"]
    pixels = family_pixels("vit")
    with torch.no_grad():
        baseline = vit.model(pixels)
    inside, release = threading.Event(), threading.Event()
    results = {}

    def hook(z):
        inside.set()
        release.wait(timeout=60)
        return torch.zeros_like(z)

    def hooked():
        results["hooked"] = run_with_hooks(vit, pixels, {"blocks.0.attn.z": hook})

    worker = threading.Thread(target=hooked)
    worker.start()
    try:
        assert inside.wait(timeout=60)
        with torch.no_grad():
            results["other"] = vit.model(pixels)
    finally:
        release.set()
        worker.join(timeout=60)
    assert torch.equal(results["other"], baseline)
    assert (results["hooked"] - baseline.float()).abs().max() > 1e-4
    _assert_no_hooks(vit.model)


def test_a_batch_split_after_out_of_memory_gives_the_same_cache(family_vits, monkeypatch):
    import analysis.engine.activations.run as run_module

    vit = family_vits["vit"]
    pixels = family_pixels("vit", batch=3)
    whole = run_with_cache(vit, pixels, names=["blocks.1.attn.probs", "blocks.0.resid_post"])
    monkeypatch.setattr(
        run_module, "run_with_oom_fallback", lambda run, batch, cpu: [run(batch[:1]), run(batch[1:])]
    )  # as after one out-of-memory halving
    split = run_with_cache(vit, pixels, names=["blocks.1.attn.probs", "blocks.0.resid_post"])
    for name in whole:
        torch.testing.assert_close(split[name], whole[name], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(split.logits, whole.logits, rtol=1e-5, atol=1e-6)


def test_a_block_missing_a_branch_point_leaves_no_hook_behind(family_vits):
    """A check that fails halfway through a block's hooks (no drop_path2 for mlp.out) must not
    leave the hooks registered before it on the model."""
    vit = copy.copy(family_vits["vit"])
    vit.model = copy.deepcopy(vit.model)
    del vit.model.blocks[0].drop_path2
    with pytest.raises(AnalysisError, match="no drop_path2"):
        run_with_cache(
            vit, family_pixels("vit"), names=["blocks.0.resid_pre", "blocks.0.attn.probs", "blocks.0.mlp.out"]
        )
    _assert_no_hooks(vit.model)
    with pytest.raises(AnalysisError, match="names must be"):
        run_with_cache(vit, family_pixels("vit"), names=5)
