"""The activations of one forward pass, by hook-point name (see :mod:`.points`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from ...base.errors import AnalysisError
from ...model.geometry import ViTSpec
from ...model.windowed_support import require_global_attention
from .points import canonical_name, parse_hook_name

__all__ = ["ActivationCache"]


class ActivationCache(Mapping):
    """A read-only mapping ``name → tensor`` of one forward pass, in the order the names were
    asked for, with the model's :class:`~analysis.model.geometry.ViTSpec` of this input and its logits.

    Names are the table's (:mod:`.points`); TransformerLens aliases look up the same entries.
    In gradient mode (``run_with_cache(..., grad_of=fn)``) :meth:`grad` gives each entry's gradient.
    Built by :func:`~analysis.engine.activations.run.run_with_cache`, not by hand.

    Parameters
    ----------
    activations : dict of str to torch.Tensor
        Canonical hook-point name -> activation of the pass, batch axis first (e.g. ``attn.probs``
        ``(B, heads, T, T)``, ``resid_post`` ``(B, T, D)``); copied into a new dict.
    spec : ViTSpec
        The token layout of this input (kept as ``spec``).
    logits : torch.Tensor or None
        ``(B, outputs)`` float32, the model's output for the same pass (kept as ``logits``); ``None``
        when the pass stopped early (``stop_at_layer``).
    stacks : dict of str to torch.Tensor or None, default None
        Point kind (e.g. ``"attn.probs"``) -> ``(L, B, ...)`` tensor whose slices are that kind's entries,
        returned by :meth:`stack` without a copy; ``None``, no stacked kind.
    grads : dict of str to torch.Tensor or None, default None
        Canonical name -> ``∂y/∂a`` of that entry, same shape (gradient mode, read by :meth:`grad`);
        ``None``, no gradients.
    residual : torch.Tensor or None, default None
        With ``stop_at_layer=n``, the residual stream after block ``n − 1`` ``(B, T, D)`` float32 (kept as
        ``residual``), else ``None``.

    Examples
    --------
    >>> from analysis.engine.activations import run_with_cache
    >>> cache = run_with_cache(vit, pixels, names=["blocks.0.attn.probs", "blocks.0.resid_post"])
    >>> tuple(cache["blocks.0.attn.probs"].shape)  # (B, heads, T, T); the demo ViT
    (1, 4, 65, 65)
    >>> prefix, patches = cache.prefix("blocks.0.resid_post"), cache.patches("blocks.0.resid_post")
    >>> tuple(prefix.shape), tuple(patches.shape)  # (B, P, D), (B, gh·gw, D)
    ((1, 1, 128), (1, 64, 128))
    """

    def __init__(
        self,
        activations: dict[str, torch.Tensor],
        spec: ViTSpec,
        logits: torch.Tensor | None,
        stacks: dict[str, torch.Tensor] | None = None,
        *,
        grads: dict[str, torch.Tensor] | None = None,
        residual: torch.Tensor | None = None,
    ) -> None:
        self._activations = dict(activations)
        self.spec = spec
        self.logits = logits
        self.residual = residual
        self._stacks = dict(stacks or {})  # point kind -> (L, ...) whose slices are the entries
        self._grads = None if grads is None else dict(grads)

    @property
    def output(self) -> torch.Tensor:
        """``logits``, from a pass that ran to the end; an AnalysisError for one that stopped early
        (``stop_at_layer``), which has no output."""
        if self.logits is None:
            raise AnalysisError(
                "This pass stopped early (stop_at_layer): it has no output; read cache.residual, "
                "or run without stop_at_layer."
            )
        return self.logits

    def grad(self, name: str) -> torch.Tensor:
        """``∂y/∂a``: the gradient of gradient mode's scalar ``y = grad_of(output)`` with respect to
        the cached activation ``a = cache[name]`` (same shape, dtype and device; zeros where ``y``
        does not depend on it). TransformerLens keeps it as ``cache[name + "_grad"]``."""
        if self._grads is None:
            raise AnalysisError(
                "This cache holds no gradients: run run_with_cache(..., grad_of=fn) with fn(output) -> "
                "scalar (e.g. lambda logits: logits[:, 3].sum())."
            )
        canonical = canonical_name(name)
        if canonical not in self._grads:
            raise KeyError(
                f"{name!r} was not cached (this cache holds: {', '.join(self._grads) or 'nothing'}); pass it in names=."
            )
        return self._grads[canonical]

    @classmethod
    def concatenate(cls, pieces: list[ActivationCache], device: torch.device) -> ActivationCache:
        """The caches of consecutive pieces of one batch as one cache (batch axis first; a
        stacked point kind is concatenated along its batch axis, 1)."""
        first = pieces[0]
        stacks = {point: torch.cat([p._stacks[point].to(device) for p in pieces], dim=1) for point in first._stacks}
        activations = {}
        for name in first:
            stacked = next((point for point in stacks if first._stacked_position(name, point) is not None), None)
            if stacked is not None:
                activations[name] = stacks[stacked][first._stacked_position(name, stacked)]
            else:
                activations[name] = torch.cat([p[name].to(device) for p in pieces])
        logits = None if first.logits is None else torch.cat([p.output.to(device) for p in pieces])
        residual = None
        if first.residual is not None:  # pieces of one pass: all stopped early, or none
            residual = torch.cat([p.residual.to(device) for p in pieces if p.residual is not None])
        return cls(activations, first.spec, logits, stacks, residual=residual)

    def _stacked_position(self, name: str, point: str) -> int | None:
        if not name.startswith("blocks.") or parse_hook_name(name, self.spec.num_layers)[1].suffix != point:
            return None
        return [n for n in self if n.startswith("blocks.") and n.endswith("." + point)].index(name)

    def layers_of(self, point: str) -> tuple[int, ...]:
        """The layers whose ``point`` (e.g. ``"attn.probs"``) this cache holds, in the order asked."""
        layers = []
        for name in self:
            if name.startswith("blocks."):
                layer, kind = parse_hook_name(name, self.spec.num_layers)
                if kind.suffix == point:
                    layers.append(layer)
        return tuple(layers)

    def stack(self, point: str) -> torch.Tensor:
        """``(L, …)``: ``point`` (e.g. ``"resid_post"``) of every cached layer, in the order asked
        (:meth:`layers_of`). No copy when the forward pass stacked them (``capture_attention``);
        otherwise a new tensor (TransformerLens's ``cache.stack_activation``)."""
        if point in self._stacks:
            return self._stacks[point]
        layers = self.layers_of(point)
        if not layers:
            raise KeyError(f"No layer's {point!r} was cached (this cache holds: {', '.join(self) or 'nothing'}).")
        values = [self[f"blocks.{layer}.{point}"] for layer in layers]
        shapes = {tuple(v.shape) for v in values}
        if len(shapes) > 1:
            raise AnalysisError(
                f"The cached {point} have shapes {sorted(shapes)} (a hierarchical model's stages "
                "differ): they cannot be stacked; read them one layer at a time."
            )
        return torch.stack(values)

    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self._activations[canonical_name(name)]
        except KeyError:
            kept = ", ".join(self._activations) or "nothing"
            raise KeyError(f"{name!r} was not cached (this cache holds: {kept}); pass it in names=.") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._activations)

    def __len__(self) -> int:
        return len(self._activations)

    def _token_axis(self, name: str, axis: int | None) -> int:
        require_global_attention(
            self.spec,
            lambda spec: AnalysisError(
                f"A windowed model ({spec.family}) has no prefix tokens and no single token axis: "
                f"{name} is laid out per stage grid or per window (see analysis.engine.activations.points)."
            ),
        )
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
