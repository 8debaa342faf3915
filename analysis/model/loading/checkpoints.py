"""Reading weights files safely and fitting them into a model.

Pickle-based files are only ever read with ``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from ...base.errors import CheckpointError

__all__ = ["read_state_dict", "load_state_dict_into", "npz_num_classes"]


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """Read tensors from safetensors, or from a pickle with ``weights_only=True`` (never code).

    A checkpoint that nests its weights under ``"state_dict"``, ``"model"``, ``"model_state_dict"``
    or ``"module"`` is unwrapped, and a ``"module."`` prefix on every key (DataParallel) is removed.

    Parameters
    ----------
    path : pathlib.Path
        A ``.safetensors`` file, else a ``torch.save`` pickle; read onto the CPU.

    Returns
    -------
    dict of str to torch.Tensor
        The state dict.

    Raises
    ------
    CheckpointError
        The file is missing, unreadable, unsafe (code or custom classes in a pickle), or does not
        hold a dict of tensors.
    """
    try:
        if path.suffix.lower() == ".safetensors":
            from safetensors.torch import load_file

            state: Any = load_file(str(path), device="cpu")  # a checkpoint: nested dicts until checked below
        else:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
    except FileNotFoundError as exc:
        raise CheckpointError(f"Checkpoint file not found: {path}.") from exc
    except Exception as exc:  # noqa: BLE001 - corrupt, unsafe or foreign files all land here
        raise CheckpointError(
            f"Could not read {path.name} as weights: {type(exc).__name__}: {str(exc)[:400]}. "
            "Pickle files are loaded with weights_only=True, so checkpoints that contain code or "
            "custom classes are refused; re-save it as a plain state dict, ideally as .safetensors."
        ) from exc
    for key in ("state_dict", "model", "model_state_dict", "module"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
            break
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path.name} does not hold a state dict of tensors.")
    if state and all(k.startswith("module.") for k in state):
        state = {k.removeprefix("module."): v for k, v in state.items()}
    return state


def _resample_position_embedding(model: Any, state_dict: dict) -> dict:  # a timm ViT (attributes read by name)
    """Fit a checkpoint's ``pos_embed`` to the model's grid (bicubic, as timm does when a
    model is built at another ``img_size`` than it was trained at)."""
    saved = state_dict.get("pos_embed")
    own = getattr(model, "pos_embed", None)
    if not isinstance(saved, torch.Tensor) or not isinstance(own, torch.Tensor) or saved.shape == own.shape:
        return state_dict
    from timm.layers import resample_abs_pos_embed

    prefix = 0 if getattr(model, "no_embed_class", False) else int(model.num_prefix_tokens)
    saved_patches = saved.shape[1] - prefix
    side = int(round(saved_patches**0.5))
    if saved.ndim != 3 or saved.shape[-1] != own.shape[-1] or side * side != saved_patches:
        return state_dict  # not a square grid we can resample: let the shape check explain it
    resampled = resample_abs_pos_embed(
        saved, new_size=list(model.patch_embed.grid_size), old_size=[side, side], num_prefix_tokens=prefix
    )
    return {**state_dict, "pos_embed": resampled}


def load_state_dict_into(model: nn.Module, state_dict: dict, path: Path) -> None:
    """Strict load, after resampling ``pos_embed`` (bicubic, as timm does) when the checkpoint's
    square grid differs from the model's.

    Parameters
    ----------
    model : torch.nn.Module
        The model to fill, as configured.
    state_dict : dict
        Parameter name to tensor, as :func:`read_state_dict` returns it.
    path : pathlib.Path
        The file it came from, as the error names it.

    Raises
    ------
    CheckpointError
        Missing or unexpected keys, or shapes that differ; the message names them.
    """
    state_dict = _resample_position_embedding(model, state_dict)
    own = model.state_dict()
    missing = sorted(set(own) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(own))
    wrong_shape = [
        f"{k}: file {tuple(state_dict[k].shape)} vs model {tuple(own[k].shape)}"
        for k in sorted(set(own) & set(state_dict))
        if tuple(own[k].shape) != tuple(state_dict[k].shape)
    ]
    if missing or unexpected or wrong_shape:
        parts = []
        if missing:
            parts.append(f"missing keys ({len(missing)}): {', '.join(missing[:8])}")
        if unexpected:
            parts.append(f"unexpected keys ({len(unexpected)}): {', '.join(unexpected[:8])}")
        if wrong_shape:
            parts.append(f"wrong shapes ({len(wrong_shape)}): {'; '.join(wrong_shape[:5])}")
        raise CheckpointError(
            f"{path.name} does not fit {type(model).__name__} as configured: "
            + " | ".join(parts)
            + ". Check arch= and model arguments (img_size, patch_size, num_classes)."
        )
    model.load_state_dict(state_dict, strict=True)


def npz_num_classes(path: Path) -> int:
    """Classes of the head stored in a Google ViT .npz (0 when it has none).

    Parameters
    ----------
    path : pathlib.Path
        The ``.npz`` archive (read with ``allow_pickle=False``).

    Returns
    -------
    int
        Length of ``head/bias``, or 0.

    Raises
    ------
    CheckpointError
        The file is not a readable ``.npz`` archive.
    """
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as weights:
            return int(weights["head/bias"].shape[0]) if "head/bias" in weights.files else 0
    except Exception as exc:  # noqa: BLE001
        raise CheckpointError(f"{path.name} is not a readable .npz archive: {exc}") from exc
