"""The Robustness page's pasted patch (vizapp.views.robustness.compute.patch_on_image): one forward per picture.

For a ViT the class token's share on the patch needs the attention of the clean and the patched
picture; the probabilities come from the logits of those same passes (no second forward). Each
result is checked against a plain forward of the model through its own normalisation.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from analysis.demo.data import render_sample
from analysis.robustness import model_input, paste_patch, patch_attention_share, unit_images
from vizapp.refs import ModelRef
from vizapp.views.robustness import compute


def _png(seed: int = 3) -> bytes:
    image, _, _ = render_sample(seed, 0, 96)
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.parametrize("model_key", [("vit", ModelRef("demo")), ("cnn", "demo", True)], ids=["vit", "cnn"])
def test_each_picture_runs_the_model_once_and_gives_the_plain_forwards_values(model_key):
    model = compute.loaded_model(model_key)
    data = _png()
    patch = np.random.default_rng(0).random((3, 16, 16)).astype(np.float32)
    pictures = []
    handle = model.model.register_forward_pre_hook(lambda module, args: pictures.append(args[0].shape[0]))
    try:
        result = compute.patch_on_image.__wrapped__(model_key, "digest", data, patch)
    finally:
        handle.remove()
    assert sum(pictures) == 2  # the clean and the patched picture, each through the model once

    image = compute.load_image(data)
    unit = unit_images(model, [image])
    position = ((unit.shape[-2] - 16) // 2, (unit.shape[-1] - 16) // 2)
    patched = paste_patch(unit, torch.as_tensor(patch), position)
    with torch.no_grad():
        logits = model.model(model_input(model, torch.cat([unit, patched]))).float()
    expected = model.probabilities(logits).cpu().numpy()
    np.testing.assert_allclose(result["clean"], expected[0], rtol=0, atol=1e-5)
    np.testing.assert_allclose(result["patched"], expected[1], rtol=0, atol=1e-5)
    assert np.array_equal(result["picture"], np.round(patched[0].permute(1, 2, 0).numpy() * 255).astype(np.uint8))
    if model_key[0] == "vit":
        share = patch_attention_share(model, [image], torch.as_tensor(patch), position)
        np.testing.assert_array_equal(result["patched_share"], share.patched_share[:, 0])
        np.testing.assert_array_equal(result["clean_share"], share.clean_share[:, 0])
    else:
        assert "patched_share" not in result
