"""The activations of one forward pass, by hook-point name (see :mod:`.points`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from ..spec import ViTSpec
from .points import parse_hook_name

__all__ = ["ActivationCache"]


class ActivationCache(Mapping):
    """A read-only mapping ``name → tensor`` of one forward pass, in the order the names were
    asked for, with the model's :class:`~analysis.spec.ViTSpec` of this input and its logits.

        >>> cache = run_with_cache(vit, pixels, names=["blocks.0.attn.probs", "blocks.0.resid_post"])
        >>> cache["blocks.0.attn.probs"].shape          # (B, heads, T, T)
        >>> prefix, patches = cache.prefix("blocks.0.resid_post"), cache.patches("blocks.0.resid_post")

    Attributes:
        spec: the token layout of this input.
        logits: ``(B, outputs)`` float32, the model's output for the same pass.
    """

    def __init__(self, activations: dict[str, torch.Tensor], spec: ViTSpec, logits: torch.Tensor) -> None:
        self._activations = dict(activations)
        self.spec = spec
        self.logits = logits

    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self._activations[name]
        except KeyError:
            kept = ", ".join(self._activations) or "nothing"
            raise KeyError(f"{name!r} was not cached (this cache holds: {kept}); pass it in names=.") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._activations)

    def __len__(self) -> int:
        return len(self._activations)

    def _token_axis(self, name: str, axis: int | None) -> int:
        _, point = parse_hook_name(name, self.spec.num_layers)
        if axis is None:
            return point.token_axes[0]
        return axis % self[name].ndim

    def prefix(self, name: str, axis: int | None = None) -> torch.Tensor:
        """The prefix tokens (class, distillation, registers) of ``name`` along its token axis
        (``axis=None``: the first one, e.g. the query axis of ``attn.probs``). A view."""
        return self.spec.split_prefix(self[name], self._token_axis(name, axis))[0]

    def patches(self, name: str, axis: int | None = None) -> torch.Tensor:
        """The ``gh·gw`` patch tokens (row-major) of ``name`` along its token axis. A view."""
        return self.spec.split_prefix(self[name], self._token_axis(name, axis))[1]

    def __repr__(self) -> str:
        shapes = ", ".join(f"{name}: {tuple(t.shape)}" for name, t in self._activations.items())
        return f"ActivationCache({shapes})"
