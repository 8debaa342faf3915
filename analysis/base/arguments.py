"""Checks of plain argument values (integers, indices, dtypes, pixel tensors): bad input becomes an
:class:`AnalysisError` that names the argument, what it got and what it accepts (never a bare
TypeError from torch).

The bottom layer of the library, beside :mod:`analysis.base.errors`: it imports nothing else of it.
The checks that need the record and spec types are in :mod:`analysis.records.checks`.
"""

from __future__ import annotations

import numbers

import torch

from .errors import AnalysisError

__all__ = ["check_int", "check_index", "check_pixels", "check_float_dtype", "resolve_layers"]


def check_int(name: str, value, *, minimum: int | None = None) -> int:
    """``value`` as an ``int`` (bools refused), at least ``minimum`` if given.

    Parameters
    ----------
    name : str
        The argument's name, for the error message.
    value : Any
        The value to check: any integral number (``int``, a numpy integer), not a ``bool``.
    minimum : int or None, default None
        The smallest value accepted; ``None``, no bound.

    Returns
    -------
    int
        ``value`` as a plain ``int``.

    Raises
    ------
    AnalysisError
        ``value`` is not an integer (or is a ``bool``), or is below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise AnalysisError(f"{name} must be an integer, got {value!r} ({type(value).__name__}).")
    value = int(value)
    if minimum is not None and value < minimum:
        raise AnalysisError(f"{name} must be at least {minimum}, got {value}.")
    return value


def check_index(name: str, value, size: int, what: str) -> int:
    """A Python-style index into ``size`` things (``-size <= value < size``), made non-negative.

    Parameters
    ----------
    name : str
        The argument's name, for the error message.
    value : Any
        The index: an integer (not a ``bool``), negative counting from the end.
    size : int
        How many things there are.
    what : str
        What the things are called in the error message (e.g. ``"layers"``).

    Returns
    -------
    int
        The index in ``0..size-1``.

    Raises
    ------
    AnalysisError
        ``value`` is not an integer, or is outside ``-size <= value < size``.
    """
    value = check_int(name, value)
    if not -size <= value < size:
        raise AnalysisError(
            f"{name}={value} does not exist: the model has {size} {what} (0..{size - 1}, or negative from the end)."
        )
    return value + size if value < 0 else value


def resolve_layers(layers, num_layers: int) -> tuple[int, ...]:
    """The one reading of a ``layers`` argument: ``None`` is every layer ``0..num_layers-1``; a
    layer index or a sequence of them gives those layers, made non-negative (negative indices
    count from the end), each once, **in the order asked**. A caller that needs the forward
    pass's order (a record's layers, which rollout composes) sorts the result.

    Parameters
    ----------
    layers : int, sequence of int or None
        ``None``, every layer; one layer index or a sequence of them (negative counts from the end).
    num_layers : int
        The model's number of layers.

    Returns
    -------
    tuple of int
        The non-negative layer indices, each once, in the order asked (the first occurrence of each).

    Raises
    ------
    AnalysisError
        An empty sequence, a string (or anything not iterable), or an index outside the model.
    """
    if layers is None:
        return tuple(range(num_layers))
    if isinstance(layers, numbers.Integral):
        layers = [layers]
    if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):
        raise AnalysisError(f"layers must be None, a layer index or a list of them, got {layers!r}.")
    layers = list(layers)
    if not layers:
        raise AnalysisError(f"layers is empty: pass None for all {num_layers} layers, or some of 0..{num_layers - 1}.")
    ordered = [check_index("layer", layer, num_layers, "layers") for layer in layers]
    return tuple(dict.fromkeys(ordered))  # the first occurrence of each, in order


def check_pixels(pixels) -> torch.Tensor:
    """A floating ``(B, 3, H, W)`` tensor with ``B >= 1``.

    Parameters
    ----------
    pixels : torch.Tensor
        The model input to check, ``(B, 3, H, W)`` floating point (normalised, as ``vit.preprocess``
        returns it).

    Returns
    -------
    torch.Tensor
        ``pixels`` itself, unchanged.

    Raises
    ------
    AnalysisError
        ``pixels`` is not a tensor, not floating point, not of shape ``(B, 3, H, W)``, or holds no image.
    """
    if not isinstance(pixels, torch.Tensor):
        raise AnalysisError(
            f"pixels must be a torch.Tensor of shape (B, 3, H, W), got {type(pixels).__name__}: use vit.preprocess(image)."
        )
    if not pixels.is_floating_point():
        raise AnalysisError(
            f"pixels must be floating point (normalised), got {pixels.dtype}: use vit.preprocess(image), "
            "which scales to [0, 1] and applies the model's mean and std."
        )
    if pixels.ndim != 4 or pixels.shape[1] != 3:
        raise AnalysisError(
            f"Expected pixels of shape (B, 3, H, W), got {tuple(pixels.shape)}. Use vit.preprocess(image)."
        )
    if pixels.shape[0] == 0:
        raise AnalysisError("pixels holds no image (batch size 0): pass at least one.")
    return pixels


def check_float_dtype(name: str, dtype) -> torch.dtype:
    """``dtype`` must be a floating torch dtype.

    Parameters
    ----------
    name : str
        The argument's name, for the error message.
    dtype : torch.dtype
        The dtype to check (``torch.float32``, ``torch.float16``, ``torch.bfloat16``, ...).

    Returns
    -------
    torch.dtype
        ``dtype`` itself.

    Raises
    ------
    AnalysisError
        ``dtype`` is not a ``torch.dtype`` or not a floating one.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise AnalysisError(
            f"{name} must be a floating torch dtype (torch.float32, torch.float16, torch.bfloat16), got {dtype!r}."
        )
    return dtype
