"""Token capture, the logit lens and high-norm artifacts, against plain hooks and loops."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import analysis
from analysis import AnalysisError, capture_attention
from analysis.tokens import attention_mass, capture_tokens, high_norm_tokens, logit_lens, token_norms
from conftest import make_vit, random_pixels


@pytest.fixture(scope="module")
def models(vits):
    return {
        "demo": analysis.load_vit("demo", device="cpu"),
        "registers": vits["registers"],
        "no_class_token": vits["no_class_token"],
        "class_token": vits["class_token"],
    }


def hooked(model, pixels):
    """Independent reference: per block, its output, and q/k (k_norm / q_norm outputs) and v
    (recomputed from the block's qkv projection)."""
    out = {"token": [], "query": [], "key": [], "value": []}
    handles = []
    for block in model.blocks:
        attn = block.attn
        handles.append(block.register_forward_hook(lambda m, a, o: out["token"].append(o)))
        handles.append(attn.q_norm.register_forward_hook(lambda m, a, o: out["query"].append(o)))
        handles.append(attn.k_norm.register_forward_hook(lambda m, a, o: out["key"].append(o)))

        def values(module, args, attn=attn):
            x = args[0]
            batch, tokens, _ = x.shape
            qkv = attn.qkv(x).reshape(batch, tokens, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
            out["value"].append(qkv[2])

        handles.append(attn.register_forward_pre_hook(values))
    with torch.no_grad():
        model(pixels)
    for handle in handles:
        handle.remove()
    concat = lambda x: x.permute(0, 2, 1, 3).reshape(x.shape[0], x.shape[2], -1)  # noqa: E731
    return {
        "token": torch.stack(out["token"]),
        **{kind: torch.stack([concat(x) for x in out[kind]]) for kind in ("query", "key", "value")},
    }


@pytest.mark.parametrize("name", ["demo", "registers", "no_class_token"])
def test_capture_tokens_equals_plain_hooks(models, name):
    vit = models[name]
    pixels = random_pixels(vit)
    reference = hooked(vit.model, pixels)
    for kind, expected in reference.items():
        got = capture_tokens(vit, pixels, kind=kind)
        assert isinstance(got, analysis.TokenRecord) and got.kind == kind and got.spec == vit.spec
        assert got.layers == tuple(range(vit.spec.num_layers))
        assert got.tokens.shape == expected.shape == (vit.spec.num_layers, 2, vit.spec.num_tokens, vit.spec.embed_dim)
        torch.testing.assert_close(got.tokens, expected, rtol=1e-5, atol=1e-5, msg=kind)
    last = vit.spec.num_layers - 1
    some = capture_tokens(vit, pixels, kind="key", layers=[-1, 0], dtype=torch.float16)  # kept in the order asked
    assert some.tokens.dtype == torch.float16 and some.layers == (last, 0)
    torch.testing.assert_close(some.tokens[0].float(), reference["key"][-1], rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(some.tokens[1].float(), reference["key"][0], rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(some.layer_tokens(0), some.tokens[1], rtol=0, atol=0)
    assert not torch.equal(some.tokens[0], some.tokens[1])
    prefix = vit.spec.num_prefix_tokens  # the split, against slices of the reference
    torch.testing.assert_close(some.prefix(0).float(), reference["key"][0][:, :prefix], rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(some.patches(last).float(), reference["key"][-1][:, prefix:], rtol=1e-2, atol=1e-2)
    assert some.patches().shape == (2, 2, vit.spec.num_patches, vit.spec.embed_dim)
    for module in vit.model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks


def test_rope_keys_are_taken_after_the_rotation():
    """For RoPE models the captured q and k are what the softmax compares: softmax(scale·q·kᵀ)
    rebuilt from them equals the captured attention (the k_norm output would not)."""
    from families import FAMILIES

    arch, kwargs, size, _ = FAMILIES["eva02"]
    vit = analysis.load_vit(arch, pretrained=False, device="cpu", **kwargs)
    pixels = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(0))
    q, k = capture_tokens(vit, pixels, kind="query").tokens, capture_tokens(vit, pixels, kind="key").tokens
    attention = capture_attention(vit, pixels).attentions  # (L, 1, heads, T, T)
    heads, dim = vit.spec.num_heads, vit.spec.embed_dim // vit.spec.num_heads
    for layer in range(vit.spec.num_layers):
        ql = q[layer, 0].reshape(-1, heads, dim).transpose(0, 1)  # (heads, T, d)
        kl = k[layer, 0].reshape(-1, heads, dim).transpose(0, 1)
        rebuilt = (ql @ kl.transpose(-2, -1) * dim**-0.5).softmax(-1)
        torch.testing.assert_close(rebuilt, attention[layer, 0], rtol=1e-4, atol=1e-5)


def test_logit_lens_reads_every_layer_through_the_head(models):
    vit = models["demo"]
    pixels = random_pixels(vit)
    lens = logit_lens(vit, pixels)
    spec = vit.spec
    assert lens.shape == (spec.num_layers, 2, spec.num_outputs)
    hidden = hooked(vit.model, pixels)["token"]
    with torch.no_grad():
        logits = vit.model(pixels)
        for layer in range(spec.num_layers):
            torch.testing.assert_close(lens[layer], vit.model.forward_head(vit.model.norm(hidden[layer])))
    assert torch.equal(lens[-1], logits)


def test_logit_lens_last_layer_is_the_logits_for_every_family():
    from families import FAMILIES

    for family, (arch, kwargs, size, _) in FAMILIES.items():
        vit = analysis.load_vit(arch, pretrained=False, device="cpu", **{**kwargs, "num_classes": 5})
        pixels = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(0))
        if not vit.spec.has_classifier:
            with pytest.raises(AnalysisError, match="no"):
                logit_lens(vit, pixels)
            continue
        with torch.no_grad():
            logits = vit.model(pixels)
        torch.testing.assert_close(logit_lens(vit, pixels)[-1], logits, rtol=1e-5, atol=1e-5, msg=family)


def test_high_norm_tokens_finds_exactly_the_edited_tokens():
    vit = make_vit("class_token", img_size=160)  # 10 x 10 patches: 2 planted = 2%, as in the paper
    model = copy.deepcopy(vit.model)
    prefix = vit.spec.num_prefix_tokens
    planted = [3, 57]
    with torch.no_grad():
        direction = torch.randn(vit.spec.embed_dim, generator=torch.Generator().manual_seed(0))
        for patch in planted:
            model.pos_embed[0, prefix + patch] += 40 * direction / direction.norm() * 10
    edited = analysis.load_vit(model, img_size=vit.spec.img_size)
    pixels = random_pixels(vit)
    found = high_norm_tokens(token_norms(capture_tokens(edited, pixels)), prefix)
    assert found.first_layer == 0
    for layer in range(vit.spec.num_layers):
        for image in range(2):
            assert found.positions(layer, image) == planted, (layer, image)
    assert torch.allclose(found.fraction, torch.full((vit.spec.num_layers,), 2 / vit.spec.num_patches))
    clean = high_norm_tokens(token_norms(capture_tokens(vit, pixels)), prefix)
    assert clean.first_layer is None and not clean.mask.any() and torch.isinf(clean.thresholds).all()
    # the record itself: each layer read on its geometry (prefix left out) gives the same outliers
    from_record = high_norm_tokens(capture_tokens(edited, pixels))
    assert torch.equal(from_record.mask, found.mask) and torch.equal(from_record.thresholds, found.thresholds)
    assert torch.equal(from_record.fraction, found.fraction) and from_record.first_layer == found.first_layer
    with pytest.raises(AnalysisError, match="drop num_prefix_tokens"):
        high_norm_tokens(capture_tokens(edited, pixels), prefix)
    with pytest.raises(AnalysisError, match="how many leading tokens"):
        high_norm_tokens(token_norms(capture_tokens(edited, pixels)))


def test_a_records_layers_split_into_prefix_and_grid_cells_by_their_geometry(models):
    vit = models["registers"]  # class + 4 registers, a 4x4 grid
    captured = capture_tokens(vit, random_pixels(vit), layers=[1, 0])
    prefix, (gh, gw) = vit.spec.num_prefix_tokens, vit.spec.grid_size
    layer = captured.tokens[0]  # model layer 1, (B, T, D)
    assert torch.equal(captured.prefix(1), layer[:, :prefix]) and torch.equal(captured.patches(1), layer[:, prefix:])
    torch.testing.assert_close(captured.grid_tokens(1)[:, 2, 3], layer[:, prefix + 2 * gw + 3], rtol=0, atol=0)
    assert torch.equal(captured.patches(), captured.tokens[:, :, prefix:])  # every layer of one grid at once
    assert captured.geometry(0).prefix_tokens == prefix and captured.geometry(0).grid_size == (gh, gw)


def test_token_norms_and_attention_mass_against_loops(models):
    vit = models["registers"]
    pixels = random_pixels(vit)
    captured = capture_tokens(vit, pixels)
    tokens = captured.tokens
    norms = token_norms(captured)
    assert norms[1, 0, 3] == pytest.approx(float(np.sqrt((tokens[1, 0, 3].double() ** 2).sum())), rel=1e-5)
    record = capture_attention(vit, pixels)
    prefix = vit.spec.num_prefix_tokens
    mass = attention_mass(record, range(prefix))  # (L, B, heads)
    a = record.attentions.double()
    for layer in range(vit.spec.num_layers):
        for head in range(vit.spec.num_heads):
            queries = range(prefix, vit.spec.num_tokens)
            expected = sum(float(a[layer, 1, head, q, :prefix].sum()) for q in queries) / len(queries)
            assert float(mass[layer, 1, head]) == pytest.approx(expected, rel=1e-5)
    mask = torch.zeros(2, vit.spec.num_tokens, dtype=torch.bool)
    mask[:, :prefix] = True
    torch.testing.assert_close(attention_mass(record, mask), mass)


def test_uniform_attention_gives_each_token_one_over_t():
    from test_analyses import synthetic_record

    tokens = 2 + 3 * 4
    record = synthetic_record(torch.full((2, 1, 3, tokens, tokens), 1 / tokens), grid=(3, 4), prefix=2)
    mass = attention_mass(record, [0, 1, 5])
    torch.testing.assert_close(mass, torch.full_like(mass, 3 / record.spec.num_tokens))


def test_bad_token_requests_are_typed_errors(models):
    vit = models["demo"]
    pixels = random_pixels(vit)
    with pytest.raises(AnalysisError, match="kind"):
        capture_tokens(vit, pixels, kind="residual")
    headless = models["registers"]
    with pytest.raises(AnalysisError, match="class head"):
        logit_lens(headless, random_pixels(headless))
    explicit = copy.deepcopy(vit.model)
    for block in explicit.blocks:
        block.attn.fused_attn = False
    with pytest.raises(AnalysisError, match="compute their softmax themselves"):
        capture_tokens(analysis.load_vit(explicit, img_size=vit.spec.img_size), pixels, kind="key")
    with pytest.raises(AnalysisError, match="no patch tokens"):
        high_norm_tokens(torch.ones(1, 1, 3), 3)
    with pytest.raises(AnalysisError, match="Key tokens"):
        attention_mass(capture_attention(vit, pixels), [vit.spec.num_tokens])


def _spec(grid=(3, 5), prefix=2, dim=6):
    from analysis import ViTSpec

    return ViTSpec(
        patch_size=(4, 4),
        grid_size=grid,
        num_prefix_tokens=prefix,
        num_layers=1,
        num_heads=1,
        embed_dim=dim,
        img_size=(4 * grid[0], 4 * grid[1]),
        has_class_token=True,
    )


def test_feature_pca_equals_numpy_pca_with_its_sign_rule():
    from analysis.tokens import feature_pca

    spec = _spec()
    rng = np.random.default_rng(0)
    tokens = torch.from_numpy(rng.normal(size=(2, spec.num_tokens, spec.embed_dim)) * [5, 3, 2, 1, 0.5, 0.1])
    rgb, fitted = feature_pca(tokens, spec)
    assert rgb.shape == (2, 3, 5, 3) and fitted.all()
    rows = tokens[:, 2:].numpy().reshape(-1, spec.embed_dim)
    centred = rows - rows.mean(0)
    covariance = centred.T @ centred / len(rows)
    values, vectors = np.linalg.eigh(covariance)
    axes = vectors[:, ::-1][:, :3].T  # the three largest
    axes *= np.sign(axes[np.arange(3), np.abs(axes).argmax(1)])[:, None]
    projected = centred @ axes.T
    expected = (projected - projected.min(0)) / (projected.max(0) - projected.min(0))
    np.testing.assert_allclose(rgb.numpy().reshape(-1, 3), expected, rtol=1e-5, atol=1e-6)


def test_feature_pca_on_one_direction_and_foreground():
    from analysis.tokens import feature_pca

    spec = _spec(grid=(4, 4), prefix=1, dim=5)
    direction = torch.tensor([0.0, 3.0, 0.0, 4.0, 0.0]) / 5
    amount = torch.zeros(16)
    amount[[5, 6, 9]] = 10.0  # a small bright "object"
    amount += torch.linspace(0, 1, 16)  # and a gentle background ramp
    tokens = torch.zeros(1, 17, 5)
    tokens[0, 1:] = amount[:, None] * direction
    tokens[0, 1:, 0] = torch.linspace(-0.01, 0.01, 16)  # a tiny second direction
    rgb, _ = feature_pca(tokens, spec, n_components=1)
    order = rgb[0, ..., 0].flatten().argsort()
    assert order.tolist() == amount.argsort().tolist()  # the first component is the amount
    fg_rgb, fg = feature_pca(tokens, spec, n_components=1, foreground=True)
    assert fg[0].flatten().nonzero().flatten().tolist() == [5, 6, 9]
    assert (fg_rgb[0][~fg[0]] == 0).all()


def test_patch_similarity_against_a_loop():
    from analysis.tokens import patch_similarity

    spec = _spec()
    rng = np.random.default_rng(1)
    tokens = torch.from_numpy(rng.normal(size=(1, spec.num_tokens, spec.embed_dim)))
    other = torch.from_numpy(rng.normal(size=(1, spec.num_tokens, spec.embed_dim)))
    for query, vector in ((4, tokens[0, 2 + 4]), ("cls", tokens[0, 0]), ("mean", tokens[0, 2:].mean(0))):
        for target in (None, other):
            got = patch_similarity(tokens, spec, query, other=target)
            patches = (tokens if target is None else target)[0, 2:]
            for p in range(spec.num_patches):
                u, v = patches[p].numpy(), vector.numpy()
                expected = u @ v / (np.linalg.norm(u) * np.linalg.norm(v))
                assert float(got.flatten()[p]) == pytest.approx(expected, abs=1e-6)
    assert float(patch_similarity(tokens, spec, 4).flatten()[4]) == pytest.approx(1.0)
    with pytest.raises(AnalysisError, match="outside"):
        patch_similarity(tokens, spec, spec.num_patches)
    with pytest.raises(AnalysisError, match="T="):
        patch_similarity(tokens[:, 1:], spec, 0)


def test_prefix_tokens_are_named_and_queryable(vits):
    from families import FAMILIES

    assert vits["registers"].spec.token_names == ("class", "register 1", "register 2", "register 3", "register 4")
    assert vits["distilled"].spec.token_names == ("class", "distillation")
    assert vits["no_class_token"].spec.token_names == ()
    arch, kwargs, _, _ = FAMILIES["rope_reg1_gap"]
    assert analysis.load_vit(arch, pretrained=False, device="cpu", **kwargs).spec.token_names == ("register 1",)
    vit = vits["registers"]
    record = capture_attention(vit, random_pixels(vit))
    prefix = vit.spec.num_prefix_tokens
    for token in range(prefix):
        got = analysis.attention_map(record, 1, head=2, query=f"prefix:{token}")
        expected = record.attentions[1, :, 2, token, prefix:].reshape(2, *vit.spec.grid_size)
        torch.testing.assert_close(got, expected)
    torch.testing.assert_close(
        analysis.attention_map(record, 0, query="prefix:0"), analysis.attention_map(record, 0, query="cls")
    )
    with pytest.raises(AnalysisError, match="5 prefix tokens"):
        analysis.attention_map(record, 0, query="prefix:5")
    tokens = capture_tokens(vit, random_pixels(vit)).tokens[-1]
    from analysis import patch_similarity

    expected = torch.nn.functional.cosine_similarity(tokens[0, prefix:].double(), tokens[0, 3].double()[None], dim=-1)
    torch.testing.assert_close(patch_similarity(tokens, vit.spec, "prefix:3").flatten(), expected.float())


@pytest.mark.parametrize("registers", [False, True])
def test_every_querys_similarity_row_is_patch_similarity_of_that_query(registers):
    """``patch_similarity_rows`` (the Tokens page's instant view, one matrix product) against
    :func:`analysis.patch_similarity` called query by query: each token by its own query (a prefix
    token as ``"prefix:<j>"``, a patch by its index), found at its place in the sequence, then the
    mean patch token."""
    from analysis.records.queries import resolve_query
    from analysis.tokens.features import patch_similarity, patch_similarity_rows
    from model_folders import model_folder

    source = (
        model_folder("vit_small_patch14_reg4_dinov2", img_size=56, embed_dim=48, depth=2, num_heads=2)
        if registers
        else "demo"
    )
    vit = analysis.load_vit(source)
    spec = vit.spec
    tokens = capture_tokens(vit, random_pixels(vit, seed=3), kind="token", layers=[1]).layer_tokens(1)  # (1, T, D)
    rows = patch_similarity_rows(tokens, spec)
    assert rows.shape == (spec.num_tokens + 1, spec.num_patches)
    queries = [f"prefix:{j}" for j in range(spec.num_prefix_tokens)] + list(range(spec.num_patches))
    for query in queries:
        (position,) = resolve_query(spec, query).tokens
        expected = patch_similarity(tokens, spec, query).ravel()
        torch.testing.assert_close(rows[position], expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(rows[-1], patch_similarity(tokens, spec, "mean").ravel(), rtol=1e-6, atol=1e-6)
