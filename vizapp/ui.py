"""Small streamlit helpers shared by the pages: charts with downloads, shared controls."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Sequence
from typing import Literal, NoReturn, cast

import numpy as np
import plotly.graph_objects as go
import streamlit as st
from PIL import Image

from analysis import ViTSpec, corresponding_query
from analysis.records.queries import parse_prefix_query, prefix_query

# Settings of the shared controls (head, query) kept across page switches (vizapp.views.persistent_keys).
KEPT_KEYS = ("head", "query_mode", "query_patch", "query_prefix")

__all__ = [
    "plot_config",
    "show_chart",
    "npz_bytes",
    "csv_bytes",
    "download_npz",
    "download_csv",
    "download_png",
    "png_bytes",
    "clamp_state",
    "query_controls",
    "selected_point",
    "describe_query",
    "patch_click",
    "head_control",
    "head_label",
    "PageRefused",
    "refuse_page",
    "stride_of_map",
    "headless_output",
]


def plot_config(filename: str) -> dict:
    """Plotly toolbar: PNG download at 2x, no plotly logo; the mouse wheel scrolls the page
    (zoom with the toolbar or a drag instead)."""
    return {
        "displaylogo": False,
        "scrollZoom": False,
        "toImageButtonOptions": {"format": "png", "filename": filename, "scale": 2},
        "modeBarButtonsToRemove": ["lasso2d", "select2d", "autoScale2d"],
    }


def show_chart(
    fig: go.Figure,
    key: str,
    *,
    filename: str,
    on_select: Callable[[], None] | None = None,
):
    """``st.plotly_chart`` with a PNG toolbar button; clicking points calls ``on_select``.

    A figure with its own ``layout.width`` (a thumbnail mosaic sized to its tiles) is drawn at
    that width (at most the column's); any other fills the column.

    ``theme=None``: Streamlit's chart theme rewrites colour scales (it replaces the dark first
    stop of Magma and Inferno with pink), so the figure is drawn exactly as built.
    """
    width: Literal["content", "stretch"] = "content" if fig.layout.width else "stretch"  # sized to its tiles: kept
    if on_select is None:
        return st.plotly_chart(fig, key=key, config=plot_config(filename), width=width, theme=None)
    return st.plotly_chart(
        fig,
        key=key,
        config=plot_config(filename),
        width=width,
        theme=None,
        on_select=on_select,
        selection_mode="points",
    )


def npz_bytes(**arrays) -> bytes:
    buffer = io.BytesIO()
    # numpy's stub types every keyword as its allow_pickle flag; these are the arrays' names
    np.savez_compressed(buffer, **{k: np.asarray(v) for k, v in arrays.items()})  # type: ignore[arg-type]
    return buffer.getvalue()


def csv_bytes(header: Sequence[str], rows: Sequence[Sequence]) -> bytes:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([f"{v:.6g}" if isinstance(v, float) else v for v in row] for row in rows)
    return buffer.getvalue().encode()


def download_npz(key: str, filename: str, label: str = "Data (.npz)", /, **arrays) -> None:
    """A download button for the figure's data; the file is only built when clicked (``arrays``: any
    names, ``key`` and ``label`` included: the first three are positional)."""
    st.download_button(
        label,
        data=lambda: npz_bytes(**arrays),
        file_name=f"{filename}.npz",
        mime="application/octet-stream",
        key=key,
        on_click="ignore",
        icon=":material/download:",
    )


def png_bytes(image) -> bytes:
    """``(H, W, 3)`` uint8 -> lossless PNG bytes."""
    buffer = io.BytesIO()
    Image.fromarray(np.asarray(image, dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def download_png(key: str, filename: str, image, label: str = "Image (.png)") -> None:
    """A download button for an image shown with ``st.image``; built only when clicked."""
    st.download_button(
        label,
        data=lambda: png_bytes(image),
        file_name=f"{filename}.png",
        mime="image/png",
        key=key,
        on_click="ignore",
        icon=":material/download:",
    )


def download_csv(
    key: str, filename: str, header: Sequence[str], rows: Sequence[Sequence], label: str = "Data (.csv)"
) -> None:
    """A download button for tabular data (curves); the file is only built when clicked."""
    st.download_button(
        label,
        data=lambda: csv_bytes(header, rows),
        file_name=f"{filename}.csv",
        mime="text/csv",
        key=key,
        on_click="ignore",
        icon=":material/download:",
    )


WIDGET_OPTIONS = "_widget_options"  # session key: key -> the options or range its widget was last drawn with


def clamp_state(key: str, options_or_range, default, *, widget: bool = True) -> None:
    """Before a widget is drawn: reset its stored value to ``default`` if the current model cannot
    take it (fewer layers, heads or patches than the previous model), and write a value it can
    take back when the options changed since the last run: a widget drawn with other options is a
    new widget to Streamlit, which keeps a key's value only when this run set it, and otherwise
    shows the widget's own default (a model switch showed layer 0 of the new model).
    ``widget=False``: a check before the widget's own (another range), which neither records
    the options nor writes back."""
    changed = False
    if widget:
        drawn = st.session_state.setdefault(WIDGET_OPTIONS, {})
        options = tuple(options_or_range)
        changed = drawn.get(key) != options
        drawn[key] = options
    if key not in st.session_state:
        return
    value = st.session_state[key]
    if (
        isinstance(options_or_range, tuple)
        and len(options_or_range) == 2
        and all(isinstance(v, (int, float)) for v in options_or_range)
    ):
        lo, hi = options_or_range
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and lo <= value <= hi
    else:
        ok = value in list(options_or_range)
    if not ok:
        st.session_state[key] = default
    elif changed:
        st.session_state[key] = value


def head_label(head: str | int) -> str:
    return "mean over heads" if head == "mean" else f"head {head}"


def head_control(spec: ViTSpec, *, key: str = "head", heads: int | None = None) -> str | int:
    """The head picker shared by the pages: ``"mean"`` or a head index of this model
    (``heads``: how many to offer, default ``spec.num_heads``)."""
    choices: list[str | int] = ["mean", *range(spec.num_heads if heads is None else heads)]
    clamp_state(key, choices, "mean")
    head = st.selectbox("Head", choices, format_func=head_label, key=key)
    assert head is not None, "a selectbox with options and no index=None always has a value"
    return head


QUERY_LABELS = {"cls": "class token", "mean": "mean over patches", "patch": "one patch", "prefix": "prefix token"}


def query_controls(spec: ViTSpec, *, container=None) -> str | int:
    """The shared query picker (keys ``query_mode`` and ``query_patch``).

    Returns the ``analysis`` query: ``"cls"``, ``"mean"``, a row-major patch index, or
    ``"prefix:<i>"`` for models with prefix tokens besides the class token (registers,
    distillation: key ``query_prefix``, picked by name). Models without a class token start on ``"mean"``.
    """
    container = container or st
    previous_grid = st.session_state.get("_query_grid")
    if (
        previous_grid is not None
        and tuple(previous_grid) != tuple(spec.grid_size)
        and "query_patch" in st.session_state
    ):
        # another model or resolution: the same place in the image, not the same index
        st.session_state["query_patch"] = corresponding_query(
            int(st.session_state["query_patch"]),
            (previous_grid[0], previous_grid[1]),
            (spec.grid_size[0], spec.grid_size[1]),
            True,
        )
    st.session_state["_query_grid"] = tuple(spec.grid_size)
    modes = ["cls", "mean", "patch"] if spec.has_class_token else ["mean", "patch"]
    names = spec.token_names
    if spec.num_prefix_tokens > int(spec.has_class_token):  # registers or a distillation token
        modes.append("prefix")
    clamp_state("query_mode", modes, modes[0])
    last = spec.num_patches - 1
    gh, gw = spec.grid_size
    centre = (gh // 2) * gw + gw // 2
    st.session_state.setdefault("query_patch", centre)
    clamp_state("query_patch", (0, last), centre)
    mode = container.radio(
        "Query",
        modes,
        format_func=QUERY_LABELS.get,
        key="query_mode",
        horizontal=True,
        help="Whose attention to show: the class token's, the average over all patch queries, "
        "or one patch's (click the image to pick it).",
    )
    patch = container.number_input(
        f"Query patch (row-major, 0..{last}; grid {spec.grid_size[0]}×{spec.grid_size[1]})",
        min_value=0,
        max_value=last,
        step=1,
        key="query_patch",
        disabled=mode != "patch",
    )
    if mode == "prefix":
        tokens = list(range(spec.num_prefix_tokens))
        clamp_state("query_prefix", tokens, tokens[-1])
        st.session_state.setdefault("query_prefix", tokens[-1])
        token = container.selectbox(
            "Prefix token", tokens, format_func=lambda i: f"{names[i]} token (token {i})", key="query_prefix"
        )
        return prefix_query(int(token))
    return int(patch) if mode == "patch" else mode


def describe_query(query: str | int, spec: ViTSpec) -> str:
    token = parse_prefix_query(query)
    if token is not None:
        return f"{spec.token_names[token]} token"
    if isinstance(query, int):
        r, c = divmod(query, spec.grid_size[1])
        return f"patch {query} (row {r}, col {c})"
    return QUERY_LABELS[query]


def selected_point(chart_key: str) -> dict | None:
    """The first clicked point of a chart's selection state, or None."""
    event = st.session_state.get(chart_key)
    if not event:
        return None
    selection = event.get("selection") if isinstance(event, dict) else getattr(event, "selection", None)
    if not selection:
        return None
    points = selection.get("points") if isinstance(selection, dict) else getattr(selection, "points", None)
    return points[0] if points else None


