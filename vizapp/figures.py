"""What only the app adds to :mod:`analysis.plots`' figures: the colour-mapped mosaic PNGs kept
per digest of their values (a rerun that only moves a highlight does not re-encode the same
picture).

The pages import every other figure builder from :mod:`analysis.plots` itself; from here only
the two mosaics, :func:`mosaic` and :func:`position_similarity_mosaic`, with that cache.
"""

from __future__ import annotations

import hashlib
from typing import cast

import numpy as np
import plotly.graph_objects as go

from analysis import plots
from vizapp.records import RecordStore

__all__ = ["mosaic", "position_similarity_mosaic"]  # analysis.plots' own, with the PNG cache

_PICTURES = RecordStore(max_entries=32, max_bytes=64 * 2**20, size=len)  # PNG data URIs of colour-mapped arrays


def _colorized_uri(z: np.ndarray, colorscale: str, zmin: float, zmax: float) -> str:
    """:func:`analysis.plots.colorized_png`, kept per digest of the values."""
    digest = hashlib.sha1(np.ascontiguousarray(z, dtype=np.float32).tobytes()).hexdigest()
    key = (digest, z.shape, colorscale, float(zmin), float(zmax))
    return cast(
        str, _PICTURES.get(key, lambda: plots.colorized_png(z, colorscale, zmin, zmax))
    )  # the store holds these URIs


def mosaic(tiles: np.ndarray, ncols: int, **options) -> go.Figure:
    """:func:`analysis.plots.mosaic` with the app's cached PNG pictures."""
    return plots.mosaic(tiles, ncols, png_uri=_colorized_uri, **options)


def position_similarity_mosaic(similarity: np.ndarray, **options) -> go.Figure:
    """:func:`analysis.plots.position_similarity_mosaic` with the app's cached PNG pictures."""
    return plots.position_similarity_mosaic(similarity, png_uri=_colorized_uri, **options)
