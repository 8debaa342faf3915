"""The instant attention view: every query's attention, held in the browser, drawn on a canvas.

One page, ``analysis/views/attention_view_page/index.html`` (plain JavaScript, no build step, no
network), serves both places the view appears:

* the app, as a Streamlit custom component (:mod:`vizapp.attention_view` declares this folder);
* ``python -m analysis report``, which inlines the same file in an ``<iframe srcdoc>`` and feeds
  it the same arguments with the same ``streamlit:render`` message (:func:`embed`), so the saved
  report hovers offline without Streamlit.

The page receives the image and, for each layer it holds, every query's attention over every
patch key, per head and for their mean, quantised to one byte per value
(:func:`analysis.plots.quantise_maps`: one ``[min, max]`` per map, every value back within half
a step). Hovering a patch redraws its map in the next animation frame; arrow keys step the head
(←/→) and the layer (↑/↓) in the page when it holds all layers (:func:`layers_to_send`).

A ViT's data (:func:`view_blob`), for the ``len(layers)`` layers it holds (a windowed layer's:
:func:`attention_view_blob`):

* ``rows``: ``(len(layers), heads + 1, T + 1, N)`` codes: row ``q < T`` is token ``q``'s
  attention over the patch keys (:func:`analysis.attention_rows`), row ``T`` the mean over the
  patch queries (``query="mean"``); head index ``heads`` is the mean over heads.
* ``cols``: ``(len(layers), heads + 1, N, N)`` codes: entry ``[l, h, k, i]`` is patch query
  ``i``'s attention to patch key ``k``, i.e. "who looks at patch k", quantised per column.
* ``pre``: ``(len(layers), heads + 1, T · P)`` codes, ``P`` the prefix tokens: entry
  ``[l, h, q · P + j]`` is token ``q``'s attention to prefix key ``j``, quantised per layer and
  head. With ``rows`` it completes each head's full ``T × T`` matrix, which the page draws
  bertviz-style (rows = queries, columns = keys, the prefix tokens named from ``spec.token_names``).
  Empty (``P = 0``, or maps with no prefix keys, such as the rollout's).
* ``row_ranges`` / ``col_ranges`` / ``pre_ranges``: each map's ``(lo, hi)`` as little-endian float32.

:func:`view_blob` gives them as one binary file (the app serves it; the page fetches it once),
:func:`view_data` the same bytes as base64 text (inline: the report). The Rollout page sends
other rows in the same layout (:func:`rollout_view_rows`: one map per layer, the rollout up to
that layer).
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import numbers
from pathlib import Path

import numpy as np
import torch

from ..attention.maps import attention_rows
from ..base.errors import AnalysisError
from ..plots import ROBUST_QUANTILE, UNIFORM_FLOOR, QuantisedMaps, colour_lut, quantise_maps
from ..records.queries import resolve_query

__all__ = [
    "PAGE",
    "PAGE_DIR",
    "attention_view_args",
    "attention_view_blob",
    "attention_view_rows",
    "embed",
    "follow_query",
    "layer_bytes",
    "layers_to_send",
    "view_layout",
    "prefix_key_rows",
    "quantised_view",
    "query_row",
    "rollout_view_rows",
    "similarity_view_rows",
    "view_args",
    "view_blob",
    "view_data",
    "view_layer_bytes",
    "view_query",
]

PAGE_DIR = Path(__file__).resolve().parent / "attention_view_page"
PAGE = PAGE_DIR / "index.html"


def view_layout(spec) -> str:
    """Which data the view draws a model from: ``"tokens"`` when every layer attends over one token
    sequence ``[prefix, patches]`` (a ViT: every query's row over the patch keys, the prefix keys and
    the columns, every layer held when they fit, :func:`view_blob`), ``"windows"`` when its layers
    attend inside windows on stage grids (Swin, SAM: one layer's windows, every window's query rows
    over its key slots). :func:`attention_view_blob` and :func:`attention_view_args` ask it; callers
    need not.

    Parameters
    ----------
    spec : ViTSpec
        The model's spec, or anything that has one as ``.spec`` (a LoadedViT, a record).

    Returns
    -------
    str
        ``"tokens"`` or ``"windows"``.
    """
    return "tokens" if getattr(spec, "spec", spec).attends_globally else "windows"


def layer_bytes(spec, maps: int | None = None) -> int:
    """Bytes of one layer's codes (before base64, which adds a third): rows, columns and prefix
    keys of ``maps`` maps (default: every head and their mean; the rollout has one).

    Parameters
    ----------
    spec : ViTSpec
        A ViT's spec: ``num_heads``, ``num_tokens`` ``T``, ``num_patches`` ``N`` and ``num_prefix_tokens`` ``P``.
    maps : int or None, default None
        Maps per layer; ``None``, ``heads + 1``.

    Returns
    -------
    int
        ``maps · ((T + 1)·N + N·N + T·P)`` (the ranges not counted).
    """
    maps = spec.num_heads + 1 if maps is None else maps
    tokens, patches = spec.num_tokens, spec.num_patches
    return maps * ((tokens + 1) * patches + patches * patches + tokens * spec.num_prefix_tokens)


def layers_to_send(spec, layer: int, budget_bytes: int) -> tuple[int, ...] | None:
    """The layers the view holds under ``budget_bytes`` of codes: every layer when they fit (layer
    and head then switch in the browser), else only ``layer`` (a new layer is new data), else
    ``None`` (one layer is over the budget: no view). ViT-B/16: 0.96 MiB a layer, 11.5 MiB all 12.
    A model whose layers attend inside windows is held one layer at a time (its layers lie on
    different grids): ``(layer,)`` or ``None``.

    Parameters
    ----------
    spec : ViTSpec
        The model's spec (:func:`view_layer_bytes`).
    layer : int
        The layer shown.
    budget_bytes : int
        The most bytes of codes the page may hold.

    Returns
    -------
    tuple of int or None
        Every layer ``0..L-1``, or ``(layer,)``, or ``None``.
    """
    one = view_layer_bytes(spec, layer)
    if view_layout(spec) == "tokens" and one * spec.num_layers <= budget_bytes:
        return tuple(range(spec.num_layers))
    return (int(layer),) if one <= budget_bytes else None


def view_layer_bytes(spec, layer: int) -> int:
    """Bytes of the codes :func:`attention_view_blob` sends for ``layer`` (before base64): a ViT's
    rows, columns and prefix keys (:func:`layer_bytes`, the same for every layer), a windowed
    layer's every window's query rows over its key slots, ``(heads + 1) · windows · Wt²``
    (Swin-T's first stage 0.6 MiB; a SAM global layer, one window of 4096 cells, 208 MiB).

    Parameters
    ----------
    spec : ViTSpec
        The model's spec.
    layer : int
        A layer index.

    Returns
    -------
    int
        Bytes of codes (the ranges, cells and mean map not counted).
    """
    if view_layout(spec) == "tokens":
        return layer_bytes(spec)
    return _windowed_bytes(spec.geometry(layer))


def attention_view_rows(record, layers) -> np.ndarray:
    """``(len(layers), heads + 1, T + 1, N)`` float32, the view's rows for image 0 of ``record``:
    ``[l, h, q]`` is token ``q``'s attention over the patch keys (:func:`analysis.attention_rows`),
    ``[l, h, T]`` the mean over the patch queries; ``h = heads`` the mean over heads.

    Parameters
    ----------
    record : AttentionRecord
        A captured pass of a ViT (:func:`analysis.capture_attention`) with every query row
        (``query_tokens=None``); image 0 is read.
    layers : sequence of int
        Model layer indices the record kept (negative count from the end), in the order wanted.

    Returns
    -------
    numpy.ndarray
        ``(len(layers), heads + 1, T + 1, N)`` float32.

    Raises
    ------
    AnalysisError
        No layer, a windowed record, a record that kept only some query rows, or a layer it did not keep.
    """
    if not layers:
        raise AnalysisError("the attention view needs at least one layer.")
    return np.stack([_with_mean_query(attention_rows(record, int(layer))[0].numpy(), record.spec) for layer in layers])


def prefix_key_rows(record, layers) -> np.ndarray:
    """``(len(layers), heads + 1, T, P)`` float32: ``[l, h, q, j]`` is token ``q``'s attention to
    prefix key ``j`` (:func:`analysis.attention_rows` with ``keys="all"``, its first ``P`` keys);
    ``h = heads`` the mean over heads. With :func:`attention_view_rows` the full ``T × T`` matrix.

    Parameters
    ----------
    record : AttentionRecord
        A captured pass of a ViT (:func:`analysis.capture_attention`) with every query row
        (``query_tokens=None``); image 0 is read.
    layers : sequence of int
        Model layer indices the record kept (negative count from the end), in the order wanted.

    Returns
    -------
    numpy.ndarray
        ``(len(layers), heads + 1, T, P)`` float32 (``P = 0``: an empty last axis).

    Raises
    ------
    AnalysisError
        No layer, a windowed record, a record that kept only some query rows, or a layer it did not keep.
    """
    if not layers:
        raise AnalysisError("the attention view needs at least one layer.")
    spec = record.spec
    return np.stack(
        [spec.split_prefix(attention_rows(record, int(layer), keys="all")[0].numpy(), -1)[0] for layer in layers]
    )


def rollout_view_rows(
    record, *, head_fusion: str = "mean", discard_ratio: float = 0.0, start_layer: int = 0
) -> tuple[list[int], np.ndarray]:
    """The rollout after each layer ``start_layer..L-1`` for every query, as view rows:
    ``(end layers, (steps, 1, T + 1, N) float32)``. ``[i, 0, q]`` is token ``q``'s row of
    ``R = Â_end ⋯ Â_start`` (:func:`analysis.attention.rollout.rollout_matrices`, the same composition) over the patch
    keys, i.e. :func:`analysis.attention_rollout` of that query with ``end_layer = start + i``;
    ``[i, 0, T]`` the mean over the patch queries (``query="mean"``). A ViT only.

    Parameters
    ----------
    record : AttentionRecord
        A captured pass of a ViT with every query row (``query_tokens=None``) and every layer from
        ``start_layer`` on; image 0 is read.
    head_fusion : str, default "mean"
        How each layer's heads are fused: ``"mean"``, ``"max"`` or ``"min"`` over heads.
    discard_ratio : float, default 0.0
        Fraction in ``[0, 1)`` of each fused matrix's weakest pairs set to 0 before the identity is mixed in.
    start_layer : int, default 0
        First layer composed (negative counts from the end).

    Returns
    -------
    tuple of (list of int, numpy.ndarray)
        ``(ends, rows)``: the end layer of each step, and ``(steps, 1, T + 1, N)`` float32 view rows.

    Raises
    ------
    AnalysisError
        A windowed record, or what :func:`analysis.attention_rollout` refuses (a bad ``head_fusion``,
        ``discard_ratio`` or ``start_layer``, missing layers or query rows).
    """
    from ..attention.rollout import rollout_steps
    from ..model.windowed_support import refuse_windowed

    refuse_windowed(record, "rollout_view_rows")
    spec = record.spec
    ends, rows = [], []
    for layer, rollout in rollout_steps(record, head_fusion, discard_ratio, start_layer, None):  # (B, T, T) float64
        every = spec.split_prefix(rollout[0].float(), -1)[1].numpy()  # (T, N)
        ends.append(layer)
        rows.append(_with_mean_query(every[None], spec))  # (1, T + 1, N)
    return ends, np.stack(rows)


def similarity_view_rows(tokens, spec) -> np.ndarray:
    """``(1, 1, T + 1, N)`` float32 view rows of one layer's tokens (a ViT's ``(1, T, D)``): row ``q``
    is token ``q``'s cosine similarity to every patch token (:func:`analysis.patch_similarity`, query
    by query: ``"prefix:<i>"``, then the patches), row ``T`` that of the mean patch token
    (``query="mean"``: the similarity to the mean, not the mean of the similarities).

    Parameters
    ----------
    tokens : torch.Tensor
        ``(B, T, D)`` tokens of one layer (image 0 is read), ``T = prefix + gh·gw`` for ``spec``.
    spec : ViTSpec
        A ViT's spec.

    Returns
    -------
    numpy.ndarray
        ``(1, 1, T + 1, N)`` float32 cosine similarities in ``[−1, 1]``.

    Raises
    ------
    AnalysisError
        A windowed model's spec.
    """
    from ..model.windowed_support import refuse_windowed
    from ..tokens.features import patch_similarity_rows

    refuse_windowed(spec, "similarity_view_rows")
    rows = patch_similarity_rows(tokens, spec).numpy()  # (T + 1, N): tokens in order, then the mean patch token
    return rows[None, None].astype(np.float32)


def _with_mean_query(rows: np.ndarray, spec) -> np.ndarray:
    """``(maps, T, N)`` -> ``(maps, T + 1, N)``: row ``T`` the mean of the patch queries' rows."""
    prefix, patches = spec.num_prefix_tokens, spec.num_patches
    mean_query = rows[:, prefix : prefix + patches].mean(axis=1, keepdims=True)  # (maps, 1, N)
    return np.concatenate([rows, mean_query], axis=1)


