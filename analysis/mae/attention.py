"""The MAE encoder's attention over the tokens it is shown, mapped back to image positions.

The encoder of a masked autoencoder sees the class token and the visible patches only, so
its attention is ``(1 + V) × (1 + V)`` per head, not ``T × T``. A
:class:`VisibleAttentionRecord` keeps those maps with the patch index of every visible
token, so each row and column has its place on the image grid: :meth:`~VisibleAttentionRecord.key_grid`
puts a query's attention back on the ``(gh, gw)`` grid (NaN where a patch was hidden: it was
never a key), :meth:`~VisibleAttentionRecord.grid_of` does the same for any per-token value,
:func:`visible_attention_distance` and :func:`visible_rollout` run the project's distance and
rollout rules on the visible set.

The probabilities are read during the model's own forward at the engine's
``blocks.{i}.attn.probs`` points (:func:`analysis.engine.activations.run.hooks_around`) of the encoder
layers that :func:`analysis.model.adapters.hf_vit_mae.encoder_sites` finds, by each layer's attention
adapter (in the one registry): the SDPA call's own ``q``, ``k`` and scale evaluated by the one
softmax rule (:func:`~analysis.model.adapters.probabilities.attention_probabilities`), or the eager
path's own ``softmax`` result. The hooks live for one call, react only to the thread that
registered them, and are removed in ``finally``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn as nn

from ..attention.distance import attention_distance_per_image, patch_centres
from ..attention.rollout_rules import compose_rollout, rollout_step
from ..base.errors import AnalysisError, UnsupportedModelError
from ..engine.activations.run import hooks_around
from ..engine.capture import require_every_layer
from ..model.adapters.hf_vit_mae import encoder_sites
from ..model.geometry import ViTSpec

__all__ = ["VisibleAttentionRecord", "encoder_attention_taps", "visible_attention_distance", "visible_rollout"]


@dataclass(frozen=True)
class VisibleAttentionRecord:
    """Attention of an MAE encoder over the class token and the visible patches.

    Attributes
    ----------
    attentions : torch.Tensor
        ``(L, B, heads, 1 + V, 1 + V)`` float32 softmax probabilities; token 0 is the class token,
        token ``1 + j`` is patch ``visible_patches[b, j]``. Rows sum to one.
    visible_patches : torch.Tensor
        ``(B, V)`` long, the row-major grid index of each visible token, ascending.
    spec : ViTSpec
        The geometry of the full input (grid, patch size, image size, layers, heads).
    layers : tuple of int
        Model layer index of each entry along ``L`` (every encoder layer).
    """

    attentions: torch.Tensor
    visible_patches: torch.Tensor
    spec: ViTSpec
    layers: tuple[int, ...]

    @property
    def num_visible(self) -> int:
        return int(self.visible_patches.shape[1])

    def token_of_patch(self, image: int, patch: int) -> int:
        """The token index (``1 + j``) of grid patch ``patch`` in image ``image``; a typed error
        when that patch was hidden (it is no token of the encoder)."""
        found = (self.visible_patches[image] == patch).nonzero()
        if not len(found):
            raise AnalysisError(
                f"Patch {patch} was hidden from the encoder, so it has no attention: "
                "choose a visible patch as the query (record.visible_patches)."
            )
        return 1 + int(found[0, 0])

    def key_grid(
        self, layer: int, query_patch: int | None = None, *, image: int = 0, head: int | None = None
    ) -> torch.Tensor:
        """``(gh, gw)`` float32: the attention of one query (``query_patch`` a grid index, or
        ``None`` for the class token) over the visible patches, on the image grid; NaN on hidden
        patches. ``head=None`` averages the heads. Attention on the class token is not drawn."""
        position = self.layers.index(layer) if layer in self.layers else None
        if position is None:
            raise AnalysisError(f"Layer {layer} is not in the record (layers {list(self.layers)}).")
        row = 0 if query_patch is None else self.token_of_patch(image, query_patch)
        maps = self.attentions[position, image, :, row, 1:]  # (heads, V)
        return self.grid_of(maps.mean(0) if head is None else maps[head], image=image)

    def grid_of(self, values: torch.Tensor, *, image: int = 0) -> torch.Tensor:
        """``(V,)`` values, one per visible patch token of ``image`` (e.g. a row of
        :func:`visible_rollout` without its class column) -> ``(gh, gw)`` float32 on the image
        grid, NaN on the hidden patches (they have no value: they were never tokens)."""
        if values.shape != (self.num_visible,):
            raise AnalysisError(
                f"grid_of takes one value per visible patch, shape ({self.num_visible},); got {tuple(values.shape)}."
            )
        grid = torch.full((self.spec.num_patches,), float("nan"), dtype=torch.float32)
        grid[self.visible_patches[image].cpu()] = values.detach().float().cpu()
        return grid.reshape(self.spec.grid_size)


def visible_attention_distance(record: VisibleAttentionRecord, *, renormalize: bool = True) -> torch.Tensor:
    """Mean attention distance in input pixels over the visible set:
    :func:`~analysis.attention.distance.attention_distance_per_image` with the visible patches' own
    centre-to-centre distances (each query and key a visible patch; the class token is left
    out as a prefix token is).

    Parameters
    ----------
    record : VisibleAttentionRecord
        The encoder's attention, ``(L, B, heads, 1 + V, 1 + V)``
        (:attr:`~analysis.mae.MAEReconstruction.attention`).
    renormalize : bool, default True
        Divide each query's row over the patch keys by its sum; ``False`` counts attention on
        the class token as distance 0.

    Returns
    -------
    torch.Tensor
        ``(B, L, heads)`` float64, in input pixels.
    """
    centres = patch_centres(record.spec)  # (N, 2)
    out = []
    for image in range(record.visible_patches.shape[0]):
        mine = centres[record.visible_patches[image].cpu()]  # (V, 2)
        distances = torch.cdist(mine, mine)  # (V, V)
        probs = record.attentions[:, image : image + 1, :, 1:, :]  # (L, 1, heads, V, 1 + V)
        out.append(
            torch.stack(
                [attention_distance_per_image(p, record.spec, distances, renormalize=renormalize)[0] for p in probs]
            )
        )  # (L, heads)
    return torch.stack(out)


def visible_rollout(
    record: VisibleAttentionRecord, *, head_fusion: str = "mean", discard_ratio: float = 0.0
) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema 2020) over all layers of the record, on the visible
    tokens: :func:`~analysis.attention.rollout_rules.rollout_step` and
    :func:`~analysis.attention.rollout_rules.compose_rollout`, the rules every rollout here uses.

    Parameters
    ----------
    record : VisibleAttentionRecord
        The encoder's attention, ``(L, B, heads, 1 + V, 1 + V)``.
    head_fusion : str, default "mean"
        How each layer's heads are fused: ``"mean"``, ``"max"`` or ``"min"`` over heads.
    discard_ratio : float, default 0.0
        Fraction in ``[0, 1)`` of each fused matrix's weakest off-diagonal pairs set to 0.

    Returns
    -------
    torch.Tensor
        ``(B, 1 + V, 1 + V)`` float64, token 0 the class token; row ``q`` is query ``q``'s rollout
        over the tokens (:meth:`~VisibleAttentionRecord.grid_of` puts a row's patch columns on the grid).

    Raises
    ------
    AnalysisError
        An unknown ``head_fusion``, or ``discard_ratio`` outside ``[0, 1)``.
    """
    steps = (
        (layer, rollout_step(record.attentions[i], head_fusion, discard_ratio), None)
        for i, layer in enumerate(record.layers)
    )
    result = None
    for _, step_result in compose_rollout(steps):  # the last step's result
        result = step_result
    assert result is not None, "a record holds at least one layer"
    return result


