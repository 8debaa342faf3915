"""Cosine similarity of position encodings (ViT paper, Figure 7 centre), for every kind.

* A learned absolute table (ViT, DeiT, DINOv2, EVA-02, PE, NaFlex): the paper's figure,
  the similarity of the table's rows of each pair of patches.
* Rotary embeddings (DINOv3, EVA-02, PE, rope ViTs): there is no table, but every patch
  position p has a well-defined rotary feature vector r(p) = [sin(θ·p), cos(θ·p)] (the
  ``rope`` tensor the model passes to its attention, over all frequencies θ). We show the
  cosine similarity of those vectors. Since sin·sin + cos·cos = cos(θ·(p − p′)), it is the
  mean over frequencies of cos(θ·(p − p′)): a function of the displacement only.
* Relative-position bias (BEiT, vit_relpos): positions exist only as a bias on attention
  scores that depends on the displacement; there is no per-position vector to compare.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from timm.layers import resample_abs_pos_embed

from .checks import check_int
from .errors import AnalysisError
from .windowed import refuse_windowed
from .spec import patch_embedding_module

__all__ = [
    "patch_position_embeddings",
    "rotary_position_features",
    "position_embedding_similarity",
    "position_encoding_kinds",
    "similarity_by_distance",
]


def position_encoding_kinds(vit) -> tuple[str, ...]:
    """The encodings :func:`position_embedding_similarity` can show: "table" and/or "rope"."""
    kind = vit.spec.position_embedding
    return tuple(k for k, present in (("table", "learned" in kind), ("rope", "rope" in kind)) if present)


def _learned_table(vit) -> tuple[torch.Tensor, tuple[int, int]]:
    """``(1, P + N, D)`` position table and its patch grid ``(gh, gw)``."""
    model = vit.model
    pos_embed = getattr(model, "pos_embed", None)
    if isinstance(pos_embed, torch.Tensor):
        return pos_embed.detach().float().cpu(), tuple(int(g) for g in model.patch_embed.grid_size)
    embed_table = getattr(patch_embedding_module(model), "pos_embed", None)  # NaFlex: (1, gh, gw, D)
    if isinstance(embed_table, torch.Tensor) and embed_table.ndim == 4:
        gh, gw = int(embed_table.shape[1]), int(embed_table.shape[2])
        return embed_table.detach().float().cpu().reshape(1, gh * gw, -1), (gh, gw)
    raise AnalysisError(_no_table_message(vit))


def _no_table_message(vit) -> str:
    kind = vit.spec.position_embedding
    if "rope" in kind:
        return f"{vit.name} has no learned position table; it uses rotary embeddings: use kind='rope'."
    if "relative" in kind:
        return (
            f"{vit.name} encodes positions only as a relative-position bias on attention scores (it depends on "
            "the displacement between two patches), so there is no per-position embedding to compare."
        )
    return f"{vit.name} has no position embedding at all."


def patch_position_embeddings(vit, *, grid_size: tuple[int, int] | None = None) -> torch.Tensor:
    """The learned position embeddings of the patch tokens as a grid, ``(gh, gw, D)`` float32.

    Prefix positions (class / distillation tokens) are dropped; models with
    ``no_embed_class`` have none. With ``grid_size``, the patch embeddings are first
    resampled to that grid (bicubic, antialiased, as timm does when fine-tuning at a
    higher resolution).
    """
    embed, old_grid = _learned_table(vit)  # (1, prefix_in_embed + N, D)
    num_patches = old_grid[0] * old_grid[1]
    prefix_in_embed = embed.shape[1] - num_patches
    if prefix_in_embed < 0:
        raise AnalysisError(
            f"pos_embed has {embed.shape[1]} positions, fewer than the {num_patches} patches of a {old_grid} grid."
        )
    patches = embed[:, prefix_in_embed:]  # (1, N, D)
    grid = _checked_grid(grid_size, old_grid)
    if grid != old_grid:
        patches = resample_abs_pos_embed(patches, new_size=list(grid), old_size=list(old_grid), num_prefix_tokens=0)
    return patches.reshape(grid[0], grid[1], -1)


def _checked_grid(grid_size, default: tuple[int, int]) -> tuple[int, int]:
    if grid_size is None:
        return tuple(default)
    if isinstance(grid_size, (str, bytes)) or not hasattr(grid_size, "__len__") or len(grid_size) != 2:
        raise AnalysisError(f"grid_size must be a (rows, columns) pair, got {grid_size!r}.")
    grid = (check_int("grid_size rows", grid_size[0], minimum=1), check_int("grid_size columns", grid_size[1], minimum=1))
    return grid


class _Captured(Exception):
    """Stops the forward once the rotary tensor has been seen."""


@torch.no_grad()
def rotary_position_features(vit, *, grid_size: tuple[int, int] | None = None, layer: int = 0) -> torch.Tensor:
    """Each patch position's rotary feature vector, ``(gh, gw, F)`` float32.

    Read from the model itself: the ``rope`` tensor its forward passes to block ``layer``'s
    attention (``[sin, cos]`` over all frequencies; per-head frequencies, as in mixed-mode
    RoPE, are concatenated). The forward stops there. ``grid_size`` other than the model's
    needs a model that accepts other input sizes.
    """
    if "rope" not in vit.spec.position_embedding:
        raise AnalysisError(f"{vit.name} has no rotary position embedding (it uses {vit.spec.position_embedding}).")
    spec = vit.spec
    grid = _checked_grid(grid_size, spec.grid_size)
    if grid != spec.grid_size and not spec.dynamic_img_size:
        raise AnalysisError(
            f"{vit.name} takes only {spec.grid_size[0]}x{spec.grid_size[1]} patch grids: load it with "
            "dynamic_img_size=True to see its rotary features on another grid."
        )
    from .adapters import block_sites

    sites = block_sites(vit.model, vit.name)
    if not -len(sites) <= layer < len(sites):
        raise AnalysisError(f"Layer {layer} does not exist: the model has {len(sites)} layers.")
    seen: list[torch.Tensor] = []

    def grab(module, args, kwargs):
        seen.append(kwargs.get("rope"))
        raise _Captured

    handle = sites[layer].module.register_forward_pre_hook(grab, with_kwargs=True)
    pixels = torch.zeros(1, 3, grid[0] * spec.patch_size[0], grid[1] * spec.patch_size[1], device=vit.device)
    try:
        vit.model(pixels)
    except _Captured:
        pass
    finally:
        handle.remove()
    rope = seen[0] if seen else None
    if not isinstance(rope, torch.Tensor):
        raise AnalysisError(f"{vit.name} did not pass a rotary embedding to block {layer}'s attention.")
    count = grid[0] * grid[1]
    rope = rope.detach().float().cpu()
    while rope.ndim > 2 and rope.shape[0] == 1:  # batch / head singletons
        rope = rope[0]
    if rope.shape[-2] != count:
        raise AnalysisError(f"The rotary tensor has {rope.shape[-2]} positions, expected {count} patches.")
    features = rope.movedim(-2, 0).reshape(count, -1)  # (N, ...·F): per-head frequencies side by side
    return features.reshape(grid[0], grid[1], -1)


def position_embedding_similarity(
    vit, *, grid_size: tuple[int, int] | None = None, kind: str | None = None
) -> torch.Tensor:
    """Cosine similarity between the position encodings of every pair of patches.

        S[i, j, k, l] = ⟨e_ij, e_kl⟩ / (‖e_ij‖·‖e_kl‖)

    with ``e_ij`` the encoding of the patch in row i, column j: the learned table's row
    (``kind="table"``, the paper's Figure 7) or the rotary feature vector ``[sin(θ·p), cos(θ·p)]``
    (``kind="rope"``; see the module docstring). ``kind=None`` picks the table when there is one.
    Tile ``S[i, j]`` is the figure's small image for patch (i, j).

    Returns:
        ``(gh, gw, gh, gw)`` float32.
    """
    refuse_windowed(vit, "position_embedding_similarity (a windowed model's position is its relative-position bias: relative_position_bias or decomposed_relative_position)")
    kinds = position_encoding_kinds(vit)
    if kind is None:
        if not kinds:
            raise AnalysisError(_no_table_message(vit))
        kind = kinds[0]
    if kind == "table":
        grid_embed = patch_position_embeddings(vit, grid_size=grid_size)  # (gh, gw, D)
    elif kind == "rope":
        grid_embed = rotary_position_features(vit, grid_size=grid_size)  # (gh, gw, F)
    else:
        raise AnalysisError(f"kind must be 'table', 'rope' or None, not {kind!r}.")
    gh, gw, _ = grid_embed.shape
    unit = F.normalize(grid_embed.reshape(gh * gw, -1).double(), dim=-1)  # (N, D)
    return (unit @ unit.T).reshape(gh, gw, gh, gw).float()


def similarity_by_distance(
    similarity: np.ndarray, unit: float = 1.0, bin_width: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Mean cosine similarity as a function of the distance between patch centres.

    similarity: ``(gh, gw, gh, gw)``. Distances are Euclidean in grid steps, multiplied by
    ``unit`` (e.g. ``original_grid / resampled_grid`` to express a resampled grid in the
    original grid's patches). Returns ``(distances, mean_similarity)``, sorted by distance,
    one entry per distinct distance (self-similarity at distance 0 included).

    ``bin_width`` (in the same unit): pool distances into bins ``[k·w, (k+1)·w)`` instead,
    each reported at the pair-weighted mean distance of its pairs (distance 0 keeps its own
    bin). A resampled grid has many near-equal distances whose means zig-zag; bins smooth that
    without moving any pair.
    """
    similarity = np.asarray(similarity)
    if similarity.ndim != 4 or similarity.shape[:2] != similarity.shape[2:]:
        raise AnalysisError(
            f"similarity_by_distance expects a (gh, gw, gh, gw) similarity grid "
            f"(position_embedding_similarity's), got shape {similarity.shape}.")
    if not unit > 0 or (bin_width is not None and not bin_width > 0):
        raise AnalysisError(f"unit and bin_width must be positive, got unit={unit!r}, bin_width={bin_width!r}.")
    gh, gw = similarity.shape[:2]
    # Sum over all pairs with displacement (dy, dx), without a (N², N²) index: along each
    # diagonal of the (row, row') plane, then along each diagonal of the (col, col') plane.
    by_rows = similarity.astype(np.float64).transpose(0, 2, 1, 3)  # (gh, gh, gw, gw): [r, r', c, c']
    dys, dxs, totals, pairs = [], [], [], []
    for dy in range(-(gh - 1), gh):
        cols = np.diagonal(by_rows, offset=dy, axis1=0, axis2=1).sum(-1)  # (gw, gw): summed over r
        for dx in range(-(gw - 1), gw):
            dys.append(dy)
            dxs.append(dx)
            totals.append(np.trace(cols, offset=dx))
            pairs.append((gh - abs(dy)) * (gw - abs(dx)))
    squared = np.asarray(dys) ** 2 + np.asarray(dxs) ** 2  # exact integers: group without float noise
    keys, inverse = np.unique(squared, return_inverse=True)
    sums = np.bincount(inverse, weights=np.asarray(totals))
    counts = np.bincount(inverse, weights=np.asarray(pairs, dtype=np.float64))
    distances = np.sqrt(keys) * unit
    if bin_width is None:
        return distances, sums / counts
    bins = np.where(distances == 0, 0, np.floor(distances / bin_width).astype(np.int64) + 1)
    _, which = np.unique(bins, return_inverse=True)
    pair_counts = np.bincount(which, weights=counts)
    centres = np.bincount(which, weights=distances * counts) / pair_counts
    return centres, np.bincount(which, weights=sums) / pair_counts
