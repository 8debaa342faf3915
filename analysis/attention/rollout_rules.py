"""The steps every attention rollout composes (Abnar & Zuidema, 2020): fuse the heads, discard
the weakest pairs, mix in the identity, and compose the layers.

One layer's ``Â = ½·fuse(A) + ½·I`` (rows divided by their sums) and ``R = Â_end ⋯ Â_start`` are
written once, here, for the rollout of every record (:mod:`analysis.attention.rollout`), MAE's
visible-token rollout and token drop. They take plain tensors, not records, so they sit below
those, and are imported from here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from ..base.arguments import check_int
from ..base.errors import AnalysisError

__all__ = [
    "HEAD_FUSIONS",
    "POST_NORM_WARNING",
    "fuse_heads",
    "discard_lowest",
    "mix_identity",
    "rollout_step",
    "compose_rollout",
    "layer_range",
]

HEAD_FUSIONS = ("mean", "max", "min")
POST_NORM_WARNING = (
    "This model normalises each residual branch after attention (post-norm, x + norm(attn(x))): "
    "rollout's ½·A + ½·I assumes pre-norm blocks (x + attn(norm(x))), where the identity and "
    "attention paths are of comparable size. Read this rollout as a heuristic."
)


def fuse_heads(attention: torch.Tensor, head_fusion: str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Fuse the heads (dim 1) by their mean, max or min.

    Parameters
    ----------
    attention : torch.Tensor
        ``(B, heads, ...)``: a ViT layer's ``(B, heads, T, T)``; a windowed layer's
        ``(B, heads, windows, Wt, Wt)`` (:func:`analysis.records.token_matrix.layer_heads`).
    head_fusion : str
        ``"mean"``, ``"max"`` or ``"min"`` (:data:`HEAD_FUSIONS`).
    dtype : torch.dtype or None, default None
        The result's dtype (the mean accumulated in it), without a converted copy of every head
        first; ``None``, ``attention``'s.

    Returns
    -------
    torch.Tensor
        ``attention`` without its head axis: ``(B, T, T)`` (``(B, windows, Wt, Wt)``), in ``dtype``.

    Raises
    ------
    AnalysisError
        An unknown ``head_fusion``.
    """
    if head_fusion == "mean":
        if dtype is None or dtype == attention.dtype:
            return attention.mean(dim=1)
        total = attention[:, 0].to(dtype)  # head by head: a converted copy of one head at a time
        for head in range(1, attention.shape[1]):
            total += attention[:, head]
        return total / attention.shape[1]
    if head_fusion == "max":
        return attention.amax(dim=1).to(dtype or attention.dtype)
    if head_fusion == "min":
        return attention.amin(dim=1).to(dtype or attention.dtype)
    raise AnalysisError(f"head_fusion must be one of {HEAD_FUSIONS}, not {head_fusion!r}.")


def discard_lowest(fused: torch.Tensor, discard_ratio: float, candidates: torch.Tensor | None = None) -> torch.Tensor:
    """Zero the ``floor(discard_ratio · T·(T−1))`` smallest off-diagonal entries of each
    ``(T, T)`` matrix in ``fused``. The diagonal (a token's attention to itself) is never
    discarded.

    Parameters
    ----------
    fused : torch.Tensor
        ``(B, T, T)`` attention with the heads already fused.
    discard_ratio : float
        Fraction in ``[0, 1)`` of the candidate pairs to zero, per matrix.
    candidates : torch.Tensor or None, default None
        ``(T, T)`` bool: the pairs that may be discarded instead of every off-diagonal pair (a
        windowed layer: the pairs its windows define, so the zeros outside a query's window are
        not counted); the ``floor(discard_ratio · #candidates)`` smallest candidates are zeroed.

    Returns
    -------
    torch.Tensor
        ``(B, T, T)``, a new tensor of ``fused``'s dtype.

    Raises
    ------
    AnalysisError
        ``discard_ratio`` outside ``[0, 1)``.
    """
    if not 0.0 <= discard_ratio < 1.0:
        raise AnalysisError(f"discard_ratio must be in [0, 1), not {discard_ratio}.")
    batch, tokens, _ = fused.shape
    if candidates is None:
        count = int(discard_ratio * tokens * (tokens - 1))
        excluded = torch.eye(tokens, dtype=torch.bool, device=fused.device)
    else:
        count = int(discard_ratio * int(candidates.sum()))
        excluded = ~candidates.to(fused.device)
    if count == 0:
        return fused.clone()
    candidates = fused.masked_fill(excluded, float("inf")).reshape(batch, -1)  # excluded pairs never chosen
    lowest = candidates.topk(count, dim=-1, largest=False).indices  # (B, count)
    flat = fused.reshape(batch, -1).clone()
    flat.scatter_(1, lowest, 0.0)
    return flat.reshape(batch, tokens, tokens)