@contextlib.contextmanager
def encoder_attention_taps(
    model: nn.Module, num_heads: int, sink: Callable[[int, torch.Tensor], None]
) -> Iterator[None]:
    """Within the block, every forward of ``model`` by this thread reports each encoder layer's
    attention probabilities ``(B, heads, T, T)`` to ``sink(layer, probs)``: the engine's
    ``blocks.{i}.attn.probs`` over the encoder layers
    (:func:`analysis.engine.activations.run.hooks_around` with
    :func:`analysis.model.adapters.hf_vit_mae.encoder_sites`), read by each layer's attention adapter,
    the path every capture takes.

    Parameters
    ----------
    model : torch.nn.Module
        The MAE model (Hugging Face ``ViTMAEForPreTraining`` or a timm one).
    num_heads : int
        The heads each encoder layer must have (the config's).
    sink : callable
        ``sink(layer, probs)``, called with each encoder layer's index and its ``(B, heads, T, T)``
        probabilities.

    Yields
    ------
    None
        Nothing; the hooks are registered for the ``with`` block and removed on leaving it.

    Raises
    ------
    UnsupportedModelError
        The encoder layers cannot be found, or a layer's head count differs from ``num_heads``.
    """
    sites = encoder_sites(model)
    for site in sites:
        heads = site.adapter.num_heads(site.module)
        if heads != num_heads:
            raise UnsupportedModelError(f"Encoder layer {site.layer} has {heads} heads; the config says {num_heads}.")

    def reporter(layer_index: int):
        return lambda probs: sink(layer_index, probs)

    # encoder sites: each has its block index (only a pooling head's is None)
    hooks = {f"blocks.{site.layer}.attn.probs": reporter(cast(int, site.layer)) for site in sites}
    with hooks_around(model, hooks, sites=sites):
        yield


def collect_visible_attention(num_layers: int) -> tuple[dict[int, torch.Tensor], Callable[[int, torch.Tensor], None]]:
    """``(store, sink)``: a sink for :func:`encoder_attention_taps` that keeps each layer's map."""
    store: dict[int, torch.Tensor] = {}

    def sink(layer: int, probs: torch.Tensor) -> None:
        store[layer] = probs

    return store, sink


def stack_visible_attention(
    store: dict[int, torch.Tensor], visible_patches: torch.Tensor, spec: ViTSpec
) -> VisibleAttentionRecord:
    """The record of one forward, after checking every layer was seen."""
    layers = tuple(range(spec.num_layers))
    require_every_layer(layers, store, "encoder attention")
    return VisibleAttentionRecord(
        attentions=torch.stack([store[layer].cpu() for layer in layers]),
        visible_patches=visible_patches,
        spec=spec,
        layers=layers,
    )
