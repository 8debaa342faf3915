"""Shareable views: the model, sample image, the shared settings (layer, head, query, colours)
and every setting the open page keeps live in the URL's query string (``st.query_params``), so a
reload or a shared link shows the same view. The page itself is the URL's path
(``st.navigation``). Uploaded images are not shareable: with an upload, the URL names no image.

    /tokens?model=random:vit_tiny_patch16_224&res=160&img=scene_1_star.png&layer=3&head=2
     &query=patch&patch=17&colours=Magma&range=minmax&tok_kind=norms

The shared settings have short names (:data:`WIDGET_PARAMS`); a page's own settings (its
``PageInfo.kept_keys``) go by their session key, their value written by :func:`encode_setting`
(a string as itself, anything else as JSON: ``opacity=0.35``, ``explain_methods=["rollout"]``).

:func:`restore` runs once per browser session, before any widget is drawn, and turns the
URL into widget state; :func:`publish` runs on every rerun and writes the widget state
back. Values that do not parse are ignored (the widget keeps its default); a page setting
that parses but does not fit its widget (a slider value out of range) is dropped by the app,
which then opens the page with its defaults (:func:`drop_linked_settings`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, MutableMapping
from typing import cast

from vizapp import access, refs
from vizapp.refs import ModelRef

RESTORED_FLAG = "_url_restored"
LINKED_KEYS = "_url_linked_keys"  # session key: the page settings the first run took from the URL


def _int(text: str) -> int:
    return int(text)


def _head(text: str) -> str | int:
    return "mean" if text == "mean" else int(text)


#: URL parameter -> (widget key, parse). Written back with ``str``.
WIDGET_PARAMS: dict[str, tuple[str, Callable[[str], object]]] = {
    "img": ("image_sample", str),
    "layer": ("layer", _int),
    "head": ("head", _head),
    "query": ("query_mode", str),
    "patch": ("query_patch", _int),
    "ptok": ("query_prefix", _int),
    "colours": ("colorscale", str),
    "range": ("map_range", str),
    "cells": ("map_cells", str),
}


#: URL parameters that name the model (:func:`model_params`); no page setting may take these names.
MODEL_PARAMS = ("model", "arch", "res")


def _no_constants(name: str) -> object:
    raise ValueError(f"{name} is not a setting")


def _json(text: str) -> object:
    """``text`` read as strict JSON (no ``NaN`` or ``Infinity``); ValueError when it is not."""
    return json.loads(text, parse_constant=_no_constants)


def encode_setting(value: object) -> str | None:
    """A page setting as one URL value, read back by :func:`decode_setting`.

    A string is written as itself unless it would read as JSON (``"3"``, ``"true"``), which is
    then quoted; a number, a bool or a list (a tuple becomes one) is written as JSON. So
    ``decode_setting(encode_setting(v)) == v`` for each of these.

    Parameters
    ----------
    value : object
        The setting's session value.

    Returns
    -------
    str or None
        The URL value; None for a value the URL cannot carry (None, NaN, an object).
    """
    if isinstance(value, str):
        try:
            _json(value)
        except ValueError:
            return value
        return json.dumps(value)
    if isinstance(value, tuple):
        value = list(value)
    if value is None or not isinstance(value, (bool, int, float, list)):
        return None
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):  # NaN, or a list holding an object
        return None


def decode_setting(text: str) -> object:
    """The setting a URL value names: its JSON value, or the text itself when it is not JSON
    (the inverse of :func:`encode_setting`).

    Parameters
    ----------
    text : str
        One URL value.

    Returns
    -------
    object
        A string, number, bool or list.
    """
    try:
        return _json(text)
    except ValueError:
        return text


def page_url_keys(kept_keys: Collection[str]) -> tuple[str, ...]:
    """The page's settings that the URL carries under their own key: its ``kept_keys`` less those
    the shared parameters carry (:data:`WIDGET_PARAMS`: layer, head, query).

    Raises
    ------
    ValueError
        A page setting named like a model parameter or a shared parameter of another widget.
    """
    shared = {key for key, _ in WIDGET_PARAMS.values()}
    clashing = [key for key in kept_keys if key not in shared and (key in MODEL_PARAMS or key in WIDGET_PARAMS)]
    if clashing:
        raise ValueError(f"Page settings {clashing} take the names of URL parameters; rename them.")
    return tuple(key for key in kept_keys if key not in shared)


def model_params(ref: ModelRef) -> dict[str, str]:
    """The URL parameters naming ``ref`` (none for the default model at its own resolution)."""
    if ref == refs.default_model_ref():
        return {}
    params = {"model": ("" if ref.pretrained else "random:") + ref.source}
    if ref.arch:
        params["arch"] = ref.arch
    if ref.img_size:
        params["res"] = str(ref.img_size)
    return params


def model_widget_state(params: Mapping[str, str], curated: Mapping[str, ModelRef]) -> dict[str, object]:
    """Sidebar widget values that select the model the URL names."""
    state: dict[str, object] = {}
    if params.get("res", "").isdigit():
        state["resolution"] = int(params["res"])
    text = params.get("model", "").strip()
    if not text:
        return state
    ref = refs.parse_model_ref(text)
    arch = params.get("arch", "").strip() or None
    ref = ref._replace(arch=arch)
    if ref == refs.default_model_ref():
        state["model_source"] = "default"
    elif ref in curated.values():
        state["model_source"] = "curated"
        state["model_curated"] = next(label for label, r in curated.items() if r == ref)
    elif arch:
        state.update(model_source="local", model_path=ref.source, model_arch=arch)
    else:
        state.update(model_source="timm", model_timm=text)
    return state


def widget_state(
    params: Mapping[str, str], curated: Mapping[str, ModelRef], options: Mapping[str, Collection] = {}
) -> dict[str, object]:
    """Every widget value the URL sets. Values that do not parse, or are not among a widget's
    ``options`` (when given for its key), are left out. Layer, head and patch indices are
    checked later, against the model (``ui.clamp_state``)."""
    state = model_widget_state(params, curated)
    for name, (key, parse) in WIDGET_PARAMS.items():
        if name in params:
            try:
                value = parse(params[name])
            except ValueError:
                continue
            if key not in options or value in options[key]:
                state[key] = value
    return state


def page_state(params: Mapping[str, str], page_keys: Collection[str]) -> dict[str, object]:
    """The page settings the URL sets: each of ``page_keys`` (:func:`page_url_keys`) it names,
    decoded (:func:`decode_setting`)."""
    return {key: decode_setting(params[key]) for key in page_keys if key in params}


def _linkable(value: str) -> bool:
    """Whether a link may carry ``value``: on a shared server, never a path outside the roots the
    operator allows (a link carries only what a visitor may choose)."""
    try:
        access.check_source(value, pretrained=False)
    except access.SourceRefusedError:
        return False
    return True


def url_params(
    session: Mapping[str, object], model: ModelRef, uploaded: bool, page_keys: Collection[str] = ()
) -> dict[str, str]:
    """The URL parameters for the current view: the model's, the shared settings', then the
    open page's own settings (``page_keys``, :func:`page_url_keys`)."""
    params = model_params(model)
    for name, (key, _) in WIDGET_PARAMS.items():
        if key == "image_sample" and uploaded:
            continue
        if key in session and session[key] is not None:
            params[name] = str(session[key])
    for key in page_keys:
        text = encode_setting(session.get(key))
        if text is not None and _linkable(text):
            params[key] = text
    return params


