"""The instant attention view (issue 28): its quantisation rule, the every-query layer matrix it
holds (against ``attention_map`` query by query), and the arguments the Attention page gives the
component (AppTest). The browser side (hover, pixels, click) is in tests/test_browser.py."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import torch

import analysis
from analysis.base.errors import AnalysisError
from analysis.plots import colorize, colour_lut, colour_range, quantise_maps
from families import family_pixels, load_family

# --------------------------------------------------------------------------- quantisation


def quantise_by_hand(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rule written out map by map: code = round((v − min) / (max − min) · 255)."""
    flat = values.reshape(-1, values.shape[-1]).astype(np.float64)
    codes = np.zeros(flat.shape, np.uint8)
    ranges = np.zeros((flat.shape[0], 2), np.float64)
    for m, row in enumerate(flat):
        lo, hi = row.min(), row.max()
        ranges[m] = lo, hi
        for k, v in enumerate(row):
            codes[m, k] = 0 if hi == lo else int(np.floor((v - lo) / (hi - lo) * 255 + 0.5))
    return codes.reshape(values.shape), ranges.reshape(*values.shape[:-1], 2)


def test_quantisation_follows_the_rule_and_round_trips_within_half_a_step():
    generator = np.random.default_rng(0)
    values = generator.dirichlet(np.ones(30) * 0.3, size=(3, 7)).astype(np.float32)  # (3, 7, 30) attention-like
    values[0, 0] = 0.0
    values[0, 0, 5] = 0.4  # a map that is zero but for one key
    quantised = quantise_maps(values)
    codes, ranges = quantise_by_hand(values)
    assert quantised.codes.dtype == np.uint8 and quantised.codes.shape == values.shape
    assert np.abs(quantised.codes.astype(int) - codes.astype(int)).max() <= 1  # ties may round either way
    np.testing.assert_allclose(quantised.ranges, ranges, rtol=1e-6)
    decoded = quantised.decoded()
    half_step = (values.max(-1, keepdims=True) - values.min(-1, keepdims=True)) / 510
    assert np.all(np.abs(decoded - values) <= half_step * (1 + 1e-4) + 1e-9)
    # each map's maximum is code 255 and comes back exactly; its minimum is code 0
    assert np.all(quantised.codes.max(-1) == 255) and np.all(quantised.codes.min(-1) == 0)
    np.testing.assert_array_equal(decoded.max(-1), values.max(-1))
    # zeros of a map whose minimum is zero are code 0 and decode to exactly 0
    assert np.all(quantised.codes[0, 0][values[0, 0] == 0] == 0)
    assert np.all(decoded[0, 0][values[0, 0] == 0] == 0.0)
    assert decoded[0, 0, 5] == np.float32(0.4)


def test_quantised_colours_are_within_one_colour_step_for_every_range_mode():
    """The promise the view relies on: under any of the app's colour ranges, a decoded map's
    colour index differs from the exact map's by at most one."""
    generator = np.random.default_rng(1)
    uniform = 1 / 50
    for trial in range(40):
        values = generator.dirichlet(np.ones(49) * generator.uniform(0.05, 20)).astype(np.float32)
        decoded = quantise_maps(values).decoded()
        for mode in ("zero", "minmax", "shared"):
            everything = np.concatenate([values, values * 1.5])
            lo, hi, _ = colour_range(mode, values, everything, uniform=uniform)
            lo_q, hi_q, _ = colour_range(mode, decoded, everything, uniform=uniform)
            exact = np.rint((values - lo) / (hi - lo) * 255)
            shown = np.rint((decoded - lo_q) / (hi_q - lo_q) * 255)
            assert np.abs(exact - shown).max() <= 1, (trial, mode)


def test_a_flat_map_and_bad_values():
    flat = quantise_maps(np.full((2, 4), 0.25, np.float32))
    assert np.all(flat.codes == 0)
    np.testing.assert_array_equal(flat.decoded(), np.full((2, 4), 0.25, np.float32))
    for bad in (np.array([0.1, np.nan]), np.array([np.inf, 0.0])):
        with pytest.raises(AnalysisError, match="finite"):
            quantise_maps(bad)
    with pytest.raises(AnalysisError, match="last axis"):
        quantise_maps(np.zeros((3, 0)))


