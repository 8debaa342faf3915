"""Streamlit explorer for Vision Transformer attention: ``streamlit run vizapp/app.py``.

The app needs the ``app`` extra (Streamlit, pyarrow): ``pip install "vit-explorer[app]"``. The
library, ``analysis``, does not; importing ``vizapp`` without them raises
:class:`AppDependencyError`, which says what to install.
"""

from __future__ import annotations

import importlib.util

#: what ``pip install "vit-explorer[app]"`` adds to the library's dependencies (pyproject.toml)
APP_DEPENDENCIES = ("streamlit", "pyarrow")


class AppDependencyError(ImportError):
    """The app's dependencies (the ``app`` extra) are not installed."""


def _missing(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):  # a module set to None in sys.modules, a broken parent
        return True


_absent = [name for name in APP_DEPENDENCIES if _missing(name)]
if _absent:
    raise AppDependencyError(
        f"vizapp, the vit-explorer app, needs {' and '.join(_absent)}, which the library alone does not install: "
        'pip install "vit-explorer[app]" (in a checkout: pip install -e ".[app]"). '
        "The library, analysis, works without them."
    )
