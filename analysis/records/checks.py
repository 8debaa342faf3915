"""Argument checks shared by the public API: bad input becomes an :class:`AnalysisError`
that names the argument, what it got and what it accepts (never a bare TypeError from torch).

The checks of plain values live in :mod:`analysis.base.arguments` (the bottom layer) and
:func:`input_spec` in :mod:`analysis.model.geometry`; this module re-exports them beside the checks
that need the record and spec types (:func:`check_record`, :func:`check_spec`), so it sits with
the records, above the adapters.
"""

from __future__ import annotations

from ..base.arguments import check_float_dtype, check_index, check_int, check_pixels
from ..base.errors import AnalysisError
from ..model.geometry import ViTSpec, input_spec
from ..model.windowed_support import refuse_windowed
from .attention import AttentionRecord

__all__ = ["check_int", "check_index", "check_record", "check_spec", "check_pixels", "check_float_dtype", "input_spec"]


def check_record(value, function: str):
    """``value`` must be an :class:`~analysis.engine.capture.AttentionRecord`."""
    refuse_windowed(value, function)  # a windowed (Swin, SAM) record: named, with the reason
    if not isinstance(value, AttentionRecord):
        raise AnalysisError(
            f"{function} takes the AttentionRecord that capture_attention(vit, pixels) returns, "
            f"got {type(value).__name__}."
        )
    return value


def check_spec(value, function: str):
    """A :class:`~analysis.model.spec.ViTSpec`, also read off a LoadedViT or an AttentionRecord."""
    spec = getattr(value, "spec", value)
    if not isinstance(spec, ViTSpec):
        raise AnalysisError(f"{function} takes a ViTSpec (vit.spec or record.spec), got {type(value).__name__}.")
    refuse_windowed(spec, function)
    return spec