def test_the_base64_text_decodes_to_the_codes_and_ranges():
    quantised = quantise_maps(np.random.default_rng(2).random((2, 3, 5)).astype(np.float32))
    codes, ranges = quantised.as_base64()
    np.testing.assert_array_equal(np.frombuffer(base64.b64decode(codes), np.uint8).reshape(2, 3, 5), quantised.codes)
    np.testing.assert_array_equal(np.frombuffer(base64.b64decode(ranges), "<f4").reshape(2, 3, 2), quantised.ranges)


# --------------------------------------------------------------------------- the layer matrix


@pytest.mark.parametrize("family", ["vit", "dinov2_registers", "relpos", "siglip"])
def test_attention_rows_are_attention_map_for_every_query(family):
    """Row by row against attention_map: registers (5 prefix tokens), a 3×4 grid, no class token."""
    vit = load_family(family)
    record = analysis.capture_attention(vit, family_pixels(family, batch=2))
    spec = record.spec
    prefix = spec.num_prefix_tokens
    for layer in range(spec.num_layers):
        rows = analysis.attention_rows(record, layer)
        assert rows.shape == (2, spec.num_heads + 1, spec.num_tokens, spec.num_patches)
        for head in [*range(spec.num_heads), None]:
            column = spec.num_heads if head is None else head
            for token in range(spec.num_tokens):
                query = token - prefix if token >= prefix else f"prefix:{token}"
                expected = analysis.attention_map(record, layer, head=head, query=query).reshape(2, -1)
                torch.testing.assert_close(rows[:, column, token], expected, rtol=1e-5, atol=1e-7)


def decode(codes, ranges):
    """The page's decoding rule: v = lo + code / 255 · (hi − lo)."""
    return ranges[..., :1] + codes / 255 * (ranges[..., 1:] - ranges[..., :1])


def unpack(data, spec):
    """``view_data``'s base64 text -> (rows, row_ranges, cols, col_ranges, pre, pre_ranges) arrays, layers first."""
    return unpack_blob(base64.b64decode(data["data_b64"]), data["layers"], spec, data["matrix"])


def test_view_data_holds_every_query_and_the_columns_of_every_layer():
    from analysis.views.attention_view import query_row, view_data

    vit = load_family("dinov2_registers")
    record = analysis.capture_attention(vit, family_pixels("dinov2_registers", batch=1))
    spec = record.spec
    heads, tokens, patches, prefix = spec.num_heads, spec.num_tokens, spec.num_patches, spec.num_prefix_tokens
    data = view_data(record, [1, 0])  # held in this order: slot 0 is layer 1
    assert data["layers"] == [1, 0]
    rows, row_ranges, cols, col_ranges, _, _ = unpack(data, spec)
    for slot, layer in enumerate(data["layers"]):
        for query in ["prefix:0", "prefix:3", 0, patches - 1, "mean"]:
            for head in (0, None):
                column = heads if head is None else head
                exact = analysis.attention_map(record, layer, head=head, query=query)[0].numpy().ravel()
                row = query_row(query, spec)
                got = decode(rows[slot, column, row], row_ranges[slot, column, row])
                assert np.abs(got - exact).max() <= (exact.max() - exact.min()) / 510 + 1e-7, (layer, query, head)
        every = analysis.attention_rows(record, layer)[0].numpy()  # (heads + 1, T, N)
        for key in (0, 7, patches - 1):  # column k: who looks at patch k, over the patch queries
            exact = every[2, prefix:, key]
            got = decode(cols[slot, 2, key], col_ranges[slot, 2, key])
            assert np.abs(got - exact).max() <= (exact.max() - exact.min()) / 510 + 1e-7
    assert query_row("mean", spec) == tokens and query_row(3, spec) == prefix + 3
    assert view_data(record, [1])["data_id"] != data["data_id"]
    with pytest.raises(AnalysisError, match="layer=2 does not exist"):
        view_data(record, [2])