def mix_identity(
    fused: torch.Tensor, discard_ratio: float = 0.0, candidates: torch.Tensor | None = None
) -> torch.Tensor:
    """One layer's ``Â = ½·discard(fused) + ½·I``, each row divided by its sum over keys.

    Parameters
    ----------
    fused : torch.Tensor
        ``(B, T, T)`` attention with the heads already fused.
    discard_ratio : float, default 0.0
        Fraction in ``[0, 1)`` of the weakest pairs zeroed first (:func:`discard_lowest`).
    candidates : torch.Tensor or None, default None
        ``(T, T)`` bool, the pairs that may be discarded: see :func:`discard_lowest`.

    Returns
    -------
    torch.Tensor
        ``(B, T, T)`` float64, every row summing to one.

    Raises
    ------
    AnalysisError
        ``discard_ratio`` outside ``[0, 1)``.
    """
    fused = discard_lowest(fused.double(), discard_ratio, candidates)  # (B, T, T)
    mixed = fused * 0.5  # ½·A + ½·I, the identity's half added on the diagonal in place
    mixed.diagonal(dim1=-2, dim2=-1).add_(0.5)
    return mixed.div_(mixed.sum(dim=-1, keepdim=True))  # rows (queries) sum to one over keys


def rollout_step(attention: torch.Tensor, head_fusion: str = "mean", discard_ratio: float = 0.0) -> torch.Tensor:
    """One layer's ``Â = ½·fuse(A) + ½·I`` (after the optional discard), each row divided by its
    sum over keys: :func:`fuse_heads`, then :func:`mix_identity`.

    Parameters
    ----------
    attention : torch.Tensor
        ``(B, heads, T, T)`` one layer's attention probabilities.
    head_fusion : str, default "mean"
        ``"mean"``, ``"max"`` or ``"min"`` over heads.
    discard_ratio : float, default 0.0
        Fraction in ``[0, 1)`` of each fused matrix's weakest off-diagonal pairs set to 0.

    Returns
    -------
    torch.Tensor
        ``(B, T, T)`` float64, every row summing to one.

    Raises
    ------
    AnalysisError
        An unknown ``head_fusion``, or ``discard_ratio`` outside ``[0, 1)``.
    """
    return mix_identity(fuse_heads(attention.double(), head_fusion), discard_ratio)


def compose_rollout(
    steps: Iterable[tuple[int, torch.Tensor, torch.Tensor | None]],
) -> Iterator[tuple[int, torch.Tensor]]:
    """The one composition of rollout: for each step ``(layer, Â_layer, carry)`` yield
    ``(layer, R_layer)`` with

        R_start = Â_start;   R_layer = Â_layer · C_layer · R_previous

    where ``C_layer`` is ``carry`` when the token set changes before ``layer`` (a windowed
    model's patch merging, :func:`analysis.attention.rollout.merge_matrix`) and the identity when
    ``carry`` is None (every ViT layer).

    Parameters
    ----------
    steps : iterable of (int, torch.Tensor, torch.Tensor or None)
        In layer order: the layer, its ``Â_layer`` ``(B, T_layer, T_layer)`` (:func:`mix_identity`)
        and ``carry`` ``(T_layer, T_previous)`` or ``None``; the first step's ``carry`` is unused.

    Yields
    ------
    tuple of (int, torch.Tensor)
        ``(layer, R_layer)``, ``R_layer`` ``(B, T_layer, T_start)`` in ``Â``'s dtype.
    """
    rollout = None
    for layer, mixed, carry in steps:
        if rollout is not None and carry is not None:
            rollout = carry.to(rollout) @ rollout  # (T_layer, T_previous) · (B, T_previous, T_start)
        rollout = mixed if rollout is None else mixed @ rollout
        yield layer, rollout


def layer_range(spec, start_layer: int, end_layer: int | None, stage: int | None = None) -> tuple[int, int]:
    """The layers a rollout composes: ``start_layer``..``end_layer``, or every layer of ``stage``.

    Parameters
    ----------
    spec : ViTSpec
        The model's spec (its ``num_layers`` and each layer's ``spec.geometry(l).stage``).
    start_layer : int
        First layer (negative counts from the end); must be 0 with ``stage``.
    end_layer : int or None
        Last layer, inclusive (negative counts from the end); ``None``, the last layer. Must be
        ``None`` with ``stage``.
    stage : int or None, default None
        Every layer of that stage instead (negative counts from the last stage; a ViT has stage 0
        only).

    Returns
    -------
    tuple of (int, int)
        ``(start, end)``, inclusive and non-negative, ``start <= end``.

    Raises
    ------
    AnalysisError
        ``stage`` together with ``start_layer`` / ``end_layer``; a ``stage`` the model lacks; a
        non-integer index; or not ``0 <= start <= end < L``.
    """
    layers = spec.num_layers
    if stage is not None:
        if check_int("start_layer", start_layer) != 0 or end_layer is not None:
            raise AnalysisError("Pass either stage or start_layer/end_layer, not both.")
        stages = [spec.geometry(layer).stage for layer in range(layers)]
        count = max(stages) + 1
        stage = check_int("stage", stage)
        if not -count <= stage < count:
            raise AnalysisError(f"stage={stage} does not exist: the model has {count} stage(s) (0..{count - 1}).")
        stage %= count
        chosen = [layer for layer, s in enumerate(stages) if s == stage]
        return chosen[0], chosen[-1]
    last = layers - 1 if end_layer is None else check_int("end_layer", end_layer)
    if last < 0:
        last += layers
    start_layer = check_int("start_layer", start_layer)
    if start_layer < 0:
        start_layer += layers
    if not 0 <= start_layer <= last < layers:
        raise AnalysisError(f"Need 0 <= start_layer ({start_layer}) <= end_layer ({last}) < {layers} layers.")
    return start_layer, last