def quantised_view(rows: np.ndarray, spec, prefix_keys: np.ndarray | None = None) -> tuple:
    """``(layers, maps, T + 1, N)`` view rows and ``(layers, maps, T, P)`` prefix keys (or None:
    none sent) -> ``(rows, cols, pre)`` :class:`analysis.plots.QuantisedMaps` (the module
    docstring's layout; a column is "who looks at patch k" over the patch queries; ``pre`` one
    map per layer and head, ``(layers, maps, 0)`` codes when there is nothing to send).

    Parameters
    ----------
    rows : numpy.ndarray
        ``(layers, maps, T + 1, N)`` float32 view rows (:func:`attention_view_rows`,
        :func:`rollout_view_rows`, :func:`similarity_view_rows`).
    spec : ViTSpec
        A ViT's spec (its prefix and patch counts).
    prefix_keys : numpy.ndarray or None, default None
        ``(layers, maps, T, P)`` float32 (:func:`prefix_key_rows`), or ``None``: none sent.

    Returns
    -------
    tuple of QuantisedMaps
        ``(rows, cols, pre)``: codes ``(layers, maps, T + 1, N)``, ``(layers, maps, N, N)`` (quantised per
        column: key ``k`` over the patch queries) and ``(layers, maps, T · P)`` uint8, each with one
        ``(lo, hi)`` float32 per map.

    Raises
    ------
    AnalysisError
        NaN or infinite values (:func:`analysis.plots.quantise_maps`).
    """
    prefix, patches = spec.num_prefix_tokens, spec.num_patches
    cols = rows[:, :, prefix : prefix + patches].transpose(0, 1, 3, 2)  # (layers, maps, N keys, N queries)
    if prefix_keys is None or prefix_keys.shape[-1] == 0:
        pre = QuantisedMaps(np.zeros((*rows.shape[:2], 0), np.uint8), np.zeros((*rows.shape[:2], 2), np.float32))
    else:
        pre = quantise_maps(prefix_keys.reshape(*prefix_keys.shape[:2], -1))  # (layers, maps, T · P)
    return quantise_maps(rows), quantise_maps(cols), pre


