"""Mean attention distance (ViT paper, Figure 7 right and Appendix D.7), written once for every
record.

Each layer is read as windows of token slots (:func:`analysis.records.token_matrix.layer_windows`:
a ViT's one window of all its tokens, a windowed layer's windows on its stage grid) and measured by
:func:`layer_attention_distance`: every cell query against the cells of its window, in input
pixels, so a ViT and a Swin compare on one chart (:func:`uniform_attention_distance_by_layer` is
each layer's uniform reference).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..base.errors import AnalysisError
from ..model.geometry import LayerGeometry, ViTSpec
from ..model.windowed_support import require_global_attention
from ..records.attention import AttentionRecord, AttentionRecordProtocol
from ..records.checks import check_spec
from ..records.token_matrix import layer_windows

__all__ = [
    "mean_attention_distance",
    "patch_centres",
    "patch_distance_matrix",
    "attention_distance_per_image",
    "layer_attention_distance",
    "uniform_attention_distance",
    "uniform_attention_distance_by_layer",
    "UniformDistanceReference",
    "uniform_distance_reference",
    "window_distance_matrices",
    "DISTANCE_UNITS",
    "distance_unit_length",
    "distance_in_units",
]

#: Units for attention distances, with the length each one divides the pixel value by.
DISTANCE_UNITS = {
    "px": "input pixels",
    "patches": "patch sides: √(ph·pw) px (the patch side for square patches)",
    "image": "fractions of the image side: √(H·W) px (the side for square inputs)",
}


def patch_centres(spec: ViTSpec) -> torch.Tensor:
    """The centre of every patch in input pixels, row-major: ``((r + ½)·ph, (c + ½)·pw)``.

    Parameters
    ----------
    spec : ViTSpec
        The model's spec: its ``grid_size`` ``(gh, gw)`` and ``patch_size`` ``(ph, pw)``.

    Returns
    -------
    torch.Tensor
        ``(N, 2)`` float64, ``N = gh·gw``: each patch's ``(y, x)`` centre.
    """
    gh, gw = spec.grid_size
    ph, pw = spec.patch_size
    rows = (torch.arange(gh, dtype=torch.float64) + 0.5) * ph
    cols = (torch.arange(gw, dtype=torch.float64) + 0.5) * pw
    grid_r, grid_c = torch.meshgrid(rows, cols, indexing="ij")
    return torch.stack([grid_r.reshape(-1), grid_c.reshape(-1)], dim=1)


def patch_distance_matrix(spec: ViTSpec) -> torch.Tensor:
    """Euclidean distance in input pixels between patch centres (:func:`patch_centres`).

    Parameters
    ----------
    spec : ViTSpec
        The model's spec: its ``grid_size`` and ``patch_size``.

    Returns
    -------
    torch.Tensor
        ``(N, N)`` float64, entry ``[q, k]`` the distance between patches ``q`` and ``k`` (row-major).
    """
    centres = patch_centres(spec)
    return torch.cdist(centres, centres)


def uniform_attention_distance(spec: ViTSpec) -> float:
    """The mean attention distance if every patch attended uniformly to every patch.

    The mean over query patches of the mean distance from the query's centre to every patch
    centre, in input pixels (≈116.5 px on a 14×14 grid of 16 px patches). A windowed model has no
    single such number (each layer's window and stride differ): it is refused, naming
    :func:`uniform_attention_distance_by_layer`.

    Parameters
    ----------
    spec : ViTSpec, LoadedViT or AttentionRecord
        The model's :class:`ViTSpec`, or a LoadedViT / AttentionRecord, whose ``spec`` is used.

    Returns
    -------
    float
        The uniform-attention distance in input pixels, one value for every layer.

    Raises
    ------
    AnalysisError
        A windowed model (Swin, SAM), or ``spec`` neither a ViTSpec nor anything with one.
    """
    require_global_attention(
        spec,
        lambda given: AnalysisError(
            f"uniform_attention_distance: a windowed model ({given.family}) has no single uniform-attention "
            "distance, since each layer attends inside its own windows on its own stage grid; use "
            "uniform_attention_distance_by_layer(spec), one value per layer."
        ),
    )
    # one rule with the windowed layers': the mean over query patches of the mean distance to every patch
    return float(uniform_attention_distance_by_layer(check_spec(spec, "uniform_attention_distance"))[0])


def window_distance_matrices(geometry: LayerGeometry) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's distances between the slots of each window, in input pixels.

        D[w, s, t] = ‖c(cells[w, s]) − c(cells[w, t])‖₂,   c(r, col) = ((r + ½)·sy, (col + ½)·sx)

    with ``cells = geometry.window_cells()`` and ``(sy, sx)`` the layer's stride: each slot
    at the true centre of the grid cell it holds (a shifted window's cells from opposite
    borders at their own, far apart, positions). Padding and prefix slots are no image
    position: their rows and columns are 0, and ``real`` marks them False.

    Parameters
    ----------
    geometry : LayerGeometry
        The layer's geometry (``spec.geometry(layer)``): its grid, stride and window slots.

    Returns
    -------
    tuple of (torch.Tensor, torch.Tensor)
        ``D`` ``(windows, Wt, Wt)`` float64 and ``real`` ``(windows, Wt)`` bool.
    """
    (_, gw), (sy, sx) = geometry.grid_size, geometry.stride
    cells = geometry.window_cells()  # (windows, Wt), −1: padding / prefix
    real = cells >= 0
    rows = (torch.div(cells.clamp(min=0), gw, rounding_mode="floor").double() + 0.5) * sy
    cols = (cells.clamp(min=0).remainder(gw).double() + 0.5) * sx
    centres = torch.stack([rows, cols], dim=-1)  # (windows, Wt, 2)
    distances = torch.cdist(centres, centres)  # (windows, Wt, Wt)
    pairs = real[:, :, None] & real[:, None, :]
    return distances.masked_fill(~pairs, 0.0), real


def uniform_attention_distance_by_layer(spec: ViTSpec) -> torch.Tensor:
    """Each layer's mean attention distance under uniform attention, in input pixels.

    A ViT: every layer is :func:`uniform_attention_distance` (all patches to all patches).
    A windowed model: each real query cell attends uniformly to the real cells its window
    lets it see (the shift mask's allowed pairs; padding slots left out, as
    :func:`mean_attention_distance` leaves them out with ``renormalize=True``), averaged over
    the real query cells of the layer's stage grid:

        u_l = mean_q  Σ_k a_qk · D_qk / Σ_k a_qk,   a_qk = 1 for allowed real keys, else 0.

    The reference a layer's measured distance is read against: near it, the heads spread
    over the whole window; far below it, they learned locality beyond what the window gives.

    Parameters
    ----------
    spec : ViTSpec, LoadedViT or AttentionRecord
        The model's :class:`ViTSpec`, or a LoadedViT / record, whose ``spec`` is used (a ViT or a
        windowed model).

    Returns
    -------
    torch.Tensor
        ``(L,)`` float64 in input pixels, one value per layer of the model (``L = spec.num_layers``).

    Raises
    ------
    AnalysisError
        ``spec`` neither a ViTSpec nor anything with one.
    """
    given = getattr(spec, "spec", spec)
    if not isinstance(given, ViTSpec):
        given = check_spec(spec, "uniform_attention_distance_by_layer")
    geometries = given.geometries()  # a ViT's: one window of the whole grid, prefix slots not real
    values: dict = {}  # per distinct geometry: a ViT's layers share one
    for geometry in geometries:
        if geometry not in values:
            distances, real = window_distance_matrices(geometry)  # (windows, Wt, Wt), (windows, Wt)
            keys = (geometry.allowed() & real[:, None, :]).double()  # (windows, Wt, Wt)
            per_query = (keys * distances).sum(-1) / keys.sum(-1).clamp_min(1.0)  # (windows, Wt)
            values[geometry] = per_query[real].mean()
    return torch.stack([values[geometry] for geometry in geometries])


@dataclass(frozen=True, eq=False)  # a tensor field: compare ``values`` and ``per_layer`` themselves
class UniformDistanceReference:
    """What a mean attention distance is read against: its value under uniform attention.

    Built by :func:`uniform_distance_reference`; :attr:`value` is the one reference of a model
    whose layers share it.

    Attributes
    ----------
    values : torch.Tensor
        ``(L,)`` float64 in input pixels, layer ``l``'s reference
        (:func:`uniform_attention_distance_by_layer`).
    per_layer : bool
        False when one value holds for every layer, because every layer attends over the whole
        patch grid (a ViT: :func:`uniform_attention_distance`, drawn as one line); True when each
        layer attends inside its own windows on its own stage grid (Swin, SAM: one reference per
        layer, drawn as a step per layer).
    """

    values: torch.Tensor
    per_layer: bool

    @property
    def value(self) -> float:
        """The one reference of every layer (``per_layer`` False), else AnalysisError."""
        if self.per_layer:
            raise AnalysisError(
                "This model has one uniform-attention reference per layer (each layer's window): read "
                "UniformDistanceReference.values."
            )
        return float(self.values[0])


def uniform_distance_reference(spec: ViTSpec) -> UniformDistanceReference:
    """The uniform-attention reference of :func:`mean_attention_distance` for the model of
    ``spec``, in input pixels: one value for every layer of a ViT
    (:func:`uniform_attention_distance`), or each layer's own for a windowed model
    (:func:`uniform_attention_distance_by_layer`). See :class:`UniformDistanceReference`.

    Parameters
    ----------
    spec : ViTSpec, LoadedViT or AttentionRecord
        The model's :class:`ViTSpec`, or a LoadedViT / record, whose ``spec`` is used.

    Returns
    -------
    UniformDistanceReference
        ``values`` ``(L,)`` float64 in input pixels, one per layer of the model; ``per_layer``
        False when every layer attends over the one patch grid (a ViT), else True.

    Raises
    ------
    AnalysisError
        ``spec`` neither a ViTSpec nor anything with one.
    """
    given = getattr(spec, "spec", spec)
    if not isinstance(given, ViTSpec):
        given = check_spec(spec, "uniform_distance_reference")
    geometries = set(given.geometries())
    one_grid = len(geometries) == 1 and next(iter(geometries)).is_global
    return UniformDistanceReference(uniform_attention_distance_by_layer(given), not one_grid)


def distance_unit_length(spec: ViTSpec, unit: str) -> float:
    """How many input pixels one ``unit`` is for this model (see :data:`DISTANCE_UNITS`).

    ``"px"`` -> 1; ``"patches"`` -> √(ph·pw); ``"image"`` -> √(H·W). Patch units compare models
    with different patch sizes on one grid; image units compare any two models, since they
    measure how far attention reaches across the picture, whatever the input resolution.
    A windowed model has ``"px"`` and ``"image"``; ``"patches"`` only when every layer has the
    same cell size (SAM), and is refused where patch merging changes it (Swin).

    Parameters
    ----------
    spec : ViTSpec, LoadedViT or AttentionRecord
        The model's :class:`ViTSpec`, or a LoadedViT / record, whose ``spec`` is used: its
        ``patch_size`` ``(ph, pw)`` and ``img_size`` ``(H, W)``.
    unit : str
        ``"px"``, ``"patches"`` or ``"image"`` (the keys of :data:`DISTANCE_UNITS`).

    Returns
    -------
    float
        The length of one ``unit`` in input pixels.

    Raises
    ------
    AnalysisError
        An unknown ``unit``; ``"patches"`` for a windowed model whose cell size changes between
        stages (Swin); ``spec`` neither a ViTSpec nor anything with one.
    """
    given = getattr(spec, "spec", spec)
    if not isinstance(given, ViTSpec):
        raise AnalysisError(
            f"distance_unit_length takes a ViTSpec (vit.spec or record.spec), got {type(spec).__name__}."
        )
    spec = given
    strides = {geometry.stride for geometry in spec.geometries()}  # px and image units always exist
    if unit == "patches" and len(strides) > 1:
        raise AnalysisError(
            f"distance unit 'patches': this model ({spec.family}) has a different cell size on each stage "
            f"({', '.join(f'{sy}x{sx}' for sy, sx in sorted(strides))} px: patch merging), so there is no one patch "
            "side; use 'px' or 'image'."
        )
    if unit == "px":
        return 1.0
    if unit == "patches":
        ph, pw = spec.patch_size
        return float(ph * pw) ** 0.5
    if unit == "image":
        height, width = spec.img_size
        return float(height * width) ** 0.5
    raise AnalysisError(f"Unknown distance unit {unit!r}; use one of {', '.join(map(repr, DISTANCE_UNITS))}.")


def distance_in_units(distance_px, spec: ViTSpec, unit: str):
    """``distance_px / distance_unit_length(spec, unit)``: a distance from input pixels into ``unit``.

    Parameters
    ----------
    distance_px : torch.Tensor, numpy.ndarray or float
        Distances in input pixels, any shape (e.g. :func:`mean_attention_distance`'s
        ``(L, heads)``).
    spec : ViTSpec, LoadedViT or AttentionRecord
        The model's :class:`ViTSpec`, or a LoadedViT / record, whose ``spec`` is used.
    unit : str
        ``"px"``, ``"patches"`` or ``"image"`` (see :func:`distance_unit_length`).

    Returns
    -------
    torch.Tensor, numpy.ndarray or float
        ``distance_px`` divided by the unit's length: the same type and shape.

    Raises
    ------
    AnalysisError
        As :func:`distance_unit_length`: an unknown or, for this model, undefined ``unit``.
    """
    return distance_px / distance_unit_length(spec, unit)


def attention_distance_per_image(
    probs: torch.Tensor,
    spec: ViTSpec,
    distances: torch.Tensor,
    *,
    renormalize: bool = True,
    compute_dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """One layer's mean attention distance per image and head, from the rows of the patch queries.

        d[b, h] = mean_q Σ_k w[b, h, q, k] · ‖c_q − c_k‖₂,   k over patch keys only,

    with ``w`` the attention row restricted to patch keys, divided by its sum when
    ``renormalize`` (so attention spent on prefix tokens does not shrink the distance).

    Parameters
    ----------
    probs : torch.Tensor
        ``(B, heads, N, T)``: the attention rows of the ``N`` patch queries over all ``T`` tokens
        (prefix first). A sequence whose patches were partly dropped is accepted: ``(B, heads, N',
        prefix + N')`` with ``N' ≤ N``.
    spec : ViTSpec
        The model's spec, which splits the prefix keys off.
    distances : torch.Tensor
        ``(N, N)``: :func:`patch_distance_matrix` on the same device (for a dropped sequence, the
        kept patches' ``(N', N')``).
    renormalize : bool, default True
        Divide each row over patch keys by its sum; ``False`` counts attention on prefix keys as
        distance 0.
    compute_dtype : torch.dtype, default torch.float64
        The dtype the sums run in.

    Returns
    -------
    torch.Tensor
        ``(B, heads)`` in ``compute_dtype``, in input pixels.

    Raises
    ------
    AnalysisError
        The last axis of ``probs`` is not this model's token axis (``T`` long, or ``prefix..T`` when
        patches were dropped).
    """
    weights = spec.split_prefix(probs, -1, dropped=True)[1].to(
        compute_dtype
    )  # (B, heads, N, N); also a shorter (dropped) sequence
    per_query = torch.einsum("bhqk,qk->bhq", weights, distances.to(compute_dtype))  # (B, heads, N)
    if renormalize:
        per_query = per_query / weights.sum(-1).clamp_min(torch.finfo(compute_dtype).tiny)
    return per_query.mean(-1)


def layer_attention_distance(
    windows: torch.Tensor,
    geometry: LayerGeometry,
    *,
    renormalize: bool = True,
    query_slots: Sequence[int] | None = None,
    compute_dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """One layer's mean attention distance per image and head, from its windows of token slots.

        d[b, h] = mean_q Σ_k w[b, h, q, k] · ‖c_q − c_k‖₂

    over the layer's cells ``q`` (each in exactly one window), ``k`` over the cells of the query's
    window, ``c`` cell centres in input pixels (:func:`window_distance_matrices`). Prefix and
    padding slots (a ViT's class token and registers; the zero tokens that pad a grid up to whole
    windows, which the module keeps as keys) are never queries, and as keys no image position:
    ``w`` is the row restricted to cell keys, divided by its sum when ``renormalize`` (so attention
    spent on them does not shrink the distance; otherwise it counts as distance 0). Masked pairs
    are 0 already.

    Parameters
    ----------
    windows : torch.Tensor
        ``(B, windows, heads, Q, Wt)``: the layer's attention per window
        (:func:`analysis.records.token_matrix.layer_windows`).
    geometry : LayerGeometry
        The layer's geometry (``spec.geometry(layer)``).
    renormalize : bool, default True
        Divide each row over cell keys by its sum; ``False`` counts attention on prefix and
        padding keys as distance 0.
    query_slots : sequence of int or None, default None
        The slots the ``Q`` rows are, when not every slot's (``Q = Wt``) row is given (a capture
        that kept only a ViT's patch rows); ``None``: ``Q = Wt``, row ``s`` is slot ``s``.
    compute_dtype : torch.dtype, default torch.float64
        The dtype the sums run in.

    Returns
    -------
    torch.Tensor
        ``(B, heads)`` in ``compute_dtype``, in input pixels.
    """
    distances, real = window_distance_matrices(geometry)  # (windows, Wt, Wt), (windows, Wt)
    distances, real = distances.to(windows.device), real.to(windows.device)
    queries = real
    if query_slots is not None:
        slots = torch.as_tensor(list(query_slots), dtype=torch.long, device=windows.device)
        distances, queries = distances.index_select(1, slots), real.index_select(1, slots)
    weights = windows.to(compute_dtype) * real[None, :, None, None, :]  # (B, windows, heads, Q, Wt)
    per_query = torch.einsum("bwhqk,wqk->bwhq", weights, distances.to(compute_dtype))  # (B, windows, heads, Q)
    if renormalize:
        per_query = per_query / weights.sum(-1).clamp_min(torch.finfo(compute_dtype).tiny)
    per_query = per_query * queries[None, :, None, :]
    return per_query.sum(dim=(1, 3)) / queries.sum()  # (B, heads)


def mean_attention_distance(
    record: AttentionRecord, *, renormalize: bool = True, per_image: bool = False
) -> torch.Tensor:
    """Average distance in input pixels between each cell query and the cells it attends to.

    For each layer and head: the mean over query cells q (and over images) of
    ``Σ_k w_qk · ‖c_q − c_k‖₂``, with ``c`` cell centres and ``w`` the attention row over cell
    keys (renormalised to sum to one when ``renormalize``), :func:`layer_attention_distance` on
    each layer's windows. A ViT: its patches, every one attending to every patch; identity
    attention gives 0, uniform attention on a 14×14 grid of 16 px patches ≈116.5 px. A windowed
    record (Swin, SAM): each layer's stage grid (stride = the stage's cell size in input pixels),
    ``k`` over the query's window. Stages differ in head count, so the head axis is as long as the
    widest layer's and is NaN beyond a layer's own heads. Read it against
    :func:`uniform_attention_distance_by_layer`, each layer's uniform reference.

    Parameters
    ----------
    record : AttentionRecord
        A captured pass (:func:`capture_attention`), attentions ``(L, B, heads, Q, T)`` or, for a
        windowed model, one ``(B, windows, heads, Wt, Wt)`` tensor per layer. A ViT record must
        hold every patch query's row (``query_tokens=None``, or every patch token kept).
    renormalize : bool, default True
        Divide each query's attention over cell keys by its sum, so attention spent on prefix
        tokens (class token, registers) and padding keys does not shrink the distance; ``False``
        counts it as distance 0.
    per_image : bool, default False
        Keep the image axis instead of averaging over the batch.

    Returns
    -------
    torch.Tensor
        ``(L, heads)`` float64 in input pixels, or ``(B, L, heads)`` with ``per_image=True``; ``L``
        the record's layers (``record.layers``, in that order), ``heads`` the widest layer's.

    Raises
    ------
    AnalysisError
        ``record`` is not what :func:`capture_attention` returns, holds no attention (no layers or
        no images), or is a ViT record that did not keep every patch query's row.
    """
    if not isinstance(record, AttentionRecordProtocol):
        raise AnalysisError(
            "mean_attention_distance takes the record that capture_attention(vit, pixels) returns, "
            f"got {type(record).__name__}."
        )
    per_layer = [
        layer_attention_distance(layer_windows(record, layer), record.spec.geometry(layer), renormalize=renormalize)
        for layer in record.layers
    ]
    if not per_layer or per_layer[0].shape[0] == 0:
        raise AnalysisError("The record holds no attention to measure.")
    heads = max(distance.shape[1] for distance in per_layer)
    result = torch.full(
        (per_layer[0].shape[0], len(per_layer), heads), float("nan"), dtype=torch.float64, device=per_layer[0].device
    )
    for position, distance in enumerate(per_layer):
        result[:, position, : distance.shape[1]] = distance
    return result if per_image else result.mean(dim=0)
