"""Device choice and mixed precision, kept in one place."""

from __future__ import annotations

import contextlib

import torch

__all__ = ["resolve_device", "autocast_context"]


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """``None`` picks cuda, then mps, then cpu; anything else is passed to ``torch.device``.

    Parameters
    ----------
    device : str, torch.device or None, default None
        ``None``, the first available of cuda, mps and cpu; else a device ``torch.device`` accepts
        (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``).

    Returns
    -------
    torch.device
        The device (not checked to be available when given explicitly).

    Raises
    ------
    ModelLoadError
        ``torch.device`` does not accept ``device``.
    """
    if device is not None:
        try:
            return torch.device(device)
        except (RuntimeError, TypeError) as exc:
            from .errors import ModelLoadError

            raise ModelLoadError(
                f"Unknown device {device!r}: use None (automatic), 'cpu', 'cuda', 'cuda:1' or 'mps'."
            ) from exc
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def autocast_context(device: torch.device, precision: str = "auto"):
    """Autocast for the model's forward pass.

    Attention probabilities are always computed in float32 by the capture code, whatever this is.

    Parameters
    ----------
    device : torch.device
        The device the forward pass runs on (its ``type`` is autocast's ``device_type``).
    precision : str, default "auto"
        ``"auto"`` (bfloat16 on cuda when supported, else float16 on cuda, float32 elsewhere),
        ``"float32"``, ``"bfloat16"`` or ``"float16"``.

    Returns
    -------
    contextlib.AbstractContextManager
        ``torch.autocast`` with that dtype, or ``contextlib.nullcontext()`` for float32.

    Raises
    ------
    AnalysisError
        ``precision`` is not one of the four names.
    """
    if precision not in ("auto", "float32", "bfloat16", "float16"):
        from .errors import AnalysisError

        raise AnalysisError(f"precision must be 'auto', 'float32', 'bfloat16' or 'float16', not {precision!r}.")
    if precision == "auto":
        if device.type != "cuda":
            return contextlib.nullcontext()
        precision = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    if precision == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=getattr(torch, precision))
