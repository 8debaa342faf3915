"""Argument checks shared by the public API: bad input becomes an :class:`AnalysisError`
that names the argument, what it got and what it accepts (never a bare TypeError from torch).

Only the checks that need the record and spec types are here (:func:`check_record`,
:func:`check_spec`), so this module sits with the records, above the adapters. The checks of plain
values live in :mod:`analysis.base.arguments` (the bottom layer) and
:func:`~analysis.model.geometry.input_spec` in :mod:`analysis.model.geometry`.
"""

from __future__ import annotations

from ..base.errors import AnalysisError
from ..model.geometry import ViTSpec
from ..model.windowed_support import refuse_windowed
from .attention import AttentionRecord

__all__ = ["check_record", "check_spec"]


def check_record(value, function: str):
    """``value`` must be an :class:`~analysis.records.attention.AttentionRecord` of a
    global-attention model.

    Parameters
    ----------
    value : object
        What the caller passed as the record.
    function : str
        The public function that asks, named in the error.

    Returns
    -------
    AttentionRecord
        ``value`` itself.

    Raises
    ------
    AnalysisError
        A windowed model's record (Swin, SAM: named, with the reason), or ``value`` not an
        :class:`~analysis.records.attention.AttentionRecord`.
    """
    refuse_windowed(value, function)  # a windowed (Swin, SAM) record: named, with the reason
    if not isinstance(value, AttentionRecord):
        raise AnalysisError(
            f"{function} takes the AttentionRecord that capture_attention(vit, pixels) returns, "
            f"got {type(value).__name__}."
        )
    return value


def check_spec(value, function: str):
    """A :class:`~analysis.model.geometry.ViTSpec` of a global-attention model, also read off a
    LoadedViT or an AttentionRecord.

    Parameters
    ----------
    value : ViTSpec, LoadedViT or AttentionRecord
        The spec, or anything whose ``spec`` is one.
    function : str
        The public function that asks, named in the error.

    Returns
    -------
    ViTSpec
        ``value`` or its ``spec``.

    Raises
    ------
    AnalysisError
        ``value`` neither a ViTSpec nor anything with one, or a windowed model's (Swin, SAM).
    """
    spec = getattr(value, "spec", value)
    if not isinstance(spec, ViTSpec):
        raise AnalysisError(f"{function} takes a ViTSpec (vit.spec or record.spec), got {type(value).__name__}.")
    refuse_windowed(spec, function)
    return spec
