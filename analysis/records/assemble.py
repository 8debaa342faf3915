"""A capture's maps into the record that holds them: the one place that knows which layout a
family's record has. The engine (:func:`analysis.engine.capture.capture_attention`) asks
:func:`stacks_layers` how to keep the maps before its forward pass, and hands them to
:func:`assemble_record` after it."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..base.errors import AnalysisError
from ..model.geometry import ViTSpec
from .attention import AttentionRecord
from .windowed import WindowedAttentionRecord

__all__ = ["stacks_layers", "assemble_record"]


def stacks_layers(spec: ViTSpec) -> bool:
    """Whether a capture keeps every layer's maps in one ``(L, B, heads, Q, T)`` tensor: layers that
    attend over one token sequence (a ViT) do; windowed layers (Swin, SAM) keep one
    ``(B, windows, heads, Wt, Wt)`` tensor each, since stages differ in shape.

    Parameters
    ----------
    spec : ViTSpec
        The spec of the captured input.

    Returns
    -------
    bool
        ``True`` to stack.
    """
    return spec.attends_globally


def assemble_record(
    maps: torch.Tensor | Sequence[torch.Tensor],
    logits: torch.Tensor,
    spec: ViTSpec,
    layers: tuple[int, ...],
    *,
    query_tokens: tuple[int, ...] | None = None,
    pool_attention: torch.Tensor | None = None,
) -> AttentionRecord:
    """The record of one captured forward pass, checked against the spec.

    Parameters
    ----------
    maps : torch.Tensor or sequence of torch.Tensor
        ``(L, B, heads, Q, T)`` stacked maps (:func:`stacks_layers`), or one
        ``(B, windows, heads, Wt, Wt)`` tensor per layer.
    logits : torch.Tensor
        ``(B, classes)`` the model's output for the same pass.
    spec : ViTSpec
        The spec of the captured input.
    layers : tuple of int
        Model layer index of each entry of ``maps``.
    query_tokens : tuple of int or None, default None
        The query rows kept (stacked maps only).
    pool_attention : torch.Tensor or None, default None
        ``(B, heads, probes, T)`` attention of an attention-pooling head, if any.

    Returns
    -------
    AttentionRecord
        An :class:`~analysis.records.attention.AttentionRecord`, or for per-layer windows a
        :class:`~analysis.records.windowed.WindowedAttentionRecord`, which stands in for it (the
        same fields and queries, refusing what windows do not define).

    Raises
    ------
    AnalysisError
        Stacked maps whose head or token count is not the spec's.
    """
    if not isinstance(maps, torch.Tensor):
        return WindowedAttentionRecord(  # type: ignore[return-value]  # stands in for the plain record
            windows=tuple(maps), logits=logits, spec=spec, layers=layers
        )
    if maps.shape[2] != spec.num_heads:
        raise AnalysisError(f"Captured {maps.shape[2]} attention maps per layer, expected {spec.num_heads} heads.")
    if maps.shape[-1] != spec.num_tokens:
        raise AnalysisError(
            f"Captured {maps.shape[-1]} tokens but the spec predicts {spec.num_tokens} "
            f"({spec.num_prefix_tokens} prefix + {spec.grid_size[0]}x{spec.grid_size[1]} patches)."
        )
    return AttentionRecord(
        attentions=maps,
        logits=logits,
        spec=spec,
        layers=layers,
        query_tokens=query_tokens,
        pool_attention=pool_attention,
    )
