"""The instant attention view as a Jupyter widget (JupyterLab, Notebook 7, VS Code), via anywidget.

The widget's front end is the view page itself, ``analysis/views/attention_view_page/index.html``, read
at import time and inlined in the widget's ES module (:data:`WIDGET_ESM`): the module puts the
page in an ``<iframe srcdoc>`` and plays Streamlit's part of the page's message protocol, as
:func:`analysis.views.attention_view.embed` does for the report, with a few lines more:

* ``streamlit:componentReady`` -> ``streamlit:render`` with the arguments
  (:func:`analysis.views.attention_view.attention_view_args`, or ``view_args`` for other maps);
* ``streamlit:setComponentValue`` (a click, a layer or head step) -> the widget's traits
  ``query``, ``layer`` and ``head``, which Python reads;
* a change of those traits from Python -> new arguments -> the page redraws.

The data goes to the browser once, as the binary file the app serves
(:func:`analysis.views.attention_view.view_blob`: the same quantised layout, every layer under the
budget), in a bytes trait; only a layer the page does not hold sends new data. Hover stays in
the browser.

Where the front end has no widget support (a notebook rendered on a website), the output's
``text/html`` is the report's self-contained view (:func:`analysis.views.attention_view.embed`), and
the widget's ``figure()`` gives the plotly figure of the shown map.

anywidget is optional: ``pip install "vit-explorer[notebook]"``; without it
:func:`attention_view` raises :class:`NotebookDependencyError`.
"""

from __future__ import annotations

import json
from functools import lru_cache

import numpy as np

from .. import plots
from ..attention.maps import attention_map
from ..base.errors import AnalysisError
from ..records.queries import resolve_query
from .attention_view import (
    PAGE,
    attention_view_args,
    attention_view_blob,
    embed,
    follow_query,
    layers_to_send,
    view_args,
    view_blob,
    view_layer_bytes,
    view_query,
)

__all__ = [
    "DEFAULT_BUDGET_MB",
    "WIDGET_ESM",
    "NotebookDependencyError",
    "attention_view",
    "compare_layers_view",
    "rollout_view",
    "token_similarity_view",
    "widget_class",
]

DEFAULT_BUDGET_MB = 64.0  # codes held in the page: every layer of a ViT-B/16 (11.5 MiB) fits

# The thin adapter between the widget's model and the page (the page itself is not changed).
_ADAPTER = r"""
function toBase64(view) {  // DataView -> base64 text (the page decodes args.data_b64)
  const bytes = new Uint8Array(view.buffer, view.byteOffset, view.byteLength);
  let text = "";
  for (let i = 0; i < bytes.length; i += 32768) text += String.fromCharCode.apply(null, bytes.subarray(i, i + 32768));
  return btoa(text);
}

function render({ model, el }) {
  const frame = document.createElement("iframe");
  frame.className = "attention-view";
  frame.title = "instant attention view";
  frame.style.cssText = "width:100%;border:0;height:560px";
  frame.srcdoc = PAGE;
  el.appendChild(frame);
  let ready = false, encoded = null, encodedId = null;
  function args() {
    const a = Object.assign({}, model.get("_args"));
    if (encodedId !== a.data_id) { encoded = toBase64(model.get("_data")); encodedId = a.data_id; }
    return Object.assign(a, {image: model.get("_image"), data_url: "widget:inline", data_b64: encoded});
  }
  function post() {
    if (ready) frame.contentWindow.postMessage({type: "streamlit:render", args: args(), dfs: [], disabled: false}, "*");
  }
  function onMessage(event) {
    if (event.source !== frame.contentWindow || !event.data) return;
    const message = event.data;
    if (message.type === "streamlit:componentReady") { ready = true; post(); }
    if (message.type === "streamlit:setFrameHeight") frame.style.height = message.height + "px";
    if (message.type === "streamlit:setComponentValue" && message.value) {
      const value = message.value;
      if (value.event === "click") model.set("query", value.patch);
      if ("layer" in value) model.set("layer", value.layer);
      if ("head" in value) model.set("head", value.head);
      model.save_changes();
    }
  }
  window.addEventListener("message", onMessage);
  model.on("change:_args", post);
  return () => { window.removeEventListener("message", onMessage); model.off("change:_args", post); };
}

export default { render };
"""

