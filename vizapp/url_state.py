"""Shareable views: the model, sample image, layer, head, query and colour settings live in
the URL's query string (``st.query_params``), so a reload or a shared link shows the same
view. The page itself is the URL's path (``st.navigation``). Uploaded images are not
shareable: with an upload, the URL names no image.

    ?model=random:vit_tiny_patch16_224&res=160&img=scene_1_star.png&layer=3&head=2
     &query=patch&patch=17&colours=Magma&range=minmax

:func:`restore` runs once per browser session, before any widget is drawn, and turns the
URL into widget state; :func:`publish` runs on every rerun and writes the widget state
back. Values that do not parse are ignored (the widget keeps its default).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, MutableMapping

from vizapp import refs
from vizapp.refs import ModelRef

RESTORED_FLAG = "_url_restored"


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


def url_params(session: Mapping[str, object], model: ModelRef, uploaded: bool) -> dict[str, str]:
    """The URL parameters for the current view."""
    params = model_params(model)
    for name, (key, _) in WIDGET_PARAMS.items():
        if key == "image_sample" and uploaded:
            continue
        if key in session and session[key] is not None:
            params[name] = str(session[key])
    return params


def restore(
    session: MutableMapping[str, object],
    query_params: Mapping[str, str],
    curated: Mapping[str, ModelRef],
    options: Mapping[str, Collection] = {},
) -> None:
    """Once per session: set widget state from the URL (before any widget is drawn)."""
    if session.get(RESTORED_FLAG):
        return
    session[RESTORED_FLAG] = True
    for key, value in widget_state(dict(query_params), curated, options).items():
        session[key] = value


def publish(query_params, session: Mapping[str, object], model: ModelRef, uploaded: bool) -> None:
    """Write the current view into the URL (only when it changed: no needless messages)."""
    params = url_params(session, model, uploaded)
    if dict(query_params) != params:
        query_params.from_dict(params)
