"""Reading an SAE's input from a ViT: the hook point checked, the chosen tokens picked, images
streamed in batches through :func:`analysis.engine.activations.run_with_cache`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from ..base.errors import AnalysisError
from ..engine.activations import run_with_cache
from ..engine.activations.points import parse_hook_name
from ..model.windowed_support import require_global_attention
from .errors import NoImagesError, SAEConfigError, SAEWidthError, UnknownPointError
from .model import SparseAutoencoder

__all__ = ["RESIDUAL_POINTS", "check_point", "token_indices", "pixel_batches", "read_tokens", "count_images"]

#: the hook points with one ``(B, T, D)`` vector of model width per token (an SAE's usual input).
RESIDUAL_POINTS = ("resid_pre", "ln1.out", "attn.in", "attn.out", "resid_mid", "ln2.out", "mlp.out", "resid_post")


def check_point(vit, point: str) -> str:
    """``point`` as the engine names it, checked to be an SAE input of ``vit``.

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`), a global-attention ViT.
    point : str
        A hook point, ``blocks.{i}.<point>`` with ``<point>`` in :data:`RESIDUAL_POINTS`, or
        ``ln_final.out``.

    Returns
    -------
    str
        The point as the engine names it.

    Raises
    ------
    UnknownPointError
        ``point`` is not one of this model's ``blocks.{i}.<point>`` with ``<point>`` in
        :data:`RESIDUAL_POINTS` (or ``ln_final.out``), or the model is windowed (Swin, SAM).
    """
    spec = vit.spec
    require_global_attention(
        spec,
        lambda _: UnknownPointError(
            "SAEs read (B, T, D) tokens of a global-attention ViT; this model's layers are laid out per "
            "window/stage. Load a plain ViT (e.g. load_vit('demo'))."
        ),
    )
    try:
        layer, hook = parse_hook_name(point, spec.num_layers)
    except AnalysisError as error:
        raise UnknownPointError(f"{error} Give an SAE a point such as 'blocks.0.resid_post'.") from None
    name = "ln_final.out" if hook.suffix == "ln_final.out" else f"blocks.{layer}.{hook.suffix}"
    if hook.suffix not in RESIDUAL_POINTS + ("ln_final.out",) or (
        hook.suffix != "ln_final.out" and not 0 <= layer < spec.num_layers
    ):
        raise UnknownPointError(
            f"{point!r} is not an SAE input of this {spec.num_layers}-block model: use "
            f"'blocks.{{i}}.<point>' with 0 ≤ i < {spec.num_layers} and <point> one of {', '.join(RESIDUAL_POINTS)}, "
            "or 'ln_final.out'."
        )
    return name


def token_indices(spec, tokens: str) -> torch.Tensor:
    """The token positions of ``tokens`` in a ``[prefix..., patches...]`` sequence.

    Parameters
    ----------
    spec : ViTSpec
        The model's spec (``vit.spec``).
    tokens : str
        ``"patches"`` (positions ``prefix .. prefix + gh·gw − 1``), ``"class"`` (the prefix token
        named "class") or ``"all"``.

    Returns
    -------
    torch.Tensor
        ``(T_chosen,)`` int64 positions.

    Raises
    ------
    SAEConfigError
        An unknown ``tokens``, or ``"class"`` for a model without a class token.
    """
    prefix, patches = spec.num_prefix_tokens, spec.num_patches
    if tokens == "patches":
        return torch.arange(prefix, prefix + patches)
    if tokens == "all":
        return torch.arange(prefix + patches)
    if tokens == "class":
        names = spec.token_names
        if "class" not in names:
            raise SAEConfigError("This model has no class token: train the SAE on tokens='patches' or 'all'.")
        return torch.tensor([names.index("class")])
    raise SAEConfigError(f"Unknown token choice {tokens!r}: use 'patches', 'class' or 'all'.")


def count_images(images) -> int:
    """How many images ``images`` holds.

    Parameters
    ----------
    images : sequence of PIL.Image.Image or torch.Tensor
        A sequence of PIL images or an ``(N, 3, H, W)`` tensor.

    Returns
    -------
    int
        ``N``.
    """
    return int(images.shape[0]) if isinstance(images, torch.Tensor) else len(images)


def pixel_batches(vit, images, batch_size: int, *, rank: int = 0, world: int = 1) -> Iterator[torch.Tensor]:
    """Preprocessed batches of ``images``, one held at a time.

    Parameters
    ----------
    vit : LoadedViT
        The model whose ``preprocess`` reads PIL images.
    images : sequence of PIL.Image.Image or torch.Tensor
        PIL images (each through ``vit.preprocess``) or an already preprocessed ``(N, 3, H, W)``
        tensor.
    batch_size : int
        Images per batch (before the split over ranks), at least 1.
    rank : int, default 0
        This process's rank.
    world : int, default 1
        With ``world > 1`` (data-parallel training, :mod:`analysis.sae.parallel`) each batch of
        ``batch_size`` images keeps only this ``rank``'s images ``rank, rank + world, ...``, so the
        ranks' batches together are the one-process batch.

    Yields
    ------
    torch.Tensor
        ``(b, 3, H, W)`` float32 batches; an empty ``(0, 3, H, W)`` batch where this rank has no
        image of a batch.

    Raises
    ------
    NoImagesError
        No images.
    SAEConfigError
        ``batch_size`` below 1.
    """
    total = count_images(images)
    if total == 0:
        raise NoImagesError(
            "No images were given: pass at least one image (a list of PIL images or an (N, 3, H, W) tensor)."
        )
    if int(batch_size) < 1:
        raise SAEConfigError(f"batch_size must be at least 1 (got {batch_size}).")
    for start in range(0, total, int(batch_size)):
        indices = range(start, min(start + int(batch_size), total))[int(rank) :: int(world)]
        if not indices:
            height, width = vit.spec.img_size
            yield torch.empty(0, 3, int(height), int(width))
            continue
        chunk = images_slice(images, indices) if int(world) > 1 else images[start : start + int(batch_size)]
        if isinstance(chunk, torch.Tensor):
            yield chunk.float()
        else:
            yield torch.cat([vit.preprocess(image) for image in chunk])


def check_width(sae: SparseAutoencoder, width: int, point: str) -> None:
    """:class:`SAEWidthError` unless the SAE's ``d_in`` is ``width``."""
    if sae.config.d_in != width:
        raise SAEWidthError(
            f"This SAE reads {sae.config.d_in}-wide activations, but {point!r} of this model is {width} wide: "
            "use an SAE trained on this model and point (see its cfg.json's d_in and hook_name)."
        )


def read_tokens(vit, pixels: torch.Tensor, point: str, tokens: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward pass: the activations at ``point`` of the chosen tokens, and the model's output.

    Parameters
    ----------
    vit : LoadedViT
        The model.
    pixels : torch.Tensor
        ``(B, 3, H, W)`` preprocessed images.
    point : str
        The hook point, as :func:`check_point` returns it.
    tokens : str
        ``"patches"``, ``"class"`` or ``"all"`` (:func:`token_indices`).

    Returns
    -------
    tuple of torch.Tensor
        ``(chosen, logits)``: ``cache[point]`` at the ``tokens`` positions, ``(B, T_chosen, D)``
        float32, and the output ``(B, outputs)``.

    Raises
    ------
    SAEConfigError
        As :func:`token_indices`.
    """
    cache = run_with_cache(vit, pixels, names=[point])
    acts = cache[point]  # (B, T, D)
    return acts[:, token_indices(vit.spec, tokens)].float(), cache.output


def images_slice(images, indices: Sequence[int]):
    """The images at ``indices`` (a tensor's rows or a list's items)."""
    if isinstance(images, torch.Tensor):
        return images[torch.as_tensor(list(indices), dtype=torch.long)]
    return [images[i] for i in indices]
