"""A griffe extension for ``mkdocs build``: the docstrings' Sphinx roles (:func:`name`,
:class:`name`, ...) become links where the API reference shows the name, and code where it does
not; a role that names nothing logs a warning, which ``mkdocs build --strict`` turns into a failed
build. The names are resolved by :func:`docs.references.resolve` (the same rule as the test)."""

from __future__ import annotations

import html
import logging
import sys
from pathlib import Path

import griffe

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the repository: analysis, vizapp
from references import ROLE, resolve  # noqa: E402

_log = logging.getLogger("mkdocs.plugins.griffe_roles")


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is None:
            return
        module = obj.module.path
        scopes = tuple(obj.path[len(module) + 1 :].split(".")) if obj.path != module else ()

        def replace(match):
            written, name = match.group(0), match.group(2)
            target = resolve(name, module, scopes)
            shown = name.rsplit(".", 1)[-1] if "~" in written else name
            if target is None:
                _log.warning("%s: %s names nothing (in the docstring of %s)", obj.relative_filepath, written, obj.path)
                return f"`{shown}`"
            return f'<autoref identifier="{html.escape(target)}" optional><code>{html.escape(shown)}</code></autoref>'

        obj.docstring.value = ROLE.sub(replace, obj.docstring.value)