def unpack_blob(blob: bytes, layers, spec, matrix: bool = True):
    """``view_blob``'s bytes as the page reads them: row_ranges, col_ranges, pre_ranges (float32),
    rows, cols, pre (uint8; ``pre`` empty unless ``matrix``)."""
    held, heads, tokens, patches = len(layers), spec.num_heads, spec.num_tokens, spec.num_patches
    maps = held * (heads + 1)
    row_maps, col_maps, pre_length = (
        maps * (tokens + 1),
        maps * patches,
        tokens * spec.num_prefix_tokens if matrix else 0,
    )
    row_ranges = np.frombuffer(blob, "<f4", 2 * row_maps, 0).reshape(held, heads + 1, tokens + 1, 2)
    col_ranges = np.frombuffer(blob, "<f4", 2 * col_maps, 8 * row_maps).reshape(held, heads + 1, patches, 2)
    pre_ranges = np.frombuffer(blob, "<f4", 2 * maps, 8 * (row_maps + col_maps)).reshape(held, heads + 1, 2)
    start = 8 * (row_maps + col_maps + maps)
    rows = np.frombuffer(blob, np.uint8, row_maps * patches, start).reshape(held, heads + 1, tokens + 1, patches)
    cols = np.frombuffer(blob, np.uint8, col_maps * patches, start + row_maps * patches)
    pre = np.frombuffer(blob, np.uint8, maps * pre_length, start + (row_maps + col_maps) * patches)
    assert len(blob) == start + (row_maps + col_maps) * patches + maps * pre_length
    return (
        rows,
        row_ranges,
        cols.reshape(held, heads + 1, patches, patches),
        col_ranges,
        pre.reshape(held, heads + 1, pre_length),
        pre_ranges,
    )


