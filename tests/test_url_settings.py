"""Every page's settings in the URL (vizapp.url_state): each setting a page keeps
(``PageInfo.kept_keys``) is written into the URL while the page is open and read back from a link,
so a reload or a shared link opens the page as it was. The browser's own reload is in
test_browser_view_state.py."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from streamlit.testing.v1 import AppTest  # noqa: E402

from vizapp import url_state, views  # noqa: E402
from vizapp.refs import default_model_ref  # noqa: E402

APP = str(REPO / "vizapp" / "app.py")
TIMEOUT = 120
PAGES = views.pages()
# the widget kinds a page setting may be, as AppTest names them
KINDS = ("selectbox", "radio", "slider", "select_slider", "number_input", "checkbox", "toggle", "multiselect")
# settings whose change starts a second model or another source loading: covered by their own pages' tests
LOADS_SOMETHING = {"cmp_model2", "dist_model2", "tok_other", "feat_source", "mae_source", "tp_source", "rob_cnn"}


@pytest.mark.parametrize(
    "value",
    [
        "pca",
        "3",
        "true",
        "null",
        '"quoted"',
        "",
        " 3",
        "NaN",
        "a,b",
        0,
        7,
        -2,
        0.35,
        1e-3,
        True,
        False,
        ["a", "b"],
        [1, 2],
        [],
    ],
)
def test_a_setting_reads_back_as_itself(value):
    text = url_state.encode_setting(value)
    assert isinstance(text, str)
    back = url_state.decode_setting(text)
    assert back == value and type(back) is type(value), (value, text, back)


def test_a_string_is_written_as_itself_unless_it_reads_as_json():
    assert url_state.encode_setting("pca") == "pca"
    assert url_state.encode_setting("3") == '"3"' and url_state.encode_setting("true") == '"true"'
    assert url_state.encode_setting(0.35) == "0.35" and url_state.encode_setting(("a", 1)) == '["a", 1]'
    assert url_state.decode_setting("NaN") == "NaN" and url_state.decode_setting("Infinity") == "Infinity"


@pytest.mark.parametrize("value", [None, float("nan"), math.inf, object(), [object()], {"a": 1}])
def test_what_a_url_cannot_carry_is_left_out(value):
    assert url_state.encode_setting(value) is None


def test_no_page_setting_takes_the_name_of_a_url_parameter():
    for page in PAGES:
        keys = url_state.page_url_keys(page.info.kept_keys)
        assert not set(keys) & (set(url_state.MODEL_PARAMS) | set(url_state.WIDGET_PARAMS)), page.name
        assert "layer" not in keys and "head" not in keys  # the shared parameters carry these
    with pytest.raises(ValueError, match="res"):
        url_state.page_url_keys(("res",))


def _widget(at: AppTest, key: str):
    """``(kind, widget)`` drawn under ``key``, or ``(None, None)`` when the page did not draw it."""
    for kind in KINDS:
        try:
            return kind, getattr(at, kind)(key=key)
        except (KeyError, AttributeError):
            continue
    return None, None


def _candidates(format_func) -> list:
    """Values an option of a widget may hold: the keys of the dicts its ``format_func`` reads (a
    bound ``dict.get``, a closure's or a global's dict), small integers and the labels themselves."""
    found: list = []
    owners = [getattr(format_func, "__self__", None)]
    owners += [cell.cell_contents for cell in getattr(format_func, "__closure__", None) or ()]
    code = getattr(format_func, "__code__", None)
    if code is not None:
        owners += [format_func.__globals__.get(name) for name in code.co_names]
    for owner in owners:
        if isinstance(owner, dict):
            found += list(owner)
        elif isinstance(owner, (list, tuple)) and all(isinstance(v, (str, int)) for v in owner):
            found += list(owner)
    return found + list(range(-1, 1000))


def _option_values(widget) -> list | None:
    """The option values behind a select widget's labels (AppTest shows only the labels), found by
    asking its ``format_func`` which candidate value gives each label; None if one is not found."""
    format_func = widget.format_func
    candidates = _candidates(format_func) + list(widget.options)
    values = []
    for label in widget.options:
        for candidate in candidates:
            try:
                if str(format_func(candidate)) == label:
                    values.append(candidate)
                    break
            except Exception:
                continue
        else:
            return None
    return values


def _another_value(kind: str, widget):
    """A valid value of the widget other than its current one; None when there is none to drive."""
    if kind in ("selectbox", "radio", "multiselect", "select_slider"):
        values = _option_values(widget) if kind != "select_slider" else list(widget.options)
        if not values or len(values) < 2:
            return None
        if kind == "multiselect":
            return [v for v in values[:2] if v not in widget.value] or values[:1]
        return next(v for v in values if v != widget.value)
    if kind in ("checkbox", "toggle"):
        return not widget.value
    if kind in ("slider", "number_input"):
        value = widget.value
        if isinstance(value, (tuple, list)) or value is None:
            return None
        step = widget.proto.step or 1
        low = widget.proto.min if kind == "slider" or widget.proto.has_min else value - 10 * step
        high = widget.proto.max if kind == "slider" or widget.proto.has_max else value + 10 * step
        new = value + step if value + step <= high else value - step
        if new < low:
            return None
        return round(new, 6) if isinstance(value, float) else type(value)(new)
    return None


def _flat(at: AppTest) -> dict[str, str]:
    return {k: (v[0] if isinstance(v, list) else v) for k, v in ((k, at.query_params[k]) for k in at.query_params)}


def _open(page: views.Page, params: dict[str, str] | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    if params:
        at.query_params.update(params)
    at.switch_page(f"views/{page.name}/{page.name}.py")
    at.run()
    at.run()  # a page that held its slower sections until its first result was shown draws them now
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_setting_of_the_page_goes_through_a_link(page):
    """Each setting the page draws (on the demo model) is changed to another valid value; the URL
    then carries it, and a fresh session opened on that URL draws the page with every one of them."""
    at = _open(page)
    keys = url_state.page_url_keys(page.info.kept_keys)
    changed: dict[str, object] = {}
    for key in keys:
        if key in LOADS_SOMETHING:
            continue
        kind, widget = _widget(at, key)
        if widget is None:
            continue
        new = _another_value(kind, widget)
        if new is None:
            continue
        widget.set_value(new).run()
        assert not at.exception, (key, new, [e.value for e in at.exception])
        if _widget(at, key)[1] is None:  # the change hid the widget itself: leave it
            continue
        changed[key] = _widget(at, key)[1].value
    assert changed, f"{page.name}: no setting was driven"
    link = _flat(at)
    for key, value in changed.items():
        assert url_state.decode_setting(link[key]) == value, (key, link.get(key), value)

    opened = _open(page, link)
    for key, value in changed.items():
        kind, widget = _widget(opened, key)
        assert widget is not None, f"{key} not drawn from the link"
        assert widget.value == value, (key, widget.value, value)
    assert _flat(opened) == link


@pytest.mark.parametrize("bad", [{"opacity": "2.5"}, {"opacity": "dense"}, {"discard_ratio": "5", "fusion": "max"}])
def test_a_link_whose_setting_does_not_fit_its_widget_opens_the_page_with_its_defaults(bad):
    """A slider value out of range (or of another type) would fail the widget: the app forgets the
    link's page settings and draws the page with its defaults, no exception shown."""
    rollout = next(page for page in PAGES if page.name == "rollout")
    default = _open(rollout)
    at = _open(rollout, {"layer": "1", **bad})
    assert at.slider(key="opacity").value == default.slider(key="opacity").value
    assert at.radio(key="fusion").value == default.radio(key="fusion").value  # the link's settings went together
    assert at.slider(key="start_layer").value == default.slider(key="start_layer").value
    assert _flat(at)["layer"] == "1"  # the shared settings stand
    assert url_state.decode_setting(_flat(at)["opacity"]) == default.slider(key="opacity").value


def test_a_shared_server_link_carries_no_path_outside_the_roots(monkeypatch, tmp_path):
    monkeypatch.setenv("VIZAPP_SHARED", "1")
    monkeypatch.setenv("VIZAPP_MODEL_ROOTS", str(tmp_path / "allowed"))
    session = {"tok_other": "/home/someone/model", "tok_kind": "pca", "mae_other": str(tmp_path / "allowed" / "m")}
    params = url_state.url_params(session, default_model_ref(), False, list(session))
    assert params == {"tok_kind": "pca", "mae_other": session["mae_other"]}
    monkeypatch.setenv("VIZAPP_SHARED", "0")
    assert (
        url_state.url_params(session, default_model_ref(), False, list(session))["tok_other"] == "/home/someone/model"
    )