#: The widget's ES module: the view page's own text, then the adapter. Built from the page file at
#: import time, so the widget always runs the page's script (tests/test_widgets.py checks it).
WIDGET_ESM = f"const PAGE = {json.dumps(PAGE.read_text(encoding='utf-8'))};\n{_ADAPTER}"


class NotebookDependencyError(AnalysisError, ImportError):
    """The notebook widgets need anywidget, which is not installed."""


@lru_cache(maxsize=1)
def widget_class():
    """The widget class (``AttentionViewWidget``), defined on first use so that the library
    imports without anywidget. Raises:
        NotebookDependencyError: anywidget is not installed.
    """
    try:
        import anywidget
        import traitlets
    except ImportError as exc:
        raise NotebookDependencyError(
            f'the notebook widgets need anywidget ({exc}); install it with: pip install "vit-explorer[notebook]".'
        ) from exc

    class AttentionViewWidget(anywidget.AnyWidget):
        """The instant attention view of one record. Traits Python reads and sets: ``layer``,
        ``head`` (``"mean"`` or an index) and ``query`` (``"cls"``, ``"prefix:<i>"``, a patch
        index, ``"mean"``; a windowed layer: a cell index of its grid or ``"mean"``). A click in the view sets
        ``query`` to the patch; ←/→ and ↑/↓ set ``head`` and ``layer``."""

        _esm = WIDGET_ESM
        layer = traitlets.Int(0).tag(sync=True)
        head = traitlets.Union([traitlets.Int(), traitlets.Unicode()], default_value="mean").tag(sync=True)
        query = traitlets.Union([traitlets.Int(), traitlets.Unicode()], default_value="mean").tag(sync=True)
        _args = traitlets.Dict().tag(sync=True)
        _data = traitlets.Bytes(b"").tag(sync=True)
        _image = traitlets.Unicode("").tag(sync=True)

        def __init__(
            self,
            source,
            image_uri: str,
            background,
            *,
            layer: int,
            head,
            query,
            colorscale: str,
            map_range: str,
            opacity: float,
        ):
            self._source, self._background = source, background
            self._style = {"colorscale": colorscale, "map_range": map_range, "opacity": opacity}
            self._held: tuple[int, ...] = ()
            self._meta: dict = {}
            self._query_layer = int(layer)  # the layer whose grid the query's cell is on
            super().__init__(layer=int(layer), head=head, query=query, _image=image_uri)
            self._refresh()
            self.observe(lambda change: self._refresh(), names=["layer", "head", "query"])

        @property
        def record(self):
            """The record the view shows."""
            return self._source.record

        @property
        def held_layers(self) -> tuple[int, ...]:
            """The layers whose data the page holds."""
            return self._held

        def data_bytes(self) -> bytes:
            """The binary data the page holds (:func:`analysis.views.attention_view.attention_view_blob`'s
            layout; :func:`analysis.views.attention_view.view_blob`'s for other maps)."""
            return self._data

        def page_args(self) -> dict:
            """The page's arguments as the app builds them, the data inline (``data_b64``)."""
            import base64

            return {
                **self._args,
                "image": self._image,
                "data_url": "widget:inline",
                "data_b64": base64.b64encode(self._data).decode("ascii"),
            }

        def _refresh(self):
            """New arguments (and new data when the layer is not held) for the current traits; a
            cell query follows the layer to the same place of the image (:func:`follow_query`).
            Nothing changes when the traits are refused."""
            layer = int(self.layer)
            self._source.check(layer, self.head)
            query = self._source.follow(self.query, self._query_layer, layer)
            held, data, meta = (self._held, self._data, self._meta)
            if layer not in held:
                held, data, meta = self._source.data(layer)
            args = self._source.args(meta, layer, self.head, query, self._style)
            args.pop("image")
            self._held, self._data, self._meta, self._args, self._query_layer = held, data, meta, args, layer
            if query != self.query:
                self.query = query  # the trait follows (its observer finds nothing left to do)

        def figure(self):
            """The plotly figure of the map the view shows (the static fallback): the shown layer,
            head and query over the image, on the view's colour range rule."""
            record, spec, layer = self.record, self.record.spec, int(self.layer)
            if not isinstance(self._source, _AttentionSource):
                raise AnalysisError(
                    "figure() draws attention maps; this view shows other maps (draw them with analysis.plots)."
                )
            head = None if self.head == "mean" else int(self.head)
            shown = attention_map(record, layer, head=head, query=self.query)[0].numpy()
            grid = spec.geometry(layer)  # a ViT's: one window of every token, the patch as stride
            uniform = 1 / grid.window_tokens
            lo, hi, range_text = plots.colour_range(self._style["map_range"], shown, uniform=uniform)
            head_text = "mean over heads" if head is None else f"head {head}"
            return plots.attention_overlay(
                self._background,
                spec.img_size,
                shown,
                tuple(grid.stride),
                colorscale=self._style["colorscale"],
                zmin=lo,
                zmax=hi,
                title=f"layer {layer} · {head_text} · query: {self.query}",
                colorbar_title=f"attention probability ({range_text})",
                uniform=uniform,
            )

        def _repr_mimebundle_(self, **kwargs):
            bundle = super()._repr_mimebundle_(**kwargs)
            data = bundle[0] if isinstance(bundle, tuple) else bundle
            if isinstance(data, dict):
                data["text/html"] = embed(self.page_args())  # the report's view: hovers without a kernel
            return bundle

    return AttentionViewWidget


