"""The SAE inside the model: hooks that put its reconstruction in place of an activation
(optionally with features zeroed or scaled), and the features of images.

``splice(vit, sae)`` gives ``{point: hook}`` for :func:`analysis.engine.activations.run_with_hooks`. At the
SAE's chosen tokens the hook replaces ``x`` by

    x̂' = decode(f')                       keep_error=False
    x  + (x̂' − x̂)                         keep_error=True   (= x̂' + (x − x̂), "the error term kept")

with ``f = encode(x)``, ``x̂ = decode(f)`` (both in the model's units: an SAE with input
normalisation reads ``s·x`` and writes back ``(f W_dec + b_dec) / s``, :mod:`analysis.sae.model`)
and ``f'`` equal to ``f`` except ``f'_i = scale[i] · f_i``
for each ``{i: scale[i]}`` (0 ablates a feature, > 1 steers towards it) and ``f'_i = clamp[i]`` for
each ``{i: clamp[i]}`` at every chosen token: clamping switches on a feature that does not fire on
an image, which scaling cannot (Templeton et al. 2024, "Scaling Monosemanticity", clamp features
to a value to steer). The second form is the
error-preserving splice of Marks et al. 2024 ("Sparse Feature Circuits") written so that with no
intervention ``x̂' − x̂`` is exactly 0 and the clean logits come back bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ..engine.activations import Hook
from .errors import SAEFeatureError
from .model import SparseAutoencoder
from .reading import check_point, check_width, count_images, images_slice, pixel_batches, read_tokens, token_indices

__all__ = ["splice", "feature_activations", "top_activating", "TopActivating"]


def splice(
    vit,
    sae: SparseAutoencoder,
    *,
    scale: Mapping[int, float] | None = None,
    clamp: Mapping[int, float] | None = None,
    keep_error: bool = False,
) -> dict[str, Hook]:
    """``{sae.config.hook_name: hook}`` that splices the SAE in (module docstring).

    Parameters
    ----------
    vit : LoadedViT
        The model the SAE was trained on.
    sae : SparseAutoencoder
        The SAE; its ``hook_name`` and ``tokens`` say where it reads and writes.
    scale : Mapping[int, float] or None, default None
        ``{feature: factor}``: ``f'_i = factor · f_i`` (0 ablates).
    clamp : Mapping[int, float] or None, default None
        ``{feature: value}``: ``f'_i = value`` at every chosen token, whether or not it fired.
    keep_error : bool, default False
        Keep the SAE's reconstruction error (``x + decode(f') − decode(f)``), Marks et al. 2024.

    Returns
    -------
    dict of str to Hook
        ``{point: hook}`` for :func:`analysis.engine.activations.run_with_hooks`; the hook maps the
        ``(B, T, D)`` activation to a new one of the same shape and dtype.

    Raises
    ------
    UnknownPointError
        The SAE's hook point is not a ``(B, T, D)`` point of ``vit``.
    SAEWidthError
        The SAE's ``d_in`` is not the model's width.
    SAEFeatureError
        A feature of ``scale`` or ``clamp`` outside ``0..d_sae − 1``, or one in both.
    SAEConfigError
        ``tokens="class"`` on a model without a class token.
    """
    point = check_point(vit, sae.config.hook_name)
    check_width(sae, vit.spec.embed_dim, point)
    chosen = token_indices(vit.spec, sae.config.tokens)  # (T_chosen,)
    factors, values = dict(scale or {}), dict(clamp or {})
    for feature in [*factors, *values]:
        if not 0 <= int(feature) < sae.config.d_sae:
            raise SAEFeatureError(f"Feature {feature} does not exist: this SAE has features 0..{sae.config.d_sae - 1}.")
    both = sorted(int(feature) for feature in set(map(int, factors)) & set(map(int, values)))
    if both:
        raise SAEFeatureError(
            f"Features {both} are both scaled and clamped: give each feature one of scale= or clamp=."
        )

    def hook(activation: torch.Tensor) -> torch.Tensor:  # (B, T, D)
        x = activation[:, chosen].to(sae.W_enc.device)  # (B, T_chosen, D), where the SAE is (a model on a GPU)
        with torch.no_grad():
            f = sae.encode(x)  # (B, T_chosen, d_sae)
            steered = f.clone()
            for feature, factor in factors.items():
                steered[..., int(feature)] = steered[..., int(feature)] * float(factor)
            for feature, value in values.items():
                steered[..., int(feature)] = float(value)
            if keep_error:
                new = x + (sae.decode(steered) - sae.decode(f)).to(x.dtype)
            else:
                new = sae.decode(steered).to(x.dtype)
        out = activation.clone()
        out[:, chosen] = new.to(activation.device)
        return out

    return {point: hook}


def feature_activations(vit, pixels: torch.Tensor, sae: SparseAutoencoder) -> torch.Tensor:
    """The SAE's features on ``pixels`` at its hook point and tokens.

    Parameters
    ----------
    vit : LoadedViT
        The model the SAE was trained on.
    pixels : torch.Tensor
        ``(B, 3, H, W)`` preprocessed images.
    sae : SparseAutoencoder
        The SAE; its ``hook_name`` and ``tokens`` say where it reads.

    Returns
    -------
    torch.Tensor
        ``(B, T_chosen, d_sae)`` float32, ``T_chosen`` the SAE's tokens (``gh·gw`` for
        ``"patches"``).

    Raises
    ------
    UnknownPointError
        The SAE's hook point is not a ``(B, T, D)`` point of ``vit``.
    SAEWidthError
        The SAE's ``d_in`` is not the model's width.
    SAEConfigError
        ``tokens="class"`` on a model without a class token.
    """
    point = check_point(vit, sae.config.hook_name)
    chosen, _ = read_tokens(vit, pixels, point, sae.config.tokens)  # (B, T_chosen, D)
    check_width(sae, chosen.shape[-1], point)
    with torch.no_grad():
        return sae.encode(chosen).float()


@dataclass(frozen=True)
class TopActivating:
    """The images on which one feature fires most.

    Attributes
    ----------
    feature : int
        The feature.
    indices : torch.Tensor
        ``(k,)`` int64, the images' positions in the image set, highest first.
    values : torch.Tensor
        ``(k,)`` float32, each image's largest activation of the feature over the SAE's tokens.
    maps : torch.Tensor
        ``(k, gh, gw)`` float32, the feature's activation on each patch token (the SAE applied to the
        patch tokens, whatever tokens it was trained on), on the model's patch grid.
    """

    feature: int
    indices: torch.Tensor
    values: torch.Tensor
    maps: torch.Tensor


def top_activating(
    vit, sae: SparseAutoencoder, images, feature: int, k: int = 8, *, batch_size: int = 16
) -> TopActivating:
    """The ``k`` images of ``images`` with the highest maximum activation of ``feature``
    (streamed in batches; ties keep the earlier image), with their per-patch maps.

    Parameters
    ----------
    vit : LoadedViT
        The model the SAE was trained on.
    sae : SparseAutoencoder
        The SAE.
    images : sequence of PIL.Image.Image or torch.Tensor
        PIL images (each through ``vit.preprocess``) or an already preprocessed ``(N, 3, H, W)`` tensor.
    feature : int
        The feature, ``0..d_sae − 1``.
    k : int, default 8
        How many images; fewer when ``images`` holds fewer.
    batch_size : int, default 16
        Images per forward pass.

    Returns
    -------
    TopActivating
        The images' indices, peak values and ``(k, gh, gw)`` maps, highest first (images where the
        feature does not fire included when fewer than ``k`` fire).

    Raises
    ------
    SAEFeatureError
        No such feature.
    NoImagesError
        No images.
    UnknownPointError
        The SAE's hook point is not a ``(B, T, D)`` point of ``vit``.
    SAEWidthError
        The SAE's ``d_in`` is not the model's width.
    SAEConfigError
        ``batch_size`` below 1; ``tokens="class"`` on a model without a class token.
    """
    if not 0 <= int(feature) < sae.config.d_sae:
        raise SAEFeatureError(f"Feature {feature} does not exist: this SAE has features 0..{sae.config.d_sae - 1}.")
    point = check_point(vit, sae.config.hook_name)
    check_width(sae, vit.spec.embed_dim, point)
    peaks = []
    for pixels in pixel_batches(vit, images, batch_size):
        features = feature_activations(vit, pixels, sae)  # (b, T_chosen, d_sae)
        peaks.append(features[..., int(feature)].amax(dim=1))  # (b,)
    peak = torch.cat(peaks)  # (N,)
    count = min(int(k), count_images(images))
    order = torch.sort(peak, descending=True, stable=True).indices[:count]  # (k,)
    gh, gw = vit.spec.grid_size
    maps = []
    for pixels in pixel_batches(vit, images_slice(images, order.tolist()), batch_size):
        patches, _ = read_tokens(vit, pixels, point, "patches")  # (b, gh·gw, D)
        with torch.no_grad():
            maps.append(sae.encode(patches)[..., int(feature)].float().reshape(-1, gh, gw))
    return TopActivating(feature=int(feature), indices=order, values=peak[order], maps=torch.cat(maps))
