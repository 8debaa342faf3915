"""Attention rollout (Abnar & Zuidema, 2020), as in the ViT paper's Figure 6."""

from __future__ import annotations

import warnings

from collections.abc import Iterator

import torch

from .capture import AttentionRecord
from .checks import check_int, check_record
from .errors import AnalysisError
from .queries import Query, query_rows_for

__all__ = [
    "attention_rollout", "attention_rollout_by_layer", "rollout_matrices", "rollout_step", "fuse_heads", "discard_lowest",
]

HEAD_FUSIONS = ("mean", "max", "min")
POST_NORM_WARNING = (
    "This model normalises each residual branch after attention (post-norm, x + norm(attn(x))): "
    "rollout's ½·A + ½·I assumes pre-norm blocks (x + attn(norm(x))), where the identity and "
    "attention paths are of comparable size. Read this rollout as a heuristic."
)


def fuse_heads(attention: torch.Tensor, head_fusion: str) -> torch.Tensor:
    """``(B, heads, T, T)`` -> ``(B, T, T)`` by the mean, max or min over heads."""
    if head_fusion == "mean":
        return attention.mean(dim=1)
    if head_fusion == "max":
        return attention.amax(dim=1)
    if head_fusion == "min":
        return attention.amin(dim=1)
    raise AnalysisError(f"head_fusion must be one of {HEAD_FUSIONS}, not {head_fusion!r}.")


def discard_lowest(fused: torch.Tensor, discard_ratio: float) -> torch.Tensor:
    """Zero the ``floor(discard_ratio · T·(T−1))`` smallest off-diagonal entries of each
    ``(T, T)`` matrix in ``fused (B, T, T)``. The diagonal (a token's attention to itself)
    is never discarded. Returns a new tensor."""
    if not 0.0 <= discard_ratio < 1.0:
        raise AnalysisError(f"discard_ratio must be in [0, 1), not {discard_ratio}.")
    batch, tokens, _ = fused.shape
    count = int(discard_ratio * tokens * (tokens - 1))
    if count == 0:
        return fused.clone()
    eye = torch.eye(tokens, dtype=torch.bool, device=fused.device)
    candidates = fused.masked_fill(eye, float("inf")).reshape(batch, -1)  # diagonal never chosen
    lowest = candidates.topk(count, dim=-1, largest=False).indices  # (B, count)
    flat = fused.reshape(batch, -1).clone()
    flat.scatter_(1, lowest, 0.0)
    return flat.reshape(batch, tokens, tokens)


def rollout_step(attention: torch.Tensor, head_fusion: str = "mean", discard_ratio: float = 0.0) -> torch.Tensor:
    """One layer's ``Â``: ``(B, heads, T, T)`` attention -> ``(B, T, T)`` float64,
    ``Â = ½·fuse(A) + ½·I`` (after the optional discard), each row divided by its sum over keys."""
    fused = discard_lowest(fuse_heads(attention.double(), head_fusion), discard_ratio)  # (B, T, T)
    eye = torch.eye(fused.shape[-1], dtype=fused.dtype, device=fused.device)
    mixed = 0.5 * fused + 0.5 * eye
    return mixed / mixed.sum(dim=-1, keepdim=True)  # rows (queries) sum to one over keys


def _rollout_steps(
    record: AttentionRecord, head_fusion: str, discard_ratio: float, start_layer: int, end_layer: int | None
) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield ``(layer, R_layer)`` with ``R_layer = Â_layer ⋯ Â_start`` for layer = start..end."""
    check_record(record, "attention_rollout")
    if record.spec.residual_norm == "post":
        warnings.warn(POST_NORM_WARNING, RuntimeWarning, stacklevel=4)
    if record.query_tokens is not None:
        raise AnalysisError("Rollout needs every query row: capture with query_tokens=None.")
    spec = record.spec
    last = spec.num_layers - 1 if end_layer is None else check_int("end_layer", end_layer)
    if last < 0:
        last += spec.num_layers
    start_layer = check_int("start_layer", start_layer)
    if start_layer < 0:
        start_layer += spec.num_layers
    if not 0 <= start_layer <= last < spec.num_layers:
        raise AnalysisError(
            f"Need 0 <= start_layer ({start_layer}) <= end_layer ({last}) < {spec.num_layers} layers."
        )
    rollout = None
    for layer in range(start_layer, last + 1):
        mixed = rollout_step(record.attentions[record.layer_position(layer)], head_fusion, discard_ratio)  # (B, T, T)
        rollout = mixed if rollout is None else mixed @ rollout
        yield layer, rollout


def rollout_matrices(
    record: AttentionRecord,
    *,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    start_layer: int = 0,
    end_layer: int | None = None,
) -> torch.Tensor:
    """The rolled-out token-to-token matrix ``R = Â_end ⋯ Â_start``, ``(B, T, T)`` float64.

    Per layer: fuse heads, discard (optional), ``Â = ½·A + ½·I``, then each row of ``Â``
    is divided by its sum over keys (``Â / Â.sum(-1, keepdim=True)``) so that every row of
    ``Â`` and of ``R`` is a probability distribution.
    """
    rollout = None
    for _, rollout in _rollout_steps(record, head_fusion, discard_ratio, start_layer, end_layer):
        pass
    return rollout


def _query_grid(record: AttentionRecord, rollout: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """``(B, T, T)`` rolled-out matrix -> ``(B, gh, gw)``: the query's row over patch tokens."""
    spec = record.spec
    over_keys = rollout[:, rows, :].mean(dim=1)  # (B, T)
    gh, gw = spec.grid_size
    return over_keys[:, spec.num_prefix_tokens :].reshape(-1, gh, gw).float()


def attention_rollout_by_layer(
    record: AttentionRecord,
    *,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    start_layer: int = 0,
    query: Query | None = None,
) -> torch.Tensor:
    """The rollout after each layer, in one pass: ``(L - start, B, gh, gw)``.

    Entry ``i`` equals ``attention_rollout(record, ..., end_layer=start_layer + i)``, but all
    partial products ``Â_end ⋯ Â_start`` are built incrementally (L matrix products, not L²/2).
    """
    check_record(record, "attention_rollout")
    rows = query_rows_for(record, query)
    steps = _rollout_steps(record, head_fusion, discard_ratio, start_layer, None)
    return torch.stack([_query_grid(record, rollout, rows) for _, rollout in steps])


def attention_rollout(
    record: AttentionRecord,
    *,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    start_layer: int = 0,
    end_layer: int | None = None,
    query: Query | None = None,
) -> torch.Tensor:
    """Attention rollout of one query over the patch grid.

    ``R = Â_end ⋯ Â_start`` as in :func:`rollout_matrices` (``end_layer`` defaults to the
    last layer, inclusive). Returns the query's row of ``R`` restricted to patch tokens,
    not rescaled: ``(B, gh, gw)`` float32. ``query=None`` (the default of every one-query map,
    :func:`analysis.queries.default_query`) is the class token when the model has one, else
    the mean over patch queries; otherwise ``"cls"``, ``"mean"``, ``"prefix:<i>"`` or a patch index.
    """
    check_record(record, "attention_rollout")
    rows = query_rows_for(record, query)
    rollout = rollout_matrices(
        record, head_fusion=head_fusion, discard_ratio=discard_ratio, start_layer=start_layer, end_layer=end_layer
    )
    return _query_grid(record, rollout, rows)
