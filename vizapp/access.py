"""Who may load what: a person's own machine (the default) or a server a lab shares.

On one's own machine every source works: server paths, hub names, the bundled demos. A shared
server (``VIZAPP_SHARED=1``) trusts no visitor, nor any link a visitor opens, with its file system:

* a path (anything with a ``/`` or ``\\``, starting with ``.`` or ``~``, ending in a weights suffix,
  or naming something that exists relative to the server's working directory) loads only when it
  resolves, symbolic links and ``..`` followed, inside one of the folders listed in
  ``VIZAPP_MODEL_ROOTS`` (separated by ``os.pathsep``; none by default);
* pretrained weights from a hub (a timm or Hugging Face name, ``hf-hub:``, ``hf:``,
  ``torchvision:``, ``open_clip:``) load only with ``VIZAPP_ALLOW_HUB=1``; random weights of an
  architecture (``random:NAME``) and the bundled demos (``demo``, ``demo_*``) always do;
* the operator's own choices (``VIZAPP_DEFAULT_MODEL``) are not a visitor's and always load.

A refusal is a :class:`SourceRefusedError` whose message is the same whether the path exists or not,
so that no visitor learns anything about the server's files. Every loader of
:mod:`vizapp.resources`, :mod:`vizapp.sae_resources` and of a page's own ``compute.py`` (the MAE
and Text prompts pages') asks :func:`check_source` first, so the sidebar, a link, the second-model
boxes and the MAE, CLIP, CNN and SAE boxes all obey it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from analysis import ModelLoadError

__all__ = ["SourceRefusedError", "check_source", "shared_mode", "model_roots", "hub_allowed"]

HUB_PREFIXES = ("hf-hub:", "hf_hub:", "hf:", "torchvision:", "open_clip:", "timm:")
WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors", ".npz", ".ckpt", ".onnx")
BUNDLED = re.compile(r"demo(_[a-z0-9_]+)?")
PATH_REFUSED = (
    "This is a shared server: it opens models only from the folders its operator allows, by their path "
    "inside them, and this source is not one of them. Choose a named model, a bundled demo or random weights."
)
HUB_REFUSED = (
    "This is a shared server: it does not download pretrained weights for visitors. Choose a bundled demo, "
    "random weights (random:NAME) or a model from the folders its operator allows."
)


class SourceRefusedError(ModelLoadError):
    """A shared server refuses a source a visitor (or a link) named; nothing was read or loaded."""


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def shared_mode() -> bool:
    """``VIZAPP_SHARED=1``: the server is shared, visitors are not trusted with its file system."""
    return _flag("VIZAPP_SHARED")


def hub_allowed() -> bool:
    """``VIZAPP_ALLOW_HUB=1``: a shared server may download pretrained weights for visitors."""
    return _flag("VIZAPP_ALLOW_HUB")


def model_roots() -> tuple[Path, ...]:
    """The folders of ``VIZAPP_MODEL_ROOTS`` (``os.pathsep``-separated), resolved; none by default."""
    text = os.environ.get("VIZAPP_MODEL_ROOTS", "")
    return tuple(Path(part).expanduser().resolve() for part in text.split(os.pathsep) if part.strip())


def _operator_choice(source: str) -> bool:
    from vizapp.refs import default_model_ref

    return source == default_model_ref().source


def _names_a_path(source: str) -> bool:
    return (
        "/" in source
        or "\\" in source
        or source.startswith((".", "~"))
        or source.lower().endswith(WEIGHT_SUFFIXES)
        or Path(source).exists()  # relative to the working directory; the refusal reads the same either way
    )


def _inside_roots(source: str) -> bool:
    path = Path(source).expanduser().resolve()
    return any(path == root or path.is_relative_to(root) for root in model_roots())


def check_source(source: str, *, pretrained: bool = True) -> None:
    """Raise :class:`SourceRefusedError` when a shared server must not load ``source`` for a visitor
    (the module docstring has the rule); do nothing on one's own machine.

    Parameters
    ----------
    source:
        What the visitor or the link named: a path, a hub name, ``"demo"``, an architecture name.
    pretrained:
        ``False`` for random weights of an architecture (nothing is downloaded).
    """
    if not shared_mode():
        return
    text = source.strip()
    if BUNDLED.fullmatch(text) or _operator_choice(text):
        return
    if text.startswith(HUB_PREFIXES):
        if pretrained and not hub_allowed():
            raise SourceRefusedError(HUB_REFUSED)
        return
    if _names_a_path(text):
        if not _inside_roots(text):
            raise SourceRefusedError(PATH_REFUSED)
        return
    if pretrained and not hub_allowed():  # a bare architecture name: its pretrained weights come from a hub
        raise SourceRefusedError(HUB_REFUSED)