def _view_maps(record, layers, rows):
    """The quantised maps of the module docstring for ``layers``: attention's own, or ``rows``
    (other maps, e.g. the rollout's, which send no prefix keys)."""
    if rows is None:
        return quantised_view(attention_view_rows(record, layers), record.spec, prefix_key_rows(record, layers))
    return quantised_view(rows, record.spec)


def view_data(record, layers, rows: np.ndarray | None = None) -> dict:
    """The view's data inline, for a page with no server to fetch it from (the report, the
    widget's static output): the same bytes as the served file (:func:`attention_view_blob`, or
    :func:`view_blob` of ``rows``), as base64 text in ``data_b64``, with the file's metadata.

    Parameters
    ----------
    record : AttentionRecord or WindowedAttentionRecord
        A captured pass (:func:`analysis.capture_attention`) with every query row; image 0 is read.
    layers : sequence of int
        The layers the data holds (:func:`layers_to_send`), or with ``rows`` the layers its first
        axis stands for.
    rows : numpy.ndarray or None, default None
        Other view rows than attention's, ``(len(layers), maps, T + 1, N)`` float32 (e.g.
        :func:`rollout_view_rows`), sent without prefix keys; ``None``, the record's attention.

    Returns
    -------
    dict
        ``data_b64`` (``str``) and the metadata of :func:`attention_view_blob` (``layers``,
        ``data_id``, ``matrix`` or ``windowed``).

    Raises
    ------
    AnalysisError
        As :func:`attention_view_blob`, or non-finite ``rows``.
    """
    blob, meta = attention_view_blob(record, layers) if rows is None else view_blob(record, layers, rows)
    return {**meta, "data_b64": base64.b64encode(blob).decode("ascii")}


