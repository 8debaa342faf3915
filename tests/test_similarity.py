"""Representation similarity (linear CKA) against slow references: HSIC from explicit loops over
the Gram matrices, CKA from the features (Kornblith et al.'s feature-space form), its invariances,
the minibatch estimator approaching the full one, and the library's layers read back by plain
forward hooks and timm's own ``forward_intermediates``."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import analysis
from analysis import AnalysisError, representation_similarity
from analysis.robustness import load_cnn
from analysis.similarity import CKAAccumulator, gram, hsic_biased, hsic_unbiased, resolve_images


def loop_hsic_biased(k: np.ndarray, m: np.ndarray) -> float:
    """tr(K·H·L·H) / (n − 1)², every product written out."""
    n = k.shape[0]
    h = [[(1.0 if i == j else 0.0) - 1.0 / n for j in range(n)] for i in range(n)]

    def matmul(a, b):
        return [[sum(a[i][t] * b[t][j] for t in range(n)) for j in range(n)] for i in range(n)]

    product = matmul(matmul(matmul(k.tolist(), h), m.tolist()), h)
    return sum(product[i][i] for i in range(n)) / (n - 1) ** 2


def loop_hsic_unbiased(k: np.ndarray, m: np.ndarray) -> float:
    """Song et al. 2012, term by term over the entries (diagonals set to 0)."""
    n = k.shape[0]
    kt = [[0.0 if i == j else float(k[i, j]) for j in range(n)] for i in range(n)]
    lt = [[0.0 if i == j else float(m[i, j]) for j in range(n)] for i in range(n)]
    trace = sum(kt[i][j] * lt[j][i] for i in range(n) for j in range(n))
    sum_k = sum(kt[i][j] for i in range(n) for j in range(n))
    sum_l = sum(lt[i][j] for i in range(n) for j in range(n))
    cross = sum(kt[i][t] * lt[t][j] for i in range(n) for t in range(n) for j in range(n))
    return (trace + sum_k * sum_l / ((n - 1) * (n - 2)) - 2.0 / (n - 2) * cross) / (n * (n - 3))


def feature_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Kornblith et al.'s linear CKA from the features: ‖Yᵀ·X‖²_F / (‖Xᵀ·X‖_F · ‖Yᵀ·Y‖_F), centred columns."""
    x, y = x - x.mean(0), y - y.mean(0)
    return float(np.linalg.norm(y.T @ x) ** 2 / (np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y)))