@pytest.mark.parametrize("family", ["dinov2_registers", "siglip"])
def test_the_prefix_keys_complete_each_heads_full_matrix(family):
    """The T×T matrix the page draws: ``attention_rows(keys="all")`` is the captured attention
    (every key, prefix first; the mean over heads averaged by hand), and the page's rows plus its
    prefix keys decode to it within half a step of each map's range. SigLIP: no prefix, no
    prefix keys, the patch rows alone are the matrix."""
    from analysis.views.attention_view import prefix_key_rows, view_data

    vit = load_family(family)
    record = analysis.capture_attention(vit, family_pixels(family, batch=1))
    spec = record.spec
    heads, T, P = spec.num_heads, spec.num_tokens, spec.num_prefix_tokens
    for layer in range(spec.num_layers):
        full = analysis.attention_rows(record, layer, keys="all")[0].numpy()  # (heads + 1, T, T)
        captured = record.attentions[layer][0].float().numpy()  # (heads, T, T): every query was captured
        np.testing.assert_allclose(full[:heads], captured, rtol=1e-6, atol=1e-8)
        mean = sum(captured[h] for h in range(heads)) / heads
        np.testing.assert_allclose(full[heads], mean, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(full[..., P:], analysis.attention_rows(record, layer)[0].numpy(), rtol=0, atol=0)
    data = view_data(record, [1, 0])
    assert data["matrix"] is True
    rows, row_ranges, _, _, pre, pre_ranges = unpack(data, spec)
    assert pre.shape == (2, heads + 1, T * P)
    np.testing.assert_allclose(
        prefix_key_rows(record, [1, 0])[:, :, :, :P],
        np.stack([analysis.attention_rows(record, layer, keys="all")[0].numpy()[..., :P] for layer in (1, 0)]),
        rtol=0,
        atol=0,
    )
    for slot, layer in enumerate(data["layers"]):
        full = analysis.attention_rows(record, layer, keys="all")[0].numpy()
        for head in (0, heads):
            matrix = np.zeros((T, T))
            for q in range(T):  # the page's decoding, written out
                for j in range(P):
                    lo, hi = pre_ranges[slot, head]
                    matrix[q, j] = lo + pre[slot, head, q * P + j] / 255 * (hi - lo)
                matrix[q, P:] = decode(rows[slot, head, q], row_ranges[slot, head, q])
            half_step = max(np.ptp(full[head, :, :P]) if P else 0, np.ptp(full[head, :, P:], axis=1).max()) / 510
            assert np.abs(matrix - full[head]).max() <= half_step + 1e-7, (layer, head)
    with pytest.raises(AnalysisError, match='keys must be "patches" or "all"'):
        analysis.attention_rows(record, 0, keys="prefix")


def test_all_layers_are_sent_when_they_fit_else_the_current_one():
    from analysis.views.attention_view import layer_bytes, layers_to_send

    spec = load_family("vit").spec
    one = layer_bytes(spec)
    assert one == (spec.num_heads + 1) * (
        (spec.num_tokens + 1) * spec.num_patches + spec.num_patches**2 + spec.num_tokens * spec.num_prefix_tokens
    )
    assert layers_to_send(spec, 1, one * spec.num_layers) == tuple(range(spec.num_layers))
    assert layers_to_send(spec, 1, one * spec.num_layers - 1) == (1,)
    assert layers_to_send(spec, 1, one - 1) is None


# --------------------------------------------------------------------------- the page (AppTest)


def test_the_attention_page_gives_the_view_the_current_layer(monkeypatch):
    from streamlit.testing.v1 import AppTest

    from test_app import APP, DEMO_PRESENT, RANDOM_MODEL, first_sample

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if not DEMO_PRESENT:
        monkeypatch.setenv("VIZAPP_DEFAULT_MODEL", RANDOM_MODEL)
    app = AppTest.from_file(APP, default_timeout=120)
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    app.slider(key="layer").set_value(1).run()
    app.selectbox(key="head").set_value(2).run()
    app.radio(key="query_mode").set_value("patch").run()
    app.number_input(key="query_patch").set_value(5).run()
    assert not app.exception, [e.value for e in app.exception]
    (view,) = [c for c in app.get("component_instance") if c.proto.component_name.endswith("attention_view")]
    args = json.loads(view.proto.json_args)
    current = app.session_state["current"]
    spec = current.spec
    assert args["grid"] == list(spec.grid_size) and args["patch_size"] == list(spec.patch_size)
    assert args["img_size"] == list(spec.img_size) and args["prefix"] == spec.num_prefix_tokens
    assert (args["layer"], args["head"], args["query_row"], args["query_patch"]) == (
        1,
        2,
        spec.num_prefix_tokens + 5,
        5,
    )
    assert args["report_layer"] is True and args["report_head"] is True  # the page follows the view's steps
    assert args["range_mode"] == current.map_range and args["uniform"] == pytest.approx(1 / spec.num_tokens)
    assert args["lut"] == colour_lut(current.colorscale).ravel().tolist()
    assert args["image"].startswith("data:image/")
    # the pinned query's map, decoded as the browser decodes it, is attention_map's within half a step
    vit = analysis.load_vit("demo") if DEMO_PRESENT else None
    image = analysis.load_image(first_sample())
    if vit is None:
        from vizapp.refs import ModelRef
        from vizapp.resources import get_model

        vit = get_model(ModelRef("vit_tiny_patch16_224", pretrained=False))
    record = analysis.capture_attention(vit, vit.preprocess(image))
    assert args["layers"] == list(range(spec.num_layers)) and args["num_layers"] == spec.num_layers  # all fit
    assert args["note"] == "" and args["data_url"].endswith(".bin") and "rows" not in args  # fetched once, by URL
    from analysis.views.attention_view import view_blob

    blob, meta = view_blob(record, args["layers"])
    assert args["data_id"] == meta["data_id"]  # a digest of every byte: the page fetches exactly this file
    codes, ranges, *_ = unpack_blob(blob, meta["layers"], spec)
    lo, hi = ranges[1, 2, args["query_row"]]
    got = lo + codes[1, 2, args["query_row"]] / 255 * (hi - lo)
    exact = analysis.attention_map(record, 1, head=2, query=5)[0].numpy().ravel()
    assert np.abs(got - exact).max() <= (exact.max() - exact.min()) / 510 + 1e-7
    # the colours it draws (colour_range's rule on the decoded map) are within one step of the chart's
    lo_c, hi_c, _ = colour_range(current.map_range, exact, uniform=1 / spec.num_tokens)
    lut = colour_lut(current.colorscale)
    exact_rgb = colorize(exact, current.colorscale, lo_c, hi_c)
    index = np.clip(np.rint((got - lo_c) / (hi_c - lo_c) * 255), 0, 255).astype(int)
    assert all(any((lut[max(0, min(255, i + d))] == rgb).all() for d in (-1, 0, 1)) for i, rgb in zip(index, exact_rgb))


def test_a_layer_over_the_limit_keeps_the_chart_and_says_why(monkeypatch):
    from streamlit.testing.v1 import AppTest

    import vizapp.limits
    from test_app import APP, DEMO_PRESENT, RANDOM_MODEL

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if not DEMO_PRESENT:
        monkeypatch.setenv("VIZAPP_DEFAULT_MODEL", RANDOM_MODEL)
    monkeypatch.setattr(vizapp.limits, "MAX_VIEW_BYTES", 1024)
    app = AppTest.from_file(APP, default_timeout=120)
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    assert not [c for c in app.get("component_instance") if c.proto.component_name.endswith("attention_view")]
    assert any("instant hover view is off" in c.value and "VIZAPP_VIEW_MB" in c.value for c in app.caption)
    assert app.get("plotly_chart")  # the map is still drawn, as a chart


def test_when_all_layers_do_not_fit_the_view_holds_the_current_one_and_says_so(monkeypatch):
    from streamlit.testing.v1 import AppTest

    import vizapp.limits
    from analysis.views.attention_view import layer_bytes
    from test_app import APP, DEMO_PRESENT, RANDOM_MODEL

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if not DEMO_PRESENT:
        monkeypatch.setenv("VIZAPP_DEFAULT_MODEL", RANDOM_MODEL)
    app = AppTest.from_file(APP, default_timeout=120)
    app.run()
    spec = app.session_state["current"].spec
    monkeypatch.setattr(vizapp.limits, "MAX_VIEW_BYTES", layer_bytes(spec) * spec.num_layers - 1)
    app.slider(key="layer").set_value(1).run()
    assert not app.exception, [e.value for e in app.exception]
    (view,) = [c for c in app.get("component_instance") if c.proto.component_name.endswith("attention_view")]
    args = json.loads(view.proto.json_args)
    assert args["layers"] == [1] and args["layer"] == 1
    assert "Only this layer is in the page" in args["note"] and "VIZAPP_VIEW_MB" in args["note"]


# --------------------------------------------------------------------------- the rollout in the view


@pytest.mark.parametrize("family", ["vit", "dinov2_registers"])
def test_rollout_view_rows_are_attention_rollout_for_every_query_and_end_layer(family):
    from analysis.views.attention_view import rollout_view_rows

    vit = load_family(family)
    record = analysis.capture_attention(vit, family_pixels(family, batch=1))
    spec = record.spec
    prefix = spec.num_prefix_tokens
    ends, rows = rollout_view_rows(record, head_fusion="max", discard_ratio=0.3, start_layer=1)
    assert ends == list(range(1, spec.num_layers))
    assert rows.shape == (len(ends), 1, spec.num_tokens + 1, spec.num_patches)
    for i, end in enumerate(ends):
        for token in [*range(spec.num_tokens), "mean"]:
            query = "mean" if token == "mean" else token - prefix if token >= prefix else f"prefix:{token}"
            row = spec.num_tokens if token == "mean" else token
            expected = (
                analysis.attention_rollout(
                    record, head_fusion="max", discard_ratio=0.3, start_layer=1, end_layer=end, query=query
                )[0]
                .numpy()
                .ravel()
            )
            np.testing.assert_allclose(rows[i, 0, row], expected, rtol=1e-5, atol=1e-7, err_msg=f"{end}, {query}")


def test_the_rollout_page_gives_the_view_every_querys_rollout(monkeypatch):
    from streamlit.testing.v1 import AppTest

    from analysis.views.attention_view import rollout_view_rows, view_blob
    from test_app import APP, DEMO_PRESENT, RANDOM_MODEL, first_sample

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if not DEMO_PRESENT:
        monkeypatch.setenv("VIZAPP_DEFAULT_MODEL", RANDOM_MODEL)
    app = AppTest.from_file(APP, default_timeout=120)
    app.run()
    app.switch_page("views/rollout/rollout.py").run()
    app.radio(key="fusion").set_value("max").run()
    app.slider(key="start_layer").set_value(1).run()
    assert not app.exception, [e.value for e in app.exception]
    (view,) = [c for c in app.get("component_instance") if c.proto.component_name.endswith("attention_view")]
    args = json.loads(view.proto.json_args)
    spec = app.session_state["current"].spec
    assert (args["heads"], args["head"], args["head_names"]) == (0, 0, ["max fusion, discard 0.00"])
    assert args["value_name"] == "rollout weight" and args["report_layer"] is False and args["report_head"] is False
    assert args["layers"] == list(range(1, spec.num_layers)) and args["layer"] == spec.num_layers - 1
    if DEMO_PRESENT:
        vit = analysis.load_vit("demo")
        record = analysis.capture_attention(vit, vit.preprocess(analysis.load_image(first_sample())))
        ends, rows = rollout_view_rows(record, head_fusion="max", start_layer=1)
        assert args["data_id"] == view_blob(record, ends, rows)[1]["data_id"]  # the page fetches exactly these maps


# --------------------------------------------------------------------------- Compare and Tokens pages


def _the_view(app) -> dict:
    views = [c for c in app.get("component_instance") if c.proto.component_name.endswith("attention_view")]
    assert len(views) == 1, len(views)
    return json.loads(views[0].proto.json_args)


def _demo_app(monkeypatch):
    from streamlit.testing.v1 import AppTest

    from test_app import APP, DEMO_PRESENT, RANDOM_MODEL

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if not DEMO_PRESENT:
        monkeypatch.setenv("VIZAPP_DEFAULT_MODEL", RANDOM_MODEL)
    app = AppTest.from_file(APP, default_timeout=120)
    app.run()
    return app


def _record_of(app):
    from vizapp.resources import forward

    current = app.session_state["current"]
    return forward(*current.args).record


def test_the_compare_page_draws_its_layers_as_panels_of_the_view(monkeypatch):
    """The chosen layers as the view's panels (held: every layer, the Attention page's file), the
    page's head and query; a click reported by the view pins that patch and the head for the page."""
    from analysis.views.attention_view import view_blob

    app = _demo_app(monkeypatch)
    app.switch_page("views/compare/compare.py").run()
    app.selectbox(key="head").set_value(1).run()
    assert not app.exception, [e.value for e in app.exception]
    args = _the_view(app)
    spec = app.session_state["current"].spec
    layers = sorted(app.session_state["cmp_layers"])
    assert (
        args["panels"] == layers and args["report_layer"] is False and args["head"] == 1 and args["report_head"] is True
    )
    assert (
        args["layers"] == list(range(spec.num_layers))
        and args["data_id"] == view_blob(_record_of(app), args["layers"])[1]["data_id"]
    )
    assert args["shared_name"] == "0–max of these layers' heads" and args["note"] == ""
    # the page's query and head reach the panels (a click in the browser sets them: follow_view)
    app.radio(key="query_mode").set_value("patch").run()
    app.number_input(key="query_patch").set_value(5).run()
    app.selectbox(key="head").set_value("mean").run()
    args = _the_view(app)
    assert (args["query_patch"], args["head"], args["query_row"]) == (5, spec.num_heads, spec.num_prefix_tokens + 5)


def test_a_click_in_a_view_pins_its_patch_and_head_for_the_page(monkeypatch):
    """``follow_view``, every page's ``on_change``: a reported click sets the page's query (and head,
    when the page has heads); other reports and bad values change nothing."""
    import vizapp.attention_view as view_module

    spec = load_family("vit").spec
    state = {}
    monkeypatch.setattr(view_module.st, "session_state", state)
    on_change = view_module.follow_view("v", patches=spec.num_patches, heads=spec.num_heads)
    state["v"] = {"event": "click", "patch": 5, "head": "mean", "layer": 0, "n": 1}
    on_change()
    assert (state["query_mode"], state["query_patch"], state["head"]) == ("patch", 5, "mean")
    for value in (
        {"event": "step", "layer": 1},
        {"event": "click", "patch": spec.num_patches, "head": spec.num_heads},
        {"event": "click", "patch": True, "head": True},
        {"event": "drawn", "patch": 1, "head": 1},
        None,
    ):
        state["v"] = value
        on_change()
        assert (state["query_patch"], state["head"]) == (5, "mean"), value
        assert "layer" not in state, value  # no layer control on this page
    state["v"] = {"event": "click", "patch": 2, "head": 1}
    view_module.follow_view("v", patches=spec.num_patches)()  # no heads on the page: the head stays
    assert (state["query_patch"], state["head"]) == (2, "mean")


def test_a_step_in_a_view_sets_the_pages_head_and_layer_and_never_the_query(monkeypatch):
    """A step (←/→, ↑/↓ in the browser) reports ``{"event": "step", "layer"?, "head"?}``: the page's
    head and layer follow, when the page has those controls; the query stays where it was."""
    import vizapp.attention_view as view_module

    spec = load_family("vit").spec
    L, H = spec.num_layers, spec.num_heads
    state = {"query_mode": "cls", "query_patch": 7, "head": "mean", "layer": L - 1}
    monkeypatch.setattr(view_module.st, "session_state", state)
    on_change = view_module.follow_view("v", patches=spec.num_patches, layers=L, heads=H)
    for value, expected in [
        ({"event": "step", "head": 0, "n": 1}, (L - 1, 0)),
        ({"event": "step", "layer": 0, "n": 2}, (0, 0)),
        ({"event": "step", "layer": 1, "head": "mean", "n": 3}, (1, "mean")),
        ({"event": "step", "layer": L, "head": H, "n": 4}, (1, "mean")),  # out of range: nothing
        ({"event": "step", "head": H - 1, "patch": 3, "n": 5}, (1, H - 1)),  # a step never pins
    ]:
        state["v"] = value
        on_change()
        assert (state["layer"], state["head"]) == expected, value
        assert (state["query_mode"], state["query_patch"]) == ("cls", 7), value
    # a windowed layer's view: its cells map to the page's query; its layer is the page's alone
    on_change = view_module.follow_view("v", patches=4, heads=2, to_query=lambda cell: 100 + cell)
    state["v"] = {"event": "click", "patch": 3, "head": 1, "layer": 0}
    on_change()
    assert (state["query_mode"], state["query_patch"], state["head"], state["layer"]) == ("patch", 103, 1, 1)
    state["v"] = {"event": "step", "head": 2}  # that layer has 2 heads: 0, 1 and the mean
    on_change()
    assert state["head"] == 1


def test_the_tokens_page_holds_every_tokens_similarity_in_the_view(monkeypatch):
    """The Tokens page's view: one layer of cosine similarities on the fixed −1..1 scale, row by
    row ``patch_similarity`` of that query (the served file, decoded as the page decodes it)."""
    from analysis.views.attention_view import similarity_view_rows, view_blob

    app = _demo_app(monkeypatch)
    app.switch_page("views/tokens/tokens.py").run()
    app.slider(key="layer").set_value(1).run()
    app.radio(key="tok_kind").set_value("key").run()
    app.radio(key="query_mode").set_value("patch").run()
    app.number_input(key="query_patch").set_value(3).run()
    assert not app.exception, [e.value for e in app.exception]
    args = _the_view(app)
    spec = app.session_state["current"].spec
    assert (args["range_mode"], args["fixed_range"], args["uniform"]) == ("fixed", [-1.0, 1.0], None)
    assert (args["layers"], args["layer"], args["heads"], args["head_names"]) == ([1], 1, 0, ["keys"])
    assert args["report_head"] is False  # one map: no head to step
    assert args["columns"] is False and args["matrix"] is False and args["query_row"] == spec.num_prefix_tokens + 3
    from vizapp.resources import layer_tokens

    keys = layer_tokens(*app.session_state["current"].args, "key", 1)  # (1, T, D)
    blob, meta = view_blob(_record_of(app), [1], similarity_view_rows(keys, spec))
    assert args["data_id"] == meta["data_id"]  # the page fetches exactly these maps
    codes, ranges, *_ = unpack_blob(blob, [1], _one_map(spec), matrix=False)
    for token, query in [(0, "prefix:0"), (spec.num_prefix_tokens + 3, 3), (spec.num_tokens, "mean")]:
        if token == 0 and spec.num_prefix_tokens == 0:
            continue
        exact = analysis.patch_similarity(keys, spec, query).numpy().ravel()
        got = decode(codes[0, 0, token], ranges[0, 0, token])
        assert np.abs(got - exact).max() <= (exact.max() - exact.min()) / 510 + 1e-6, query


def _one_map(spec):
    """``spec`` as the unpacking helpers read a one-map view (no heads besides the map itself)."""
    from types import SimpleNamespace

    return SimpleNamespace(
        num_heads=0, num_tokens=spec.num_tokens, num_patches=spec.num_patches, num_prefix_tokens=spec.num_prefix_tokens
    )