def view_blob(record, layers, rows: np.ndarray | None = None) -> tuple[bytes, dict]:
    """The same maps as one binary file, for a page that fetches it once (the app: then only the
    small arguments travel with each rerun): ``row_ranges``, ``col_ranges``, ``pre_ranges``
    (little-endian float32), ``rows``, ``cols``, ``pre`` (uint8), back to back in C order.

    Parameters
    ----------
    record : AttentionRecord
        A captured pass of a ViT (:func:`analysis.capture_attention`) with every query row
        (``query_tokens=None``); image 0 is read.
    layers : sequence of int
        The layers the data holds, as in :func:`view_data`.
    rows : numpy.ndarray or None, default None
        Other view rows than attention's, ``(len(layers), maps, T + 1, N)`` float32; ``None``, the
        record's attention.

    Returns
    -------
    tuple of (bytes, dict)
        ``(blob, {"layers", "data_id", "matrix"})``; ``matrix``: whether these are attention's
        own maps, with ``pre`` (the page then offers the ``T × T`` matrix).

    Raises
    ------
    AnalysisError
        As :func:`view_data`.
    """
    layers = [int(layer) for layer in layers]
    maps = _view_maps(record, layers, rows)
    blob = b"".join(
        [np.ascontiguousarray(m.ranges, "<f4").tobytes() for m in maps]
        + [np.ascontiguousarray(m.codes).tobytes() for m in maps]
    )
    return blob, {
        "layers": layers,
        "data_id": hashlib.sha1(f"{layers}:".encode() + blob).hexdigest()[:16],
        "matrix": rows is None,
    }


def query_row(query, spec) -> int:
    """The row of ``rows`` that holds the app's query (``"cls"``, ``"prefix:<i>"``, a patch
    index, a ``(y, x)`` input pixel, ``"mean"``), parsed by :func:`analysis.records.queries.resolve_query`:
    the query's token, or ``spec.num_tokens`` (the row after the tokens) for ``"mean"``.

    Parameters
    ----------
    query : int, (y, x), str or None
        The app's query; ``None``, the default query (the class token when the model has one, else
        ``"mean"``).
    spec : ViTSpec
        A ViT's spec.

    Returns
    -------
    int
        A row index in ``0..T`` of the view's rows.

    Raises
    ------
    AnalysisError
        A query :func:`analysis.records.queries.resolve_query` refuses.
    """
    resolved = resolve_query(spec, query)
    return spec.num_tokens if resolved.mean else resolved.tokens[0]