def correlated(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Two representations of ``n`` samples that share a 3-d signal, with their own noise."""
    g = torch.Generator().manual_seed(seed)
    signal = torch.randn(n, 3, generator=g, dtype=torch.float64)
    x = signal @ torch.randn(3, 20, generator=g, dtype=torch.float64) + 0.5 * torch.randn(
        n, 20, generator=g, dtype=torch.float64
    )
    y = signal @ torch.randn(3, 12, generator=g, dtype=torch.float64) + 0.8 * torch.randn(
        n, 12, generator=g, dtype=torch.float64
    )
    return x, y


def test_hsic_equals_the_loops():
    x, y = correlated(7)
    grams = torch.stack([gram(x), gram(y)])
    biased, unbiased = hsic_biased(grams, grams), hsic_unbiased(grams, grams)
    for (i, a), (j, b) in itertools.product(enumerate(grams), repeat=2):
        assert float(biased[i, j]) == pytest.approx(loop_hsic_biased(a.numpy(), b.numpy()), rel=1e-10)
        assert float(unbiased[i, j]) == pytest.approx(loop_hsic_unbiased(a.numpy(), b.numpy()), rel=1e-10)


def test_full_cka_is_the_feature_space_formula_and_keeps_its_invariances():
    x, y = correlated(40)
    accumulator = CKAAccumulator("full")
    accumulator.add([x[:25], y[:25]], [x[:25], y[:25]])  # two batches of one set
    accumulator.add([x[25:], y[25:]], [x[25:], y[25:]])
    matrix = accumulator.matrix()
    assert float(matrix[0, 1]) == pytest.approx(feature_cka(x.numpy(), y.numpy()), rel=1e-10)
    np.testing.assert_allclose(torch.diagonal(matrix).numpy(), 1.0, rtol=1e-12)
    q, _ = torch.linalg.qr(torch.randn(20, 20, generator=torch.Generator().manual_seed(3), dtype=torch.float64))
    for transformed in (x @ q, 7.5 * x, 7.5 * x @ q + 3.0):  # orthogonal, isotropic scaling, and a shift (centred away)
        both = CKAAccumulator("full")
        both.add([x], [transformed])
        assert float(both.matrix()[0, 0]) == pytest.approx(1.0, abs=1e-10)
    projection = torch.randn(20, 2, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    lowered = CKAAccumulator("full")
    lowered.add([x], [x @ projection])
    assert float(lowered.matrix()[0, 0]) < 0.95  # a random projection to 2 dimensions loses most of it


def test_the_minibatch_estimator_is_the_mean_of_the_batches_and_approaches_the_full_one():
    x, y = correlated(2048, seed=1)
    full = CKAAccumulator("full")
    full.add([x], [y])
    target = float(full.matrix()[0, 0])
    errors = {}
    for size in (16, 512):
        accumulator = CKAAccumulator("minibatch")
        cross, self_x, self_y = [], [], []
        for start in range(0, 2048, size):
            bx, by = x[start : start + size], y[start : start + size]
            accumulator.add([bx], [by])
            if start < 3 * size:  # the loops, on the first batches only (they are slow)
                kx, ky = gram(bx).numpy(), gram(by).numpy()
                if size == 16:
                    cross.append(loop_hsic_unbiased(kx, ky))
                    self_x.append(loop_hsic_unbiased(kx, kx))
                    self_y.append(loop_hsic_unbiased(ky, ky))
        errors[size] = abs(float(accumulator.matrix()[0, 0]) - target)
        if size == 16:
            three = CKAAccumulator("minibatch")
            for start in range(0, 48, 16):
                three.add([x[start : start + 16]], [y[start : start + 16]])
            expected = np.mean(cross) / np.sqrt(np.mean(self_x) * np.mean(self_y))
            assert float(three.matrix()[0, 0]) == pytest.approx(expected, rel=1e-9)
    assert errors[512] < 0.01 and errors[512] < errors[16], errors


def _hooked_blocks(vit, pixels) -> list[torch.Tensor]:
    """Every block's output by a plain forward hook on the timm modules (no code of ours)."""
    kept = []
    handles = [block.register_forward_hook(lambda m, a, o: kept.append(o.detach())) for block in vit.model.blocks]
    try:
        with torch.no_grad():
            vit.model(pixels)
    finally:
        for handle in handles:
            handle.remove()
    return [k.reshape(k.shape[0], -1) for k in kept]


def test_a_vit_against_a_cnn_reads_their_own_layers(tmp_path):
    """The demo ViT against the demo CNN over 16 demo scenes (2 minibatches of 8): the matrix is
    the minibatch CKA of the ViT blocks' outputs (plain hooks) and the CNN stages' (timm's
    forward_intermediates), recomputed here; a folder of the same scenes gives the same matrix."""
    vit, cnn = analysis.load_vit("demo"), load_cnn("demo")
    images = resolve_images("demo:16")
    result = representation_similarity(vit, images, cnn, batch_size=8)
    assert result.layers_a == ("block 0", "block 1", "block 2", "block 3")
    assert result.layers_b == tuple(stage["module"] for stage in cnn.model.feature_info) and result.images == 16
    expected = CKAAccumulator("minibatch")
    for start in (0, 8):
        batch = images[start : start + 8]
        a = _hooked_blocks(vit, torch.cat([vit.preprocess(i) for i in batch]))
        with torch.no_grad():
            b = cnn.model.forward_intermediates(torch.cat([cnn.preprocess(i) for i in batch]), intermediates_only=True)
        expected.add(a, [t.reshape(t.shape[0], -1) for t in b])
    np.testing.assert_allclose(result.matrix, expected.matrix().numpy(), atol=1e-6)
    for index, image in enumerate(images):
        image.save(tmp_path / f"scene_{index:02d}.png")
    np.testing.assert_allclose(
        representation_similarity(vit, tmp_path, cnn, batch_size=8).matrix, result.matrix, atol=1e-6
    )


@pytest.mark.parametrize("estimator", ["full", "minibatch"])
def test_a_model_against_itself_is_symmetric_with_a_diagonal_of_one(estimator):
    swin = analysis.load_vit("demo_swin")  # a windowed model: its stage grids flattened
    result = representation_similarity(swin, "demo:16", estimator=estimator, batch_size=8)
    assert result.layers_a == result.layers_b and "block 5 (stage 2)" in result.layers_a
    np.testing.assert_allclose(result.matrix, result.matrix.T, atol=1e-12)
    np.testing.assert_allclose(np.diagonal(result.matrix), 1.0, atol=1e-9)
    some = representation_similarity(swin, "demo:16", estimator=estimator, batch_size=8, layers_a=[0, -1], layers_b=[5])
    np.testing.assert_allclose(some.matrix, result.matrix[[0, 5]][:, [5]], atol=1e-9)


def test_bad_arguments_are_refused_with_the_reason():
    vit = analysis.load_vit("demo")
    for call, words in (
        (lambda: representation_similarity(vit, "demo:8", kernel="rbf"), "linear"),
        (lambda: representation_similarity(vit, "demo:8", batch_size=2), "batch_size"),
        (lambda: representation_similarity(vit, "demo:1"), "at least 2 images"),
        (lambda: representation_similarity(vit, "/no/such/folder"), "neither a folder"),
        (lambda: representation_similarity(vit, "demo:8", layers_a=[9]), "not among"),
        (lambda: representation_similarity(vit, "demo:8", estimator="exact"), "estimator"),
    ):
        with pytest.raises(AnalysisError, match=words):
            call()


def test_the_heatmap_draws_the_matrix_with_each_models_layers():
    from analysis.plots import cka_heatmap

    matrix = np.array([[1.0, 0.5, -0.05], [0.25, np.nan, 0.75]])
    figure = cka_heatmap(matrix, ["block 0", "block 1"], ["act1", "layer1", "layer2"], model_a="ViT", model_b="CNN")
    (trace,) = figure.data
    np.testing.assert_array_equal(np.asarray(trace.z, dtype=float), matrix)
    assert list(trace.y) == ["block 0", "block 1"] and list(trace.x) == ["act1", "layer1", "layer2"]
    assert (trace.zmin, trace.zmax) == (0.0, 1.0)
    assert figure.layout.xaxis.title.text == "CNN layer" and figure.layout.yaxis.title.text == "ViT layer"


def test_a_layer_that_does_not_vary_gives_nan_in_both_estimators():
    """A constant representation has HSIC(K, K) = 0: CKA against it is undefined (NaN), not the 1
    that the full estimator's rounding residue of the centring (~1e-21) once gave."""
    x = torch.randn(32, 50, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    constant = torch.randn(1, 3000, generator=torch.Generator().manual_seed(6), dtype=torch.float64).expand(32, -1)
    for estimator in ("full", "minibatch"):
        accumulator = CKAAccumulator(estimator)
        accumulator.add([x, constant])
        matrix = accumulator.matrix()
        assert float(matrix[0, 0]) == pytest.approx(1.0) and torch.isnan(matrix[0, 1]) and torch.isnan(matrix[1, 1]), (
            estimator,
            matrix,
        )
