"""Where one forward pass puts the activations it keeps (the storage behind an
:class:`~analysis.engine.activations.cache.ActivationCache`).

Two layouts:

* one tensor per name (``run_with_cache``'s default);
* stacked (``stack=True``): every kept name of one point kind (``attn.probs``, ``resid_post``,
  …) is a slice of one ``(L, …)`` buffer, in the order the names were asked. This is what
  :func:`analysis.capture_attention` reads as its ``(L, B, heads, Q, T)`` record, with no copy:
  a float32 value computed on the storage device goes straight into its slice
  (:meth:`ActivationStore.destination`).

A kept value is never the model's own tensor: what the model continues with is copied (or
converted); a value computed into a :meth:`~ActivationStore.destination` is kept as it is.
"""

from __future__ import annotations

import torch

from ...base.errors import AnalysisError
from .points import parse_hook_name

__all__ = ["ActivationStore"]


def same_device(a: torch.device, b: torch.device) -> bool:
    """``cuda`` and ``cuda:0`` are the same device (an index left out means the current one)."""
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same elements of the same memory (a hook may return another view of a buffer,
    e.g. ``p[:, :, :1].expand_as(p)``: same start and shape, other contents)."""
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype


class ActivationStore:
    """The kept activations of one forward pass.

    Parameters
    ----------
    kept : list of str
        The names to keep (canonical hook-point names), in the order asked.
    num_layers : int
        The model's block count (to parse the names).
    dtype : torch.dtype
        Storage dtype of floating activations (others keep their own).
    device : torch.device
        Where they are kept.
    stack : bool, default False
        One ``(L, …)`` buffer per point kind of the ``blocks.*`` names (see the module docstring).
    pin : bool, default False
        Stage CPU buffers in pinned memory (a CUDA forward keeping its values on the CPU);
        the caller synchronises before reading them.
    track : bool, default False
        Also hold each kept name's live tensor, in the autograd graph (``live``), for
        gradient mode's ``torch.autograd.grad``.

    Raises
    ------
    AnalysisError
        With ``stack=True``, a kept name that is not a hook point.
    """

    def __init__(
        self,
        kept: list[str],
        num_layers: int,
        dtype: torch.dtype,
        device: torch.device,
        *,
        stack: bool = False,
        pin: bool = False,
        track: bool = False,
    ) -> None:
        self.kept = list(kept)
        self.track = track
        self.live: dict[str, torch.Tensor] = {}
        self.dtype, self.device, self.pin = dtype, device, pin
        self.values: dict[str, torch.Tensor] = {}
        self.stacks: dict[str, torch.Tensor] = {}
        self._slot_of: dict[str, tuple[str, int]] = {}  # name -> (point kind, position in its stack)
        self._stack_length: dict[str, int] = {}
        self._handed: dict[str, torch.Tensor] = {}  # destinations given out, by name
        if stack:
            for name in self.kept:
                if not name.startswith("blocks."):
                    continue
                _, point = parse_hook_name(name, num_layers)
                position = self._stack_length.get(point.suffix, 0)
                self._slot_of[name] = (point.suffix, position)
                self._stack_length[point.suffix] = position + 1

    def __contains__(self, name: str) -> bool:
        return name in self.values

    def destination(self, name: str, shape: tuple[int, ...], device: torch.device) -> torch.Tensor | None:
        """A float32 tensor of ``shape`` on ``device`` to compute ``name``'s value into, so that
        keeping it copies nothing; ``None`` when the value would have to be converted or moved
        anyway (another dtype or device) or ``name`` is not kept."""
        if name not in self.kept or self.dtype != torch.float32 or not same_device(device, self.device):
            return None
        if name in self._slot_of:
            target = self._slot(name, shape)
        else:
            target = torch.empty(shape, dtype=torch.float32, device=device)
        self._handed[name] = target
        return target

    def keep(self, name: str, value: torch.Tensor) -> None:
        """Keep ``value`` (what the forward pass continues with at ``name``)."""
        if self.track:
            self.live[name] = value
        handed = self._handed.pop(name, None)
        value = value.detach()
        if handed is not None and _same_view(value, handed):  # computed in place: nothing to copy
            self.values[name] = handed
            return
        if name in self._slot_of:
            slot = self._slot(name, tuple(value.shape))
            slot.copy_(value, non_blocking=self.pin)
            self.values[name] = slot
            return
        dtype = self.dtype if value.is_floating_point() else value.dtype
        kept = value.to(device=self.device, dtype=dtype)
        self.values[name] = kept.clone() if kept.data_ptr() == value.data_ptr() else kept

    def _slot(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """``name``'s slice of its point kind's ``(L, *shape)`` buffer, allocated on first use."""
        point, position = self._slot_of[name]
        buffer = self.stacks.get(point)
        if buffer is None:
            full = (self._stack_length[point], *shape)
            buffer = torch.empty(full, dtype=self.dtype, device=self.device, pin_memory=self.pin)
            self.stacks[point] = buffer
        if tuple(buffer.shape[1:]) != tuple(shape):
            raise AnalysisError(
                f"{name} has shape {tuple(shape)}, the other layers' {point} {tuple(buffer.shape[1:])}: they cannot be "
                "stacked into one tensor (a hierarchical model's stages differ); read them one layer at a time."
            )
        return buffer[position]