def view_args(
    *,
    data: dict,
    image_uri: str,
    spec,
    layer: int,
    head: str | int,
    query,
    colorscale: str,
    map_range: str,
    opacity: float,
    max_height: int = 520,
    note: str = "",
    heads: int | None = None,
    head_names: list[str] | None = None,
    value_name: str = "attention probability",
    layer_label: str = "Layer",
    report_layer: bool = True,
    shared_name: str = "0–max of this layer's heads",
    panels: list[int] | None = None,
    fixed_range: tuple[float, float] | None = None,
    columns: bool = True,
    report_drawn: bool = False,
    drawn_limit_s: float = 8.0,
    report_head: bool = True,
    left_out=(),
    hide_left_out: bool = False,
) -> dict:
    """The page's arguments (what ``streamlit:render`` carries): the data, the geometry read from
    ``spec``, the shown layer / head / query, the colour scale's 256 colours and range rule
    (:func:`analysis.plots.colour_range`'s), and ``note``, shown under the view.

    Other maps than attention's (the rollout) name what they hold with ``heads``, ``head_names``,
    ``value_name``, ``layer_label``, ``shared_name`` and ``report_layer``.

    Parameters
    ----------
    data : dict
        :func:`view_data`'s dict (inline data), or :func:`view_blob`'s metadata (the page fetches the
        bytes); its ``layers`` are the held layers.
    image_uri : str
        The model-input image the maps are drawn on, as a ``data:`` URI or URL (``""`` when the caller
        fills it in later).
    spec : ViTSpec
        A ViT's spec (image and grid size, patch size, prefix tokens, heads, token names).
    layer : int
        The layer shown (one of the held layers).
    head : str or int
        ``"mean"`` or a head index.
    query : int, (y, x), str or None
        The query shown, as :func:`query_row` reads it.
    colorscale : str
        A plotly colour scale's name (:func:`analysis.plots.colour_lut`).
    map_range : str
        The colour range rule: ``"robust"``, ``"zero"``, ``"minmax"`` or ``"shared"``
        (:func:`analysis.plots.colour_range`).
    opacity : float
        The maps' opacity over the image, 0 to 1.
    max_height : int, default 520
        The view's largest height in CSS pixels.
    note : str, default ""
        Text shown under the view.
    heads : int or None, default None
        Maps per layer less one; default the model's heads, the last map their mean (the rollout: 0).
    head_names : list of str or None, default None
        One name per map; ``None``, the page's own (head indices and "mean").
    value_name : str, default "attention probability"
        What the maps' values are.
    layer_label : str, default "Layer"
        What a layer is called ("Layer", "Rollout to layer").
    report_layer : bool, default True
        Whether a layer step is reported to Python; without it ↑/↓ stay within the held layers.
    shared_name : str, default "0–max of this layer's heads"
        What the ``"shared"`` range spans.
    panels : list of int or None, default None
        Held layers drawn side by side on one colour scale (the Compare page; the ``"shared"`` range
        then spans their heads).
    fixed_range : tuple of float or None, default None
        ``(lo, hi)`` for maps on a fixed scale (cosine similarity, −1 to 1); it replaces ``map_range``
        and the uniform level.
    columns : bool, default True
        Whether to offer the "who looks at this patch" toggle (not for maps that are not attention).
    report_drawn : bool, default False
        Report ``{"event": "drawn"}`` once the first map is on the canvas (the app holds its other charts
        back until then), or ``{"event": "drawn", "late": true}`` after ``drawn_limit_s`` when no map
        came (its data never arrived).
    drawn_limit_s : float, default 8.0
        With ``report_drawn``: the seconds after the first render within which the page reports,
        drawn or not (the browser's own timer).
    report_head : bool, default True
        Whether a head step is reported (a page with a Head box follows it; there is nothing to step
        without heads, ``heads = 0``).
    left_out : iterable of int, default ()
        Row-major patch indices of the outlier tokens (:func:`analysis.tokens.outlier_patches`), which
        never set a ``"robust"`` range's top.
    hide_left_out : bool, default False
        Draw the ``left_out`` patches blank in the maps of where a patch looks.

    Returns
    -------
    dict
        The page's arguments, JSON-serialisable, ``data``'s entries included.

    Raises
    ------
    AnalysisError
        ``panels`` that are not held layers, or a query :func:`query_row` refuses.
    """
    heads = spec.num_heads if heads is None else int(heads)
    if panels is not None and not set(panels) <= {int(layer) for layer in data["layers"]}:
        raise AnalysisError(f"the view's panels {list(panels)} must be held layers ({data['layers']}).")
    return dict(
        image=image_uri,
        img_size=list(spec.img_size),
        grid=list(spec.grid_size),
        patch_size=list(spec.patch_size),
        prefix=spec.num_prefix_tokens,
        tokens=spec.num_tokens,
        heads=heads,
        token_names=list(spec.token_names),
        layer=int(layer),
        num_layers=spec.num_layers,
        head=heads if head == "mean" else int(head),
        head_names=head_names,
        query_row=query_row(query, spec),
        query_patch=int(query) if isinstance(query, int) else None,
        range_mode="fixed" if fixed_range is not None else map_range,
        fixed_range=None if fixed_range is None else [float(fixed_range[0]), float(fixed_range[1])],
        uniform=None if fixed_range is not None else 1 / spec.num_tokens,
        uniform_floor=UNIFORM_FLOOR,
        robust_quantile=ROBUST_QUANTILE,
        left_out=[int(cell) for cell in left_out],
        hide_left_out=bool(hide_left_out),
        panels=None if panels is None else [int(layer) for layer in panels],
        columns=bool(columns),
        lut=colour_lut(colorscale).ravel().tolist(),
        value_name=value_name,
        layer_label=layer_label,
        report_layer=bool(report_layer),
        shared_name=shared_name,
        report_drawn=bool(report_drawn),
        drawn_limit_s=float(drawn_limit_s),
        report_head=bool(report_head) and heads > 0,
        opacity=float(opacity),
        max_height=int(max_height),
        note=note,
        **data,
    )


def embed(args: dict, *, title: str = "instant attention view") -> str:
    """The view as a self-contained HTML fragment for a static page (the report): the page's own
    file inlined in an ``<iframe srcdoc>``, and a few lines that play Streamlit's part (answer its
    ``componentReady`` with ``streamlit:render`` and ``args``, follow ``setFrameHeight``;
    a click's value has nowhere to go). Needs no network.

    Parameters
    ----------
    args : dict
        The page's arguments (:func:`attention_view_args` or :func:`view_args`) with the data inline and
        the image as a ``data:`` URI.
    title : str, default "instant attention view"
        The iframe's title (HTML-escaped).

    Returns
    -------
    str
        An ``<iframe>`` and two ``<script>`` elements, to be placed in a page as they are.
    """
    page = PAGE.read_text(encoding="utf-8")
    payload = json.dumps(args, separators=(",", ":")).replace("</", "<\\/")
    return (
        f"<iframe class='attention-view' title='{html.escape(title)}' style='width:100%;border:0;height:560px' "
        f'srcdoc="{html.escape(page, quote=True)}"></iframe>'
        f"<script type='application/json' class='attention-view-args'>{payload}</script>"
        "<script>(function () {"
        "const data = document.currentScript.previousElementSibling, frame = data.previousElementSibling;"
        "const args = JSON.parse(data.textContent);"
        "window.addEventListener('message', (event) => {"
        " if (event.source !== frame.contentWindow || !event.data) return;"
        " if (event.data.type === 'streamlit:componentReady')"
        "  frame.contentWindow.postMessage({type: 'streamlit:render', args: args, dfs: [], disabled: false}, '*');"
        " if (event.data.type === 'streamlit:setFrameHeight') frame.style.height = event.data.height + 'px';"
        "});"
        "})();</script>"
    )