def restore(
    session: MutableMapping[str, object],
    query_params: Mapping[str, str],
    curated: Mapping[str, ModelRef],
    options: Mapping[str, Collection] = {},
    page_keys: Collection[str] = (),
) -> None:
    """Once per session: set widget state from the URL (before any widget is drawn): the model,
    the shared settings, and the open page's own (``page_keys``), whose keys are remembered for
    :func:`drop_linked_settings`."""
    if session.get(RESTORED_FLAG):
        return
    session[RESTORED_FLAG] = True
    params = dict(query_params)
    for key, value in widget_state(params, curated, options).items():
        session[key] = value
    linked = page_state(params, page_keys)
    session.update(linked)
    session[LINKED_KEYS] = tuple(linked)


def drop_linked_settings(session: MutableMapping[str, object], copies: Callable[[str], str]) -> bool:
    """Forget the page settings the URL set (:func:`restore`), once: the app calls it when the
    first run of a linked page failed, and reruns the page with its defaults.

    Parameters
    ----------
    session : MutableMapping
        The session state.
    copies : callable
        The session key of a setting's permanent copy (``vizapp.state.kept_key``), dropped too.

    Returns
    -------
    bool
        Whether there were any to forget (else the failure is not the link's).
    """
    linked = cast(tuple[str, ...], session.pop(LINKED_KEYS, ()))
    for key in linked:
        session.pop(key, None)
        session.pop(copies(key), None)
    return bool(linked)


def set_by_link(session: Mapping[str, object], key: str) -> bool:
    """Whether the page setting ``key`` holds a link's value not yet drawn: a page that decides a
    setting itself (an automatic default) leaves it to the link on that first draw."""
    return key in cast(tuple[str, ...], session.get(LINKED_KEYS, ()))


def settle_linked_settings(session: MutableMapping[str, object]) -> None:
    """The first run drew with the link's settings: they are the page's own from now on."""
    session.pop(LINKED_KEYS, None)


def publish(
    query_params, session: Mapping[str, object], model: ModelRef, uploaded: bool, page_keys: Collection[str] = ()
) -> None:
    """Write the current view into the URL (only when it changed: no needless messages)."""
    params = url_params(session, model, uploaded, page_keys)
    if dict(query_params) != params:
        query_params.from_dict(params)
