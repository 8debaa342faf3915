"""Resolving a user's query ("cls", a patch index, "mean", "prefix:<i>", an input pixel) to tokens.

:func:`resolve_query` is the one parser: every analysis, the attention view and the notebook
widgets read "which query token(s)" through it, so each query form means the same everywhere.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from ..base.arguments import check_int
from ..base.errors import AnalysisError
from ..model.geometry import LayerGeometry, ViTSpec
from ..model.windowed_support import refuse_windowed
from .attention import AttentionRecord

__all__ = [
    "Query",
    "QueryTokens",
    "resolve_query",
    "default_query",
    "query_rows_for",
    "patch_of_pixel",
    "prefix_query",
    "parse_prefix_query",
    "corresponding_layer",
    "corresponding_query",
    "query_for_layers",
]

Query = str | int | tuple[int, int]  # "cls" | "mean" | "prefix:<i>" | row-major patch index | (y, x) input pixel


def prefix_query(index: int) -> str:
    """The query of prefix token ``index``: ``"prefix:<index>"``.

    Parameters
    ----------
    index : int
        The prefix token (0 = the class token when there is one; then the distillation token and
        registers, as ``spec.token_names`` names them).

    Returns
    -------
    str
        ``"prefix:<index>"``.
    """
    return f"prefix:{int(index)}"


def parse_prefix_query(query) -> int | None:
    """The prefix token a ``"prefix:<i>"`` query names.

    Parameters
    ----------
    query : object
        Any query.

    Returns
    -------
    int or None
        ``i`` for ``"prefix:<i>"`` (``i`` decimal digits); ``None`` for anything else.
    """
    if isinstance(query, str) and query.startswith("prefix:") and query[7:].isdigit():
        return int(query[7:])
    return None


def default_query(spec, query: Query | None = None) -> Query:
    """The query an analysis reads when the caller passes ``query=None``: the token the model's
    head reads, i.e. the class token when the model has one, else the mean over every patch
    query (global-average pooling). Every map of one query (``attention_map``,
    ``attention_rollout``, ``attention_rollout_by_layer``) defaults to this, so the default
    works on every model; ``"cls"`` asked for explicitly on a model without one is an error.

    Parameters
    ----------
    spec : ViTSpec or LayerGeometry
        The model's spec (its ``has_class_token``) or one layer's geometry (its ``class_token``).
    query : int, (y, x), str or None, default None
        The caller's query; anything but ``None`` is returned as it is.

    Returns
    -------
    int, (y, x) or str
        ``query``, or for ``None``: ``"cls"`` when the model has a class token, else ``"mean"``.
    """
    if query is None:
        has_class_token = getattr(spec, "has_class_token", getattr(spec, "class_token", False))  # spec or geometry
        return "cls" if has_class_token else "mean"
    return query


@dataclass(frozen=True)
class QueryTokens:
    """A query resolved on a model's tokens ``[prefix, patches]`` (what :func:`resolve_query`
    returns).

    Attributes
    ----------
    query : int or str
        Its canonical form: ``"cls"``, ``"mean"``, ``"prefix:<i>"`` or a patch index ``int`` (an
        input pixel becomes the patch that contains it).
    tokens : tuple of int
        The token positions whose rows make it up (``"mean"``: every patch, averaged by callers).
    mean : bool, default False
        Whether it is the mean over the patches.
    """

    query: Query
    tokens: tuple[int, ...]
    mean: bool = False

    @property
    def patch(self) -> int | None:
        """The row-major patch index of a patch query, else ``None``."""
        return self.query if isinstance(self.query, int) else None


def resolve_query(spec: ViTSpec | LayerGeometry, query: Query | None) -> QueryTokens:
    """The tokens of ``query`` on the model ``spec`` (or on one layer's ``LayerGeometry``: its
    grid, with its prefix tokens, the first the class token when ``class_token``).

    ``"cls"`` is the class token (token 0); an ``int`` p is patch p in row-major order (token
    ``num_prefix_tokens + p``); ``"mean"`` is every patch; ``"prefix:<i>"`` is prefix token i
    (class, distillation or register token); a tuple ``(y, x)`` is the patch that contains input
    pixel ``(y, x)`` (:func:`patch_of_pixel`); ``None`` is :func:`default_query`.

    Parameters
    ----------
    spec : ViTSpec or LayerGeometry
        The model's spec, or one layer's geometry (its grid and prefix tokens).
    query : int, (y, x), str or None
        ``"cls"``, ``"mean"``, ``"prefix:<i>"``, a row-major patch index, an input pixel
        ``(y, x)``, or ``None``.

    Returns
    -------
    QueryTokens
        The canonical query and the token positions that make it up.

    Raises
    ------
    AnalysisError
        The query is none of these, names a token the model lacks (``"cls"`` without a class
        token, a prefix or patch index out of range, a pixel outside the input), or ``spec`` is a
        windowed model's (whose layers differ in grid: pass one layer's geometry).
    """
    if isinstance(spec, ViTSpec):
        refuse_windowed(spec, "Token queries over [prefix, patches]")
        grid, prefix, has_class_token = spec.grid_size, spec.num_prefix_tokens, spec.has_class_token
        names: tuple[str, ...] = tuple(spec.token_names)
    else:
        grid, prefix, has_class_token, names = spec.grid_size, spec.prefix_tokens, spec.class_token, ()
    num_patches = grid[0] * grid[1]
    query = default_query(spec, query)
    if isinstance(query, tuple):
        patch = patch_of_pixel(spec, query)
        return QueryTokens(patch, (prefix + patch,))
    token = parse_prefix_query(query)
    if token is not None:
        if not 0 <= token < prefix:
            raise AnalysisError(f"{query!r}: this model has {prefix} prefix tokens ({', '.join(names) or 'none'}).")
        return QueryTokens(query, (token,))
    if isinstance(query, str):
        if query == "cls":
            if not has_class_token:
                raise AnalysisError(
                    "This model has no class token (it pools patch tokens): use query='mean' "
                    "or a patch index instead of 'cls'."
                )
            return QueryTokens("cls", (0,))
        if query == "mean":
            return QueryTokens("mean", tuple(range(prefix, prefix + num_patches)), mean=True)
        raise AnalysisError(f"query must be 'cls', 'mean', 'prefix:<i>' or a patch index, not {query!r}.")
    if isinstance(query, bool) or not isinstance(query, numbers.Integral):
        raise AnalysisError(f"query must be 'cls', 'mean', 'prefix:<i>' or a patch index, not {query!r}.")
    patch = int(query)
    if not 0 <= patch < num_patches:
        raise AnalysisError(f"Patch index {patch} is outside the {grid[0]}x{grid[1]} grid (0..{num_patches - 1}).")
    return QueryTokens(patch, (prefix + patch,))


def query_for_layers(spec: ViTSpec, query: Query) -> Query:
    """The app's query (``"mean"``, ``"cls"``, ``"prefix:<i>"``, a pixel ``(y, x)`` or a row-major
    patch index ``p`` of ``spec.grid_size``) as every layer's :func:`analysis.attention_map` and
    rollout (and the code that reproduces them) take it.

    A model whose layers all attend over the one patch grid (a ViT): ``query`` unchanged, since
    patch ``p`` is the same token in every layer. A windowed model (Swin, SAM), whose layers lie
    on stage grids of their own: patch ``p = r·gw + c`` becomes the input pixel at its centre,
    :meth:`~analysis.model.geometry.ViTSpec.patch_centre`,

        (y, x) = (r·ph + ⌊ph/2⌋, c·pw + ⌊pw/2⌋),   (ph, pw) = spec.patch_size,

    so each layer reads the cell of its own grid that holds that pixel
    (:meth:`~analysis.model.geometry.ViTSpec.layer_cell`); ``"mean"`` and a pixel stay as they are.

    Parameters
    ----------
    spec : ViTSpec
        The model's spec.
    query : int, (y, x) or str
        The app's query: ``"mean"``, ``"cls"``, ``"prefix:<i>"``, a pixel ``(y, x)`` or a
        row-major patch index of ``spec.grid_size``.

    Returns
    -------
    int, (y, x) or str
        ``query`` unchanged, or for a windowed model's patch index the ``(y, x)`` pixel at its
        centre.

    Raises
    ------
    AnalysisError
        A windowed model's patch index outside ``spec.grid_size``.
    """
    if spec.attends_globally or not isinstance(query, numbers.Integral) or isinstance(query, bool):
        return query
    (gh, gw) = spec.grid_size
    if not 0 <= int(query) < gh * gw:
        raise AnalysisError(f"Patch index {query} is outside the {gh}x{gw} grid (0..{gh * gw - 1}).")
    return spec.patch_centre(int(query))


def query_rows_for(record: AttentionRecord, query: Query | None) -> list[int]:
    """Positions along the record's ``Q`` axis whose attention rows make up ``query``: the
    tokens :func:`resolve_query` gives, where the record holds them.

    Parameters
    ----------
    record : AttentionRecord
        A ViT's captured pass, attentions ``(L, B, heads, Q, T)``.
    query : int, (y, x), str or None
        As :func:`resolve_query` takes it (``"mean"``: every patch query, averaged by callers;
        ``None``: :func:`default_query`).

    Returns
    -------
    list of int
        Indices along ``Q``, one per token of the query.

    Raises
    ------
    AnalysisError
        A windowed record; a query :func:`resolve_query` refuses; a token whose row the record
        did not keep (``query_tokens``).
    """
    refuse_windowed(record, "Token queries over [prefix, patches]")
    return record.query_rows(list(resolve_query(record.spec, query).tokens))


def patch_of_pixel(spec, pixel: tuple[int, int]) -> int:
    """The row-major patch that contains input pixel ``(y, x)`` (of the ``spec.img_size``
    input the model sees): ``⌊y/ph⌋·gw + ⌊x/pw⌋``, as :meth:`~analysis.model.geometry.LayerGeometry.cell_of_pixel`.

    Parameters
    ----------
    spec : ViTSpec or LayerGeometry
        The model's spec, or one layer's ``LayerGeometry`` (the input it covers: grid × stride;
        the result is then a cell of its grid).
    pixel : tuple of (int, int)
        ``(y, x)`` integers inside the input.

    Returns
    -------
    int
        The row-major patch (cell) index.

    Raises
    ------
    AnalysisError
        ``pixel`` not two integers inside the input.
    """
    if isinstance(spec, LayerGeometry):
        size = (spec.grid_size[0] * spec.stride[0], spec.grid_size[1] * spec.stride[1])
        return spec.cell_of_pixel(*check_pixel_query(pixel, size))
    return spec.geometry(0).cell_of_pixel(*check_pixel_query(pixel, spec.img_size))


def check_pixel_query(pixel: tuple, img_size: tuple[int, int]) -> tuple[int, int]:
    """``(y, x)`` as ints inside an ``img_size = (H, W)`` input, else AnalysisError."""
    height, width = img_size
    if (
        len(pixel) != 2
        or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in pixel)
        or not (0 <= pixel[0] < height and 0 <= pixel[1] < width)
    ):
        raise AnalysisError(f"Pixel query {pixel!r} must be integers (y, x) inside the {height}x{width} input.")
    return int(pixel[0]), int(pixel[1])


def select_query(attention: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """``(..., Q, T)`` -> ``(..., T)``: the mean of the chosen query rows."""
    if len(rows) == 1:
        return attention[..., rows[0], :].float()
    index = torch.as_tensor(rows, device=attention.device)
    return attention.index_select(-2, index).float().mean(dim=-2)


def corresponding_layer(layer: int, from_layers: int, to_layers: int) -> int:
    """The layer at the same relative depth in a model with ``to_layers`` layers:

        round(layer · (to_layers − 1) / (from_layers − 1))

    (the first maps to the first, the last to the last). When either model has a single layer,
    the result is ``min(layer, to_layers − 1)``.

    Parameters
    ----------
    layer : int
        Layer index in the first model (at least 0).
    from_layers : int
        Number of layers of the model ``layer`` comes from (at least 1).
    to_layers : int
        Number of layers of the other model (at least 1).

    Returns
    -------
    int
        The layer index in the model with ``to_layers`` layers.

    Raises
    ------
    AnalysisError
        An argument is not an integer (bools refused) or is below its minimum.
    """
    from_layers = check_int("from_layers", from_layers, minimum=1)
    to_layers = check_int("to_layers", to_layers, minimum=1)
    layer = check_int("layer", layer, minimum=0)
    if from_layers <= 1 or to_layers <= 1:
        return min(layer, to_layers - 1)
    return int(round(layer * (to_layers - 1) / (from_layers - 1)))


def _grid_pair(name: str, grid) -> tuple[int, int]:
    if not isinstance(grid, (tuple, list)) or len(grid) != 2:
        raise AnalysisError(f"{name} must be a (rows, columns) pair, got {grid!r}.")
    return check_int(f"{name} rows", grid[0], minimum=1), check_int(f"{name} columns", grid[1], minimum=1)


def corresponding_query(
    query: Query,
    from_grid: tuple[int, int],
    to_grid: tuple[int, int],
    to_has_class_token: bool,
    *,
    from_has_class_token: bool | None = None,
) -> Query:
    """The same query in another model (or at another grid).

    The class token becomes the class token (or ``"mean"`` without one); ``"mean"`` stays
    ``"mean"``, and so do the other prefix tokens, whose roles differ between models
    (``"prefix:0"`` is the class token only when ``from_has_class_token``: in a registers-only
    model it is a register, so it needs saying); a patch becomes the patch of ``to_grid`` that
    contains the centre of patch ``(r, c)`` of ``from_grid``:

        (⌊(r + ½)·gh′/gh⌋, ⌊(c + ½)·gw′/gw⌋)

    clipped to ``to_grid``. A pixel query ``(y, x)`` is already a place in the image: turn it into
    a patch with :func:`patch_of_pixel` first.

    Parameters
    ----------
    query : int or str
        ``"cls"``, ``"mean"``, ``"prefix:<i>"`` or a row-major patch index of ``from_grid``.
    from_grid : (int, int)
        The ``(gh, gw)`` patch grid the query comes from.
    to_grid : (int, int)
        The ``(gh′, gw′)`` grid to map onto (the other model's patch grid).
    to_has_class_token : bool
        Whether the other model has a class token (``"cls"`` becomes ``"mean"`` when not).
    from_has_class_token : bool or None, default None
        Whether the model the query comes from has a class token (its
        ``spec.has_class_token``); needed only for ``query="prefix:0"``.

    Returns
    -------
    int or str
        ``"cls"``, ``"mean"`` or a row-major patch index of ``to_grid``.

    Raises
    ------
    AnalysisError
        A grid is not a ``(rows, columns)`` pair of positive integers; ``query`` is a pixel
        ``(y, x)``, ``"prefix:0"`` without ``from_has_class_token``, a patch index outside
        ``from_grid``, or none of the forms above.
    """
    from_grid, to_grid = _grid_pair("from_grid", from_grid), _grid_pair("to_grid", to_grid)
    if query == "cls":
        return "cls" if to_has_class_token else "mean"
    if query == "prefix:0" and from_has_class_token is None:
        raise AnalysisError(
            "query='prefix:0' is the class token only in a model that has one: pass from_has_class_token="
            "spec.has_class_token of the model the query comes from."
        )
    if query == "mean" or (isinstance(query, str) and query.startswith("prefix:")):
        is_class_token = query == "prefix:0" and bool(from_has_class_token)
        return "cls" if is_class_token and to_has_class_token else "mean"  # registers differ per model
    if isinstance(query, tuple):
        raise AnalysisError(f"query={query!r} is a pixel position: map it with patch_of_pixel(...) first.")
    if isinstance(query, str) or isinstance(query, bool) or not isinstance(query, numbers.Integral):
        raise AnalysisError(f"query must be 'cls', 'mean', 'prefix:<i>' or a patch index, not {query!r}.")
    if not 0 <= int(query) < from_grid[0] * from_grid[1]:
        raise AnalysisError(f"Patch index {query} is outside the {from_grid[0]}x{from_grid[1]} grid.")
    r, c = divmod(int(query), from_grid[1])
    r2 = min(int((r + 0.5) * to_grid[0] / from_grid[0]), to_grid[0] - 1)
    c2 = min(int((c + 0.5) * to_grid[1] / from_grid[1]), to_grid[1] - 1)
    return r2 * to_grid[1] + c2