# --------------------------------------------------------------------------- windowed models (Swin, SAM)


def _windowed_bytes(geometry) -> int:
    """Bytes of one windowed layer's codes (:func:`_windowed_blob`): every window's every
    query slot over its key slots, per head and their mean. Swin-T stage 1: 0.6 MiB; a SAM
    global layer (one window of 4096 cells): 208 MiB, no view.

    Parameters
    ----------
    geometry : LayerGeometry
        The layer's geometry (``spec.geometry(layer)``): heads, windows, slots ``Wt`` a window.

    Returns
    -------
    int
        ``(heads + 1) · windows · Wt²`` (the ranges, cells and mean map not counted).
    """
    return (geometry.num_heads + 1) * geometry.num_windows * geometry.window_tokens**2


def _windowed_blob(record, layer: int) -> tuple[bytes, dict]:
    """One windowed layer of image 0 of ``record`` (a :class:`analysis.records.windowed.WindowedAttentionRecord`)
    for the view, as one binary file. Back to back in C order, ``Wt`` slots a window, ``N`` cells:

    * ``row_ranges``: ``(heads + 1, windows, Wt, 2)`` float32, ``mean_ranges``: ``(heads + 1, 2)``;
    * ``cells``: ``(windows, Wt)`` int32, the grid cell of each slot (``−1``: padding or prefix),
      :meth:`analysis.model.geometry.LayerGeometry.window_cells`;
    * ``rows``: ``(heads + 1, windows, Wt, Wt)`` uint8: ``[h, w, s, t]`` is the attention of the
      query in slot ``s`` of window ``w`` to key slot ``t`` (``record.windows``; head ``heads`` the
      mean over heads), quantised per row, the keys off the grid set to 0 (never drawn);
    * ``mean``: ``(heads + 1, N)`` uint8, :func:`analysis.attention_map` with ``query="mean"``.

    Scattered onto the grid, a query cell's row is :func:`analysis.attention_map` of that cell
    (zero outside its window, which the page leaves undrawn).

    Parameters
    ----------
    record : WindowedAttentionRecord
        A captured pass of a windowed model (Swin, SAM); image 0 is read.
    layer : int
        A model layer index the record kept.

    Returns
    -------
    tuple of (bytes, dict)
        ``(blob, {"layers": [layer], "windowed": True, "data_id"})``.

    Raises
    ------
    AnalysisError
        A layer the record did not keep.
    """
    from ..attention.maps import attention_map

    geometry = record.spec.geometry(layer)
    heads, cells = geometry.num_heads, geometry.window_cells()  # (windows, Wt)
    probs = record.layer_windows(layer)[0].float()  # (windows, heads, Wt, Wt)
    with_mean = torch.cat([probs, probs.mean(dim=1, keepdim=True)], dim=1).transpose(
        0, 1
    )  # (heads + 1, windows, Wt, Wt)
    on_grid = (cells >= 0)[None, :, None, :]  # key slots that are grid cells
    rows = quantise_maps(with_mean.masked_fill(~on_grid, 0.0).numpy())
    mean = quantise_maps(
        np.stack(
            [attention_map(record, layer, head=head, query="mean")[0].numpy().ravel() for head in [*range(heads), None]]
        )
    )
    blob = b"".join(
        [
            np.ascontiguousarray(rows.ranges, "<f4").tobytes(),
            np.ascontiguousarray(mean.ranges, "<f4").tobytes(),
            np.ascontiguousarray(cells.numpy(), "<i4").tobytes(),
            np.ascontiguousarray(rows.codes).tobytes(),
            np.ascontiguousarray(mean.codes).tobytes(),
        ]
    )
    return blob, {
        "layers": [int(layer)],
        "windowed": True,
        "data_id": hashlib.sha1(f"windowed {layer}:".encode() + blob).hexdigest()[:16],
    }


