"""What :func:`~analysis.tokens.capture_tokens` returns for every family: the tokens of the layers
asked for, in the order asked, each layer read with its own geometry (which tokens are prefix
tokens, which grid the rest lie on)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..base.arguments import check_index
from ..base.errors import AnalysisError
from ..model.geometry import LayerGeometry, ViTSpec
from ..records.layer_tokens import layer_grid

__all__ = ["TokenRecord"]


@dataclass(frozen=True)
class TokenRecord:
    """Tokens captured from one forward pass, one layer at a time in one layout for every family.

    Layer ``l``'s tokens are ``(B, T_l, D_l)``: its geometry's ``prefix_tokens`` first (class,
    distillation, register tokens of a ViT; none on a windowed model's stage grid), then one token
    per cell of ``geometry(l).grid_size``, row-major. Layers that share one ``T`` and ``D`` (a ViT's,
    SAM's) are stored as one ``(L, B, T, D)`` tensor; a Swin's stages differ in grid and width
    (patch merging halves the grid and doubles the channels) and are stored as one tensor per layer. :meth:`layer_tokens`, :meth:`patches`, :meth:`grid_tokens` and
    :meth:`geometry` read either.

    Attributes
    ----------
    tokens : torch.Tensor or tuple of torch.Tensor
        ``(L, B, T, D)`` on the CPU in the capture's ``dtype`` (float32 by default) when every
        layer has the same token count and width, else one ``(B, T_l, D_l)`` tensor per layer;
        entry ``i`` is model layer ``layers[i]``. For ``query``/``key``/``value``,
        ``D = heads · d`` (``kv_heads · d`` for grouped-query keys and values).
    spec : ViTSpec
        The token layout of *this* input (``spec.geometry(l)`` for each layer).
    layers : tuple of int
        Model layer index of each entry of ``tokens``, in the order they were asked for.
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
    >>> tuple(record.grid_tokens(3).shape)  # (B, gh, gw, D)
    (1, 8, 8, 128)
    """

    tokens: torch.Tensor | tuple[torch.Tensor, ...]
    spec: ViTSpec
    layers: tuple[int, ...]
    kind: str = "token"

    def layer_position(self, layer: int) -> int:
        """Position in ``tokens`` of model layer ``layer`` (negative indices count from the end)."""
        layer = check_index("layer", layer, self.spec.num_layers, "layers")
        if layer not in self.layers:
            raise AnalysisError(
                f"Layer {layer} was not captured (captured: {list(self.layers)}). Capture it with "
                "capture_tokens(..., layers=None) for all layers."
            )
        return self.layers.index(layer)

    def layer_tokens(self, layer: int) -> torch.Tensor:
        """Model layer ``layer``'s ``(B, T_l, D_l)`` tokens (a view)."""
        return self.tokens[self.layer_position(layer)]

    def geometry(self, layer: int) -> LayerGeometry:
        """Model layer ``layer``'s geometry (``spec.geometry``): its prefix tokens, grid and stride."""
        return self.spec.geometry(self.layers[self.layer_position(layer)])

    def every_layer(self, what: str = "TokenRecord.every_layer()") -> torch.Tensor:
        """Every layer's tokens at once, ``(L, B, T, D)`` (a view), for layers of one grid and width.

        Parameters
        ----------
        what : str, default "TokenRecord.every_layer()"
            The read that needs them, as the error names it.

        Returns
        -------
        torch.Tensor
            ``tokens`` itself, ``(L, B, T, D)``.

        Raises
        ------
        AnalysisError
            The layers differ in grid or width (a windowed model's stages): read them one layer at a
            time (:meth:`layer_tokens`, :meth:`patches` with ``layer=``).
        """
        if isinstance(self.tokens, torch.Tensor):
            return self.tokens
        raise AnalysisError(
            f"{what} of every layer at once needs layers of one grid and width; this {self.spec.family}'s "
            "layers differ (stage grids): read them one layer at a time (layer_tokens(layer), patches(layer))."
        )

    def _split(self, layer: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        if layer is None:
            tokens = self.every_layer("TokenRecord.prefix()/patches()")
            return self.spec.split_prefix(tokens, tokens.ndim - 2)
        tokens, geometry = self.layer_tokens(layer), self.geometry(layer)
        prefix, cells = geometry.prefix_tokens, geometry.grid_size[0] * geometry.grid_size[1]
        if tokens.shape[-2] != prefix + cells:
            raise AnalysisError(
                f"Layer {layer} holds {tokens.shape[-2]} tokens; its geometry predicts {prefix} prefix + "
                f"{geometry.grid_size[0]}x{geometry.grid_size[1]} cells."
            )
        return tokens[..., :prefix, :], tokens[..., prefix:, :]

    def prefix(self, layer: int | None = None) -> torch.Tensor:
        """The prefix tokens (class, distillation, registers): ``(B, prefix, D)`` of one ``layer``
        (``prefix`` may be 0), or ``(L, B, prefix, D)`` of every layer of one grid. A view."""
        return self._split(layer)[0]

    def patches(self, layer: int | None = None) -> torch.Tensor:
        """The patch (grid-cell) tokens, row-major on the layer's grid: ``(B, gh·gw, D)`` of one
        ``layer``, or ``(L, B, gh·gw, D)`` of every layer of one grid. A view."""
        return self._split(layer)[1]

    def grid_tokens(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s patch tokens on its grid: ``(B, gh, gw, D)`` (a view)."""
        return layer_grid(self.layer_tokens(layer), self.geometry(layer))