class _AttentionSource:
    """Attention's own maps of any model: every layer under the budget for a ViT (or the one shown),
    one layer at a time for a windowed model (:func:`analysis.views.attention_view.layers_to_send`)."""

    def __init__(self, record, budget_bytes: int):
        self.record, self.budget = record, budget_bytes

    def check(self, layer: int, head) -> None:
        spec = self.record.spec
        if not 0 <= layer < spec.num_layers:
            raise AnalysisError(f"layer {layer} is not a layer of this model (0..{spec.num_layers - 1}).")
        heads = spec.geometry(layer).num_heads
        if head != "mean" and not (isinstance(head, int) and 0 <= head < heads):
            raise AnalysisError(f'head {head!r} is not "mean" or a head index (0..{heads - 1}).')

    def query(self, query, layer: int):
        """The query as the view reads it on ``layer`` (:func:`analysis.views.attention_view.view_query`:
        a ViT's token query; a windowed layer's cell index or ``"mean"``)."""
        return view_query(self.record.spec, layer, query)

    def follow(self, query, from_layer: int, to_layer: int):
        """The query of ``from_layer`` on ``to_layer`` (:func:`analysis.views.attention_view.follow_query`)."""
        return query if from_layer == to_layer else follow_query(self.record.spec, query, from_layer, to_layer)

    def data(self, layer: int):
        held = layers_to_send(self.record.spec, layer, self.budget)
        if held is None:
            size = view_layer_bytes(self.record.spec, layer) / 2**20
            raise AnalysisError(
                f"layer {layer}'s attention for every query is {size:.0f} MiB, over the view's budget of "
                f"{self.budget / 2**20:.0f} MiB; pass a larger budget_mb."
            )
        blob, meta = attention_view_blob(self.record, held)
        return held, blob, meta

    def args(self, meta: dict, layer: int, head, query, style: dict) -> dict:
        return attention_view_args(
            data=meta, image_uri="", spec=self.record.spec, layer=layer, head=head, query=query, **style
        )


