"""Reading one SAE's features on a model: which features fire on a patch, where one feature fires
over an image set (an index built once), which classes a feature's decoder direction pushes, and
what zeroing or scaling a feature inside the forward pass changes.

* :func:`patch_feature_grid`: the features of every patch token, ``(B, gh, gw, d_sae)`` (the SAE
  applied to the patch tokens at its hook point, whatever tokens it was trained on).
* :func:`build_feature_index`: over ``N`` images, each feature's peak per image ``(N, d_sae)`` and
  every nonzero activation (feature, value) of every patch token: top-activating images and the
  activation histogram of a feature without another pass.
* :func:`feature_class_effect`: the decoder row ``d = W_dec[i] / s`` (in the model's units; ``s``
  the SAE's input scale, 1 without normalisation) read through the model's
  readout with the norm's scale frozen, ``Δlogit = W_head · (γ ⊙ (d − mean(d)))`` (the LayerNorm's
  linear part; the "top logits" of a feature in Neuronpedia / TransformerLens's ``W_dec @ W_U``,
  here with the norm's centering and gain). A direction's class effect *if it reached the
  readout unchanged*: later blocks also act on it, which :func:`intervene` measures instead.
* :func:`intervene`: the logits and the per-patch class map (each patch token after the last
  block read by the final norm and the head) with the SAE spliced in and ``scale`` applied
  (:func:`~analysis.sae.splice`, the error term kept), next to the clean ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn as nn

from ..base.progress import Progress, tell
from ..engine.activations import run_with_cache
from .errors import NoClassHeadError, SAEFeatureError
from .model import SparseAutoencoder
from .reading import check_point, check_width, count_images, pixel_batches, read_tokens
from .splice import splice

__all__ = [
    "FeatureIndex",
    "Intervention",
    "patch_feature_grid",
    "build_feature_index",
    "feature_class_effect",
    "intervene",
    "check_feature",
]


def check_feature(sae: SparseAutoencoder, feature: int) -> int:
    """``feature`` as an int, checked to be one of the SAE's.

    Parameters
    ----------
    sae : SparseAutoencoder
        The SAE.
    feature : int
        A feature index.

    Returns
    -------
    int
        ``int(feature)``.

    Raises
    ------
    SAEFeatureError
        ``feature`` outside ``0..d_sae − 1``.
    """
    if not 0 <= int(feature) < sae.config.d_sae:
        raise SAEFeatureError(f"Feature {feature} does not exist: this SAE has features 0..{sae.config.d_sae - 1}.")
    return int(feature)


def patch_feature_grid(vit, sae: SparseAutoencoder, pixels: torch.Tensor) -> torch.Tensor:
    """The SAE's features of each patch token of ``pixels`` (the SAE applied to the patch tokens at
    its hook point, whatever tokens it was trained on).

    Parameters
    ----------
    vit : LoadedViT
        The model the SAE was trained on (:func:`analysis.load_vit`).
    sae : SparseAutoencoder
        The SAE; its ``hook_name`` says where it reads.
    pixels : torch.Tensor
        ``(B, 3, H, W)`` preprocessed images.

    Returns
    -------
    torch.Tensor
        ``(B, gh, gw, d_sae)`` float32 on ``spec.grid_size``.

    Raises
    ------
    UnknownPointError
        The SAE's point is not a ``(B, T, D)`` point of ``vit``.
    SAEWidthError
        The SAE's ``d_in`` is not the model's width.
    """
    point = check_point(vit, sae.config.hook_name)
    check_width(sae, vit.spec.embed_dim, point)
    patches, _ = read_tokens(vit, pixels, point, "patches")  # (B, gh·gw, D)
    gh, gw = vit.spec.grid_size
    with torch.no_grad():
        return sae.encode(patches).float().reshape(patches.shape[0], gh, gw, -1)


@dataclass(frozen=True)
class FeatureIndex:
    """Where each feature fires over an image set (patch tokens).

    Attributes
    ----------
    peaks : torch.Tensor
        ``(N, d_sae)`` float32, each feature's largest activation on each image's patches.
    token_features : torch.Tensor
        ``(nnz,)`` int64, the feature of every nonzero activation of every patch token.
    token_values : torch.Tensor
        ``(nnz,)`` float32, its value.
    tokens : int
        How many patch tokens were read (``N · gh · gw``).
    """

    peaks: torch.Tensor
    token_features: torch.Tensor
    token_values: torch.Tensor
    tokens: int

    @property
    def images(self) -> int:
        return int(self.peaks.shape[0])

    def top_images(self, feature: int, k: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
        """``(indices (k,), peaks (k,))``: the images where ``feature`` peaks highest (ties: the
        earlier image), only those where it fires at all."""
        column = self.peaks[:, int(feature)]  # (N,)
        order = torch.sort(column, descending=True, stable=True).indices[: int(k)]
        order = order[column[order] > 0]
        return order, column[order]

    def activations(self, feature: int) -> torch.Tensor:
        """``(n,)`` the feature's nonzero activations over every patch token (its histogram's data;
        it is 0 on the other ``tokens − n``)."""
        return self.token_values[self.token_features == int(feature)]

    def fire_rate(self) -> torch.Tensor:
        """``(d_sae,)`` each feature's share of patch tokens on which it fires."""
        counts = torch.bincount(self.token_features, minlength=self.peaks.shape[1]).double()
        return (counts / max(1, self.tokens)).float()


