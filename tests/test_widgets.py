"""The notebook widget (analysis.views.widgets): the app's view page in anywidget, two-way traits, the
data the app's view gets, the static fallback, and the error without anywidget."""

from __future__ import annotations

import base64
import json
import sys

import numpy as np
import pytest

pytest.importorskip("anywidget")

from analysis import attention_map, capture_attention, load_image, load_vit
from analysis.base.errors import AnalysisError
from analysis.views.attention_view import (
    PAGE,
    attention_view_blob,
    embed,
    view_args,
    view_blob,
)
from analysis.views.widgets import (
    WIDGET_ESM,
    NotebookDependencyError,
    attention_view,
    widget_class,
)

SAMPLE = "assets/samples/scene_1_star.png"


@pytest.fixture(scope="module")
def demo():
    vit = load_vit("demo")
    image = load_image(SAMPLE)
    return vit, capture_attention(vit, vit.preprocess(image)), vit.model_input_image(image)


@pytest.fixture(scope="module")
def swin():
    vit = load_vit("demo_swin")
    image = load_image(SAMPLE)
    return vit, capture_attention(vit, vit.preprocess(image)), vit.model_input_image(image)


def _decode_rows(blob: bytes, spec, layers: int) -> np.ndarray:
    """The view_blob layout read back by hand: (layers, heads + 1, T + 1, N) values."""
    maps, tokens, patches = layers * (spec.num_heads + 1), spec.num_tokens, spec.num_patches
    row_ranges = np.frombuffer(blob, "<f4", count=2 * maps * (tokens + 1)).reshape(maps * (tokens + 1), 2)
    start = 4 * 2 * (maps * (tokens + 1) + maps * patches + maps)
    codes = np.frombuffer(blob, np.uint8, count=maps * (tokens + 1) * patches, offset=start)
    codes = codes.reshape(maps * (tokens + 1), patches).astype(np.float64)
    lo, hi = row_ranges[:, :1].astype(np.float64), row_ranges[:, 1:].astype(np.float64)
    values = lo + codes / 255.0 * (hi - lo)
    return values.reshape(layers, spec.num_heads + 1, tokens + 1, patches), ((hi - lo) / 255.0).reshape(
        layers, spec.num_heads + 1, tokens + 1, 1
    )


def test_the_widgets_script_is_the_view_pages(demo):
    """The widget's ES module carries the view page's own text, byte for byte, and nothing of the
    page's script besides: the adapter only plays Streamlit's part of its message protocol."""
    first_line, adapter = WIDGET_ESM.split("\n", 1)
    assert first_line.startswith("const PAGE = ") and first_line.endswith(";")
    assert json.loads(first_line[len("const PAGE = ") : -1]) == PAGE.read_text(encoding="utf-8")
    assert "<script" not in adapter and "function decodeBase64" not in adapter and "function paint" not in adapter
    assert "frame.srcdoc = PAGE" in adapter
    assert widget_class()._esm == WIDGET_ESM


def test_the_data_the_widget_sends_is_the_apps_and_holds_the_attention(demo):
    """The bytes are view_blob's for every layer (what the app serves), and read back they are
    attention_map's values within half a quantisation step."""
    vit, record, image = demo
    spec = vit.spec
    widget = attention_view(record, image)
    everything = tuple(range(spec.num_layers))
    blob, meta = view_blob(record, everything)
    assert widget.held_layers == everything and widget.data_bytes() == blob
    assert widget._args["data_id"] == meta["data_id"] and widget._args["layers"] == list(everything)
    values, step = _decode_rows(widget.data_bytes(), spec, spec.num_layers)
    for layer in (0, spec.num_layers - 1):
        for head in (0, None):
            slot = spec.num_heads if head is None else head
            for query, row in (("cls", 0), (5, spec.num_prefix_tokens + 5)):
                expected = attention_map(record, layer, head=head, query=query)[0].numpy().ravel()
                assert np.all(np.abs(values[layer, slot, row] - expected) <= step[layer, slot, row] / 2 + 1e-7)
    app_args = view_args(
        data=meta,
        image_uri="",
        spec=spec,
        layer=spec.num_layers - 1,
        head="mean",
        query="cls",
        colorscale="Viridis",
        map_range="robust",
        opacity=0.6,
    )
    app_args.pop("image")
    assert widget._args == app_args


