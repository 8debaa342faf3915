"""Cosine similarity of the learned position embeddings (ViT paper, Figure 7 centre)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import resample_abs_pos_embed

from .errors import AnalysisError

__all__ = ["patch_position_embeddings", "position_embedding_similarity"]


def patch_position_embeddings(vit, *, grid_size: tuple[int, int] | None = None) -> torch.Tensor:
    """The position embeddings of the patch tokens as a grid, ``(gh, gw, D)`` float32.

    Prefix positions (class / distillation tokens) are dropped; models with
    ``no_embed_class`` have none. With ``grid_size``, the patch embeddings are first
    resampled to that grid (bicubic, antialiased, as timm does when fine-tuning at a
    higher resolution).
    """
    model = vit.model
    pos_embed = getattr(model, "pos_embed", None)
    if not isinstance(pos_embed, torch.Tensor):
        raise AnalysisError(
            f"{vit.name} has no learned absolute position embedding (e.g. it uses rotary or "
            "relative positions), so there is no position-embedding grid to show."
        )
    old_grid = tuple(int(g) for g in model.patch_embed.grid_size)
    num_patches = old_grid[0] * old_grid[1]
    embed = pos_embed.detach().float().cpu()  # (1, prefix_in_embed + N, D)
    prefix_in_embed = embed.shape[1] - num_patches
    if prefix_in_embed < 0:
        raise AnalysisError(
            f"pos_embed has {embed.shape[1]} positions, fewer than the {num_patches} patches of a {old_grid} grid."
        )
    patches = embed[:, prefix_in_embed:]  # (1, N, D)
    grid = old_grid
    if grid_size is not None:
        grid = (int(grid_size[0]), int(grid_size[1]))
        if min(grid) < 1:
            raise AnalysisError(f"grid_size must be positive, got {grid_size}.")
        patches = resample_abs_pos_embed(patches, new_size=list(grid), old_size=list(old_grid), num_prefix_tokens=0)
    return patches.reshape(grid[0], grid[1], -1)


def position_embedding_similarity(vit, *, grid_size: tuple[int, int] | None = None) -> torch.Tensor:
    """Cosine similarity between the position embeddings of every pair of patches.

        S[i, j, k, l] = ⟨e_ij, e_kl⟩ / (‖e_ij‖·‖e_kl‖)

    with ``e_ij`` the embedding of the patch in row i, column j. Tile ``S[i, j]`` is the
    figure's small image for patch (i, j).

    Returns:
        ``(gh, gw, gh, gw)`` float32.
    """
    grid_embed = patch_position_embeddings(vit, grid_size=grid_size)  # (gh, gw, D)
    gh, gw, _ = grid_embed.shape
    unit = F.normalize(grid_embed.reshape(gh * gw, -1).double(), dim=-1)  # (N, D)
    return (unit @ unit.T).reshape(gh, gw, gh, gw).float()