def build_feature_index(
    vit, sae: SparseAutoencoder, images, *, batch_size: int = 32, progress: Progress | None = None
) -> FeatureIndex:
    """The :class:`FeatureIndex` of ``images``, streamed in batches.

    Parameters
    ----------
    vit : LoadedViT
        The model the SAE was trained on.
    sae : SparseAutoencoder
        The SAE.
    images : sequence of PIL.Image.Image or torch.Tensor
        PIL images (each through ``vit.preprocess``) or an already preprocessed ``(N, 3, H, W)`` tensor.
    batch_size : int, default 32
        Images per forward pass.
    progress : Progress or None, default None
        Called as ``progress(done, total)`` after each batch (images).

    Returns
    -------
    FeatureIndex
        Each feature's peak per image and every nonzero activation of every patch token.

    Raises
    ------
    NoImagesError
        No images.
    UnknownPointError
        The SAE's point is not a ``(B, T, D)`` point of ``vit``.
    SAEWidthError
        The SAE's ``d_in`` is not the model's width.
    SAEConfigError
        ``batch_size`` below 1.
    """
    peaks, features, values = [], [], []
    tokens = done = 0
    total = count_images(images)
    for pixels in pixel_batches(vit, images, batch_size):
        grid = patch_feature_grid(vit, sae, pixels)  # (b, gh, gw, d_sae)
        flat = grid.reshape(grid.shape[0], -1, grid.shape[-1])  # (b, gh·gw, d_sae)
        peaks.append(flat.amax(dim=1))
        nonzero = flat.reshape(-1, flat.shape[-1]).nonzero(as_tuple=True)  # (token, feature)
        features.append(nonzero[1])
        values.append(flat.reshape(-1, flat.shape[-1])[nonzero])
        tokens += flat.shape[0] * flat.shape[1]
        done += pixels.shape[0]
        tell(progress, done, total)
    return FeatureIndex(torch.cat(peaks), torch.cat(features), torch.cat(values), tokens)


def _readout(vit) -> tuple[list[nn.Module], nn.Linear]:
    """The model's per-token readout after the last block: its norms (``norm``, then ``fc_norm``)
    and its linear head; :class:`NoClassHeadError` when it is not that."""
    model = vit.model
    head = getattr(model, "head", None)
    if not vit.spec.has_classifier or not isinstance(head, nn.Linear):
        raise NoClassHeadError(
            "A feature's classes are read through the model's linear class head, and this model has none "
            f"({vit.spec.head} head): use a classifier such as the demo ViT."
        )
    norms = [m for m in (getattr(model, "norm", None), getattr(model, "fc_norm", None)) if isinstance(m, nn.Module)]
    for norm in norms:
        if not isinstance(norm, (nn.LayerNorm, nn.Identity)):
            raise NoClassHeadError(
                f"The readout's norm is a {type(norm).__name__}; a feature's classes are read through LayerNorms only."
            )
    return norms, head


