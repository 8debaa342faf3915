"""What :func:`~analysis.tokens.capture_tokens` returns for a ViT: the tokens of the layers
asked for, in the order asked, with the spec that says which are prefix and which are patches."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..base.arguments import check_index
from ..base.errors import AnalysisError
from ..model.geometry import ViTSpec

__all__ = ["TokenRecord"]


@dataclass(frozen=True)
class TokenRecord:
    """Tokens captured from one forward pass of a global-attention ViT: what
    :func:`~analysis.tokens.capture_tokens` returns for one.

    Attributes
    ----------
    tokens : torch.Tensor
        ``(L, B, T, D)`` on the CPU, in the capture's ``dtype`` (float32 by default): entry ``i`` is model layer ``layers[i]``; tokens in model order
        (the ``spec.num_prefix_tokens`` prefix tokens first, then the patches row-major on
        ``spec.grid_size``). For ``query``/``key``/``value``, ``D = heads · d`` (``kv_heads · d``
        for grouped-query keys and values).
    spec : ViTSpec
        The token layout of *this* input.
    layers : tuple of int
        Model layer index of each entry along ``L``, in the order they were asked for.
    kind : str, default "token"
        ``"token"`` (block outputs), ``"query"``, ``"key"`` or ``"value"``.

    Examples
    --------
    >>> from analysis import capture_tokens
    >>> record = capture_tokens(vit, pixels, kind="key", layers=[3, 0])
    >>> record.layers  # the order asked
    (3, 0)
    >>> tuple(record.layer_tokens(3).shape)  # (B, T, D); the demo ViT
    (1, 65, 128)
    >>> tuple(record.patches(3).shape)  # (B, gh·gw, D), a view
    (1, 64, 128)
    """

    tokens: torch.Tensor
    spec: ViTSpec
    layers: tuple[int, ...]
    kind: str = "token"

    def layer_position(self, layer: int) -> int:
        """Position along ``L`` of model layer ``layer`` (negative indices count from the end)."""
        layer = check_index("layer", layer, self.spec.num_layers, "layers")
        if layer not in self.layers:
            raise AnalysisError(
                f"Layer {layer} was not captured (captured: {list(self.layers)}). Capture it with "
                "capture_tokens(..., layers=None) for all layers."
            )
        return self.layers.index(layer)

    def layer_tokens(self, layer: int) -> torch.Tensor:
        """Model layer ``layer``'s ``(B, T, D)`` tokens (a view)."""
        return self.tokens[self.layer_position(layer)]

    def prefix(self, layer: int | None = None) -> torch.Tensor:
        """The prefix tokens (class, distillation, registers): ``(L, B, prefix, D)``, or
        ``(B, prefix, D)`` of one ``layer``. A view."""
        tokens = self.tokens if layer is None else self.layer_tokens(layer)
        return self.spec.split_prefix(tokens, tokens.ndim - 2)[0]

    def patches(self, layer: int | None = None) -> torch.Tensor:
        """The patch tokens, row-major on ``spec.grid_size``: ``(L, B, gh·gw, D)``, or
        ``(B, gh·gw, D)`` of one ``layer``. A view."""
        tokens = self.tokens if layer is None else self.layer_tokens(layer)
        return self.spec.split_prefix(tokens, tokens.ndim - 2)[1]
