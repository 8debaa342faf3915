"""Perturbations of "Intriguing Properties of Vision Transformers" (Naseer et al. 2021):
patch drop (as pixels, for any model, or as tokens removed from a ViT's sequence), patch
shuffle, Gaussian noise and blur (those two live in :mod:`analysis.base.image_ops`, shared with the
explanations). Pure functions of the pixels, except :func:`token_drop`, which edits the
engine's ``embed.out`` point of the forwards run inside it (this thread only,
:func:`analysis.engine.activations.run.hooks_around`) and removes its hook afterwards.
"""

from __future__ import annotations

import contextlib
import numbers
from collections.abc import Iterator

import numpy as np
import torch

from ..base.arguments import check_int
from ..base.errors import AnalysisError
from ..base.image_ops import patch_grid, patch_pixel_mask
from ..engine.activations.run import hooks_around
from ..model.geometry import ViTSpec
from ..model.windowed_support import require_global_attention

__all__ = [
    "DROP_SELECTIONS",
    "patch_drop_indices",
    "drop_pixels",
    "token_drop",
    "check_token_drop",
    "shuffle_grids",
    "shuffle_patches",
]

#: ``random`` (seeded), ``most_salient`` / ``least_salient`` (by a saliency map: any
#: ``explain`` method or rollout), ``foreground`` / ``background`` (of a known object mask; the
#: fraction is then of that region).
DROP_SELECTIONS = ("random", "most_salient", "least_salient", "foreground", "background")


def _check_fraction(fraction) -> float:
    if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real) or not 0.0 <= float(fraction) <= 1.0:
        raise AnalysisError(f"fraction must be in [0, 1], got {fraction!r}.")
    return float(fraction)


def patch_drop_indices(
    spec: ViTSpec, fraction: float, *, selection: str = "random", seed: int = 0, saliency=None, mask=None
) -> torch.Tensor:
    """Row-major indices of the patches to drop: ``round(fraction · n)`` of the ``n``
    candidates (all patches, or the object's / the background's patches), chosen by
    ``selection`` (:data:`DROP_SELECTIONS`). Ties in saliency keep patch order.

    Parameters
    ----------
    spec : ViTSpec
        The model's geometry; its ``grid_size`` ``(gh, gw)`` holds the ``gh·gw`` patches.
    fraction : float
        Fraction in ``[0, 1]`` of the candidates to drop.
    selection : str, default "random"
        One of :data:`DROP_SELECTIONS`: ``"random"`` (seeded), ``"most_salient"`` /
        ``"least_salient"`` (needs ``saliency``), ``"foreground"`` / ``"background"`` (needs
        ``mask``; the fraction is then of that region).
    seed : int, default 0
        Seed of the random choice (``"random"``, ``"foreground"``, ``"background"``).
    saliency : array-like or None, default None
        A saliency map with one value per patch, e.g. ``(gh, gw)`` from ``explain`` or rollout.
    mask : array-like or None, default None
        The object's ``(gh, gw)`` boolean patch mask (any shape with ``gh·gw`` values).

    Returns
    -------
    torch.Tensor
        ``(round(fraction · n),)`` int64 row-major patch indices: sorted ascending for
        ``"random"`` / ``"foreground"`` / ``"background"``, in saliency order (most or least
        salient first) for the saliency selections.

    Raises
    ------
    AnalysisError
        ``fraction`` outside ``[0, 1]``; an unknown ``selection``; a saliency selection without
        ``saliency`` or with a map of the wrong size; a region selection without ``mask`` or
        with a mask of the wrong size.
    """
    fraction = _check_fraction(fraction)
    if selection not in DROP_SELECTIONS:
        raise AnalysisError(f"selection must be one of {', '.join(DROP_SELECTIONS)}, got {selection!r}.")
    n = spec.num_patches
    generator = torch.Generator().manual_seed(int(seed))
    if selection in ("most_salient", "least_salient"):
        if saliency is None:
            raise AnalysisError(f"selection={selection!r} needs a saliency map (e.g. from explain or rollout).")
        values = torch.as_tensor(saliency).detach().double().reshape(-1)
        if values.numel() != n:
            raise AnalysisError(f"The saliency map has {values.numel()} values for {n} patches.")
        order = torch.sort(-values if selection == "most_salient" else values, stable=True).indices
        return order[: int(round(fraction * n))]
    if selection in ("foreground", "background"):
        if mask is None:
            raise AnalysisError(f"selection={selection!r} needs the object's (gh, gw) patch mask.")
        region = torch.as_tensor(np.asarray(mask, dtype=bool)).reshape(-1)
        if region.numel() != n:
            raise AnalysisError(f"The mask has {region.numel()} patches, the model's grid {n}.")
        candidates = torch.nonzero(region if selection == "foreground" else ~region).flatten()
    else:
        candidates = torch.arange(n)
    chosen = candidates[torch.randperm(len(candidates), generator=generator)]
    return torch.sort(chosen[: int(round(fraction * len(candidates)))]).values


