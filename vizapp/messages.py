"""Text for people: error messages in the app's own words, safe to render as Markdown.

``st.error``/``st.warning`` render Markdown, so a model name such as ``vit_r50*`` or a
message with ``load_vit_x`` loses its ``*`` and ``_``. Every dynamic piece of text goes
through :func:`escape_markdown`. Messages of the analysis API name Python arguments
(``arch=``, ``pretrained=False``); :func:`app_wording` names the sidebar fields instead.
"""

from __future__ import annotations

import re

__all__ = ["escape_markdown", "app_wording", "error_text", "demo_scope_note", "toy_model_note"]

_MARKDOWN_SPECIALS = re.compile(r"([\\`*_{}\[\]<>#|~$])")

# API phrase -> the control that does the same in the app (applied in order).
_API_TO_APP = [
    (
        re.compile(r"e\.g\. load_vit\([^)]*arch='([^']+)'\)(\s*\(in the app: the 'architecture' field\))?"),
        r"e.g. \1 in the sidebar's 'Architecture (for a single file)' field",
    ),
    (
        re.compile(r"a weights file with arch='([^']+)'"),
        r"a weights file with \1 in the 'Architecture (for a single file)' field",
    ),
    (re.compile(r"\barch=('[^']*'|\S+)?"), "the 'Architecture (for a single file)' field"),
    (re.compile(r"\bpretrained=False\b"), "the random: prefix before the model name"),
    (
        re.compile(r"load the model with img_size=\.\.\.(?: or dynamic_img_size=True)?"),
        "set the sidebar's 'Input resolution'",
    ),
    (re.compile(r"\bimg_size=(\d+)"), r"Input resolution \1"),
]


def escape_markdown(text: object) -> str:
    """``text`` with the characters that change Markdown inline (emphasis, code, links, HTML,
    headings, tables, strikethrough, LaTeX ``$``) backslash-escaped."""
    return _MARKDOWN_SPECIALS.sub(r"\\\1", str(text))


def app_wording(message: str) -> str:
    """An API message with its Python arguments replaced by the app's controls."""
    for pattern, replacement in _API_TO_APP:
        message = pattern.sub(replacement, message)
    return message


def error_text(exc: BaseException) -> str:
    """The message of ``exc`` for the app: our typed errors verbatim, others with their type;
    in the app's wording and Markdown-escaped."""
    text = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
    return escape_markdown(app_wording(text))


def demo_scope_note(model_source: str, class_names, is_demo_scene: bool) -> str | None:
    """What the bundled demo model's predictions mean on an image that is not one of its
    scenes; ``None`` for other models and for the demo scenes."""
    if model_source != "demo" or is_demo_scene:
        return None
    names = ", ".join(class_names or [])
    return (
        f"The bundled demo model is a {len(class_names or [])}-class synthetic-shapes classifier ({names}), "
        "trained on generated 48×48 scenes of one shape on clutter (assets/demo_vit/MODEL_CARD.md). "
        "This image is not one of its scenes: it still names one of these shapes, which says nothing "
        "about what the image shows."
    )


def toy_model_note(what: str, route: str) -> str:
    """What a page's own bundled demo model (``what``: "MAE", "CLIP") means on an image that is not
    one of the synthetic scenes it was trained on, and ``route``, the real model to choose instead."""
    return (
        f"**A toy model on this image.** The bundled demo {what} was trained on generated 48×48 scenes of "
        f"one shape on clutter and sees this image at 48×48: what it shows here says nothing about what a real "
        f"{what} does with it. {route}"
    )