def _windowed_args(
    *,
    data: dict,
    image_uri: str,
    spec,
    layer: int,
    head: str | int,
    query_cell: int | None,
    colorscale: str,
    map_range: str,
    opacity: float,
    max_height: int = 520,
    note: str = "",
    report_head: bool = True,
    report_drawn: bool = False,
    drawn_limit_s: float = 8.0,
) -> dict:
    """The page's arguments for one windowed layer (:func:`_windowed_blob`'s ``data``): the
    layer's own grid (cells of its stride), its heads, the query as a cell of that grid (``None``:
    the mean over cells), the uniform level ``1/Wt`` of a window, whether a head step is reported
    (``report_head``; the layer is the page's alone). Rows only: a key's "who looks
    at it" is not offered (each row is quantised on its own range).

    Parameters
    ----------
    data : dict
        :func:`_windowed_blob`'s metadata.
    image_uri : str
        The model-input image, as a ``data:`` URI or URL (``""`` when the caller fills it in later).
    spec : ViTSpec
        The windowed model's spec (``spec.geometry(layer)`` gives the layer's grid, stride and heads).
    layer : int
        The layer shown.
    head : str or int
        ``"mean"`` or a head index.
    query_cell : int or None
        The query, a row-major cell of the layer's grid; ``None``, the mean over cells.
    colorscale : str
        A plotly colour scale's name (:func:`analysis.plots.colour_lut`).
    map_range : str
        The colour range rule (:func:`analysis.plots.colour_range`).
    opacity : float
        The maps' opacity over the image, 0 to 1.
    max_height : int, default 520
        The view's largest height in CSS pixels.
    note : str, default ""
        Text shown under the view.
    report_head : bool, default True
        Whether a head step is reported to Python.
    report_drawn : bool, default False
        Report ``{"event": "drawn"}`` once the first map is drawn (:func:`view_args`).
    drawn_limit_s : float, default 8.0
        With ``report_drawn``: the seconds within which the page reports, drawn or not.

    Returns
    -------
    dict
        The page's arguments, JSON-serialisable, ``data``'s entries included.
    """
    geometry = spec.geometry(layer)
    heads, cells = geometry.num_heads, geometry.grid_size[0] * geometry.grid_size[1]
    return dict(
        image=image_uri,
        img_size=list(spec.img_size),
        grid=list(geometry.grid_size),
        patch_size=list(geometry.stride),
        prefix=0,
        tokens=cells,
        heads=heads,
        token_names=[],
        layer=int(layer),
        num_layers=spec.num_layers,
        head=heads if head == "mean" else int(head),
        head_names=None,
        query_row=cells if query_cell is None else int(query_cell),
        query_patch=query_cell,
        range_mode=map_range,
        uniform=1 / geometry.window_tokens,
        uniform_floor=UNIFORM_FLOOR,
        robust_quantile=ROBUST_QUANTILE,
        lut=colour_lut(colorscale).ravel().tolist(),
        value_name="attention probability",
        layer_label="Layer",
        report_layer=False,
        report_head=bool(report_head),
        report_drawn=bool(report_drawn),
        drawn_limit_s=float(drawn_limit_s),
        shared_name="0–max of this layer's heads",
        panels=None,
        fixed_range=None,
        columns=False,
        unit="cell",
        windows=geometry.num_windows,
        window_tokens=geometry.window_tokens,
        matrix=False,
        opacity=float(opacity),
        max_height=int(max_height),
        note=note,
        **data,
    )


# --------------------------------------------------------------------------- every model: one entry point


def attention_view_blob(record, layers) -> tuple[bytes, dict]:
    """The view's data for ``layers`` of image 0 of ``record``, as one binary file, for any model:
    a ViT's rows, columns and prefix keys of every held layer (:func:`view_blob`), or one windowed
    layer's windows. The windowed layout, back to back in C order, ``Wt`` slots a window, ``N`` cells:

    * ``row_ranges``: ``(heads + 1, windows, Wt, 2)`` float32, ``mean_ranges``: ``(heads + 1, 2)``;
    * ``cells``: ``(windows, Wt)`` int32, the grid cell of each slot (``−1``: padding or prefix),
      :meth:`analysis.model.geometry.LayerGeometry.window_cells`;
    * ``rows``: ``(heads + 1, windows, Wt, Wt)`` uint8: ``[h, w, s, t]`` is the attention of the
      query in slot ``s`` of window ``w`` to key slot ``t`` (head ``heads`` the mean over heads),
      quantised per row, the keys off the grid set to 0 (never drawn);
    * ``mean``: ``(heads + 1, N)`` uint8, :func:`analysis.attention_map` with ``query="mean"``.

    Parameters
    ----------
    record : AttentionRecord or WindowedAttentionRecord
        A captured pass (:func:`analysis.capture_attention`) with every query row; image 0 is read.
    layers : sequence of int
        The layers to hold (:func:`layers_to_send`): any kept layers of a ViT, one layer of a
        windowed model.

    Returns
    -------
    tuple of (bytes, dict)
        ``(blob, meta)``: ``meta`` has ``layers``, ``data_id`` (16 hex digits) and ``matrix`` (a ViT)
        or ``windowed`` (a windowed layer), which :func:`attention_view_args` passes on.

    Raises
    ------
    AnalysisError
        A layer the record did not keep, query rows it did not keep, or several layers of a
        windowed model.
    """
    layers = [int(layer) for layer in layers]
    if view_layout(record) == "tokens":
        return view_blob(record, layers)
    if len(layers) != 1:
        raise AnalysisError(
            f"the view holds one layer of a model whose layers attend inside windows, not {layers}: "
            "its layers lie on different grids; send one layer (layers_to_send)."
        )
    return _windowed_blob(record, layers[0])