def drop_pixels(pixels: torch.Tensor, spec: ViTSpec, indices: torch.Tensor, *, fill: float = 0.0) -> torch.Tensor:
    """``(B, 3, H, W)`` copy with the patches ``indices`` set to ``fill`` (0 in normalised
    space: the dataset mean colour). Works for any model, CNNs included.

    Parameters
    ----------
    pixels : torch.Tensor
        ``(B, 3, H, W)`` normalised model input.
    spec : ViTSpec
        The geometry that defines the patches (``grid_size``, ``patch_size``).
    indices : torch.Tensor
        Row-major patch indices to drop, e.g. :func:`patch_drop_indices`'s.
    fill : float, default 0.0
        The value written into the dropped patches' pixels (all channels).

    Returns
    -------
    torch.Tensor
        ``(B, 3, H, W)``, the dtype and device of ``pixels``; ``pixels`` itself is unchanged.
    """
    dropped = patch_pixel_mask(
        patch_grid([indices], spec.grid_size)[0], spec.patch_size, (pixels.shape[-2], pixels.shape[-1])
    )  # (H, W)
    return pixels.masked_fill(dropped.to(pixels.device), fill)


def check_token_drop(vit):
    """The module after which :func:`token_drop` removes tokens, or a typed error saying why
    this model cannot drop tokens (a CNN; a windowed model; RoPE or relative positions).

    Parameters
    ----------
    vit : LoadedViT
        A model from :func:`load_vit` (anything else is refused).

    Returns
    -------
    torch.nn.Module
        The model's ``patch_drop`` module (timm's ``VisionTransformer``), which runs right after
        the position embedding.

    Raises
    ------
    AnalysisError
        A windowed model (Swin, SAM); an object without ``model`` / ``spec`` or a model without
        ``blocks`` (a CNN); a model without ``patch_drop``, without a learned absolute position
        embedding, or not of the ``VisionTransformer`` family.
    """
    model = getattr(vit, "model", None)
    spec = getattr(vit, "spec", None)
    require_global_attention(
        spec,
        lambda spec: AnalysisError(
            f"Token drop is not defined for a windowed model ({spec.family}): it has no token sequence to remove "
            "tokens from after the position embedding. Its blocks work on the whole stage grid (windows cut "
            "from it, patch merging of 2x2 neighbours), so every cell must stay. Drop pixels instead "
            "(perturbation 'pixel_drop', drop_pixels)."
        ),
    )
    if spec is None or model is None or not hasattr(model, "blocks"):
        raise AnalysisError("Token drop needs a ViT loaded with load_vit; for a CNN drop pixels (drop_pixels).")
    site = getattr(model, "patch_drop", None)
    if site is None or spec.position_embedding != "learned" or spec.family != "VisionTransformer":
        raise AnalysisError(
            f"Token drop needs a learned absolute position embedding added before the blocks; this "
            f"{spec.family} uses {spec.position_embedding} positions. Drop pixels instead (drop_pixels)."
        )
    return site