class _HeldMapsSource:
    """Other maps than attention's, all held at once (rollout, compare panels, token similarity)."""

    def __init__(self, record, layers, rows: np.ndarray | None, labels: dict, *, spec=None):
        self.record, self.layers, self.rows, self.labels = record, tuple(int(i) for i in layers), rows, labels
        self.spec = record.spec if spec is None else spec

    def check(self, layer: int, head) -> None:
        if layer not in self.layers:
            raise AnalysisError(f"layer {layer} is not one this view holds ({list(self.layers)}).")
        heads = self.labels.get("heads", self.spec.num_heads)
        if head != "mean" and not (isinstance(head, int) and 0 <= head < max(heads, 1)):
            raise AnalysisError(f'head {head!r} is not "mean" or a head index of this view.')

    def follow(self, query, from_layer: int, to_layer: int):
        """The query as it is: held maps lie on one token grid."""
        return query

    def query(self, query, layer: int):
        """A token query (:func:`analysis.records.queries.resolve_query`): held maps lie on one token grid."""
        return resolve_query(self.spec, query).query

    def data(self, layer: int):
        blob, meta = view_blob(self.record, self.layers, self.rows)
        return self.layers, blob, meta

    def args(self, meta: dict, layer: int, head, query, style: dict) -> dict:
        return view_args(
            data=meta, image_uri="", spec=self.spec, layer=layer, head=head, query=query, **style, **self.labels
        )


def _image_array(image, spec) -> np.ndarray:
    """The model-input image as ``(H, W, 3)`` uint8 (a PIL image or an array of that size)."""
    array = np.asarray(image)
    if array.ndim == 2:
        array = np.repeat(array[..., None], 3, axis=-1)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[:2] != tuple(spec.img_size):
        raise AnalysisError(
            f"the view's image must be the model-input image, {tuple(spec.img_size)} uint8 pixels "
            f"(np.asarray(vit.model_input_image(image))); got {array.dtype} {array.shape}."
        )
    return array[..., :3]


def attention_view(
    record,
    image,
    *,
    layer: int | None = None,
    head: str | int = "mean",
    query=None,
    colorscale: str = "Viridis",
    map_range: str = "robust",
    opacity: float = 0.6,
    budget_mb: float = DEFAULT_BUDGET_MB,
):
    """The instant attention view of image 0 of ``record`` as a Jupyter widget: the app's view page,
    hover in the browser.

    ``layer``, ``head`` and ``query`` start the view and stay two-way traits of the returned widget:
    ``w.query`` after a click, ``w.layer = 5`` redraws.

    Parameters
    ----------
    record : AttentionRecord
        :func:`analysis.capture_attention`'s record with every query row, or a windowed record.
    image : PIL.Image.Image or numpy.ndarray
        The model-input image (``vit.model_input_image(image)``, a PIL image or ``(H, W, 3)`` uint8 array
        of ``spec.img_size``).
    layer : int or None, default None
        The layer shown first; ``None``, the last.
    head : str or int, default "mean"
        ``"mean"`` or a head index.
    query : int, (y, x), str or None, default None
        ``None``: ``"cls"`` with a class token, else ``"mean"``; also ``"prefix:<i>"``, a patch index or an
        input pixel ``(y, x)`` (a windowed record: a cell index of the layer's grid, an input pixel or
        ``"mean"``).
    colorscale : str, default "Viridis"
        A plotly colour scale's name.
    map_range : str, default "robust"
        The colour range rule: ``"robust"``, ``"zero"``, ``"minmax"`` or ``"shared"``
        (:func:`analysis.plots.colour_range`).
    opacity : float, default 0.6
        The maps' opacity over the image, 0 to 1.
    budget_mb : float, default DEFAULT_BUDGET_MB
        The MiB of codes the page may hold (:func:`analysis.views.attention_view.layers_to_send`;
        :data:`DEFAULT_BUDGET_MB`, 64).

    Returns
    -------
    AttentionViewWidget
        The anywidget widget (:func:`widget_class`); display it in a notebook cell.

    Raises
    ------
    NotebookDependencyError
        anywidget is not installed.
    AnalysisError
        A layer, head, query or image that does not fit the model, or one layer over the budget.
    """
    spec = record.spec
    return _widget(
        _AttentionSource(record, int(budget_mb * 2**20)),
        image,
        spec,
        layer=spec.num_layers - 1 if layer is None else layer,
        head=head,
        query=query,
        colorscale=colorscale,
        map_range=map_range,
        opacity=opacity,
    )


