"""The app's figures: :mod:`analysis.plots` (numpy in, ``go.Figure`` out), plus what only the
app needs, the colour-mapped mosaic PNGs kept per digest of their values (a rerun that only
moves a highlight does not re-encode the same picture).

The pages import their figure builders from here; every builder but the two mosaics is
:mod:`analysis.plots`'s own.
"""

from __future__ import annotations

import hashlib

import numpy as np
import plotly.graph_objects as go

from analysis.plots import (
    COLORSCALES,
    HIGHLIGHT,
    LABEL_WIDTH,
    attention_distance_scatter,
    attention_overlay,
    colorized_png,
    colour_stops,
    explained_variance,
    filter_components_grid,
    image_data_uri,
    map_panels,
    patch_centres,
    perturbation_curves,
    predictions_bar,
    rgb_patch_grid,
    robustness_curves,
    similarity_tile,
    similarity_vs_distance,
    styled_layout,
    wrap_label,
)
from analysis.plots import colorize as _colorize  # noqa: F401 - the colour mapping tests compare with
from analysis.plots import mosaic as _plain_mosaic
from analysis.plots import position_similarity_mosaic as _plain_position_similarity_mosaic
from vizapp.records import RecordStore

__all__ = [
    "COLORSCALES",
    "HIGHLIGHT",
    "LABEL_WIDTH",
    "attention_distance_scatter",
    "attention_overlay",
    "colour_stops",
    "explained_variance",
    "filter_components_grid",
    "image_data_uri",
    "map_panels",
    "mosaic",
    "patch_centres",
    "perturbation_curves",
    "position_similarity_mosaic",
    "predictions_bar",
    "rgb_patch_grid",
    "robustness_curves",
    "similarity_tile",
    "similarity_vs_distance",
    "styled_layout",
    "wrap_label",
]

_PICTURES = RecordStore(max_entries=32, max_bytes=64 * 2**20, size=len)  # PNG data URIs of colour-mapped arrays


def _colorized_uri(z: np.ndarray, colorscale: str, zmin: float, zmax: float) -> str:
    """:func:`analysis.plots.colorized_png`, kept per digest of the values."""
    digest = hashlib.sha1(np.ascontiguousarray(z, dtype=np.float32).tobytes()).hexdigest()
    key = (digest, z.shape, colorscale, float(zmin), float(zmax))
    return _PICTURES.get(key, lambda: colorized_png(z, colorscale, zmin, zmax))


def mosaic(tiles: np.ndarray, ncols: int, **options) -> go.Figure:
    """:func:`analysis.plots.mosaic` with the app's cached PNG pictures."""
    return _plain_mosaic(tiles, ncols, png_uri=_colorized_uri, **options)


def position_similarity_mosaic(similarity: np.ndarray, **options) -> go.Figure:
    """:func:`analysis.plots.position_similarity_mosaic` with the app's cached PNG pictures."""
    return _plain_position_similarity_mosaic(similarity, png_uri=_colorized_uri, **options)
