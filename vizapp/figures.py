"""The app's figures: :mod:`analysis.plots` (numpy in, ``go.Figure`` out), plus what only the
app needs, the colour-mapped mosaic PNGs kept per digest of their values (a rerun that only
moves a highlight does not re-encode the same picture).

The pages import their figure builders from here; every builder but the two mosaics is
:mod:`analysis.plots`'s own.
"""

from __future__ import annotations

import hashlib
from typing import cast

import numpy as np
import plotly.graph_objects as go

from analysis import plots
from analysis.plots import *  # noqa: F403 - the pages draw with analysis.plots' own builders
from vizapp.records import RecordStore

__all__ = list(plots.__all__)  # mosaic and position_similarity_mosaic below: the same, with the PNG cache

_PICTURES = RecordStore(max_entries=32, max_bytes=64 * 2**20, size=len)  # PNG data URIs of colour-mapped arrays


def _colorized_uri(z: np.ndarray, colorscale: str, zmin: float, zmax: float) -> str:
    """:func:`analysis.plots.colorized_png`, kept per digest of the values."""
    digest = hashlib.sha1(np.ascontiguousarray(z, dtype=np.float32).tobytes()).hexdigest()
    key = (digest, z.shape, colorscale, float(zmin), float(zmax))
    return cast(
        str, _PICTURES.get(key, lambda: plots.colorized_png(z, colorscale, zmin, zmax))
    )  # the store holds these URIs


def mosaic(tiles: np.ndarray, ncols: int, **options) -> go.Figure:  # type: ignore[no-redef]  # replaces plots'
    """:func:`analysis.plots.mosaic` with the app's cached PNG pictures."""
    return plots.mosaic(tiles, ncols, png_uri=_colorized_uri, **options)


def position_similarity_mosaic(similarity: np.ndarray, **options) -> go.Figure:  # type: ignore[no-redef]  # as mosaic
    """:func:`analysis.plots.position_similarity_mosaic` with the app's cached PNG pictures."""
    return plots.position_similarity_mosaic(similarity, png_uri=_colorized_uri, **options)