def patch_click(chart_key: str, grids: Sequence[tuple[int, int]], to_grid: tuple[int, int]) -> Callable[[], None]:
    """A chart's ``on_select``: the clicked patch becomes the query.

    The chart's click targets carry ``customdata = [patch index, panel]``; panel ``i`` is on
    grid ``grids[i]``, and its patch is mapped to the same image position on ``to_grid``
    (the current model's grid).
    """

    def on_click() -> None:
        point = selected_point(chart_key)
        if not point:
            return
        custom = point_customdata(point)
        index = point_index(point)
        panel = int(round(float(custom[1]))) if custom is not None and len(custom) > 1 else 0
        if index is None or not 0 <= panel < len(grids):
            return
        grid = (int(grids[panel][0]), int(grids[panel][1]))
        if not 0 <= index < grid[0] * grid[1]:
            return
        st.session_state["query_mode"] = "patch"
        moved = corresponding_query(index, grid, (int(to_grid[0]), int(to_grid[1])), True)  # an index in: an index out
        st.session_state["query_patch"] = int(cast(int, moved))

    return on_click


def point_customdata(point: dict) -> list | None:
    """A clicked point's ``customdata`` as a list, or None. A figure built from a 2-D numpy
    ``customdata`` reaches the browser as a typed array, and its row comes back from Streamlit
    as a dict ``{"0": ..., "1": ...}``; a plain list comes back as a list."""
    custom = point.get("customdata")
    if isinstance(custom, dict):
        try:
            return [custom[str(i)] for i in range(len(custom))]
        except KeyError:
            return None
    return list(custom) if isinstance(custom, (list, tuple)) else None


