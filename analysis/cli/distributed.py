"""Runs under ``torchrun``: one process per rank, sums and counts reduced with
``torch.distributed.all_reduce`` (gloo on the CPU, nccl on GPUs), results written by rank 0.
Without torchrun's environment (``WORLD_SIZE`` unset or 1) everything is a no-op and the
command runs as one process."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

__all__ = ["Ranks", "start", "stop"]


@dataclass(frozen=True)
class Ranks:
    """This process's place in the run, and the device it computes on (:func:`start`).

    Attributes
    ----------
    rank : int
        This process's rank, 0 for the main one (the one that writes results).
    world : int
        How many processes run.
    device : torch.device
        Where this process computes.
    distributed : bool
        Whether a process group was joined (``world > 1`` under torchrun); otherwise :meth:`sum` and
        :meth:`gather` are local.
    """

    rank: int
    world: int
    device: torch.device
    distributed: bool

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed over the ranks (a new tensor; float64 stays float64)."""
        if not self.distributed:
            return tensor.clone()
        import torch.distributed as dist

        backend_device = self.device if dist.get_backend() == "nccl" else torch.device("cpu")
        out = tensor.to(backend_device).clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out.cpu()

    def gather(self, value) -> list:
        """Every rank's ``value`` (picklable), in rank order."""
        if not self.distributed:
            return [value]
        import torch.distributed as dist

        out = [None] * self.world
        dist.all_gather_object(out, value)
        return out


def start(device: str | None = None) -> Ranks:
    """Join the process group torchrun set up (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and the
    rendezvous variables), or run alone. Under torchrun the backend is nccl on GPUs, gloo on the CPU,
    and each rank uses GPU ``LOCAL_RANK``.

    Parameters
    ----------
    device : str or None, default None
        ``"cpu"``, ``"cuda"`` or ``None`` (a GPU per rank when there are enough, else the CPU).

    Returns
    -------
    Ranks
        This process's place; ``Ranks(0, 1, device, False)`` when ``WORLD_SIZE`` is unset or 1.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device == "cuda" or (device is None and torch.cuda.is_available() and torch.cuda.device_count() > local)
    where = torch.device("cuda", local) if use_cuda else torch.device("cpu")
    if world <= 1:
        return Ranks(0, 1, torch.device("cuda") if use_cuda else torch.device("cpu"), False)
    import torch.distributed as dist

    if use_cuda:
        torch.cuda.set_device(where)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo", init_method="env://")
    return Ranks(rank, world, where, True)


def stop(ranks: Ranks) -> None:
    """Leave the process group (after a barrier, so no rank leaves while others still reduce); a
    no-op for a run that is not distributed.

    Parameters
    ----------
    ranks : Ranks
        What :func:`start` returned.
    """
    if ranks.distributed:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
