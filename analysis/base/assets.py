"""Where the bundled files are: the demo ViT and CNN, the sample images and the favicon.

In a source checkout they sit in the repository's top-level ``assets/`` folder. A wheel ships
a copy of that folder inside this package, as ``analysis/_assets`` (``pyproject.toml`` maps it
with ``[tool.setuptools.package-dir]``; the documentation's screenshots, in docs/img, stay out of the wheel).
:func:`asset_path` is the one place that knows both layouts; every reader of a bundled file
goes through it.

    >>> asset_path("demo_vit", "config.json").is_file()
    True
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["asset_path", "assets_dir"]

_PACKAGE = Path(__file__).resolve().parents[1]  # analysis/ (this module is analysis/base/assets.py)
PACKAGED_ASSETS = _PACKAGE / "_assets"  # an installed wheel
CHECKOUT_ASSETS = _PACKAGE.parent / "assets"  # a source checkout (or an editable install of one)


def assets_dir() -> Path:
    """The folder holding the bundled files: the wheel's copy when there is one, else the
    checkout's ``assets/``.

    Returns
    -------
    pathlib.Path
        ``analysis/_assets`` when that folder exists (an installed wheel), else the checkout's top-level
        ``assets/`` (not checked to exist).
    """
    return PACKAGED_ASSETS if PACKAGED_ASSETS.is_dir() else CHECKOUT_ASSETS


def asset_path(*parts: str) -> Path:
    """The path of a bundled file or folder: ``asset_path("demo_vit")``,
    ``asset_path("samples", "coffee.jpg")``.

    Inside the wheel's copy (``analysis/_assets``) when there is one, else the checkout's ``assets/``
    (:func:`assets_dir`). Whether it exists is the caller's question: a missing demo model gets the
    caller's own typed error.

    Parameters
    ----------
    *parts : str
        Path components below the assets folder, joined in order (none: the folder itself).

    Returns
    -------
    pathlib.Path
        The absolute path; not checked to exist.
    """
    return assets_dir().joinpath(*parts)