def point_index(point: dict) -> int | None:
    """Index of a clicked point of our click-target scatter (customdata[0], else point index)."""
    custom = point_customdata(point)
    if custom:
        return int(round(float(custom[0])))
    for name in ("point_index", "point_number", "pointIndex", "pointNumber"):
        if point.get(name) is not None:
            return int(point[name])
    return None


class PageRefused(Exception):
    """Raised by :func:`refuse_page`; ``app.py`` catches it after the page, so the run ends
    cleanly (URL and timing still published) with the reason on screen."""


def refuse_page(exc: Exception) -> None:
    """End the page here, showing why the library refused it (a typed ``AnalysisError``, e.g.
    an analysis not yet defined for windowed models) as an info box, never a traceback."""
    from vizapp.messages import error_text

    st.info(error_text(exc), icon=":material/block:")
    raise PageRefused(str(exc)) from exc


def end_page() -> NoReturn:
    """End the page here, after it has said why there is nothing more to show (an info box): as
    :func:`refuse_page`, ``app.py`` then still publishes the URL and the sidebar's server time, which
    ``st.stop()`` would skip."""
    raise PageRefused("the page ended early")


def stride_of_map(image_size: tuple[int, int], grid: tuple[int, int]) -> tuple[int, int]:
    """The cell size ``(sy, sx)`` in input pixels of a ``grid`` map over an ``image_size``
    ``(H, W)`` input: read from the map itself, so a result on any stage grid (windowed models)
    is drawn where it belongs."""
    (height, width), (gh, gw) = image_size, grid
    return (max(1, height // gh), max(1, width // gw))


def headless_output(spec: ViTSpec) -> str:
    """What a model without a head (``head == "none"``) outputs, in words: ``"pooled features"``
    for a ViT (its pooled tokens), ``"features"`` for a model whose layers attend inside windows (its
    last stage's)."""
    return "pooled features" if all(g.is_global for g in spec.geometries()) else "features"


def predictions_panel(cur) -> None:
    """The Attention page's right column: the top-5 predictions (with the demo model's scope note),
    or why there are none (an embedding tower, or no head). ``cur``: the page's ``state.Current``."""
    from analysis.plots import predictions_bar
    from vizapp import inputs, resources
    from vizapp.messages import demo_scope_note

    spec = cur.spec
    if spec.has_classifier:
        st.subheader("Top-5 predictions")
        names, probabilities = resources.top_predictions(*cur.args)
        show_chart(predictions_bar(names, probabilities), "predictions", filename="predictions")
        scope = demo_scope_note(cur.model.source, cur.vit.class_names, inputs.is_demo_scene(cur.image))
        if scope:
            st.caption(scope)
    elif spec.head == "embedding":
        st.caption(
            f"No class predictions: this model's head projects to a {spec.num_outputs}-d image embedding "
            "(CLIP/SigLIP/PE tower), not to classes."
        )
    else:
        st.caption(
            f"No class predictions: this model has no classification head (its output is {headless_output(spec)})."
        )


def outlier_notice(cur, grid_map, what: str = "this map") -> bool:
    """A notice when the image's outlier tokens (``cur.outliers``) stand out in ``grid_map``
    (:func:`analysis.tokens.dominated_by_outliers`): which patches, their share of the map's mass
    ("dominate" only when it is a majority),
    what the colour range does about them, and a link to the Tokens page that finds them.
    Returns whether it was shown (a page with several maps shows it once, for the first)."""
    from analysis.tokens import dominated_by_outliers, outlier_share

    cells = cur.left_out(grid_map)
    values = np.nan_to_num(np.asarray(grid_map, dtype=np.float64))
    if not cells or not dominated_by_outliers(values, cells):
        return False
    gw = cur.spec.grid_size[1]
    named = ", ".join(f"{c} (row {c // gw}, col {c % gw})" for c in cells[:6]) + (" …" if len(cells) > 6 else "")
    share = outlier_share(values, cells)
    one = len(cells) == 1
    verb = ("dominates" if one else "dominate") if share > 0.5 else ("stands out in" if one else "stand out in")
    token_word = f"{'token' if one else 'tokens'} {verb}"
    largest = int(np.argmax(values)) in set(cells)
    blanked = (
        "they are drawn blank"
        if cur.hide_outliers
        else "tick **Leave outlier tokens out of the maps** in the sidebar to draw them blank"
    )
    st.info(
        f"**{len(cells)} outlier {token_word} {what}**: patch {named} hold "
        f"{share:.0%} of its mass{' (and its largest cell)' if largest and share <= 0.5 else ''}. They are high-norm tokens (Darcet et al. 2024, "
        '"Vision Transformers Need Registers"), not necessarily where the object is. The default colour range '
        f"leaves them out of its top; {blanked}.",
        icon=":material/report:",
    )
    st.page_link(
        "views/tokens/tokens.py", label="See the outlier tokens on the Tokens page", icon=":material/scatter_plot:"
    )
    return True
