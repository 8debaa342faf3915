"""Layers' grids, stages and windows as the pages draw them, for every family: a ViT is one stage
whose layers are one window of all tokens; Swin v1/v2 and SAM's image encoder have stage grids and
windows.

A model's layers live on stage grids (:class:`analysis.model.geometry.LayerGeometry`: grid, stride
in input pixels, windows, shift). The app keeps one query for every layer as a cell of the
finest grid (``spec.grid_size``, the patch embedding's, as the ViT pages do) and hands the
library the *pixel* at that cell's centre: each layer then finds the cell of its own grid
that holds that pixel (:meth:`LayerGeometry.cell_of_pixel`). Layer grids never need to agree.

Everything here is geometry and app glue; the maps themselves come from
:func:`analysis.attention_map`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from analysis import ViTSpec
from analysis.model.geometry import LayerGeometry

__all__ = [
    "stage_layers",
    "stage_label",
    "finest_cell_of_pixel",
    "layer_cell_to_query_patch",
    "window_members",
    "window_rectangles",
    "window_shapes",
    "WINDOW_SHAPE_NAME",
]

WINDOW_SHAPE_NAME = "query window"  # the ``name`` of each outline rectangle (tests read it)
WINDOW_COLOUR = "#ffffff"


def stage_layers(spec: ViTSpec) -> dict[int, list[int]]:
    """Stage -> its layers, in order (a ViT or SAM: one stage holding every layer)."""
    stages: dict[int, list[int]] = {}
    for layer in range(spec.num_layers):
        stages.setdefault(spec.geometry(layer).stage, []).append(layer)
    return stages


def stage_label(spec: ViTSpec, stage: int) -> str:
    """``"stage 1 · 14×14 cells of 8 px · 6 heads · 7×7 windows"`` (read from its first layer)."""
    geometry = spec.geometry(stage_layers(spec)[stage][0])
    (gh, gw), (sy, sx), (wh, ww) = geometry.grid_size, geometry.stride, geometry.window_size
    stride = f"{sy} px" if sy == sx else f"{sy}×{sx} px"
    window = "global" if geometry.is_global else f"{ww}×{wh} windows"
    return f"stage {stage} · {gw}×{gh} cells of {stride} · {geometry.num_heads} heads · {window}"


def finest_cell_of_pixel(spec: ViTSpec, y: float, x: float) -> int:
    """The cell of ``spec.grid_size`` (cells of ``spec.patch_size`` px) that holds pixel ``(y, x)``."""
    (ph, pw), (gh, gw) = spec.patch_size, spec.grid_size
    r = min(max(int(y // ph), 0), gh - 1)
    c = min(max(int(x // pw), 0), gw - 1)
    return r * gw + c


def layer_cell_to_query_patch(spec: ViTSpec, geometry: LayerGeometry, cell: int) -> int:
    """A click on cell ``cell`` of a layer's grid, as the app's query: the finest-grid cell
    under that cell's centre pixel (so the layer's own cell of the query is the clicked one)."""
    return finest_cell_of_pixel(spec, *geometry.cell_centre(cell))


def window_members(geometry: LayerGeometry, cell: int) -> np.ndarray:
    """The grid cells (row-major) of the window that holds ``cell``: one row of
    ``geometry.window_cells()``, padding and prefix slots left out."""
    cells = geometry.window_cells().numpy()  # (windows, Wt), −1: padding / prefix
    (window,) = np.nonzero((cells == int(cell)).any(axis=1))[0][:1]
    members = cells[window]
    return np.sort(members[members >= 0])


def _runs(values: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted integers as maximal runs of consecutive values ``[(first, last), ...]``."""
    runs: list[tuple[int, int]] = []
    for value in values:
        if runs and value == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], value)
        else:
            runs.append((value, value))
    return runs


def window_rectangles(geometry: LayerGeometry, cell: int) -> list[tuple[int, int, int, int]]:
    """The window that holds ``cell``, as rectangles ``(x0, y0, x1, y1)`` in input pixels.

    A window is the product of a set of grid rows and a set of grid columns. Without a shift
    each set is one run, so the window is one rectangle; Swin's cyclic shift wraps a window at
    the far edge around the image, so its rows (and/or columns) are two runs, one at each
    border, and the window is drawn as 2 or 4 rectangles. Read from ``window_cells()``; a set of
    cells that is not such a product raises ValueError (then no outline would be honest).
    """
    members = window_members(geometry, cell)
    gw = geometry.grid_size[1]
    rows, cols = sorted(set((members // gw).tolist())), sorted(set((members % gw).tolist()))
    if len(rows) * len(cols) != len(members):
        raise ValueError(f"window of cell {cell} is not a product of rows and columns: cannot outline it")
    sy, sx = geometry.stride
    return [(c0 * sx, r0 * sy, (c1 + 1) * sx, (r1 + 1) * sy) for r0, r1 in _runs(rows) for c0, c1 in _runs(cols)]


def window_shapes(rectangles: Sequence[tuple[int, int, int, int]]) -> list[dict]:
    """Plotly rectangle shapes (dashed white, named :data:`WINDOW_SHAPE_NAME`) in the overlay's
    pixel coordinates (pixel ``x`` spans ``[x, x + 1]``)."""
    return [
        dict(
            type="rect",
            x0=x0,
            y0=y0,
            x1=x1,
            y1=y1,
            name=WINDOW_SHAPE_NAME,
            layer="above",
            line=dict(color=WINDOW_COLOUR, width=2, dash="dash"),
        )
        for x0, y0, x1, y1 in rectangles
    ]
