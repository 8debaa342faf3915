"""Charts without an image: predictions, explained variance, similarity against distance,
attention distance against depth, deletion/insertion and robustness curves."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .layout import LABEL_WIDTH, wrap_label
from .style import SERIES_COLOURS, colour_stops, restyle_figure, styled_figure

__all__ = [
    "predictions_bar",
    "wrap_label",
    "LABEL_WIDTH",
    "explained_variance",
    "similarity_vs_distance",
    "SIMILARITY_AXIS_TITLE",
    "attention_distance_scatter",
    "perturbation_curves",
    "perturbation_axis_top",
    "perturbation_axis_bottom",
    "robustness_curves",
    "transfer_heatmap",
    "grouped_bars",
    "DISTANCE_UNIT_SHORT",
    "DISTANCE_UNIT_TITLE",
]


def predictions_bar(
    names: Sequence[str], probabilities: np.ndarray, *, height: int = 240, x_title: str = "probability (%)"
) -> go.Figure:
    """Top-k predictions as horizontal bars, most probable on top. Long class names (ImageNet's
    "tench, Tinca tinca") are wrapped onto lines of at most ``LABEL_WIDTH`` characters rather
    than clipped; the hover shows the name whole.

    Parameters
    ----------
    names : sequence of str
        The ``k`` class names, most probable first.
    probabilities : numpy.ndarray
        ``(k,)`` probabilities in [0, 1], in the order of ``names``; drawn as percentages.
    height : int, default 240
        Figure height (px) at least; it grows with the number of bars and their label lines.
    x_title : str, default "probability (%)"
        The x axis's title.

    Returns
    -------
    plotly.graph_objects.Figure
        One horizontal bar trace on a 0–100 x axis, each bar labelled with its percentage.
    """
    probs = np.asarray(probabilities, dtype=np.float64)[::-1] * 100
    full = list(names)[::-1]
    wrapped = [wrap_label(name) for name in full]
    lines = max((label.count("<br>") + 1 for label in wrapped), default=1)
    trace = dict(
        type="bar",
        x=probs,
        y=list(range(len(full))),
        orientation="h",
        text=[f"{p:.1f}%" for p in probs],
        textposition="auto",
        marker=dict(color="#3b528b"),
        customdata=full,
        hovertemplate="%{customdata}: %{x:.2f}%<extra></extra>",
    )
    return styled_figure(
        [trace],
        title=None,
        height=max(height, 40 + len(full) * 18 * lines),
        xaxis=dict(title=dict(text=x_title), range=[0, 100], showgrid=True),
        yaxis=dict(automargin=True, tickmode="array", tickvals=list(range(len(full))), ticktext=wrapped),
    )


SIMILARITY_AXIS_TITLE = "cosine similarity (mean ± std per distance bin)"


def _rgba(hex_colour: str, alpha: float) -> str:
    r, g, b = (int(hex_colour[k : k + 2], 16) for k in (1, 3, 5))
    return f"rgba({r}, {g}, {b}, {alpha})"


def similarity_vs_distance(curves: Sequence[tuple[str, Any]], *, height: int = 360) -> go.Figure:  # Any: a DistanceBins
    """Cosine similarity against patch distance: the mean of each distance bin as a line with
    markers at the bin's mean distance, a band of ± one standard deviation around it, and the
    bin's edges and pair count in the hover.

    Parameters
    ----------
    curves : sequence of (str, DistanceBins)
        One curve per ``(name, bins)`` with ``bins`` a :class:`analysis.DistanceBins`
        (:func:`analysis.similarity_distance_bins`): its ``distance``, ``mean``, ``std``,
        ``lower``, ``upper`` and ``count``, each ``(bins,)``.
    height : int, default 360
        Figure height (px).

    Returns
    -------
    plotly.graph_objects.Figure
        Per curve a line and a shaded band on a y axis from −1.05 to 1.05.
    """
    traces = []
    for i, (name, bins) in enumerate(curves):
        colour = SERIES_COLOURS[i % len(SERIES_COLOURS)]
        x, mean, std = (np.asarray(v, dtype=np.float64) for v in (bins.distance, bins.mean, bins.std))
        band = dict(
            type="scatter",
            mode="lines",
            line=dict(width=0, color=colour),
            hoverinfo="skip",
            showlegend=False,
            legendgroup=name,
        )
        traces += [
            dict(band, x=x, y=mean - std, name=f"{name}: mean − std"),
            dict(band, x=x, y=mean + std, name=f"{name}: mean + std", fill="tonexty", fillcolor=_rgba(colour, 0.2)),
        ]
        where = [
            ("distance 0 (each patch with itself)" if hi == 0 else f"distance in [{lo:.3g}, {hi:.3g})")
            for lo, hi in zip(np.asarray(bins.lower), np.asarray(bins.upper), strict=True)
        ]
        traces.append(
            dict(
                type="scatter",
                x=x,
                y=mean,
                mode="lines+markers",
                name=name,
                marker=dict(size=5),
                legendgroup=name,
                line=dict(color=colour),
                text=where,
                customdata=np.stack([std, np.asarray(bins.count)], axis=1),
                hovertemplate="%{text}: mean %{x:.2f}<br>cos %{y:.3f} ± %{customdata[0]:.3f} (std)"
                "<br>%{customdata[1]:,} pairs<extra>" + name + "</extra>",
            )
        )
    return styled_figure(
        traces,
        title=None,
        height=height,
        legend=dict(orientation="h", y=1.1, x=0),
        xaxis=dict(title=dict(text="distance between patch centres (patches of the model's grid)"), showgrid=True),
        yaxis=dict(title=dict(text=SIMILARITY_AXIS_TITLE), range=[-1.05, 1.05], showgrid=True),
    )


def perturbation_curves(
    curves: Sequence[tuple[str, np.ndarray, np.ndarray, np.ndarray, float, float]],
    *,
    height: int = 380,
    y_title: str = "probability of the class",
    symbol: str = "p",
) -> go.Figure:
    """Deletion (left) and insertion (right) curves; the AUCs are in the legend. The random
    baseline, when named ``"random"``, is drawn dashed grey. A dotted line in both panels marks
    the first curve's deletion value at 0% (the unperturbed image). Both panels share the y range
    of :func:`perturbation_axis_bottom` and :func:`perturbation_axis_top`: a value that goes
    below 0 (an image–text score) gets an axis from its minimum.

    Parameters
    ----------
    curves : sequence of (str, numpy.ndarray, numpy.ndarray, numpy.ndarray, float, float)
        One line per ``(name, fractions, deletion, insertion, deletion AUC, insertion AUC)``:
        ``fractions`` ``(S,)`` in [0, 1] (drawn as % of patches), ``deletion`` and ``insertion``
        ``(S,)`` the measured value at each fraction.
    height : int, default 380
        Figure height (px).
    y_title : str, default "probability of the class"
        The y axis's title: the measured value.
    symbol : str, default "p"
        The measured value's symbol in the hover and the unperturbed-value note.

    Returns
    -------
    plotly.graph_objects.Figure
        Two side-by-side panels (deletion, insertion), one legend entry per curve.
    """
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=["Deletion (lower is more faithful)", "Insertion (higher is more faithful)"],
        horizontal_spacing=0.08,
    )
    traces = []
    for i, (name, fractions, deletion, insertion, deletion_auc, insertion_auc) in enumerate(curves):
        baseline = name == "random"
        line = dict(color="#9e9e9e", dash="dash") if baseline else dict(color=SERIES_COLOURS[i % len(SERIES_COLOURS)])
        for column, values, auc in ((1, deletion, deletion_auc), (2, insertion, insertion_auc)):
            traces.append(
                dict(
                    type="scatter",
                    x=100 * np.asarray(fractions),
                    y=values,
                    mode="lines+markers",
                    marker=dict(size=4),
                    line=line,
                    name=f"{name} (AUC {deletion_auc:.3f} / {insertion_auc:.3f})",
                    legendgroup=name,
                    showlegend=column == 1,
                    xaxis="x" if column == 1 else "x2",
                    yaxis="y" if column == 1 else "y2",
                    hovertemplate="%{x:.0f}% of patches<br>"
                    + symbol
                    + " = %{y:.3f}<extra>"
                    + name
                    + f" · AUC {auc:.3f}</extra>",
                )
            )
    fig.add_traces(traces)
    axis = dict(range=[0, 100], showgrid=True, title=dict(text="patches removed, most relevant first (%)"))
    top = perturbation_axis_top(curves)
    start = float(np.asarray(curves[0][2])[0]) if curves else None  # deletion at 0%: the unperturbed image
    shapes, notes = [], []
    if start is not None and np.isfinite(start):
        for x_ref, y_ref in (("x", "y"), ("x2", "y2")):
            shapes.append(
                dict(
                    type="line",
                    xref=f"{x_ref} domain",
                    yref=y_ref,
                    x0=0,
                    x1=1,
                    y0=start,
                    y1=start,
                    line=dict(color="#616161", width=1, dash="dot"),
                )
            )
        notes.append(
            dict(
                xref="x domain",
                yref="y",
                x=1,
                y=start,
                xanchor="right",
                yanchor="bottom",
                showarrow=False,
                text=f"unperturbed {symbol} = {start:.3g}",
                font=dict(size=11, color="#616161"),
            )
        )
    bottom = perturbation_axis_bottom(curves)
    fig = restyle_figure(
        fig,
        title=None,
        height=height,
        legend=dict(orientation="h", y=-0.25, x=0),
        xaxis=axis,
        xaxis2={**axis, "title": dict(text="patches restored, most relevant first (%)")},
        yaxis=dict(range=[bottom, top], title=dict(text=y_title), showgrid=True),
        yaxis2=dict(range=[bottom, top], showgrid=True),
    )
    fig.update_layout(shapes=shapes)
    for note in notes:
        fig.add_annotation(**note)
    fig.update_layout(margin=dict(t=40))  # room for the subplot titles
    return fig


def perturbation_axis_top(curves) -> float:
    """The y-axis top of :func:`perturbation_curves`: 5% above the largest probability on any
    curve (a low-probability class is not flattened onto a 0–1 axis), at most 1.02; both
    panels share it so deletion and insertion compare. A value beyond 1 (an image–text score):
    5% above its largest.

    Parameters
    ----------
    curves : sequence of tuple
        The curves of :func:`perturbation_curves`; items 2 and 3 of each (deletion, insertion,
        each ``(S,)``) are read, NaN ignored.

    Returns
    -------
    float
        The axis top; 1.02 when no curve has a positive finite value.
    """
    values = [np.asarray(v, dtype=np.float64) for curve in curves for v in (curve[2], curve[3])]
    peak = max((float(np.nanmax(v)) for v in values if v.size and np.isfinite(v).any()), default=1.0)
    if peak > 1:
        return peak * 1.05
    return min(1.02, peak * 1.05) if peak > 0 else 1.02


def perturbation_axis_bottom(curves) -> float:
    """The y-axis bottom of :func:`perturbation_curves`: 0, or 5% below the smallest value when
    a curve goes below 0 (a score, not a probability).

    Parameters
    ----------
    curves : sequence of tuple
        The curves of :func:`perturbation_curves`; items 2 and 3 of each (deletion, insertion,
        each ``(S,)``) are read, NaN ignored.

    Returns
    -------
    float
        ``0.0``, or ``1.05 ×`` the smallest (negative) value.
    """
    values = [np.asarray(v, dtype=np.float64) for curve in curves for v in (curve[2], curve[3])]
    low = min((float(np.nanmin(v)) for v in values if v.size and np.isfinite(v).any()), default=0.0)
    return 0.0 if low >= 0 else low * 1.05


def robustness_curves(
    curves: Sequence[tuple[str, Sequence[float], np.ndarray]],
    *,
    x_title: str,
    y_title: str,
    chance: float | None = None,
    height: int = 380,
    x_dtick: float | None = None,
    dashed: Sequence[str] = (),
) -> go.Figure:
    """Score against perturbation level, one line per curve, on a y axis from 0 to 1.02.

    Parameters
    ----------
    curves : sequence of (str, sequence of float, numpy.ndarray)
        One line per ``(name, levels, scores)``: ``levels`` ``(S,)`` and ``scores`` ``(S,)`` in [0, 1].
    x_title : str
        The x axis's title (the perturbation and its unit).
    y_title : str
        The y axis's title (the score).
    chance : float or None, default None
        The chance level (e.g. 1 / classes), drawn as a dotted grey line; ``None``, no line.
    height : int, default 380
        Figure height (px).
    x_dtick : float or None, default None
        The x axis's tick step (1 for layers); ``None`` (or 0), plotly's.
    dashed : sequence of str, default ()
        Names of control lines, each drawn dashed in the colour of the line it controls (the name
        before its first comma: ``"ViT, noise patch"`` beside ``"ViT"``).

    Returns
    -------
    plotly.graph_objects.Figure
        One line-and-marker trace per curve.
    """
    solid = [name for name, _, _ in curves if name not in dashed]
    traces = [
        dict(
            type="scatter",
            x=list(levels),
            y=scores,
            mode="lines+markers",
            name=name,
            marker=dict(size=6),
            line=_line_style(name, i, solid, dashed),
            hovertemplate="level %{x:.3g}<br>%{y:.3f}<extra>" + name + "</extra>",
        )
        for i, (name, levels, scores) in enumerate(curves)
    ]
    shapes = []
    if chance is not None:
        shapes.append(
            dict(
                type="line",
                xref="paper",
                x0=0,
                x1=1,
                y0=chance,
                y1=chance,
                line=dict(color="#9e9e9e", dash="dot", width=1),
            )
        )
    return styled_figure(
        traces,
        title=None,
        height=height,
        legend=dict(orientation="h", y=1.12, x=0),
        shapes=shapes,
        xaxis=dict(title=dict(text=x_title), showgrid=True, **({"dtick": x_dtick} if x_dtick else {})),
        yaxis=dict(title=dict(text=y_title), range=[0, 1.02], showgrid=True),
    )


def _line_style(name: str, index: int, solid: Sequence[str], dashed: Sequence[str]) -> dict:
    """A line's colour (a control line: its solid line's colour) and dash."""
    if name in dashed:
        owner = name.split(",", 1)[0]
        colour_index = solid.index(owner) if owner in solid else index
        return dict(color=SERIES_COLOURS[colour_index % len(SERIES_COLOURS)], dash="dash")
    return dict(color=SERIES_COLOURS[solid.index(name) % len(SERIES_COLOURS)])


def transfer_heatmap(
    names: Sequence[str], accuracy: np.ndarray, *, title: str | None = None, height: int = 340
) -> go.Figure:
    """``accuracy (source, target)`` in [0, 1] as a heatmap: row ``i`` the model the attack was made
    against, column ``j`` the model it was fed to (the diagonal: white-box), each cell labelled.

    Parameters
    ----------
    names : sequence of str
        The ``M`` model names, for both the rows and the columns.
    accuracy : numpy.ndarray
        ``(M, M)`` accuracies in [0, 1], row the source model, column the target.
    title : str or None, default None
        Figure title; ``None``, none.
    height : int, default 340
        Figure height (px).

    Returns
    -------
    plotly.graph_objects.Figure
        One Viridis heatmap on a fixed 0–1 scale, the first source at the top.
    """
    accuracy = np.asarray(accuracy, dtype=np.float64)
    names = list(names)
    trace = dict(
        type="heatmap",
        z=accuracy,
        x=names,
        y=names,
        zmin=0.0,
        zmax=1.0,
        colorscale="Viridis",
        text=[[f"{v:.2f}" for v in row] for row in accuracy],
        texttemplate="%{text}",
        colorbar=dict(title=dict(text="accuracy")),
        xgap=1,
        ygap=1,
        hovertemplate="made against %{y}<br>fed to %{x}<br>accuracy %{z:.3f}<extra></extra>",
    )
    return styled_figure(
        [trace],
        title=title,
        height=height,
        xaxis=dict(title=dict(text="fed to"), showgrid=False, side="bottom"),
        yaxis=dict(title=dict(text="made against"), autorange="reversed", showgrid=False),
    )


def cka_heatmap(
    matrix: np.ndarray,
    layers_a: Sequence[str],
    layers_b: Sequence[str],
    *,
    model_a: str = "model A",
    model_b: str = "model B",
    colorscale: str = "Viridis",
    title: str | None = None,
    height: int = 480,
) -> go.Figure:
    """Linear CKA between layers, Raghu et al. 2021's figure: ``matrix (La, Lb)``
    (:func:`analysis.representation_similarity`) with ``model_a``'s layers down the y axis (the
    first at the bottom, as the paper draws depth) and ``model_b``'s along x, on one scale from 0
    to 1 (the minibatch estimator can dip below 0: those cells take the bottom colour, their value
    in the hover). A cell a layer's constant representation leaves undefined (NaN) is not drawn.

    Parameters
    ----------
    matrix : numpy.ndarray
        ``(La, Lb)`` linear CKA, row ``i`` layer ``i`` of model A, column ``j`` layer ``j`` of model B.
    layers_a : sequence of str
        The ``La`` labels of model A's layers (the y axis).
    layers_b : sequence of str
        The ``Lb`` labels of model B's layers (the x axis).
    model_a : str, default "model A"
        Model A's name, in the y axis title and the hover.
    model_b : str, default "model B"
        Model B's name, in the x axis title and the hover.
    colorscale : str, default "Viridis"
        A plotly colour scale's name (:func:`~analysis.plots.style.colour_stops`).
    title : str or None, default None
        Figure title; ``None``, none.
    height : int, default 480
        Figure height (px).

    Returns
    -------
    plotly.graph_objects.Figure
        One heatmap on a fixed 0–1 scale.
    """
    matrix = np.asarray(matrix, dtype=np.float64)
    trace = dict(
        type="heatmap",
        z=matrix,
        x=list(layers_b),
        y=list(layers_a),
        zmin=0.0,
        zmax=1.0,
        colorscale=colour_stops(colorscale),
        colorbar=dict(title=dict(text="linear CKA", side="right")),
        hovertemplate=f"{model_a} %{{y}}<br>{model_b} %{{x}}<br>CKA %{{z:.3f}}<extra></extra>",
    )
    return styled_figure(
        [trace],
        title=title,
        height=height,
        xaxis=dict(title=dict(text=f"{model_b} layer"), showgrid=False, tickangle=-45),
        yaxis=dict(title=dict(text=f"{model_a} layer"), showgrid=False, scaleanchor=None),
    )


def grouped_bars(
    categories: Sequence[str],
    series: Sequence[tuple[str, Sequence[float]]],
    *,
    y_title: str,
    y_range: tuple[float, float] | None = (0.0, 1.02),
    height: int = 340,
) -> go.Figure:
    """One bar per (category, series), drawn side by side within each category, each value
    written on its bar (NaN: no bar, "n/a").

    Parameters
    ----------
    categories : sequence of str
        The ``C`` categories along the x axis.
    series : sequence of (str, sequence of float)
        ``[(name, values)]``, ``values`` one per category (``(C,)``).
    y_title : str
        The y axis's title.
    y_range : (float, float) or None, default (0.0, 1.02)
        The y axis's range; ``None``, plotly's automatic range.
    height : int, default 340
        Figure height (px).

    Returns
    -------
    plotly.graph_objects.Figure
        One bar trace per series, grouped.
    """
    traces = [
        dict(
            type="bar",
            x=list(categories),
            y=[None if not np.isfinite(v) else float(v) for v in values],
            name=name,
            marker=dict(color=SERIES_COLOURS[i % len(SERIES_COLOURS)]),
            text=["n/a" if not np.isfinite(v) else f"{v:.2f}" for v in values],
            textposition="outside",
            hovertemplate="%{x}<br>%{y:.3f}<extra>" + name + "</extra>",
        )
        for i, (name, values) in enumerate(series)
    ]
    return styled_figure(
        traces,
        title=None,
        height=height,
        barmode="group",
        legend=dict(orientation="h", y=1.12, x=0),
        xaxis=dict(showgrid=False),
        yaxis=dict(title=dict(text=y_title), showgrid=True, **({"range": list(y_range)} if y_range else {})),
    )


def explained_variance(ratio: np.ndarray, *, height: int = 320) -> go.Figure:
    """Explained variance ratio per principal component (bars, left axis) and cumulative (line, right).

    Parameters
    ----------
    ratio : numpy.ndarray
        ``(K,)`` explained variance ratios of the components, in order (fractions; drawn as %).
    height : int, default 320
        Figure height (px).

    Returns
    -------
    plotly.graph_objects.Figure
        A bar trace (per component, %) and a line on a 0–100% right axis (cumulative).
    """
    ratio = np.asarray(ratio, dtype=np.float64)
    k = np.arange(1, ratio.size + 1)
    traces = [
        dict(
            type="bar",
            x=k,
            y=ratio * 100,
            name="per component",
            marker=dict(color="#31688e"),
            hovertemplate="PC %{x}: %{y:.2f}%<extra></extra>",
        ),
        dict(
            type="scatter",
            x=k,
            y=np.cumsum(ratio) * 100,
            name="cumulative (right axis)",
            mode="lines+markers",
            line=dict(color="#35b779", width=2),
            marker=dict(color="#35b779", size=5),
            yaxis="y2",
            hovertemplate="PC 1..%{x}: %{y:.1f}%<extra></extra>",
        ),
    ]
    return styled_figure(
        traces,
        title=None,
        height=height,
        legend=dict(orientation="h", y=1.12, x=0),
        xaxis=dict(title=dict(text="principal component"), dtick=max(1, ratio.size // 14)),
        yaxis=dict(title=dict(text="explained variance per component (%)"), rangemode="tozero", showgrid=True),
        yaxis2=dict(
            title=dict(text="cumulative (%)"),
            overlaying="y",
            side="right",
            range=[0, 100],
            tickmode="linear",
            tick0=0,
            dtick=25,
            showgrid=False,
        ),
    )


DISTANCE_UNIT_SHORT = {"px": "px", "patches": "patches", "image": "× image side"}
DISTANCE_UNIT_TITLE = {"px": "input pixels", "patches": "patch sides", "image": "fraction of the image side"}


def attention_distance_scatter(
    series: Sequence[tuple[str, np.ndarray]],
    *,
    references: Sequence[tuple[str, float]] = (),
    layer_references: Sequence[tuple[str, np.ndarray]] = (),
    unit: str = "px",
    height: int = 460,
) -> go.Figure:
    """Figure 7 (right): one dot per head at each layer, mean attention distance.

    Parameters
    ----------
    series : sequence of (str, numpy.ndarray)
        ``(name, distances)`` with ``distances`` ``(L, heads)`` in ``unit``; series are shifted
        sideways a little so they do not hide each other.
    references : sequence of (str, float), default ()
        ``(name, value)`` labelled horizontal dashed lines (the distance under uniform attention),
        in the same unit.
    layer_references : sequence of (str, numpy.ndarray), default ()
        ``(name, values)`` with ``values`` ``(L,)``: one reference per layer, drawn as a dashed step
        line, a flat piece over each layer (a windowed model's uniform distance, which differs by
        stage: :func:`analysis.uniform_attention_distance_by_layer`), in the same unit.
    unit : str, default "px"
        A key of :data:`analysis.DISTANCE_UNITS` (``"px"``, ``"patches"`` or ``"image"``): the unit
        of the values, named on the y axis and in the hover.
    height : int, default 460
        Figure height (px).

    Returns
    -------
    plotly.graph_objects.Figure
        One marker trace per series, layer index on the x axis.

    Raises
    ------
    KeyError
        For a ``unit`` that is not one of ``"px"``, ``"patches"``, ``"image"``.
    """
    short = DISTANCE_UNIT_SHORT[unit]
    digits = ".1f" if unit == "px" else (".2f" if unit == "patches" else ".3f")
    traces: list[dict[str, Any]] = []
    count = len(series)
    for i, (name, values) in enumerate(series):
        values = np.asarray(values)
        layers, heads = values.shape
        offset = (i - (count - 1) / 2) * (0.5 / count) if count > 1 else 0.0
        layer_ids = np.repeat(np.arange(layers), heads)
        head_ids = np.tile(np.arange(heads), layers)
        traces.append(
            dict(
                type="scatter",
                x=layer_ids + offset,
                y=values.ravel(),
                mode="markers",
                name=name,
                marker=dict(
                    size=7,
                    color=SERIES_COLOURS[i % len(SERIES_COLOURS)],
                    opacity=0.8,
                    line=dict(width=0.5, color="white"),
                ),
                customdata=np.stack([layer_ids, head_ids], axis=1),
                hovertemplate="layer %{customdata[0]}, head %{customdata[1]}<br>%{y:"
                + digits
                + "} "
                + short
                + "<extra>"
                + name
                + "</extra>",
            )
        )
    for name, values in layer_references:  # a flat piece per layer, gaps between
        values = np.asarray(values, dtype=np.float64)
        layers = np.arange(len(values))
        traces.append(
            dict(
                type="scatter",
                x=np.stack([layers - 0.45, layers + 0.45, layers + 0.45]).T.ravel(),
                y=np.stack([values, values, np.full_like(values, np.nan)]).T.ravel(),
                mode="lines",
                name=name,
                line=dict(dash="dash", color="#777", width=1.5),
                hovertemplate="%{y:" + digits + "} " + short + "<extra>" + name + "</extra>",
                connectgaps=False,
            )
        )
    shapes, annotations = [], []
    for j, (name, value) in enumerate(references):
        shapes.append(
            dict(
                type="line",
                xref="paper",
                x0=0,
                x1=1,
                y0=value,
                y1=value,
                line=dict(dash="dash", color="#777", width=1.2),
            )
        )
        annotations.append(
            dict(
                xref="paper",
                x=1.0 if j % 2 else 0.0,
                xanchor="right" if j % 2 else "left",
                y=value,
                yanchor="bottom",
                text=f"{name}: {value:{digits}} {short}",
                showarrow=False,
                font=dict(color="#555"),
            )
        )
    return styled_figure(
        traces,
        title=None,
        height=height,
        legend=dict(orientation="h", y=1.1, x=0),
        shapes=shapes,
        annotations=annotations,
        xaxis=dict(title=dict(text="network depth (layer index)"), dtick=1, showgrid=True),
        yaxis=dict(
            title=dict(text=f"mean attention distance ({DISTANCE_UNIT_TITLE[unit]})"), rangemode="tozero", showgrid=True
        ),
    )
