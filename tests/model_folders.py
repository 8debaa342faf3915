"""Small random-weight models written as folders (timm's layout: config.json + model.safetensors).

A test that needs a family's layout (its stages, windows, heads and layers) rather than its width
opens a narrow copy of it by path, in the app or through ``analysis.load_vit``: the same layout at a
fraction of the cost on two cores. The weights are drawn once per process (seed 0), so every load of
a folder gives the same numbers, whichever process loads it (a Streamlit server, a notebook kernel).
"""

from __future__ import annotations

import atexit
import functools
import json
import shutil
import tempfile
from pathlib import Path

import timm
import torch
from safetensors.torch import save_file

__all__ = ["model_folder", "narrow_swin", "NARROW_SWIN"]

# A Swin-T's stages (2 blocks each, the shifted one second), windows and heads (3, 6, 12, 24), at a
# third of its width and 8 blocks instead of 12: for timm's Swin v1, v2 and swinv2_cr alike.
NARROW_SWIN = dict(embed_dim=48, depths=(2, 2, 2, 2), num_heads=(3, 6, 12, 24))


@functools.cache
def _root() -> Path:
    root = Path(tempfile.mkdtemp(prefix="vit-explorer-test-models-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


def model_folder(architecture: str, **model_args) -> str:
    """The path of a folder holding ``timm.create_model(architecture, **model_args)`` with random
    weights (seed 0); the folder is named after ``architecture``, so that labels and URLs name it.

    Parameters
    ----------
    architecture:
        A timm model name, e.g. ``"swin_tiny_patch4_window7_224"``.
    model_args:
        Keyword arguments of ``timm.create_model`` (``img_size``, ``embed_dim``, ``depths``, ...);
        they are written to config.json's ``model_args``, which ``analysis.load_vit`` passes back.

    Returns
    -------
    str
        The folder's path, one folder per distinct call in this process.
    """
    return _written(architecture, json.dumps(model_args, sort_keys=True))


@functools.cache
def _written(architecture: str, args_json: str) -> str:
    model_args = json.loads(args_json)
    folder = _root() / f"{len(list(_root().iterdir())):02d}" / architecture
    folder.mkdir(parents=True)
    torch.manual_seed(0)
    model = timm.create_model(architecture, pretrained=False, **model_args)
    config = {"architecture": architecture, "num_classes": model.num_classes, "model_args": model_args}
    (folder / "config.json").write_text(json.dumps(config))
    save_file(model.state_dict(), str(folder / "model.safetensors"))
    return str(folder)


def narrow_swin(architecture: str = "swin_tiny_patch4_window7_224", img_size: int = 112) -> str:
    """:func:`model_folder` of a :data:`NARROW_SWIN` ``architecture`` at ``img_size``; at 112 px a Swin v1 has
    28×28, 14×14, 7×7 and 4×4 cells (the last merging pads), 7×7 windows, a shift of 3 on stages 0-1."""
    return model_folder(architecture, img_size=img_size, **NARROW_SWIN)