def _widget(source, image, spec, *, layer, head, query, colorscale, map_range, opacity):
    cls = widget_class()
    background = _image_array(image, spec)
    source.check(int(layer), head)  # before the query, which is read on the layer's grid
    return cls(
        source,
        plots.image_data_uri(background),
        background,
        layer=int(layer),
        head=head,
        query=source.query(query, int(layer)),
        colorscale=colorscale,
        map_range=map_range,
        opacity=opacity,
    )


def rollout_view(
    record,
    image,
    *,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    start_layer: int = 0,
    layer: int | None = None,
    query=None,
    colorscale: str = "Viridis",
    map_range: str = "robust",
    opacity: float = 0.6,
):
    """The app's instant rollout view as a widget: every query's attention rollout from
    ``start_layer`` up to each layer (:func:`analysis.views.attention_view.rollout_view_rows`), all held in
    the page (↑/↓ step the end layer within the held ones). A ViT only.

    Parameters
    ----------
    record : AttentionRecord
        A ViT's record with every query row and every layer from ``start_layer`` on.
    image : PIL.Image.Image or numpy.ndarray
        The model-input image (``vit.model_input_image(image)``, a PIL image or ``(H, W, 3)`` uint8 array
        of ``spec.img_size``).
    head_fusion : str, default "mean"
        How each layer's heads are fused: ``"mean"``, ``"max"`` or ``"min"``.
    discard_ratio : float, default 0.0
        Fraction in ``[0, 1)`` of each fused matrix's weakest pairs set to 0.
    start_layer : int, default 0
        First layer composed (negative counts from the end).
    layer : int or None, default None
        The end layer shown first; ``None``, the last.
    query : int, (y, x), str or None, default None
        A two-way trait as in :func:`attention_view`.
    colorscale : str, default "Viridis"
        A plotly colour scale's name.
    map_range : str, default "robust"
        The colour range rule: ``"robust"``, ``"zero"``, ``"minmax"`` or ``"shared"``
        (:func:`analysis.plots.colour_range`).
    opacity : float, default 0.6
        The maps' opacity over the image, 0 to 1.

    Returns
    -------
    AttentionViewWidget
        The anywidget widget (:func:`widget_class`); display it in a notebook cell.

    Raises
    ------
    NotebookDependencyError
        anywidget is not installed.
    AnalysisError
        A windowed record, a rollout :func:`analysis.attention_rollout` refuses, or a layer, query or
        image that does not fit.
    """
    from .attention_view import rollout_view_rows

    widget_class()
    spec = record.spec
    ends, rows = rollout_view_rows(
        record, head_fusion=head_fusion, discard_ratio=discard_ratio, start_layer=start_layer
    )
    labels = {
        "heads": 0,
        "head_names": [f"{head_fusion} fusion, discard {discard_ratio:.2f}"],
        "value_name": "rollout weight",
        "layer_label": f"Rollout layers {start_layer} to",
        "report_layer": False,
        "shared_name": "0–max of this map",
    }
    return _widget(
        _HeldMapsSource(record, ends, rows, labels),
        image,
        spec,
        layer=ends[-1] if layer is None else layer,
        head="mean",
        query=query,
        colorscale=colorscale,
        map_range=map_range,
        opacity=opacity,
    )


