"""Every analysis against explicit loops, plus analytic cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from analysis import (
    AnalysisError,
    AttentionRecord,
    ViTSpec,
    attention_map,
    attention_rollout,
    capture_attention,
    mean_attention_distance,
    patch_embedding_components,
    position_embedding_similarity,
    position_encoding_kinds,
)
from analysis.attention.rollout import rollout_matrices
from conftest import random_pixels
from reference import loop_attention_distance, loop_rollout


def synthetic_record(attentions: torch.Tensor, grid=(3, 4), patch=(16, 8), prefix=1, has_cls=True) -> AttentionRecord:
    """A record built from given attention (L, B, heads, T, T)."""
    layers, batch, heads, tokens, _ = attentions.shape
    assert tokens == prefix + grid[0] * grid[1]
    spec = ViTSpec(
        patch_size=patch,
        grid_size=grid,
        num_prefix_tokens=prefix,
        num_layers=layers,
        num_heads=heads,
        embed_dim=8,
        img_size=(grid[0] * patch[0], grid[1] * patch[1]),
        has_class_token=has_cls,
    )
    return AttentionRecord(attentions=attentions, logits=torch.zeros(batch, 1), spec=spec, layers=tuple(range(layers)))


def random_attention(layers=3, batch=2, heads=3, tokens=13, seed=0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(layers, batch, heads, tokens, tokens, generator=generator) * 2
    return scores.softmax(-1)


# ----------------------------------------------------------------------------- attention_map


def test_attention_map_picks_the_right_row_and_columns():
    attn = random_attention(tokens=14)  # 2 prefix tokens + a 3x4 grid
    record = synthetic_record(attn, grid=(3, 4), prefix=2)
    got = attention_map(record, 1, head=2, query="cls")
    for b in range(2):
        for i in range(3):
            for j in range(4):
                assert got[b, i, j] == pytest.approx(float(attn[1, b, 2, 0, 2 + i * 4 + j]), abs=1e-7)
    assert torch.equal(attention_map(record, 0, query=np.int64(5)), attention_map(record, 0, query=5))
    mean_heads = attention_map(record, 0, query=5)
    expected = attn[0, :, :, 2 + 5, 2:].mean(1).reshape(2, 3, 4)
    torch.testing.assert_close(mean_heads, expected)
    mean_query = attention_map(record, -1, head=0, query="mean")
    expected = attn[2, :, 0, 2:, 2:].mean(1).reshape(2, 3, 4)
    torch.testing.assert_close(mean_query, expected)


def test_one_query_default_for_every_map():
    """``query=None`` is the class token when there is one, else the mean of the patch queries,
    for attention_map as for rollout (one rule: analysis.records.queries.default_query)."""
    with_cls = synthetic_record(random_attention(tokens=14), grid=(3, 4), prefix=2, has_cls=True)
    gap = synthetic_record(random_attention(tokens=12), grid=(3, 4), prefix=0, has_cls=False)
    torch.testing.assert_close(attention_map(with_cls, 1), attention_map(with_cls, 1, query="cls"))
    torch.testing.assert_close(attention_map(gap, 1), attention_map(gap, 1, query="mean"))
    torch.testing.assert_close(attention_rollout(with_cls), attention_rollout(with_cls, query="cls"))
    torch.testing.assert_close(attention_rollout(gap), attention_rollout(gap, query="mean"))


def test_attention_map_errors_are_typed():
    record = synthetic_record(random_attention(tokens=12), grid=(3, 4), prefix=0, has_cls=False)
    with pytest.raises(AnalysisError, match="no class token"):
        attention_map(record, 0, query="cls")
    with pytest.raises(AnalysisError, match="outside"):
        attention_map(record, 0, query=12)
    with pytest.raises(AnalysisError, match="head=7 does not exist"):
        attention_map(record, 0, head=7, query="mean")
    with pytest.raises(AnalysisError, match="layer=5 does not exist"):
        attention_map(record, 5, query="mean")


def test_attention_map_on_real_models(any_vit):
    record = capture_attention(any_vit, random_pixels(any_vit))
    query = "cls" if any_vit.spec.has_class_token else "mean"
    grid = attention_map(record, 0, query=query)
    assert grid.shape == (2, *any_vit.spec.grid_size)


# ----------------------------------------------------------------------------- distance


def test_distance_matches_explicit_loops():
    attn = random_attention(layers=2, tokens=13)
    record = synthetic_record(attn, grid=(3, 4), patch=(16, 8), prefix=1)
    for renormalize in (True, False):
        got = mean_attention_distance(record, renormalize=renormalize, per_image=True)  # (B, L, heads)
        for layer in range(2):
            expected = loop_attention_distance(attn[layer].double().numpy(), (3, 4), (16, 8), 1, renormalize)
            np.testing.assert_allclose(got[:, layer].numpy(), expected, rtol=1e-10, atol=1e-9)
    averaged = mean_attention_distance(record)
    torch.testing.assert_close(averaged, mean_attention_distance(record, per_image=True).mean(0))


def test_distance_analytic_identity_and_uniform():
    tokens = 1 + 14 * 14
    identity = torch.eye(tokens).expand(1, 1, 2, tokens, tokens).clone()
    record = synthetic_record(identity, grid=(14, 14), patch=(16, 16), prefix=1)
    assert mean_attention_distance(record).abs().max() == 0
    uniform = torch.full((1, 1, 2, tokens, tokens), 1.0 / tokens)
    record = synthetic_record(uniform, grid=(14, 14), patch=(16, 16), prefix=1)
    assert mean_attention_distance(record)[0, 0].item() == pytest.approx(116.49, abs=0.01)
    # one neighbour exactly one patch to the right, as in a known grid
    shift = torch.zeros(1, 1, 1, 4, 4)
    shift[0, 0, 0, 0, 1] = shift[0, 0, 0, 1, 0] = shift[0, 0, 0, 2, 3] = shift[0, 0, 0, 3, 2] = 1.0
    record = synthetic_record(shift, grid=(2, 2), patch=(10, 7), prefix=0, has_cls=False)
    assert mean_attention_distance(record).item() == pytest.approx(7.0)


def test_distance_on_real_models_matches_loops(any_vit):
    record = capture_attention(any_vit, random_pixels(any_vit, batch=1))
    spec = any_vit.spec
    distance = mean_attention_distance(record, per_image=True)[0]  # (L, heads)
    for layer in range(spec.num_layers):
        expected = loop_attention_distance(
            record.attentions[layer].double().numpy(), spec.grid_size, spec.patch_size, spec.num_prefix_tokens
        )
        np.testing.assert_allclose(distance[layer].numpy(), expected[0], rtol=1e-9)


# ----------------------------------------------------------------------------- rollout


@pytest.mark.parametrize("fusion", ["mean", "max", "min"])
@pytest.mark.parametrize("discard", [0.0, 0.3, 0.9])
def test_rollout_matches_explicit_loops(fusion, discard):
    attn = random_attention(layers=3, batch=2, heads=3, tokens=13, seed=1)
    record = synthetic_record(attn, grid=(3, 4), prefix=1)
    got = rollout_matrices(record, head_fusion=fusion, discard_ratio=discard)
    for b in range(2):
        expected = loop_rollout(attn[:, b].double().numpy(), fusion, discard)
        np.testing.assert_allclose(got[b].numpy(), expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got.sum(-1), torch.ones(2, 13, dtype=torch.float64))
    grid = attention_rollout(record, head_fusion=fusion, discard_ratio=discard)
    torch.testing.assert_close(grid, got[:, 0, 1:].reshape(2, 3, 4).float())


def test_rollout_normalises_rows_not_columns():
    """Dividing by column sums (the widespread bug) changes max fusion results; ours matches rows."""
    attn = random_attention(layers=1, batch=1, heads=4, tokens=5, seed=3)
    record = synthetic_record(attn, grid=(2, 2), prefix=1)
    fused = attn[0, 0].double().amax(0)
    mixed = 0.5 * fused + 0.5 * torch.eye(5, dtype=torch.float64)
    rows = mixed / mixed.sum(-1, keepdim=True)
    columns = mixed / mixed.sum(-1)  # broadcasting divides entry (i, j) by row j's sum
    got = rollout_matrices(record, head_fusion="max")[0]
    torch.testing.assert_close(got, rows)
    assert (got - columns).abs().max() > 1e-3


def test_rollout_start_end_and_queries():
    attn = random_attention(layers=4, tokens=13, seed=2)
    record = synthetic_record(attn, grid=(3, 4), prefix=1)
    later = rollout_matrices(record, start_layer=2)
    sub = synthetic_record(attn[2:], grid=(3, 4), prefix=1)
    torch.testing.assert_close(later, rollout_matrices(sub))
    first_two = rollout_matrices(record, end_layer=1)
    torch.testing.assert_close(first_two, rollout_matrices(synthetic_record(attn[:2], grid=(3, 4), prefix=1)))
    patch = attention_rollout(record, query=5)
    torch.testing.assert_close(patch, rollout_matrices(record)[:, 6, 1:].reshape(2, 3, 4).float())


@pytest.mark.parametrize("start", [0, 2])
def test_rollout_by_layer_equals_one_rollout_per_end_layer(start):
    from analysis import attention_rollout_by_layer

    attn = random_attention(layers=4, tokens=13, seed=5)
    record = synthetic_record(attn, grid=(3, 4), prefix=1)
    strip = attention_rollout_by_layer(record, head_fusion="max", discard_ratio=0.2, start_layer=start, query=3)
    assert strip.shape == (4 - start, 2, 3, 4)
    for i, end in enumerate(range(start, 4)):
        one = attention_rollout(record, head_fusion="max", discard_ratio=0.2, start_layer=start, end_layer=end, query=3)
        torch.testing.assert_close(strip[i], one)


def test_rollout_analytic_identity_and_no_class_token():
    tokens = 1 + 6
    identity = torch.eye(tokens).expand(3, 1, 2, tokens, tokens).clone()
    record = synthetic_record(identity, grid=(2, 3), prefix=1)
    assert attention_rollout(record).abs().max() == 0  # the class token only ever sees itself
    uniform = torch.full((2, 1, 1, 6, 6), 1 / 6)
    record = synthetic_record(uniform, grid=(2, 3), prefix=0, has_cls=False)
    grid = attention_rollout(record)  # query=None -> mean over patch queries
    torch.testing.assert_close(grid, torch.full((1, 2, 3), 1 / 6))


def test_rollout_on_real_models_matches_loops(any_vit):
    record = capture_attention(any_vit, random_pixels(any_vit, batch=1))
    for fusion, discard in (("mean", 0.0), ("max", 0.5)):
        full = rollout_matrices(record, head_fusion=fusion, discard_ratio=discard)
        expected = loop_rollout(record.attentions[:, 0].double().numpy(), fusion, discard)
        np.testing.assert_allclose(full[0].numpy(), expected, rtol=1e-9, atol=1e-12)
    grid = attention_rollout(record)
    assert grid.shape == (1, *any_vit.spec.grid_size)
    spec = any_vit.spec
    row = 0 if spec.has_class_token else None
    full = rollout_matrices(record)[0]
    over = full[row] if row is not None else full[spec.num_prefix_tokens :].mean(0)
    torch.testing.assert_close(grid[0].flatten().double(), over[spec.num_prefix_tokens :], atol=1e-7, rtol=0)


# ----------------------------------------------------------------------------- position embedding


def explicit_cosine_grid(embeddings: torch.Tensor, grid) -> np.ndarray:
    gh, gw = grid
    e = embeddings.double().numpy()
    out = np.zeros((gh, gw, gh, gw))
    for a in range(gh * gw):
        for b in range(gh * gw):
            out[a // gw, a % gw, b // gw, b % gw] = e[a] @ e[b] / (np.linalg.norm(e[a]) * np.linalg.norm(e[b]))
    return out


def test_position_similarity_matches_explicit_cosine(any_vit):
    model = any_vit.model
    n = any_vit.spec.num_patches
    patch_positions = model.pos_embed[0, -n:].detach()
    expected_prefix = 0 if model.no_embed_class else any_vit.spec.num_prefix_tokens
    assert model.pos_embed.shape[1] == expected_prefix + n
    got = position_embedding_similarity(any_vit)
    assert got.shape == (*any_vit.spec.grid_size, *any_vit.spec.grid_size)
    np.testing.assert_allclose(got.numpy(), explicit_cosine_grid(patch_positions, any_vit.spec.grid_size), atol=1e-6)


def test_position_similarity_resampled(vits):
    vit = vits["non_square"]
    gh, gw = vit.spec.grid_size
    same = position_embedding_similarity(vit, grid_size=(gh, gw))
    torch.testing.assert_close(same, position_embedding_similarity(vit))
    patches = vit.model.pos_embed[0, 1:].detach().reshape(1, gh, gw, -1).permute(0, 3, 1, 2)
    resampled = F.interpolate(patches, size=(6, 7), mode="bicubic", antialias=True, align_corners=False)
    resampled = resampled.permute(0, 2, 3, 1).reshape(42, -1)
    got = position_embedding_similarity(vit, grid_size=(6, 7))
    np.testing.assert_allclose(got.numpy(), explicit_cosine_grid(resampled, (6, 7)), atol=1e-5)


def test_position_similarity_analytic_known_grid(vits):
    """Embeddings set by hand: orthogonal rows and a known cosine between two patches."""
    vit = vits["class_token"]
    model = vit.model
    saved = model.pos_embed.data.clone()
    try:
        n = vit.spec.num_patches
        dim = model.pos_embed.shape[-1]
        new = torch.zeros(1, 1 + n, dim)
        new[0, 1:, :n] = torch.eye(n)  # every patch orthogonal to every other
        new[0, 0] = 1.0  # the class position must be ignored
        new[0, 2, 0] = 1.0  # patch 1 = e1 + e0 -> cos with patch 0 = 1/sqrt(2)
        model.pos_embed.data.copy_(new)
        sim = position_embedding_similarity(vit).reshape(n, n)
        assert sim[0, 1].item() == pytest.approx(1 / math.sqrt(2), abs=1e-6)
        off = sim.clone()
        off[0, 1] = off[1, 0] = 0
        torch.testing.assert_close(off, torch.eye(n))
    finally:
        model.pos_embed.data.copy_(saved)


def loop_distance_bins(sim: np.ndarray, unit: float, width: float) -> list[tuple[float, float, float, float, int]]:
    """Every ordered pair of patches written out: (mean distance, mean, std, lower edge, count)
    per bin, the self-pairs alone, others in [k·w, (k + 1)·w)."""
    gh, gw = sim.shape[:2]
    groups: dict[int, list[tuple[float, float]]] = {}
    for r in range(gh):
        for c in range(gw):
            for r2 in range(gh):
                for c2 in range(gw):
                    d = unit * math.sqrt((r - r2) ** 2 + (c - c2) ** 2)
                    key = -1 if (r, c) == (r2, c2) else int(math.floor(d / width))
                    groups.setdefault(key, []).append((d, float(sim[r, c, r2, c2])))
    out = []
    for key in sorted(groups):
        ds, vs = zip(*groups[key])
        out.append((float(np.mean(ds)), float(np.mean(vs)), float(np.std(vs)), max(key, 0) * width, len(vs)))
    return out


@pytest.mark.parametrize(
    "grid, unit, width", [((3, 5), 1.0, 1.0), ((6, 4), 0.5, 1.0), ((5, 5), 1.0, 0.5), ((1, 7), 0.7, 1.5)]
)
def test_distance_bins_equal_a_loop_over_every_pair(grid, unit, width):
    from analysis import similarity_distance_bins

    gh, gw = grid
    sim = np.random.default_rng(gh * 10 + gw).normal(size=(gh, gw, gh, gw))
    expected = loop_distance_bins(sim, unit, width)
    bins = similarity_distance_bins(sim, unit=unit, bin_width=width)
    np.testing.assert_allclose(bins.distance, [e[0] for e in expected], rtol=1e-12)
    np.testing.assert_allclose(bins.mean, [e[1] for e in expected], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(bins.std, [e[2] for e in expected], rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(bins.lower, [e[3] for e in expected])
    np.testing.assert_array_equal(bins.count, [e[4] for e in expected])
    assert bins.count.sum() == (gh * gw) ** 2 and bins.upper[0] == 0 and bins.count[0] == gh * gw
    np.testing.assert_allclose(bins.upper[1:], bins.lower[1:] + width)


def test_an_all_zero_position_table_is_refused_in_plain_words(vits):
    vit = vits["class_token"]
    saved = vit.model.pos_embed.data.clone()
    try:
        vit.model.pos_embed.data.zero_()
        with pytest.raises(AnalysisError, match="all zero.*learned nothing about position"):
            position_embedding_similarity(vit)
        vit.model.pos_embed.data.copy_(saved)
        vit.model.pos_embed.data[0, 3] = 0  # one patch position (after the class token's)
        with pytest.raises(AnalysisError, match=r"^1 of the \d+ positions"):
            position_embedding_similarity(vit)
    finally:
        vit.model.pos_embed.data.copy_(saved)


def test_sams_absolute_position_table_is_compared_like_a_vits():
    """SAM keeps its absolute table as (1, gh, gw, D): the similarity is that of its cells."""
    from windowed_models import small_sam

    vit = small_sam()
    with torch.no_grad():  # timm starts it at zero
        vit.model.pos_embed.copy_(torch.randn(vit.model.pos_embed.shape, generator=torch.Generator().manual_seed(1)))
    table = vit.model.pos_embed[0].detach()  # (gh, gw, D)
    gh, gw = table.shape[:2]
    assert "learned" in vit.spec.position_embedding and position_encoding_kinds(vit) == ("table",)
    got = position_embedding_similarity(vit)
    np.testing.assert_allclose(got.numpy(), explicit_cosine_grid(table.reshape(gh * gw, -1), (gh, gw)), atol=1e-6)


# ----------------------------------------------------------------------------- patch-embedding PCA


def test_pca_matches_direct_svd_and_covariance(vits):
    vit = vits["non_square"]
    components, ratio = patch_embedding_components(vit, n_components=10)
    weight = vit.model.patch_embed.proj.weight.detach().double().numpy()
    flat = weight.reshape(weight.shape[0], -1)
    centred = flat - flat.mean(0)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    np.testing.assert_allclose(ratio.numpy(), (s**2 / (s**2).sum())[:10], rtol=1e-5)
    got = components.reshape(10, -1).double().numpy()
    for i in range(10):
        sign = np.sign(got[i] @ vt[i])
        np.testing.assert_allclose(got[i], sign * vt[i], atol=1e-5)
    # an independent route: eigenvectors of the covariance
    eigenvalues = np.sort(np.linalg.eigvalsh(centred.T @ centred))[::-1]
    np.testing.assert_allclose(ratio.numpy(), (eigenvalues / eigenvalues.sum())[:10], rtol=1e-4)
    assert components.shape == (10, 3, *vit.spec.patch_size)


def test_pca_analytic_rank_one_filters(vits):
    vit = vits["qk_norm"]
    proj = vit.model.patch_embed.proj
    saved = proj.weight.data.clone()
    try:
        direction = torch.randn(proj.weight[0].shape)
        scales = torch.linspace(-2, 3, proj.weight.shape[0]).view(-1, 1, 1, 1)
        proj.weight.data.copy_(scales * direction)
        components, ratio = patch_embedding_components(vit, n_components=3)
        assert ratio[0].item() == pytest.approx(1.0, abs=1e-5)
        unit = direction / direction.norm()
        cos = (components[0].flatten() @ unit.flatten()).abs().item()
        assert cos == pytest.approx(1.0, abs=1e-5)
    finally:
        proj.weight.data.copy_(saved)


def test_pca_refuses_hybrid_models():
    from analysis import load_vit

    hybrid = load_vit("vit_tiny_r_s16_p8_224", pretrained=False, img_size=64)
    with pytest.raises(AnalysisError, match="hybrid"):
        patch_embedding_components(hybrid)


def test_distance_units_divide_by_the_patch_side_and_the_image_side():
    """Analytic: one 3x4 grid with 16x8 px or 4x2 px patches (one picture, 4x the resolution)
    has one uniform distance in patch units and in image-side units, not in pixels; one
    patch step between square-patch neighbours is exactly 1 patch."""
    from analysis import DISTANCE_UNITS, distance_in_units, distance_unit_length, uniform_attention_distance

    uniform = torch.full((1, 1, 1, 13, 13), 1 / 13)
    big = synthetic_record(uniform, patch=(16, 8)).spec
    small = synthetic_record(uniform, patch=(4, 2)).spec
    assert distance_unit_length(big, "px") == 1.0
    assert distance_unit_length(big, "patches") == pytest.approx(math.sqrt(16 * 8))
    assert distance_unit_length(big, "image") == pytest.approx(math.sqrt(48 * 32))
    for unit in ("patches", "image"):
        assert distance_in_units(uniform_attention_distance(big), big, unit) == pytest.approx(
            distance_in_units(uniform_attention_distance(small), small, unit), rel=1e-12
        )
    assert uniform_attention_distance(big) == pytest.approx(4 * uniform_attention_distance(small))
    # square patches: one patch step between horizontal neighbours is exactly 1 patch
    square = synthetic_record(torch.full((1, 1, 1, 3, 3), 1 / 3), grid=(1, 2), patch=(10, 10), prefix=1).spec
    from analysis.attention.distance import patch_distance_matrix

    assert distance_in_units(patch_distance_matrix(square)[0, 1].item(), square, "patches") == pytest.approx(1.0)
    assert set(DISTANCE_UNITS) == {"px", "patches", "image"}
    with pytest.raises(AnalysisError, match="Unknown distance unit"):
        distance_unit_length(big, "inches")
