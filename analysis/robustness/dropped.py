"""Attention of a ViT whose patch tokens were dropped (:func:`token_drop`): the shorter
sequence's attention, read by the same adapters as :func:`~analysis.capture_attention`, and
its rollout placed back on the full patch grid (dropped patches: NaN)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..attention.distance import attention_distance_per_image, patch_distance_matrix
from ..attention.rollout_rules import rollout_step
from ..engine.activations.run import visit_forward
from ..engine.capture import require_every_layer
from ..model.geometry import ViTSpec, input_spec
from .perturbations import check_token_drop, token_drop

__all__ = ["DroppedTokenPass", "token_drop_attention", "kept_rollout", "kept_attention_distance"]


@dataclass(frozen=True)
class DroppedTokenPass:
    """One forward pass with tokens dropped.

    Attributes
    ----------
    logits : torch.Tensor
        ``(B, classes)`` float32 on the CPU.
    attentions : torch.Tensor
        ``(L, B, heads, T', T')`` float32 on the CPU, every layer's attention over the kept tokens.
    kept : torch.Tensor
        ``(T',)`` int64 indices into the full sequence: the prefix tokens, then the kept patches in order.
    spec : ViTSpec
        The spec of the input (full sequence, before the drop).
    """

    logits: torch.Tensor
    attentions: torch.Tensor
    kept: torch.Tensor
    spec: ViTSpec


def token_drop_attention(vit, pixels: torch.Tensor, indices) -> DroppedTokenPass:
    """Logits and every layer's attention of ``vit`` on ``pixels`` ``(B, 3, H, W)`` with the
    patch tokens ``indices`` removed after the position embedding (this thread, one call).
    Refused, with the reason, where token drop is not defined (:func:`check_token_drop`:
    CNNs, windowed models, positions that are not a learned absolute table).

    Parameters
    ----------
    vit : LoadedViT
        A ViT from :func:`load_vit` with a learned absolute position embedding.
    pixels : torch.Tensor
        ``(B, 3, H, W)`` preprocessed input.
    indices : array-like of int
        Row-major patch indices to drop (e.g. :func:`patch_drop_indices`'s).

    Returns
    -------
    DroppedTokenPass
        Float32 logits and every layer's attention over the ``T'`` kept tokens.

    Raises
    ------
    AnalysisError
        As :func:`check_token_drop`; ``pixels`` does not fit the model; a layer's attention was
        never computed during the forward.
    """
    check_token_drop(vit)
    spec = input_spec(vit, pixels)
    dropped = torch.as_tensor(indices, dtype=torch.long).reshape(-1)
    keep = torch.ones(spec.num_tokens, dtype=torch.bool)
    keep[spec.num_prefix_tokens + dropped] = False
    maps: dict[int, torch.Tensor] = {}

    def keep_map(layer: int, probs: torch.Tensor) -> None:  # (B, heads, T', T')
        maps[layer] = probs.detach().float().cpu()

    hooks = {
        f"blocks.{layer}.attn.probs": (lambda probs, layer=layer: keep_map(layer, probs))
        for layer in range(spec.num_layers)
    }
    with token_drop(vit, dropped):
        logits = (
            visit_forward(vit.model, vit.device, pixels, spec, hooks, precision="float32").float().cpu()
        )  # as the clean reference
    require_every_layer(range(spec.num_layers), maps)
    attentions = torch.stack([maps[layer] for layer in range(spec.num_layers)])
    return DroppedTokenPass(logits=logits, attentions=attentions, kept=torch.nonzero(keep).flatten(), spec=spec)


def kept_rollout(passed: DroppedTokenPass, *, head_fusion: str = "mean", discard_ratio: float = 0.0) -> torch.Tensor:
    """Rollout ``R = Â_L ⋯ Â_1`` (:func:`~analysis.attention.rollout_rules.rollout_step`) of the shorter
    sequence; the class token's row (without one: the mean over kept patch queries) over the
    kept patches, scattered onto the ``(B, gh, gw)`` grid, NaN where a patch was dropped.
    With nothing dropped it equals :func:`~analysis.attention_rollout`.

    Parameters
    ----------
    passed : DroppedTokenPass
        A pass of :func:`token_drop_attention`, attentions ``(L, B, heads, T', T')``.
    head_fusion : str, default "mean"
        How each layer's heads are fused: ``"mean"``, ``"max"`` or ``"min"`` over heads.
    discard_ratio : float, default 0.0
        Fraction in ``[0, 1)`` of each fused matrix's weakest pairs set to 0 before the identity
        is mixed in.

    Returns
    -------
    torch.Tensor
        ``(B, gh, gw)`` float32 on ``spec.grid_size``, NaN at the dropped patches.

    Raises
    ------
    AnalysisError
        An unknown ``head_fusion``; ``discard_ratio`` outside ``[0, 1)``.
    """
    spec = passed.spec
    rollout = None
    for attention in passed.attentions:  # (B, heads, T', T')
        mixed = rollout_step(attention, head_fusion, discard_ratio)
        rollout = mixed if rollout is None else mixed @ rollout
    assert rollout is not None, "a pass records every layer: one at least"
    patch_rows = spec.split_prefix(passed.kept, 0, dropped=True)[1] - spec.num_prefix_tokens  # (N',) patch indices
    to_patches = spec.split_prefix(rollout, 2, dropped=True)[1]  # (B, T', N')
    if spec.has_class_token:
        row = to_patches[:, 0]
    else:
        row = spec.split_prefix(to_patches, 1, dropped=True)[1].mean(dim=1)
    grid = torch.full((rollout.shape[0], spec.num_patches), float("nan"), dtype=torch.float64)
    grid[:, patch_rows] = row
    return grid.reshape(-1, *spec.grid_size).float()


def kept_attention_distance(passed: DroppedTokenPass) -> torch.Tensor:
    """Mean attention distance (input pixels) of the shorter sequence, ``(L, heads)`` float64:
    for each kept patch query, ``Σ_k w_qk·‖c_q − c_k‖`` over the kept patch keys (``w``
    renormalised over them), averaged over kept queries and images. Patches keep their
    original centres. With nothing dropped it equals :func:`~analysis.mean_attention_distance`.

    Parameters
    ----------
    passed : DroppedTokenPass
        A pass of :func:`token_drop_attention`, attentions ``(L, B, heads, T', T')``.

    Returns
    -------
    torch.Tensor
        ``(L, heads)`` float64, in input pixels.
    """
    spec = passed.spec
    patches = spec.split_prefix(passed.kept, 0, dropped=True)[1] - spec.num_prefix_tokens  # (N',)
    distances = patch_distance_matrix(spec)[patches][:, patches]  # (N', N')
    return torch.stack(
        [
            attention_distance_per_image(spec.split_prefix(attention, 2, dropped=True)[1], spec, distances).mean(
                0
            )  # (heads,)
            for attention in passed.attentions  # (B, heads, T', T')
        ]
    ).double()