def compare_layers_view(
    record,
    image,
    layers,
    *,
    head: str | int = "mean",
    query=None,
    colorscale: str = "Viridis",
    map_range: str = "robust",
    opacity: float = 0.6,
):
    """The app's Compare view as a widget: ``layers`` side by side on one colour scale; hovering
    any panel shows that patch's attention in every layer. ``head`` and ``query`` are two-way
    traits. A ViT only.

    Parameters
    ----------
    record : AttentionRecord
        A ViT's record with every query row and each of ``layers``.
    image : PIL.Image.Image or numpy.ndarray
        The model-input image (``vit.model_input_image(image)``, a PIL image or ``(H, W, 3)`` uint8 array
        of ``spec.img_size``).
    layers : sequence of int
        The layers compared, one panel each, in this order.
    head : str or int, default "mean"
        ``"mean"`` or a head index.
    query : int, (y, x), str or None, default None
        A two-way trait as in :func:`attention_view`.
    colorscale : str, default "Viridis"
        A plotly colour scale's name.
    map_range : str, default "robust"
        The colour range rule: ``"robust"``, ``"zero"``, ``"minmax"`` or ``"shared"``
        (:func:`analysis.plots.colour_range`).
    opacity : float, default 0.6
        The maps' opacity over the image, 0 to 1.

    Returns
    -------
    AttentionViewWidget
        The anywidget widget (:func:`widget_class`); display it in a notebook cell.

    Raises
    ------
    NotebookDependencyError
        anywidget is not installed.
    AnalysisError
        A windowed record, a layer the record did not keep, or a head, query or image that does not fit.
    """
    widget_class()
    spec = record.spec
    labels = {"panels": [int(i) for i in layers], "report_layer": False, "shared_name": "0–max of these layers' heads"}
    source = _HeldMapsSource(record, sorted({int(i) for i in layers}), None, labels)
    return _widget(
        source,
        image,
        spec,
        layer=int(layers[0]),
        head=head,
        query=query,
        colorscale=colorscale,
        map_range=map_range,
        opacity=opacity,
    )


def token_similarity_view(
    record,
    tokens,
    image,
    *,
    layer: int,
    kind: str = "token",
    query=None,
    colorscale: str = "Viridis",
    opacity: float = 0.7,
):
    """The app's Tokens view as a widget: every token's cosine similarity to every patch token of
    one layer (:func:`analysis.views.attention_view.similarity_view_rows`), on −1 to 1. A ViT only.

    Parameters
    ----------
    record : AttentionRecord
        A ViT's record of the same image (its spec).
    tokens : torch.Tensor
        That layer's ``(1, T, D)`` tokens (``capture_tokens(vit, pixels, kind=kind).tokens[layer]``).
    image : PIL.Image.Image or numpy.ndarray
        The model-input image (``vit.model_input_image(image)``, a PIL image or ``(H, W, 3)`` uint8 array
        of ``spec.img_size``).
    layer : int
        The layer the tokens come from.
    kind : str, default "token"
        What the tokens are, for the map's name (``capture_tokens``' ``kind``).
    query : int, (y, x), str or None, default None
        A two-way trait as in :func:`attention_view`.
    colorscale : str, default "Viridis"
        A plotly colour scale's name.
    opacity : float, default 0.7
        The maps' opacity over the image, 0 to 1.

    Returns
    -------
    AttentionViewWidget
        The anywidget widget (:func:`widget_class`); display it in a notebook cell.

    Raises
    ------
    NotebookDependencyError
        anywidget is not installed.
    AnalysisError
        A windowed model, or a query or image that does not fit.
    """
    from .attention_view import similarity_view_rows

    widget_class()
    spec = record.spec
    rows = similarity_view_rows(tokens, spec)
    labels = {
        "heads": 0,
        "head_names": [f"{kind}s"],
        "value_name": "cosine similarity",
        "report_layer": False,
        "fixed_range": (-1.0, 1.0),
        "columns": False,
    }
    return _widget(
        _HeldMapsSource(record, [layer], rows, labels),
        image,
        spec,
        layer=layer,
        head="mean",
        query=query,
        colorscale=colorscale,
        map_range="robust",
        opacity=opacity,
    )
