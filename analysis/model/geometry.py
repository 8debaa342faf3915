"""The geometry of a ViT: :class:`ViTSpec` and its per-layer :class:`LayerGeometry`.

The types only, below the attention adapters (which build a windowed layer's geometry);
:func:`analysis.model.spec.spec_from_model` reads them off a model through its adapters (never
assumed). Every name here is imported from this module.

Windowed and hierarchical models (Swin, SAM) add one :class:`LayerGeometry` per layer:
where that layer's tokens sit on the image and which of them each query may attend to.

* **Stage grid and stride.** Layer ``l`` works on a ``grid_size = (gh, gw)`` grid of cells,
  each ``stride = (sy, sx)`` input pixels (Swin: the patch size, doubled by every patch
  merging before the layer's stage). Cells are numbered row-major on that grid.
* **Windows.** Attention runs separately inside ``num_windows`` windows of
  ``window_size = (wh, ww)`` cells (``Wt = wh·ww`` tokens each). A layer rolls the grid by
  ``−shift`` (Swin's cyclic shift, ``torch.roll``; ``(0, 0)`` for most), pads it to whole windows
  (zero tokens at the bottom and right, which stay keys: a map may sum to less than one),
  and cuts it into windows in row-major window order; window slot ``(i, j)`` of window
  ``(a, b)`` therefore holds cell ``((a·wh + i + sh) mod gh, (b·ww + j + sw) mod gw)``, or
  padding when ``a·wh + i ≥ gh`` or ``b·ww + j ≥ gw`` (:meth:`LayerGeometry.window_cells`).
* **Shift mask.** After the roll, a window at the far edge holds cells from opposite image
  borders; the module masks pairs from different roll regions (:meth:`LayerGeometry.allowed`).
  Their recorded probability is exactly 0.

SAM's global blocks are one window of the whole grid. A ViT is the special case of one stage
and one global window over the patch grid (plus its prefix tokens): :meth:`ViTSpec.geometry`
returns that, and a ViT's spec stores no per-layer
geometry (``layer_geometry == ()``), so every ViT record, field and result is unchanged. A
windowed record (:class:`analysis.records.windowed.WindowedAttentionRecord`) keeps one tensor
``(B, windows, heads, Wt, Wt)`` per layer, since stages differ in grid, heads and windows.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

import torch
import torch.nn as nn

from ..base.arguments import check_pixels
from ..base.errors import AnalysisError

__all__ = [
    "ViTSpec",
    "LayerGeometry",
    "input_spec",
    "patch_embedding_module",
    "as_pair",
    "POSITION_KINDS",
    "HEAD_KINDS",
]

# How positions enter the model: a learned absolute table, rotary embeddings inside
# attention, a relative-position bias on the attention scores, or combinations.
POSITION_KINDS = ("learned", "rope", "learned+rope", "relative", "learned+relative", "none")
# What the model's output is: class scores, an embedding (CLIP/SigLIP/PE projection), or
# pooled features with no head at all.
HEAD_KINDS = ("classifier", "embedding", "none")


@dataclass(frozen=True)
class LayerGeometry:
    """Where one layer's attention lives on the image (see the module docstring).

    A global layer has one window of the whole grid and ``prefix_tokens`` extra (class /
    register) tokens before the cells (a ViT's layer, :meth:`ViTSpec.geometry`).

    Attributes
    ----------
    stage : int
        The layer's stage (0 for a ViT).
    grid_size : tuple of int
        ``(gh, gw)`` cells of the layer's grid, numbered row-major.
    stride : tuple of int
        ``(sy, sx)`` input pixels per cell.
    window_size : tuple of int
        ``(wh, ww)`` cells per attention window.
    shift : tuple of int, default (0, 0)
        ``(sh, sw)`` cells of the cyclic shift applied before windowing (Swin's ``torch.roll``).
    num_heads : int, default 1
        Attention heads of the layer.
    prefix_tokens : int, default 0
        Extra (class / register) tokens before the cells of each window (a global layer's).
    class_token : bool, default False
        The first prefix token is a class token.
    """

    stage: int
    grid_size: tuple[int, int]
    stride: tuple[int, int]
    window_size: tuple[int, int]
    shift: tuple[int, int] = (0, 0)
    num_heads: int = 1
    prefix_tokens: int = 0
    class_token: bool = False

    @property
    def is_global(self) -> bool:
        """One window over the whole grid, no shift: every query sees every cell (a ViT layer)."""
        return self.window_size == self.grid_size and self.shift == (0, 0)

    @property
    def padded_grid(self) -> tuple[int, int]:
        """The grid padded up to whole windows: ``(⌈gh/wh⌉·wh, ⌈gw/ww⌉·ww)``."""
        (gh, gw), (wh, ww) = self.grid_size, self.window_size
        return (-(-gh // wh) * wh, -(-gw // ww) * ww)

    @property
    def windows_per_side(self) -> tuple[int, int]:
        (ph, pw), (wh, ww) = self.padded_grid, self.window_size
        return (ph // wh, pw // ww)

    @property
    def num_windows(self) -> int:
        rows, cols = self.windows_per_side
        return rows * cols

    @property
    def window_tokens(self) -> int:
        """``Wt``, tokens per window (prefix tokens included for a global layer)."""
        return self.prefix_tokens + self.window_size[0] * self.window_size[1]

    def uniform_attention(self, *, mean_query: bool = False) -> float:
        """What a key cell of this layer's map gets under uniform attention, the reference that
        a colour scale's floor and the "× uniform" units read.

        One query's row: ``1/Wt`` (its softmax runs over the window's ``Wt`` slots, padding and
        prefix slots included; a global layer's window is every token, ``1/T``). The mean over
        every cell's query (``mean_query``) of a windowed layer: ``1/(gh·gw)``, since each cell
        is a key of the ``Wt`` queries of its own window only, ``Wt · (1/Wt) / (gh·gw)`` (exact
        without padding or a shift's mask); a global layer's mean row is ``1/T`` like one row.
        """
        if mean_query and not self.is_global:
            return 1.0 / (self.grid_size[0] * self.grid_size[1])
        return 1.0 / self.window_tokens

    def window_cells(self) -> torch.Tensor:
        """``(windows, Wt)`` long: the row-major cell index on :attr:`grid_size` of each
        window slot, ``−1`` for padding and prefix slots."""
        return _window_cells(self).clone()

    def allowed(self) -> torch.Tensor:
        """``(windows, Wt, Wt)`` bool: the (query slot, key slot) pairs the shift mask keeps
        (all True without a shift). Slots are labelled by roll region, as Swin does: along
        each axis of the padded, shifted grid, ``[0, P−w)``, ``[P−w, P−s)`` and ``[P−s, P)``
        (``P`` the padded side, ``w`` the window side, ``s`` the shift); pairs with different
        labels are masked."""
        return _allowed(self).clone()

    def cell_of_pixel(self, y: int, x: int) -> int:
        """The row-major cell that input pixel ``(y, x)`` falls in: ``(⌊y/sy⌋, ⌊x/sx⌋)``."""
        (sy, sx), (gh, gw) = self.stride, self.grid_size
        return min(int(y) // sy, gh - 1) * gw + min(int(x) // sx, gw - 1)

    def cell_centre(self, cell: int) -> tuple[int, int]:
        """The input pixel ``(y, x)`` at the centre of row-major cell ``cell``:
        ``(r·sy + ⌊sy/2⌋, c·sx + ⌊sx/2⌋)`` with ``(r, c) = divmod(cell, gw)``; :meth:`cell_of_pixel`
        of it is ``cell`` again."""
        (sy, sx), gw = self.stride, self.grid_size[1]
        row, col = divmod(int(cell), gw)
        return (row * sy + sy // 2, col * sx + sx // 2)


@functools.lru_cache(maxsize=64)
def _window_cells(geometry: LayerGeometry) -> torch.Tensor:
    (gh, gw), (wh, ww), (sh, sw) = geometry.grid_size, geometry.window_size, geometry.shift
    (rows, cols), prefix = geometry.windows_per_side, geometry.prefix_tokens
    y = torch.arange(rows * wh).view(rows, wh)  # shifted, padded row of each (window row, slot row)
    x = torch.arange(cols * ww).view(cols, ww)
    source_y = torch.where(y < gh, (y + sh) % gh, -1)  # (rows, wh) the original row, −1: padding
    source_x = torch.where(x < gw, (x + sw) % gw, -1)  # (cols, ww)
    cells = source_y[:, None, :, None] * gw + source_x[None, :, None, :]  # (rows, cols, wh, ww)
    padding = (source_y[:, None, :, None] < 0) | (source_x[None, :, None, :] < 0)
    cells = cells.masked_fill(padding, -1).reshape(rows * cols, wh * ww)
    return torch.cat([torch.full((rows * cols, prefix), -1, dtype=torch.long), cells], dim=1)


def _roll_regions(padded: int, window: int, shift: int) -> torch.Tensor:
    """Region label of each position along one padded, shifted axis (0, 1, 2)."""
    position = torch.arange(padded)
    if shift == 0:
        return torch.zeros(padded, dtype=torch.long)
    return (position >= padded - window).long() + (position >= padded - shift).long()


@functools.lru_cache(maxsize=64)
def _allowed(geometry: LayerGeometry) -> torch.Tensor:
    (rows, cols), (wh, ww) = geometry.windows_per_side, geometry.window_size
    (ph, pw), (sh, sw) = geometry.padded_grid, geometry.shift
    labels = _roll_regions(ph, wh, sh)[:, None] * 3 + _roll_regions(pw, ww, sw)[None, :]  # (ph, pw)
    labels = labels.view(rows, wh, cols, ww).permute(0, 2, 1, 3).reshape(rows * cols, wh * ww)
    labels = torch.cat([torch.full((rows * cols, geometry.prefix_tokens), -1, dtype=torch.long), labels], dim=1)
    return labels[:, :, None] == labels[:, None, :]  # (windows, Wt, Wt)


@dataclass(frozen=True)
class ViTSpec:
    """Token layout and sizes of a ViT.

    Token order in every sequence is ``[prefix tokens..., patch tokens...]`` where the
    prefix is (class token?) + (distillation token?) + (register tokens); patch tokens
    are in row-major order over a ``grid_size = (gh, gw)`` grid, so a sequence is
    ``T = num_prefix_tokens + gh·gw`` tokens long (:attr:`num_tokens`).

    Attributes
    ----------
    patch_size : tuple of int
        ``(ph, pw)`` input pixels per patch (the stride for hybrid stems, whose own patch is a
        feature-map patch).
    grid_size : tuple of int
        ``(gh, gw)`` patches per column / per row (a windowed model: its patch embedding's grid,
        before any patch merging).
    num_prefix_tokens : int
        Class + distillation + register tokens before the patches.
    num_layers : int
        Transformer blocks (attention layers) ``L``.
    num_heads : int
        Attention heads of the first layer (every layer's for a ViT; a windowed model's stages
        differ: :meth:`geometry`, :attr:`max_layer_heads`).
    embed_dim : int
        Token width the model declares (its ``embed_dim``, else ``num_features``).
    img_size : tuple of int
        ``(H, W)`` input resolution ``= grid_size * patch_size``.
    has_class_token : bool
        Whether the first prefix token is a class token.
    position_embedding : str, default "learned"
        How positions enter the model, one of :data:`POSITION_KINDS`.
    head : str, default "classifier"
        What the output is, one of :data:`HEAD_KINDS`.
    num_outputs : int, default 0
        Classes (``"classifier"``), embedding width (``"embedding"``), 0 (``"none"``).
    dynamic_img_size : bool, default False
        The model accepts other whole-patch input sizes (:meth:`with_image_size`).
    dynamic_img_pad : bool, default False
        The model pads partial patches up to whole ones.
    family : str, default ""
        The model class, e.g. ``"VisionTransformer"``, ``"Eva"``, ``"Beit"``.
    residual_norm : str, default "pre"
        ``"pre"``: ``x + f(norm(x))``; ``"post"``: ``x + norm(f(x))`` (timm's ``*_rpn`` ResPost
        blocks, Swin V2).
    prefix_names : tuple of str, default ()
        One per prefix token, e.g. ``("class", "register 1", ...)``; see :attr:`token_names`.
    layer_geometry : tuple of LayerGeometry, default ()
        Windowed / hierarchical models only: one :class:`LayerGeometry` per layer (empty for a
        ViT; :meth:`geometry` gives every layer's).
    """

    patch_size: tuple[int, int]  # (ph, pw) input pixels per patch (the stride for hybrid stems)
    grid_size: tuple[int, int]  # (gh, gw) patches per column / per row
    num_prefix_tokens: int  # class + distillation + register tokens
    num_layers: int
    num_heads: int
    embed_dim: int
    img_size: tuple[int, int]  # (H, W) input resolution = grid_size * patch_size
    has_class_token: bool
    position_embedding: str = "learned"  # one of POSITION_KINDS
    head: str = "classifier"  # one of HEAD_KINDS
    num_outputs: int = 0  # classes (classifier), embedding width (embedding), 0 (none)
    dynamic_img_size: bool = False  # accepts other whole-patch input sizes
    dynamic_img_pad: bool = False  # pads partial patches up to whole ones
    family: str = ""  # the model class, e.g. "VisionTransformer", "Eva", "Beit"
    residual_norm: str = "pre"  # "pre": x + f(norm(x)); "post": x + norm(f(x)) (timm's *_rpn ResPost blocks)
    prefix_names: tuple[str, ...] = ()  # one per prefix token, e.g. ("class", "register 1", ...); see token_names
    # Windowed / hierarchical models only: one LayerGeometry per layer (empty for a ViT).
    layer_geometry: tuple[LayerGeometry, ...] = field(default=(), repr=False)

    @property
    def is_windowed(self) -> bool:
        """True for a model whose layers attend inside windows or on stage grids (Swin)."""
        return bool(self.layer_geometry)

    @property
    def attends_globally(self) -> bool:
        """True when every layer attends over the whole token sequence of one patch grid (a ViT:
        one ``(L, B, heads, Q, T)`` stack of maps, prefix tokens, one token axis); False for a
        windowed model (Swin, SAM), whose layers attend inside windows of their own stage grids
        (:meth:`geometry` gives each layer's)."""
        return not self.is_windowed

    @property
    def max_layer_heads(self) -> int:
        """The most attention heads of any layer (``num_heads`` for a ViT; stages differ in Swin)."""
        return max((geometry.num_heads for geometry in self.geometries()), default=self.num_heads)

    def window_geometry(self, layer: int) -> LayerGeometry | None:
        """Layer ``layer``'s :class:`LayerGeometry` when it attends inside windows of a stage grid
        (a windowed model), else ``None`` (a ViT's layer attends over every token)."""
        return self.geometry(layer) if self.is_windowed else None

    def geometry(self, layer: int) -> LayerGeometry:
        """Layer ``layer``'s :class:`LayerGeometry`; for a ViT, one global window over the
        patch grid with the prefix tokens in front."""
        if self.layer_geometry:
            return self.layer_geometry[layer]
        return LayerGeometry(
            stage=0,
            grid_size=self.grid_size,
            stride=self.patch_size,
            window_size=self.grid_size,
            num_heads=self.num_heads,
            prefix_tokens=self.num_prefix_tokens,
            class_token=self.has_class_token,
        )

    def geometries(self) -> tuple[LayerGeometry, ...]:
        """Every layer's :meth:`geometry`, in order: a ViT's global windows or a windowed model's own."""
        return tuple(self.geometry(layer) for layer in range(self.num_layers))

    def patch_centre(self, patch: int) -> tuple[int, int]:
        """The input pixel ``(y, x)`` at the centre of patch ``patch`` (row-major on :attr:`grid_size`,
        cells of :attr:`patch_size`): ``(r·ph + ⌊ph/2⌋, c·pw + ⌊pw/2⌋)`` with ``(r, c) = divmod(patch, gw)``."""
        (ph, pw), gw = self.patch_size, self.grid_size[1]
        row, col = divmod(int(patch), gw)
        return (row * ph + ph // 2, col * pw + pw // 2)

    def layer_cell(self, layer: int, patch: int) -> int:
        """The cell of layer ``layer``'s own grid that holds the centre of patch ``patch`` of
        :attr:`grid_size`: ``geometry(layer).cell_of_pixel(*patch_centre(patch))``. On a ViT (one grid
        for every layer) that is ``patch`` itself; on a windowed model, the stage grid's cell under it."""
        return self.geometry(layer).cell_of_pixel(*self.patch_centre(patch))

    @property
    def resolution_step(self) -> int:
        """The smallest side (input pixels) whose multiples are whole cells on every layer's grid:
        ``lcm`` of every layer's stride (and of the patch size). A ViT: ``lcm(ph, pw)``; Swin:
        the patch size times 2 per patch merging (``4·2³ = 32`` for four stages of patch 4)."""
        sides = [*self.patch_size, *(side for geometry in self.geometries() for side in geometry.stride)]
        return math.lcm(*sides)

    @property
    def outlier_grid(self) -> tuple[int, int] | None:
        """The one patch grid on which an image's outlier tokens are indices
        (:func:`analysis.tokens.outlier_patches`): :attr:`grid_size` for a ViT, whose every layer's
        tokens lie on it; ``None`` for a windowed model (each stage has its own grid, outliers are
        found layer by layer: :func:`analysis.tokens.high_norm_tokens` of the record)."""
        return None if self.is_windowed else self.grid_size

    @property
    def token_names(self) -> tuple[str, ...]:
        """A name for each prefix token: "class", "distillation", "register k" (read from the
        model; specs built by hand get "class" then registers)."""
        if len(self.prefix_names) == self.num_prefix_tokens:
            return self.prefix_names
        first = ("class",) if self.has_class_token else ()
        return first + tuple(f"register {k}" for k in range(1, self.num_prefix_tokens - len(first) + 1))

    @property
    def num_patches(self) -> int:
        return self.grid_size[0] * self.grid_size[1]

    @property
    def num_tokens(self) -> int:
        """T, the sequence length seen by attention."""
        return self.num_prefix_tokens + self.num_patches

    @property
    def has_classifier(self) -> bool:
        """True when the output is class scores (a softmax over it means something)."""
        return self.head == "classifier" and self.num_outputs > 1

    def split_prefix(self, tokens, dim: int = 1, *, dropped: bool = False):
        """``(prefix, patches)``: views of ``tokens`` (a tensor or a numpy array) along its token
        axis ``dim``, the first ``num_prefix_tokens`` entries and the patch tokens (row-major on
        :attr:`grid_size`). No copy. The one prefix split of the project.

        Raises AnalysisError when that axis is not ``T`` long; ``dropped=True``: a sequence
        whose patches were partly removed (token drop), ``prefix + N'`` long with ``N' ≤ N``."""
        ndim = len(tokens.shape)
        if not -ndim <= dim < ndim:
            raise AnalysisError(f"A {tuple(tokens.shape)} tensor has no axis {dim}: pass its token axis.")
        length, prefix = tokens.shape[dim], self.num_prefix_tokens
        if length != self.num_tokens and not (dropped and prefix <= length <= self.num_tokens):
            allowed = f"{prefix}..{self.num_tokens} (some patches dropped)" if dropped else str(self.num_tokens)
            raise AnalysisError(
                f"Axis {dim} of a {tuple(tokens.shape)} tensor is not this model's token axis: it must be {allowed} "
                f"long ({self.num_prefix_tokens} prefix + {self.grid_size[0]}x{self.grid_size[1]} patches)."
            )
        before = (slice(None),) * (dim % len(tokens.shape))
        return tokens[before + (slice(0, prefix),)], tokens[before + (slice(prefix, length),)]

    def with_image_size(self, height: int, width: int) -> ViTSpec:
        """The spec for an input of another size (models with ``dynamic_img_size``)."""
        ph, pw = self.patch_size
        grid = (height // ph, width // pw)
        return replace(self, grid_size=grid, img_size=(grid[0] * ph, grid[1] * pw))


def as_pair(value) -> tuple[int, int]:
    """``(h, w)`` ints from one size (``16`` -> ``(16, 16)``) or a pair (``[16, 12]``), as model
    configs give patch, image and window sizes.

    Parameters
    ----------
    value : int, list or tuple
        One size, or a list / tuple whose first two entries are ``(h, w)``.

    Returns
    -------
    tuple of int
        ``(h, w)``.
    """
    if isinstance(value, (list, tuple)):
        return (int(value[0]), int(value[1]))
    return (int(value), int(value))


def patch_embedding_module(model: nn.Module) -> nn.Module | None:
    """``patch_embed`` (timm ViT, Eva, BEiT, relpos) or ``embeds`` (NaFlex).

    Parameters
    ----------
    model : torch.nn.Module
        The vision model.

    Returns
    -------
    torch.nn.Module or None
        The patch-embedding module, or ``None`` when the model has neither attribute.
    """
    return getattr(model, "patch_embed", None) or getattr(model, "embeds", None)


def input_spec(vit, pixels: torch.Tensor) -> ViTSpec:
    """The spec for this input, checking its shape against the model (``vit.spec``; a model
    with ``dynamic_img_size`` gets the spec of the input's own size, padded up to whole patches
    with ``dynamic_img_pad``).

    Parameters
    ----------
    vit : LoadedModel
        The loaded model (anything with a ``spec``).
    pixels : torch.Tensor
        The input, ``(B, 3, H, W)`` floating point.

    Returns
    -------
    ViTSpec
        ``vit.spec``, or for a ``dynamic_img_size`` model the spec of an ``H × W`` input.

    Raises
    ------
    AnalysisError
        ``pixels`` is not a floating ``(B, 3, H, W)`` tensor; ``H × W`` is not the model's
        ``img_size`` (a fixed-size model) or not whole patches (a dynamic model without
        ``dynamic_img_pad``).
    """
    check_pixels(pixels)
    height, width = int(pixels.shape[-2]), int(pixels.shape[-1])
    spec = vit.spec
    if spec.dynamic_img_size:
        ph, pw = spec.patch_size
        if spec.dynamic_img_pad:  # timm pads up to whole patches
            height, width = -(-height // ph) * ph, -(-width // pw) * pw
        elif height % ph or width % pw or height < ph or width < pw:
            raise AnalysisError(
                f"A {height}x{width} input is not a whole number of {ph}x{pw} patches: resize or crop it "
                "(or load the model with dynamic_img_pad=True)."
            )
        return spec.with_image_size(height, width)
    if (height, width) != spec.img_size:
        raise AnalysisError(
            f"The model expects {spec.img_size[0]}x{spec.img_size[1]} inputs, got {height}x{width}. "
            "Use vit.preprocess(image), or load the model with img_size=... or dynamic_img_size=True."
        )
    return spec
