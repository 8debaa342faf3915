"""Argument checks shared by the public API: bad input becomes an :class:`AnalysisError`
that names the argument, what it got and what it accepts (never a bare TypeError from torch)."""

from __future__ import annotations

import numbers

from typing import TYPE_CHECKING

import torch

from .errors import AnalysisError

if TYPE_CHECKING:
    from .spec import ViTSpec

__all__ = ["check_int", "check_index", "check_record", "check_spec", "check_pixels", "check_float_dtype", "input_spec"]


def check_int(name: str, value, *, minimum: int | None = None) -> int:
    """``value`` as an ``int`` (bools refused), at least ``minimum`` if given."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise AnalysisError(f"{name} must be an integer, got {value!r} ({type(value).__name__}).")
    value = int(value)
    if minimum is not None and value < minimum:
        raise AnalysisError(f"{name} must be at least {minimum}, got {value}.")
    return value


def check_index(name: str, value, size: int, what: str) -> int:
    """A Python-style index into ``size`` things (``-size <= value < size``), made non-negative."""
    value = check_int(name, value)
    if not -size <= value < size:
        raise AnalysisError(f"{name}={value} does not exist: the model has {size} {what} (0..{size - 1}, or negative from the end).")
    return value + size if value < 0 else value


def check_record(value, function: str):
    """``value`` must be an :class:`~analysis.capture.AttentionRecord`."""
    from .capture import AttentionRecord
    from .windowed import refuse_windowed

    refuse_windowed(value, function)  # a windowed (Swin, SAM) record: named, with the reason
    if not isinstance(value, AttentionRecord):
        raise AnalysisError(
            f"{function} takes the AttentionRecord that capture_attention(vit, pixels) returns, "
            f"got {type(value).__name__}."
        )
    return value


def check_spec(value, function: str):
    """A :class:`~analysis.spec.ViTSpec`, also read off a LoadedViT or an AttentionRecord."""
    from .spec import ViTSpec
    from .windowed import refuse_windowed

    spec = getattr(value, "spec", value)
    if not isinstance(spec, ViTSpec):
        raise AnalysisError(f"{function} takes a ViTSpec (vit.spec or record.spec), got {type(value).__name__}.")
    refuse_windowed(spec, function)
    return spec


def check_pixels(pixels) -> torch.Tensor:
    """A floating ``(B, 3, H, W)`` tensor with ``B >= 1``."""
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
        raise AnalysisError(f"Expected pixels of shape (B, 3, H, W), got {tuple(pixels.shape)}. Use vit.preprocess(image).")
    if pixels.shape[0] == 0:
        raise AnalysisError("pixels holds no image (batch size 0): pass at least one.")
    return pixels


def check_float_dtype(name: str, dtype) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise AnalysisError(f"{name} must be a floating torch dtype (torch.float32, torch.float16, torch.bfloat16), got {dtype!r}.")
    return dtype


def input_spec(vit, pixels: torch.Tensor) -> ViTSpec:
    """The spec for this input, checking its shape against the model."""
    check_pixels(pixels)
    height, width = int(pixels.shape[-2]), int(pixels.shape[-1])
    spec = vit.spec
    if spec.dynamic_img_size:
        ph, pw = spec.patch_size
        if spec.dynamic_img_pad:  # timm pads up to whole patches
            height, width = -(-height // ph) * ph, -(-width // pw) * pw
        elif height % ph or width % pw or height < ph or width < pw:
            raise AnalysisError(
                f"A {height}x{width} input is not a whole number of {ph}x{pw} patches: resize or crop it "
                "(or load the model with dynamic_img_pad=True)."
            )
        return spec.with_image_size(height, width)
    if (height, width) != spec.img_size:
        raise AnalysisError(
            f"The model expects {spec.img_size[0]}x{spec.img_size[1]} inputs, got {height}x{width}. "
            "Use vit.preprocess(image), or load the model with img_size=... or dynamic_img_size=True."
        )
    return spec