@contextlib.contextmanager
def token_drop(vit, indices: torch.Tensor) -> Iterator[None]:
    """Within the block, this thread's forward passes of ``vit.model`` drop the patch tokens
    ``indices`` right after the position embedding (the paper's protocol); prefix tokens are
    kept. Needs a ViT with an absolute position embedding added before the blocks (timm's
    ``VisionTransformer``: ViT, DeiT, DINOv2, SigLIP, ...): with RoPE or relative-position
    bias the remaining tokens' positions would be wrong, so those are refused.

    Parameters
    ----------
    vit : LoadedViT
        A ViT from :func:`load_vit` that :func:`check_token_drop` accepts.
    indices : torch.Tensor
        Row-major patch indices to drop (e.g. :func:`patch_drop_indices`'s); none at all leaves
        the forward unchanged.

    Yields
    ------
    None
        Nothing; the drop applies to the forwards run inside the ``with`` block.

    Raises
    ------
    AnalysisError
        As :func:`check_token_drop`; inside the block, a forward whose sequence after the position
        embedding does not have the ``T`` tokens of ``vit.spec``.
    """
    check_token_drop(vit)
    spec = vit.spec
    keep_patches = torch.ones(spec.num_patches, dtype=torch.bool)
    keep_patches[torch.as_tensor(indices, dtype=torch.long)] = False
    keep = torch.cat([torch.ones(spec.num_prefix_tokens, dtype=torch.bool), keep_patches])  # (T,)

    def drop(tokens: torch.Tensor) -> torch.Tensor | None:  # (B, T, D) after the position embedding
        if bool(keep.all()):
            return None  # fraction 0: the very same tensor, logits unchanged
        if tokens.shape[1] != len(keep):
            raise AnalysisError(f"Expected {len(keep)} tokens after the position embedding, got {tokens.shape[1]}.")
        return tokens[:, keep.to(tokens.device)]

    with hooks_around(vit.model, {"embed.out": drop}):
        yield


def shuffle_grids(spec: ViTSpec) -> list[int]:
    """Shuffle grids ``g`` whose ``g x g`` blocks are whole patches: ``g`` divides both sides of the patch grid.

    Parameters
    ----------
    spec : ViTSpec
        The model's geometry (its patch grid ``grid_size``).

    Returns
    -------
    list of int
        Every such ``g``, ascending, from 1.
    """
    gh, gw = spec.grid_size
    return [g for g in range(1, min(gh, gw) + 1) if gh % g == 0 and gw % g == 0]


def shuffle_patches(pixels: torch.Tensor, spec: ViTSpec, grid: int, *, seed: int = 0) -> torch.Tensor:
    """Cut the image into ``grid x grid`` blocks and permute them (seeded; ``grid=1`` returns
    the pixels unchanged). The same permutation for every image of the batch.

    Parameters
    ----------
    pixels : torch.Tensor
        ``(B, C, H, W)`` images.
    spec : ViTSpec
        The geometry whose patch grid the blocks must tile in whole patches.
    grid : int
        Blocks per side; one of :func:`shuffle_grids`'s.
    seed : int, default 0
        Seed of the permutation.

    Returns
    -------
    torch.Tensor
        ``(B, C, H, W)``, a new tensor (a copy for ``grid=1``).

    Raises
    ------
    AnalysisError
        ``grid`` not an integer ``>= 1``, or not one of :func:`shuffle_grids`'s.
    """
    grid = check_int("grid", grid, minimum=1)
    allowed = shuffle_grids(spec)
    if grid not in allowed:
        raise AnalysisError(
            f"A {grid}x{grid} shuffle does not split the {spec.grid_size[0]}x{spec.grid_size[1]} "
            f"patch grid into whole patches; use one of {allowed}."
        )
    if grid == 1:
        return pixels.clone()
    batch, channels, height, width = pixels.shape
    bh, bw = height // grid, width // grid
    blocks = (
        pixels.reshape(batch, channels, grid, bh, grid, bw)
        .permute(0, 2, 4, 1, 3, 5)
        .reshape(batch, grid * grid, channels, bh, bw)
    )
    order = torch.randperm(grid * grid, generator=torch.Generator().manual_seed(int(seed)))
    blocks = blocks[:, order].reshape(batch, grid, grid, channels, bh, bw).permute(0, 3, 1, 4, 2, 5)
    return blocks.reshape(batch, channels, height, width)