def view_query(spec, layer: int, query):
    """The query as the view reads it for ``layer``: a ViT's token query
    (:func:`analysis.records.queries.resolve_query`: ``None`` → ``"cls"`` with a class token, else
    ``"mean"``; an input pixel ``(y, x)`` → its patch), a windowed layer's cell of its own grid or
    ``"mean"`` (``None`` → ``"mean"``; an input pixel → the cell that holds it).

    Parameters
    ----------
    spec : ViTSpec
        The model's spec.
    layer : int
        The layer shown.
    query : int, (y, x), str or None
        ``"cls"``, ``"prefix:<i>"``, a patch (cell) index, an input pixel, ``"mean"`` or ``None``.

    Returns
    -------
    int or str
        A patch or cell index, or a token name (``"cls"``, ``"prefix:<i>"``, ``"mean"``).

    Raises
    ------
    AnalysisError
        A query the model's layer does not have (a prefix token of a windowed layer, a cell off its
        grid, a pixel outside the image).
    """
    if view_layout(spec) == "tokens":
        return resolve_query(spec, query).query
    geometry = spec.geometry(layer)
    cells = geometry.grid_size[0] * geometry.grid_size[1]
    if query is None or query == "mean":
        return "mean"
    if isinstance(query, tuple) and len(query) == 2:
        (height, width), (y, x) = spec.img_size, query
        if not (0 <= y < height and 0 <= x < width):
            raise AnalysisError(f"query pixel {query!r} is outside the {height}×{width} input image.")
        return int(geometry.cell_of_pixel(y, x))
    if isinstance(query, numbers.Integral) and not isinstance(query, bool) and 0 <= int(query) < cells:
        return int(query)
    raise AnalysisError(
        f"query={query!r}: layer {layer} attends inside windows on a {geometry.grid_size[0]}×"
        f"{geometry.grid_size[1]} grid; its queries are a cell index (0..{cells - 1}), an input pixel "
        "(y, x) or 'mean'."
    )


def follow_query(spec, query, from_layer: int, to_layer: int):
    """The view's query of layer ``from_layer`` (:func:`view_query`) as the same place on layer
    ``to_layer``: a cell moves to the cell of ``to_layer``'s grid under its centre pixel (a Swin's
    stages have grids of different strides; a ViT's patch stays itself); a token name stays.

    Parameters
    ----------
    spec : ViTSpec
        The model's spec.
    query : int or str
        A cell of ``from_layer``'s grid, or a token name (``"cls"``, ``"prefix:<i>"``, ``"mean"``).
    from_layer, to_layer : int
        The layer the query was read on, and the layer shown next.

    Returns
    -------
    int or str
        The query on ``to_layer`` (:func:`view_query`'s form).
    """
    if not isinstance(query, numbers.Integral) or isinstance(query, bool):
        return query
    return view_query(spec, to_layer, spec.geometry(from_layer).cell_centre(int(query)))


def attention_view_args(
    *,
    data: dict,
    image_uri: str,
    spec,
    layer: int,
    head: str | int,
    query,
    colorscale: str,
    map_range: str,
    opacity: float,
    query_cell: int | None = None,
    max_height: int = 520,
    note: str = "",
    report_head: bool = True,
    report_drawn: bool = False,
    drawn_limit_s: float = 8.0,
    left_out=(),
    hide_left_out: bool = False,
) -> dict:
    """The page's arguments for attention's own maps of any model (:func:`attention_view_blob`'s
    data): :func:`view_args` for a ViT; for a windowed layer its own grid (cells of its stride),
    its heads, the query as a cell of that grid, the uniform level ``1/Wt`` of a window, rows only
    (each row is quantised on its own range, so "who looks at this key" is not offered).

    Parameters
    ----------
    data : dict
        :func:`attention_view_blob`'s metadata (the page fetches the bytes), or :func:`view_data`
        (inline).
    image_uri : str
        The model-input image, as a ``data:`` URI or URL (``""`` when the caller fills it in later).
    spec : ViTSpec
        The model's spec.
    layer : int
        The layer shown (one of the held layers).
    head : str or int
        ``"mean"`` or a head index.
    query : int, (y, x), str or None
        The query shown (:func:`view_query`).
    colorscale : str
        A plotly colour scale's name (:func:`analysis.plots.colour_lut`).
    map_range : str
        The colour range rule (:func:`analysis.plots.colour_range`).
    opacity : float
        The maps' opacity over the image, 0 to 1.
    query_cell : int or None, default None
        A windowed layer's query cell when the caller has it already (the app maps its query onto
        the layer's grid); ``None``, read from ``query``. A ViT's view ignores it.
    max_height : int, default 520
        The view's largest height in CSS pixels.
    note : str, default ""
        Text shown under the view.
    report_head : bool, default True
        Whether a head step is reported to Python.
    report_drawn : bool, default False
        Report ``{"event": "drawn"}`` once the first map is drawn (:func:`view_args`).
    drawn_limit_s : float, default 8.0
        With ``report_drawn``: the seconds within which the page reports, drawn or not.
    left_out : iterable of int, default ()
        Outlier patches of a ViT's one patch grid (:func:`view_args`); a windowed layer has none.
    hide_left_out : bool, default False
        Draw ``left_out`` blank (:func:`view_args`).

    Returns
    -------
    dict
        The page's arguments, JSON-serialisable, ``data``'s entries included.

    Raises
    ------
    AnalysisError
        A query :func:`view_query` refuses.
    """
    style = dict(
        data=data,
        image_uri=image_uri,
        spec=spec,
        layer=layer,
        head=head,
        colorscale=colorscale,
        map_range=map_range,
        opacity=opacity,
        max_height=max_height,
        note=note,
        report_head=report_head,
        report_drawn=report_drawn,
        drawn_limit_s=drawn_limit_s,
    )
    if view_layout(spec) == "tokens":
        shown = view_query(spec, layer, query)  # an input pixel -> its patch, which the page pins
        return view_args(**style, query=shown, left_out=left_out, hide_left_out=hide_left_out)
    if query_cell is None:
        shown = view_query(spec, layer, query)
        query_cell = None if shown == "mean" else int(shown)
    return _windowed_args(**style, query_cell=query_cell)