def feature_class_effect(vit, sae: SparseAutoencoder, feature: int) -> torch.Tensor:
    """``W_head · (γ ⊙ (d − mean(d)))`` for the decoder row ``d = W_dec[feature] / s`` (what one unit
    of the feature adds to the activation, in the model's units), through each
    LayerNorm of the readout in turn (module docstring): the direction's class effect if it reached
    the readout unchanged.

    Parameters
    ----------
    vit : LoadedViT
        A classifier with a linear head after LayerNorms (e.g. the demo ViT).
    sae : SparseAutoencoder
        The SAE.
    feature : int
        The feature, ``0..d_sae − 1``.

    Returns
    -------
    torch.Tensor
        ``(C,)`` float32 on the CPU (computed in float64), the change of each class's logit.

    Raises
    ------
    SAEFeatureError
        No such feature.
    NoClassHeadError
        The model has no linear class head after LayerNorms.
    """
    direction = sae.W_dec[check_feature(sae, feature)].detach().double()  # (D,), the SAE's units
    if sae.config.norm_scaling_factor is not None:  # one unit of the feature adds W_dec[i] / s to x
        direction = direction / float(sae.config.norm_scaling_factor)
    norms, head = _readout(vit)
    for norm in norms:
        if isinstance(norm, nn.LayerNorm):
            direction = direction - direction.mean()
            if norm.weight is not None:
                direction = direction * norm.weight.detach().double().cpu()
    return (head.weight.detach().double().cpu() @ direction).float()  # (C,)


@dataclass(frozen=True)
class Intervention:
    """One image, clean and with features scaled (the SAE spliced in, its error kept).

    Attributes
    ----------
    clean_logits : torch.Tensor
        ``(C,)`` float32, the model's logits.
    steered_logits : torch.Tensor
        ``(C,)`` float32, the logits with the intervention.
    clean_class_map : torch.Tensor
        ``(gh, gw)`` int64, each patch token's top class after the last block, read by the final
        norm and the head.
    steered_class_map : torch.Tensor
        ``(gh, gw)`` int64, the same with the intervention.
    change_map : torch.Tensor
        ``(gh, gw)`` float32, ``‖h'_L − h_L‖`` per patch token: where the intervention changed the
        last block's output.
    """

    clean_logits: torch.Tensor
    steered_logits: torch.Tensor
    clean_class_map: torch.Tensor
    steered_class_map: torch.Tensor
    change_map: torch.Tensor


def intervene(
    vit,
    sae: SparseAutoencoder,
    pixels: torch.Tensor,
    scale: Mapping[int, float] | None = None,
    *,
    clamp: Mapping[int, float] | None = None,
) -> Intervention:
    """The :class:`Intervention` of one image: features scaled or clamped, both through
    :func:`analysis.sae.splice` with the reconstruction error kept: only the features' change
    reaches the rest of the model.

    Parameters
    ----------
    vit : LoadedViT
        A classifier with a linear head after LayerNorms, the model the SAE was trained on.
    sae : SparseAutoencoder
        The SAE.
    pixels : torch.Tensor
        ``(1, 3, H, W)``, one preprocessed image.
    scale : Mapping[int, float] or None, default None
        ``{feature: factor}`` (0 ablates, 2 doubles).
    clamp : Mapping[int, float] or None, default None
        ``{feature: value}``: the feature set to ``value`` at every token the SAE reads, so a feature
        silent on this image can be switched on, which scaling cannot.

    Returns
    -------
    Intervention
        The clean and steered logits and class maps, and the change map.

    Raises
    ------
    SAEFeatureError
        A feature that does not exist, or one both scaled and clamped.
    NoClassHeadError
        The model has no linear class head after LayerNorms.
    UnknownPointError
        The SAE's point is not a ``(B, T, D)`` point of ``vit``.
    SAEWidthError
        The SAE's ``d_in`` is not the model's width.
    """
    scale, clamp = dict(scale or {}), dict(clamp or {})
    for feature in [*scale, *clamp]:
        check_feature(sae, feature)
    norms, head = _readout(vit)
    last = f"blocks.{vit.spec.num_layers - 1}.resid_post"
    spec = vit.spec
    gh, gw = spec.grid_size
    patches = slice(spec.num_prefix_tokens, spec.num_prefix_tokens + spec.num_patches)

    def read(hooks) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cache = run_with_cache(vit, pixels, names=[last], hooks=hooks)
        hidden = cache[last][:, patches]  # (1, gh·gw, D)
        with torch.no_grad():
            x = hidden.to(head.weight.device, head.weight.dtype)
            for norm in norms:
                x = norm(x)
            classes = head(x).argmax(-1).reshape(gh, gw).cpu()  # (gh, gw)
        return cache.output[0].float(), classes, hidden[0].float()

    clean_logits, clean_map, clean_hidden = read({})
    steered_logits, steered_map, steered_hidden = read(splice(vit, sae, scale=scale, clamp=clamp, keep_error=True))
    change = (steered_hidden - clean_hidden).norm(dim=-1).reshape(gh, gw)
    return Intervention(clean_logits, steered_logits, clean_map, steered_map, change)