def test_traits_round_trip_between_python_and_the_page(demo):
    """Python sets layer / head / query and the page's arguments follow; the page's report of a
    click or a step (a state update from the front end) lands in the traits."""
    vit, record, image = demo
    spec = vit.spec
    widget = attention_view(record, image, layer=0, head=1, query="cls")
    assert (widget._args["layer"], widget._args["head"], widget._args["query_row"]) == (0, 1, 0)
    data_id = widget._args["data_id"]
    widget.layer = 2
    widget.head = "mean"
    widget.query = 7
    assert widget._args["layer"] == 2 and widget._args["head"] == spec.num_heads
    assert widget._args["query_row"] == spec.num_prefix_tokens + 7 and widget._args["query_patch"] == 7
    assert widget._args["data_id"] == data_id  # every layer is held: no new data
    widget.set_state({"query": 3, "layer": 1, "head": 0})  # what the front end's save_changes sends
    assert (widget.query, widget.layer, widget.head) == (3, 1, 0)
    assert (widget._args["query_row"], widget._args["layer"], widget._args["head"]) == (
        spec.num_prefix_tokens + 3,
        1,
        0,
    )
    with pytest.raises(AnalysisError, match="layer"):
        widget.layer = spec.num_layers


def test_a_pixel_query_opens_the_view_on_the_patch_that_holds_it(demo, swin):
    """``query=(y, x)``, an input pixel as :func:`analysis.attention_map` takes it, opens the view on
    the row-major patch ``⌊y/ph⌋·gw + ⌊x/pw⌋`` (worked by hand here); a windowed view on the cell of
    the shown layer's grid that holds it, ``⌊y/sy⌋·gw + ⌊x/sx⌋`` with that layer's stride; a prefix
    token, which a windowed layer does not have, is refused."""
    vit, record, image = demo
    (ph, pw), (_, gw) = vit.spec.patch_size, vit.spec.grid_size
    y, x = 3 * ph + 2, 5 * pw + 1
    widget = attention_view(record, image, layer=1, query=(y, x))
    assert widget.query == 3 * gw + 5 and widget._args["query_patch"] == 3 * gw + 5
    swin_vit, swin_record, swin_image = swin
    layer = 0
    geometry = swin_vit.spec.geometry(layer)
    (sy, sx), (gh, gw) = geometry.stride, geometry.grid_size
    assert gh > 2 and gw > 1
    windowed = attention_view(swin_record, swin_image, layer=layer, query=(2 * sy + 1, sx + 3))
    assert windowed.query == 2 * gw + 1 and windowed._args["query_patch"] == 2 * gw + 1
    with pytest.raises(AnalysisError, match="cell index"):
        attention_view(swin_record, swin_image, query="cls")


def test_a_layer_the_page_does_not_hold_sends_new_data(demo):
    vit, record, image = demo
    one = vit.spec.num_heads + 1
    widget = attention_view(record, image, layer=1, budget_mb=1.01 * _layer_mib(vit.spec, one))
    assert widget.held_layers == (1,) and widget.data_bytes() == view_blob(record, (1,))[0]
    widget.layer = 3
    assert widget.held_layers == (3,) and widget.data_bytes() == view_blob(record, (3,))[0]


def _layer_mib(spec, maps):
    from analysis.views.attention_view import layer_bytes

    return layer_bytes(spec, maps) / 2**20


def test_windowed_models_send_their_windowed_layer(swin):
    _vit, record, image = swin
    widget = attention_view(record, image, layer=0, query=4)
    blob, _meta = attention_view_blob(record, [0])
    assert widget.data_bytes() == blob and widget._args["windowed"] and widget._args["query_row"] == 4
    widget.layer = 1
    assert widget.data_bytes() == attention_view_blob(record, [1])[0]


