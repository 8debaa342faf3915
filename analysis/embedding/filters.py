"""Principal components of the patch-embedding filters (ViT paper, Figure 7 left)."""

from __future__ import annotations

import torch
import torch.nn as nn

from ..base.arguments import check_int
from ..base.errors import AnalysisError
from ..model.geometry import patch_embedding_module

__all__ = ["patch_embedding_filters", "patch_embedding_components"]


def patch_embedding_filters(vit) -> torch.Tensor:
    """The linear patch projection as ``(D, C, ph, pw)`` float32 filters.

    A convolution stem (``PatchEmbed.proj``) gives its weight as is; NaFlex's ``Linear`` over
    flattened patches is unflattened in its own patch layout (``(ph, pw, C)`` when
    ``channels_last``, else ``(C, ph, pw)``).

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`~analysis.load_vit`), whose patch embedding is one linear projection of the
        pixels.

    Returns
    -------
    torch.Tensor
        ``(D, C, ph, pw)`` float32 on the CPU, detached: one filter per embedding dimension ``D``,
        over the ``C`` input channels of a ``ph × pw`` patch.

    Raises
    ------
    AnalysisError
        For a hybrid ViT (a CNN stem before a 1x1 projection) or a patch embedding that is not a single
        convolution (or NaFlex ``Linear``) over pixels.
    """
    patch_embed = patch_embedding_module(vit.model)
    if getattr(patch_embed, "backbone", None) is not None:
        raise AnalysisError(
            f"{vit.name} is a hybrid ViT: its patch embedding is a CNN stem followed by a 1x1 "
            "projection of CNN features, not a linear projection of RGB pixels, so its filters "
            "cannot be shown as image patches."
        )
    proj = getattr(patch_embed, "proj", None)
    if isinstance(proj, nn.Linear) and getattr(patch_embed, "is_linear", False):
        ph, pw = (int(v) for v in getattr(patch_embed, "patch_size"))
        channels = proj.in_features // (ph * pw)
        weight = proj.weight.detach().float().cpu()  # (D, ph·pw·C) or (D, C·ph·pw)
        if getattr(patch_embed, "channels_last", True):
            return weight.reshape(-1, ph, pw, channels).permute(0, 3, 1, 2).contiguous()
        return weight.reshape(-1, channels, ph, pw)
    if not isinstance(proj, nn.Conv2d):
        raise AnalysisError(f"{vit.name}: the patch embedding is not a single convolution over pixels.")
    return proj.weight.detach().float().cpu()


def patch_embedding_components(vit, n_components: int = 28) -> tuple[torch.Tensor, torch.Tensor]:
    """PCA over the D filters of the patch-embedding projection.

    With ``X`` the ``(D, C·ph·pw)`` matrix of flattened filters (:func:`patch_embedding_filters`)
    and ``Xc = X − mean_rows(X)``, the SVD ``Xc = U S Vᵀ`` gives the principal directions (rows of
    ``Vᵀ``) and the explained variance ratio ``S² / ΣS²``. Each component's sign is fixed so its
    largest-magnitude entry is positive (PCA signs are arbitrary).

    Parameters
    ----------
    vit : LoadedViT
        The model, as :func:`patch_embedding_filters` takes it.
    n_components : int, default 28
        How many leading components to return (at least 1; fewer when the filters span fewer).

    Returns
    -------
    tuple of (torch.Tensor, torch.Tensor)
        ``components (k, C, ph, pw)`` (unit-norm directions, each reshaped as a filter) and
        ``explained_variance_ratio (k,)`` (each component's share of the total variance over all
        components, largest first), float32 on the CPU, with ``k = min(n_components, D, C·ph·pw)``.

    Raises
    ------
    AnalysisError
        If ``n_components`` is not an integer of at least 1, or for a patch embedding that
        :func:`patch_embedding_filters` refuses.
    """
    n_components = check_int("n_components", n_components, minimum=1)
    filters = patch_embedding_filters(vit)  # (D, C, ph, pw)
    count, channels, ph, pw = filters.shape
    flat = filters.reshape(count, -1).double()  # (D, C·ph·pw)
    centred = flat - flat.mean(dim=0, keepdim=True)
    _, singular, vh = torch.linalg.svd(centred, full_matrices=False)  # vh (r, C·ph·pw)
    variance = singular**2
    ratio = variance / variance.sum().clamp_min(torch.finfo(torch.float64).tiny)
    k = min(n_components, vh.shape[0])
    components = vh[:k]
    largest = components.gather(1, components.abs().argmax(dim=1, keepdim=True))  # (k, 1)
    components = components * torch.where(largest < 0, -1.0, 1.0).to(components)
    return components.reshape(k, channels, ph, pw).float(), ratio[:k].float()
