"""Mean attention distance (ViT paper, Figure 7 right and Appendix D.7)."""

from __future__ import annotations

import torch

from .capture import AttentionRecord
from .checks import check_record, check_spec
from .errors import AnalysisError
from .spec import ViTSpec

__all__ = [
    "mean_attention_distance", "patch_centres", "patch_distance_matrix", "attention_distance_per_image",
    "uniform_attention_distance", "DISTANCE_UNITS", "distance_unit_length", "distance_in_units",
]

#: Units for attention distances, with the length each one divides the pixel value by.
DISTANCE_UNITS = {
    "px": "input pixels",
    "patches": "patch sides: √(ph·pw) px (the patch side for square patches)",
    "image": "fractions of the image side: √(H·W) px (the side for square inputs)",
}


def patch_centres(spec: ViTSpec) -> torch.Tensor:
    """``(N, 2)`` centre of every patch in input pixels, row-major: ``((r + ½)·ph, (c + ½)·pw)``."""
    gh, gw = spec.grid_size
    ph, pw = spec.patch_size
    rows = (torch.arange(gh, dtype=torch.float64) + 0.5) * ph
    cols = (torch.arange(gw, dtype=torch.float64) + 0.5) * pw
    grid_r, grid_c = torch.meshgrid(rows, cols, indexing="ij")
    return torch.stack([grid_r.reshape(-1), grid_c.reshape(-1)], dim=1)


def patch_distance_matrix(spec: ViTSpec) -> torch.Tensor:
    """``(N, N)`` Euclidean distance in pixels between patch centres."""
    centres = patch_centres(spec)
    return torch.cdist(centres, centres)


def uniform_attention_distance(spec: ViTSpec) -> float:
    """The mean attention distance if every patch attended uniformly to every patch
    (``spec``: a ViTSpec, or a LoadedViT / AttentionRecord, whose spec is used)."""
    return float(patch_distance_matrix(check_spec(spec, "uniform_attention_distance")).mean())


def distance_unit_length(spec: ViTSpec, unit: str) -> float:
    """How many input pixels one ``unit`` is for this model (see :data:`DISTANCE_UNITS`).

    ``"px"`` -> 1; ``"patches"`` -> √(ph·pw); ``"image"`` -> √(H·W). Patch units compare models
    with different patch sizes on one grid; image units compare any two models, since they
    measure how far attention reaches across the picture, whatever the input resolution.
    """
    spec = check_spec(spec, "distance_unit_length")
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
    """``distance_px / distance_unit_length(spec, unit)``: a distance (tensor, array or float)
    from input pixels into ``unit``."""
    return distance_px / distance_unit_length(spec, unit)


def attention_distance_per_image(
    probs: torch.Tensor,
    spec: ViTSpec,
    distances: torch.Tensor,
    *,
    renormalize: bool = True,
    compute_dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """One layer: ``probs (B, heads, N, T)`` rows of the N patch queries -> ``(B, heads)``.

        d[b, h] = mean_q Σ_k w[b, h, q, k] · ‖c_q − c_k‖₂,   k over patch keys only,

    with ``w`` the attention row restricted to patch keys, divided by its sum when
    ``renormalize`` (so attention spent on prefix tokens does not shrink the distance).
    ``distances`` is :func:`patch_distance_matrix` on the same device.
    """
    weights = probs[..., spec.num_prefix_tokens :].to(compute_dtype)  # (B, heads, N, N)
    per_query = torch.einsum("bhqk,qk->bhq", weights, distances.to(compute_dtype))  # (B, heads, N)
    if renormalize:
        per_query = per_query / weights.sum(-1).clamp_min(torch.finfo(compute_dtype).tiny)
    return per_query.mean(-1)


def mean_attention_distance(
    record: AttentionRecord, *, renormalize: bool = True, per_image: bool = False
) -> torch.Tensor:
    """Average distance in input pixels between each patch query and the patches it attends to.

    For each layer and head: the mean over query patches q (and over images) of
    ``Σ_k w_qk · ‖c_q − c_k‖₂``, with ``c`` patch centres and ``w`` the attention row over
    patch keys (renormalised to sum to one when ``renormalize``). Identity attention gives
    0; uniform attention on a 14×14 grid of 16 px patches gives ≈116.5 px.

    Returns:
        ``(L, heads)`` float64, or ``(B, L, heads)`` with ``per_image=True``.
    """
    spec = check_record(record, "mean_attention_distance").spec
    prefix = spec.num_prefix_tokens
    rows = record.query_rows(range(prefix, prefix + spec.num_patches))
    distances = patch_distance_matrix(spec).to(record.attentions.device)
    per_layer = []
    index = torch.as_tensor(rows, device=record.attentions.device)
    for position in range(len(record.layers)):
        probs = record.attentions[position].index_select(-2, index)  # (B, heads, N, T)
        per_layer.append(attention_distance_per_image(probs, spec, distances, renormalize=renormalize))
    result = torch.stack(per_layer, dim=1).double()  # (B, L, heads)
    if result.numel() == 0:
        raise AnalysisError("The record holds no attention to measure.")
    return result if per_image else result.mean(dim=0)
