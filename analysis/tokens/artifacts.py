"""High-norm artifact tokens ("Vision Transformers Need Registers", Darcet et al. 2024) and the
attention mass that goes to prefix tokens and to those artifacts.

Outliers are found per layer without a fixed threshold: sort the patch tokens' log-norms,
take the largest gap between neighbours inside the top :data:`MAX_OUTLIER_FRACTION` of
them; it separates outliers when the norms across it differ by at least
:data:`MIN_NORM_RATIO`. The threshold is the geometric mean of the two norms at the gap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..base.errors import AnalysisError
from ..model.windowed_support import require_global_attention
from ..records.attention import AttentionRecord
from ..records.checks import check_record
from .record import TokenRecord

__all__ = [
    "MAX_OUTLIER_FRACTION",
    "MIN_NORM_RATIO",
    "DOMINANT_SHARE",
    "STANDOUT_RATIO",
    "HighNormTokens",
    "token_norms",
    "high_norm_tokens",
    "attention_mass",
    "outlier_patches",
    "outlier_share",
    "dominated_by_outliers",
]

MAX_OUTLIER_FRACTION = 0.1  # outliers are rare (about 2% of tokens in the paper's models)
MIN_NORM_RATIO = 2.0  # ... and stand apart (about 10x the norm of the others there)
#: The outlier tokens stand out in a map when they hold at least this share of its mass ...
DOMINANT_SHARE = 0.25
#: ... or its largest cell is one of them and at least this many times the 99th percentile of the
#: other cells (on a flat map, such as a first layer's, the largest cell is barely above the rest).
STANDOUT_RATIO = 2.0


def token_norms(tokens) -> torch.Tensor:
    """Euclidean norms ``‖h‖₂`` of tokens: ``(..., T, D)`` -> ``(..., T)``, in float32.

    Parameters
    ----------
    tokens : torch.Tensor, array-like or TokenRecord
        ``(..., T, D)`` tokens (e.g. ``(L, B, T, D)``, or one layer's ``record.layer_tokens(l)``),
        or a :class:`~analysis.tokens.record.TokenRecord` whose layers share one grid (its
        ``(L, B, T, D)`` tokens).

    Returns
    -------
    torch.Tensor
        ``(..., T)`` float32 norms (``(L, B, T)`` for a record).

    Raises
    ------
    AnalysisError
        ``tokens`` has fewer than 2 dimensions, or is a record whose layers differ in grid (a
        windowed model's: pass ``record.layer_tokens(l)``).
    """
    if isinstance(tokens, TokenRecord):
        tokens = tokens.every_layer("token_norms(record)")  # (L, B, T, D)
    tokens = torch.as_tensor(tokens)
    if tokens.ndim < 2:
        raise AnalysisError(f"token_norms expects (..., T, D) tokens, got shape {tuple(tokens.shape)}.")
    return tokens.float().norm(dim=-1)


@dataclass(frozen=True)
class HighNormTokens:
    """High-norm outlier tokens, layer by layer: what :func:`high_norm_tokens` returns.

    Attributes
    ----------
    thresholds : torch.Tensor
        ``(L,)`` float32 norm threshold of each layer, ``inf`` where it has no outliers.
    mask : torch.Tensor or tuple of torch.Tensor
        ``(L, B, N)`` bool over the patch tokens (prefix tokens left out), ``True`` above the
        threshold; when the layers differ in grid (a windowed model's stages) a tuple of
        ``(B, N_l)`` bool, one per layer, ``N_l = gh·gw`` of the layer's grid.
    fraction : torch.Tensor
        ``(L,)`` float32 share of the layer's patch tokens (over the batch) above the threshold.
    first_layer : int or None
        The first position along ``L`` with any outlier; ``None`` if none.
    """

    thresholds: torch.Tensor
    mask: torch.Tensor | tuple[torch.Tensor, ...]
    fraction: torch.Tensor
    first_layer: int | None

    def positions(self, layer: int, image: int = 0) -> list[int]:
        """Row-major patch indices of the outliers of one layer and image."""
        return torch.nonzero(self.mask[layer][image]).flatten().tolist()


def _gap_threshold(norms: torch.Tensor, max_fraction: float, min_ratio: float) -> float:
    values = torch.sort(norms.double().flatten().clamp(min=1e-12)).values
    n = len(values)
    top = max(1, int(math.floor(max_fraction * n)))
    if n < 2:
        return math.inf
    logs = values.log()
    gaps = logs[n - top :] - logs[n - top - 1 : n - 1]  # gaps below each of the top candidates
    best = int(torch.argmax(gaps))
    if float(gaps[best]) < math.log(min_ratio):
        return math.inf
    below, above = values[n - top - 1 + best], values[n - top + best]
    return float(torch.sqrt(below * above))


def high_norm_tokens(
    norms: torch.Tensor | TokenRecord,
    num_prefix_tokens: int | None = None,
    *,
    max_fraction: float = MAX_OUTLIER_FRACTION,
    min_ratio: float = MIN_NORM_RATIO,
) -> HighNormTokens:
    """Outlier patch tokens of ``norms`` (prefix tokens excluded), layer by layer, pooling the
    batch's patch tokens to fit each layer's split.

    Each layer's ``B·N`` patch norms are sorted; the largest gap between neighbouring log-norms
    among the top ``max_fraction`` of them is the split if the norms across it differ by at least
    ``min_ratio``, and the threshold is the geometric mean of the two norms at the gap (the
    module docstring; Darcet et al. 2024).

    Given a :class:`~analysis.tokens.record.TokenRecord` (block outputs), each layer is measured on
    its own geometry (its prefix tokens left out, its grid's cells kept): one rule for a ViT's
    layers and a windowed model's stage grids.

    Parameters
    ----------
    norms : torch.Tensor or TokenRecord
        ``(L, B, T)`` token norms (:func:`token_norms`), prefix tokens first; or a record, whose
        layers' ``‖h‖₂`` are measured here.
    num_prefix_tokens : int or None, default None
        How many leading tokens of ``norms`` are prefix tokens, left out
        (``0 <= num_prefix_tokens < T``); ``None`` (only) for a record, which says it per layer.
    max_fraction : float, default MAX_OUTLIER_FRACTION
        The split is looked for among the top ``max(1, ⌊max_fraction · B·N⌋)`` patch norms of a
        layer (0.1, in ``(0, 1)``).
    min_ratio : float, default MIN_NORM_RATIO
        The least ratio of the norms across the gap that counts as a split (2.0, above 1).

    Returns
    -------
    HighNormTokens
        ``thresholds`` ``(L,)`` float32 (``inf`` where no outliers), ``mask`` ``(L, B, N)`` bool
        over the patch tokens (``N = T − num_prefix_tokens``; a tuple of ``(B, N_l)`` when a
        record's layers differ in grid), ``fraction`` ``(L,)`` float32 of patch tokens above the
        threshold, ``first_layer`` the first position along ``L`` (``record.layers``'s order)
        with any (``None`` if none).

    Raises
    ------
    AnalysisError
        ``norms`` is not 3-D, ``num_prefix_tokens`` is missing for norms, given for a record, or
        leaves no patch tokens, ``max_fraction`` is outside ``(0, 1)`` or ``min_ratio`` is not
        above 1.
    """
    if isinstance(norms, TokenRecord):
        if num_prefix_tokens is not None:
            raise AnalysisError(
                "high_norm_tokens reads a record's prefix tokens from its layers: drop num_prefix_tokens."
            )
        return _record_outliers(norms, max_fraction, min_ratio)
    if num_prefix_tokens is None:
        raise AnalysisError(
            "high_norm_tokens(norms, num_prefix_tokens): say how many leading tokens are prefix tokens."
        )
    norms = torch.as_tensor(norms).float()
    if norms.ndim != 3:
        raise AnalysisError(f"high_norm_tokens expects (L, B, T) norms, got shape {tuple(norms.shape)}.")
    if not 0 <= num_prefix_tokens < norms.shape[-1]:
        raise AnalysisError(f"num_prefix_tokens={num_prefix_tokens} leaves no patch tokens of {norms.shape[-1]}.")
    if not 0 < max_fraction < 1 or not min_ratio > 1:
        raise AnalysisError("max_fraction must be in (0, 1) and min_ratio above 1.")
    patches = norms[..., num_prefix_tokens:]  # (L, B, N)
    thresholds = torch.tensor([_gap_threshold(layer, max_fraction, min_ratio) for layer in patches])
    mask = patches > thresholds[:, None, None]
    fraction = mask.float().mean((1, 2))
    layers = torch.nonzero(fraction > 0).flatten().tolist()
    return HighNormTokens(
        thresholds=thresholds, mask=mask, fraction=fraction, first_layer=layers[0] if layers else None
    )


def _record_outliers(record: TokenRecord, max_fraction: float, min_ratio: float) -> HighNormTokens:
    """:func:`high_norm_tokens` of a record: each layer on its own geometry, then the layers joined
    (``mask`` stacked when every layer has the same patch count, else one per layer)."""
    per_layer = [
        high_norm_tokens(
            token_norms(record.layer_tokens(layer))[None],
            record.geometry(layer).prefix_tokens,
            max_fraction=max_fraction,
            min_ratio=min_ratio,
        )
        for layer in record.layers
    ]  # each over one layer: mask (1, B, N_l)
    masks = [found.mask[0] for found in per_layer]
    fraction = torch.cat([found.fraction for found in per_layer])
    with_outliers = torch.nonzero(fraction > 0).flatten().tolist()
    one_grid = len({mask.shape for mask in masks}) == 1
    return HighNormTokens(
        thresholds=torch.cat([found.thresholds for found in per_layer]),
        mask=torch.stack(masks) if one_grid else tuple(masks),
        fraction=fraction,
        first_layer=with_outliers[0] if with_outliers else None,
    )


def attention_mass(record: AttentionRecord, key_tokens: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """The attention the patch queries give to ``key_tokens``, averaged over the patch queries:

        mass[l, b, h] = mean_q Σ_{k ∈ key_tokens} A[l, b, h, q, k]

    with ``q`` over every patch query (each must have been captured) and ``k`` over the keys.

    Parameters
    ----------
    record : AttentionRecord
        A captured pass (:func:`analysis.capture_attention`), attentions ``(L, B, heads, Q, T)``
        with every patch query row kept; windowed records are refused.
    key_tokens : sequence of int or torch.Tensor
        Token indices in ``0..T-1`` (e.g. ``range(num_prefix_tokens)``), or a ``(B, T)`` bool mask
        (per-image outliers).

    Returns
    -------
    torch.Tensor
        ``(L, B, heads)`` float32.

    Raises
    ------
    AnalysisError
        ``record`` is not an :class:`~analysis.records.attention.AttentionRecord` (a windowed
        record included), a patch query row was not captured, a mask is not ``(B, T)``, or a token
        index is outside ``0..T-1``.
    """
    require_global_attention(
        record,
        lambda spec: AnalysisError(
            f"the attention mass is not defined for this {spec.family}: it has no prefix tokens, and its cells "
            "attend only inside their windows, so the mass to a set of tokens is not one number per head over the "
            "whole image."
        ),
    )
    check_record(record, "attention_mass")
    spec = record.spec
    prefix = spec.num_prefix_tokens
    rows = record.query_rows(range(prefix, spec.num_tokens))
    attention = record.attentions[:, :, :, rows].float()  # (L, B, heads, N, T)
    keys = torch.as_tensor(key_tokens)
    if keys.dtype == torch.bool:
        if tuple(keys.shape) != (attention.shape[1], attention.shape[-1]):
            raise AnalysisError(
                f"A key mask must be (B, T) = {(attention.shape[1], attention.shape[-1])}, got {tuple(keys.shape)}."
            )
        weights = keys.float()[None, :, None, None, :]  # (1, B, 1, 1, T)
        return (attention * weights).sum(-1).mean(-1)
    keys = keys.long().flatten()
    if len(keys) and (keys.min() < 0 or keys.max() >= spec.num_tokens):
        raise AnalysisError(f"Key tokens must be in 0..{spec.num_tokens - 1}.")
    return attention[..., keys].sum(-1).mean(-1)


def outlier_patches(found: HighNormTokens, image: int = 0) -> list[int]:
    """The outlier tokens of one image as the maps see them: sorted row-major patch indices that
    are high-norm outliers in *any* layer (the union of ``found.positions(layer, image)``).

    This is the one rule by which maps, rollout and their colour ranges leave outliers out
    (:func:`analysis.plots.colour_range`'s ``left_out``).

    Parameters
    ----------
    found : HighNormTokens
        The outliers of a ViT (:func:`high_norm_tokens`), ``mask`` ``(L, B, N)``.
    image : int, default 0
        The image in the batch, ``0 <= image < B``.

    Returns
    -------
    list of int
        Sorted row-major patch indices on the patch grid.

    Raises
    ------
    AnalysisError
        ``found`` is a windowed model's (its stage grids differ from layer to layer, so it has no
        single set), or ``image`` is outside the batch.
    """
    if isinstance(found.mask, tuple):
        raise AnalysisError(
            "outlier_patches needs one patch grid for every layer (a ViT); a windowed model's "
            "outliers are per stage grid: read found.mask[layer] layer by layer."
        )
    if not 0 <= image < found.mask.shape[1]:
        raise AnalysisError(f"image {image} is outside the batch of {found.mask.shape[1]}.")
    return torch.nonzero(found.mask[:, image].any(0)).flatten().tolist()


def outlier_share(values, cells: Sequence[int]) -> float:
    """The share of a non-negative map's mass on the cells ``cells``:

        share = Σ_{c ∈ cells} m_c / Σ_c m_c

    over finite cells (non-finite ones count as 0).

    Parameters
    ----------
    values : torch.Tensor, numpy.ndarray or array-like
        The map, any shape (e.g. ``(gh, gw)``), flattened row-major; read in float64.
    cells : Sequence of int
        Flat row-major indices into the map (e.g. :func:`outlier_patches`).

    Returns
    -------
    float
        The share in ``[0, 1]``; 0 when ``cells`` is empty or the map's finite mass is not positive.
    """
    flat = torch.as_tensor(values, dtype=torch.float64).flatten()
    flat = torch.where(torch.isfinite(flat), flat, torch.zeros_like(flat))
    total = float(flat.sum())
    if not len(cells) or total <= 0:
        return 0.0
    index = torch.as_tensor(list(cells), dtype=torch.long)
    return float(flat[index].sum()) / total


def dominated_by_outliers(values, cells: Sequence[int], *, share: float = DOMINANT_SHARE) -> bool:
    """Whether the outlier tokens ``cells`` stand out in a map: they hold at least ``share`` of
    its mass (:func:`outlier_share`), or its largest cell ``m_max`` is one of them and

        m_max ≥ STANDOUT_RATIO · quantile(m_others, 0.99)

    (the other finite cells' 99th percentile, numpy's linear rule; :data:`STANDOUT_RATIO`). On a
    flat map the largest cell is barely above the others, whichever it is.

    Parameters
    ----------
    values : torch.Tensor, numpy.ndarray or array-like
        The map, any shape (e.g. ``(gh, gw)``), flattened row-major; read in float64, non-finite
        cells ignored.
    cells : Sequence of int
        The outliers' flat row-major indices into the map (:func:`outlier_patches`).
    share : float, default DOMINANT_SHARE
        The least share of the mass (0.25) on ``cells`` that counts as dominating.

    Returns
    -------
    bool
        ``False`` when ``cells`` is empty; ``True`` when the largest cell is an outlier and no other
        finite cell is left to compare it with.
    """
    if not len(cells):
        return False
    if outlier_share(values, cells) >= share:
        return True
    flat = torch.as_tensor(values, dtype=torch.float64).flatten()
    finite = torch.isfinite(flat)
    flat = torch.where(finite, flat, torch.full_like(flat, -torch.inf))
    largest = int(torch.argmax(flat))
    chosen = {int(c) for c in cells}
    if largest not in chosen:
        return False
    others = flat[[i for i in range(flat.numel()) if i not in chosen and bool(finite[i])]]
    if not others.numel():
        return True
    return float(flat[largest]) >= STANDOUT_RATIO * float(torch.quantile(others, 0.99))
