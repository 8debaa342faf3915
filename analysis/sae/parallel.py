"""Data-parallel SAE training: which images of each batch a rank reads, and how its sums meet the
other ranks' (``torch.distributed.all_reduce`` under ``torchrun``; a no-op alone).

Each training step reads one batch of ``batch_size`` images of the shared image list; rank ``r`` of
``W`` reads the batch's images ``r, r + W, ...`` only. The loss is a mean over every token of the
batch on every rank, ``L = Σ_ranks Σ_tokens ℓ_t / N`` with ``N = Σ_ranks n_rank``, so each rank
backpropagates ``Σ_its tokens ℓ_t / N`` and the gradients are summed over the ranks: every rank then
takes the same Adam step on the same gradient as one process reading the whole batch (up to the
order of floating-point sums). The dead-feature counters use the ranks' union of firing features.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["DataParallel", "SINGLE_PROCESS"]


def _identity(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.clone()


@dataclass(frozen=True)
class DataParallel:
    """This process's place among the ranks.

    Attributes
    ----------
    rank : int, default 0
        This process's rank, ``0 ≤ rank < world``.
    world : int, default 1
        How many ranks train together.
    sum : Callable[[torch.Tensor], torch.Tensor]
        ``tensor → tensor`` summed over the ranks (a new tensor, on any device); by default a clone
        (one process alone).
    """

    rank: int = 0
    world: int = 1
    sum: Callable[[torch.Tensor], torch.Tensor] = _identity

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that writes checkpoints and outputs."""
        return self.rank == 0

    def reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed over the ranks, on ``tensor``'s device and dtype."""
        if self.world == 1:
            return tensor
        return self.sum(tensor.detach()).to(device=tensor.device, dtype=tensor.dtype)

    def mine(self, indices: range) -> range:
        """This rank's share of one batch's image indices: every ``world``-th from ``rank``."""
        return indices[self.rank :: self.world]


#: one process training alone.
SINGLE_PROCESS = DataParallel()