def test_a_windowed_query_follows_the_layer_to_the_same_place(swin):
    """A cell query is a cell of the shown layer's grid: a step to a stage of another stride moves
    it to the cell under the old cell's centre pixel (worked by hand here), and a refused layer
    leaves the widget as it was (its data and arguments still agree)."""
    vit, record, image = swin
    spec = vit.spec
    first, coarse = spec.geometry(0), spec.geometry(2)
    assert first.stride != coarse.stride
    (sy, sx), gw = first.stride, first.grid_size[1]
    widget = attention_view(record, image, layer=0, query=(spec.img_size[0] - 1, spec.img_size[1] - 1))
    cell = widget.query
    assert cell == first.grid_size[0] * gw - 1  # the bottom-right cell
    widget.layer = 2
    (cy, cx), cgw = coarse.stride, coarse.grid_size[1]
    row, col = divmod(cell, gw)
    expected = ((row * sy + sy // 2) // cy) * cgw + (col * sx + sx // 2) // cx
    assert widget.query == expected and widget._args["query_patch"] == expected and widget._args["layer"] == 2
    assert widget.data_bytes() == attention_view_blob(record, [2])[0]
    before = (widget._args, widget.data_bytes())
    with pytest.raises(AnalysisError, match="layer"):
        widget.layer = spec.num_layers
    assert (widget._args, widget.data_bytes()) == before
    with pytest.raises(AnalysisError, match="layer 99"):
        attention_view(record, image, layer=99)


def test_a_windowed_layer_over_the_budget_is_refused_with_its_size(swin):
    from analysis.views.attention_view import layers_to_send, view_layer_bytes

    vit, record, image = swin
    spec = vit.spec
    one = view_layer_bytes(spec, 0)
    geometry = spec.geometry(0)
    assert one == (geometry.num_heads + 1) * geometry.num_windows * geometry.window_tokens**2
    assert layers_to_send(spec, 0, 10 * one * spec.num_layers) == (0,)  # one layer at a time, however large
    assert layers_to_send(spec, 0, one - 1) is None
    with pytest.raises(AnalysisError, match=rf"{one / 2**20:.0f} MiB, over the view's budget"):
        attention_view(record, image, layer=0, budget_mb=(one - 1) / 2**20)
    with pytest.raises(AnalysisError, match="one layer of a model whose layers attend inside windows"):
        attention_view_blob(record, [0, 1])


def test_the_static_fallback_shows_the_same_map(demo):
    """figure() draws attention_map of the shown layer, head and query; the notebook output's
    text/html is the report's self-contained view with the same arguments."""
    _vit, record, image = demo
    widget = attention_view(record, image, layer=2, head=1, query=6)
    heatmap = next(trace for trace in widget.figure().data if trace.type == "heatmap")
    np.testing.assert_allclose(np.asarray(heatmap.z), attention_map(record, 2, head=1, query=6)[0].numpy(), rtol=1e-6)
    bundle = widget._repr_mimebundle_()
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    assert "application/vnd.jupyter.widget-view+json" in data
    assert data["text/html"] == embed(widget.page_args())
    assert base64.b64decode(widget.page_args()["data_b64"]) == widget.data_bytes()


def test_an_image_of_another_size_is_refused(demo):
    _vit, record, _image = demo
    with pytest.raises(AnalysisError, match="model-input image"):
        attention_view(record, np.zeros((7, 7, 3), np.uint8))


def test_without_anywidget_the_error_names_the_extra(demo, monkeypatch):
    _vit, record, image = demo
    monkeypatch.setitem(sys.modules, "anywidget", None)  # import anywidget -> ImportError
    widget_class.cache_clear()
    try:
        with pytest.raises(NotebookDependencyError, match=r'pip install "vit-explorer\[notebook\]"'):
            attention_view(record, image)
    finally:
        widget_class.cache_clear()
    assert isinstance(NotebookDependencyError("x"), ImportError)


def test_the_rollout_view_sends_the_apps_rollout_rows(demo):
    """The Rollout page's data (rollout_view_rows as one view_blob) and its labels; the end layer
    and the query are traits."""
    from analysis import attention_rollout
    from analysis.views.attention_view import rollout_view_rows
    from analysis.views.widgets import rollout_view

    vit, record, image = demo
    spec = vit.spec
    widget = rollout_view(record, image, query=9)
    ends, rows = rollout_view_rows(record)
    assert widget.data_bytes() == view_blob(record, ends, rows)[0] and widget.held_layers == tuple(ends)
    assert widget._args["layer_label"] == "Rollout layers 0 to" and widget._args["heads"] == 0
    assert widget._args["query_row"] == spec.num_prefix_tokens + 9 and widget.layer == spec.num_layers - 1
    widget.layer = 1
    assert widget._args["layer"] == 1
    codes = _decode_single_map_rows(widget.data_bytes(), spec, len(ends))
    expected = attention_rollout(record, end_layer=1, query=9)[0].numpy().ravel()
    values, step = codes
    assert np.all(
        np.abs(values[1, spec.num_prefix_tokens + 9] - expected) <= step[1, spec.num_prefix_tokens + 9] / 2 + 1e-7
    )


def _decode_single_map_rows(blob: bytes, spec, layers: int):
    """view_blob's rows of one map a layer, no prefix keys: (layers, T + 1, N) values and steps."""
    tokens, patches = spec.num_tokens, spec.num_patches
    ranges = (
        np.frombuffer(blob, "<f4", count=2 * layers * (tokens + 1)).reshape(layers, tokens + 1, 2).astype(np.float64)
    )
    start = 4 * 2 * (layers * (tokens + 1) + layers * patches + layers)
    codes = np.frombuffer(blob, np.uint8, count=layers * (tokens + 1) * patches, offset=start)
    codes = codes.reshape(layers, tokens + 1, patches).astype(np.float64)
    step = (ranges[..., 1] - ranges[..., 0]) / 255.0
    return ranges[..., :1] + codes * step[..., None], step


def test_the_compare_view_holds_its_panels(demo):
    from analysis.views.widgets import compare_layers_view

    vit, record, image = demo
    widget = compare_layers_view(record, image, [3, 0, 2], head=1, query="cls")
    assert widget._args["panels"] == [3, 0, 2] and widget.held_layers == (0, 2, 3)
    assert widget.data_bytes() == view_blob(record, (0, 2, 3))[0]
    widget.set_state({"query": 4, "head": "mean"})
    assert widget._args["query_row"] == vit.spec.num_prefix_tokens + 4 and widget._args["head"] == vit.spec.num_heads


def test_the_token_similarity_view_holds_every_patchs_similarity(demo):
    from analysis import capture_tokens, patch_similarity
    from analysis.views.attention_view import similarity_view_rows
    from analysis.views.widgets import token_similarity_view

    vit, record, image = demo
    spec = vit.spec
    tokens = capture_tokens(vit, vit.preprocess(load_image(SAMPLE)), kind="key").tokens[2]  # (1, T, D)
    widget = token_similarity_view(record, tokens, image, layer=2, kind="key", query=5)
    assert widget.data_bytes() == view_blob(record, [2], similarity_view_rows(tokens, spec))[0]
    assert widget._args["fixed_range"] == [-1.0, 1.0] and widget._args["range_mode"] == "fixed"
    values, step = _decode_single_map_rows(widget.data_bytes(), spec, 1)
    row = spec.num_prefix_tokens + 5
    expected = patch_similarity(tokens, spec, 5).numpy().ravel()
    assert np.all(np.abs(values[0, row] - expected) <= step[0, row] / 2 + 1e-6)
    with pytest.raises(AnalysisError, match="not one this view holds"):
        widget.layer = 3
