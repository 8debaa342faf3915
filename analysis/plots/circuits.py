"""Figures of the causal analyses (:mod:`analysis.circuits`): signed layers × heads heatmaps, the
per-layer split of the direct logit attribution, the cumulative ablation curve, and the
patching map over layers and token positions.

Signed quantities (a change of logit, a contribution) are drawn on a diverging scale centred
at 0 with a symmetric range ``±max|v|``, stated in the colour bar, so red is "raises the target
logit", blue "lowers it", and white exactly 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from .style import SERIES_COLOURS, colour_stops, highlight_rect, image_colorbar, styled_figure

__all__ = ["DIVERGING", "symmetric_limit", "head_heatmap", "layer_contributions", "ablation_curve", "patching_heatmap"]

DIVERGING = "RdBu_r"  # negative blue, 0 white, positive red


def symmetric_limit(values: np.ndarray) -> float:
    """``max|v|`` over the finite values (a tiny positive number for an all-zero or empty map).

    Parameters
    ----------
    values : numpy.ndarray
        Values of any shape; NaN and infinite ones are ignored.

    Returns
    -------
    float
        ``max|v|``, at least ``1e-12``: the half-range of a diverging scale centred at 0.
    """
    finite = np.abs(np.asarray(values, dtype=np.float64))
    finite = finite[np.isfinite(finite)]
    return float(max(finite.max(), 1e-12)) if finite.size else 1e-12


def head_heatmap(
    values: np.ndarray,
    *,
    title: str | None,
    colorbar_title: str,
    selected: tuple[int, int] | None = None,
    layers: Sequence[int] | None = None,
    height: int = 360,
) -> go.Figure:
    """``values (rows, heads)`` as a heatmap, layer 0 at the top, on the diverging scale with range
    ``±max|v|`` (:func:`symmetric_limit`). One transparent marker per cell carries
    ``customdata = [layer, head, value]`` for clicks.

    Parameters
    ----------
    values : numpy.ndarray
        ``(rows, heads)`` signed values, one row per layer.
    title : str or None
        Figure title; ``None``, none.
    colorbar_title : str
        The colour bar's title; the range ``(±max|v|)`` is appended.
    selected : (int, int) or None, default None
        ``(layer, head)`` outlined, ``layer`` a model layer of ``layers``; ``None`` (or a layer not
        shown), no outline.
    layers : sequence of int or None, default None
        The model layer of each row; ``None``, ``0..rows−1``.
    height : int, default 360
        Figure height (px).

    Returns
    -------
    plotly.graph_objects.Figure
        A heatmap and a scatter of click markers, ``clickmode="event+select"``.
    """
    values = np.asarray(values, dtype=np.float64)
    rows, heads = values.shape
    layers = list(range(rows)) if layers is None else [int(layer) for layer in layers]
    limit = symmetric_limit(values)
    head_index, row_index = np.meshgrid(np.arange(heads), np.arange(rows))
    traces = [
        dict(
            type="heatmap",
            z=values,
            x=list(range(heads)),
            y=list(range(rows)),
            zmin=-limit,
            zmax=limit,
            zmid=0,
            colorscale=colour_stops(DIVERGING),
            colorbar=image_colorbar(f"{colorbar_title} (±{limit:.3g})"),
            hoverinfo="skip",
            xgap=1,
            ygap=1,
        ),
        dict(
            type="scatter",
            x=head_index.ravel(),
            y=row_index.ravel(),
            mode="markers",
            showlegend=False,
            marker=dict(color="rgba(0,0,0,0)", size=max(8, min(40, 300 // max(rows, heads)))),
            customdata=np.stack([np.array(layers)[row_index.ravel()], head_index.ravel(), values.ravel()], axis=1),
            hovertemplate="layer %{customdata[0]:.0f}, head %{customdata[1]:.0f}<br>%{customdata[2]:+.4g}"
            "<extra>click: show this head</extra>",
        ),
    ]
    shapes = []
    if selected is not None and selected[0] in layers:
        row, head = layers.index(selected[0]), selected[1]
        shapes.append(highlight_rect(head - 0.5, row - 0.5, head + 0.5, row + 0.5))
    return styled_figure(
        traces,
        title=title,
        height=height,
        shapes=shapes,
        clickmode="event+select",
        # ranges fixed to the cells (the click markers would pad them): the heatmap fills the
        # plot area, and its colour bar, as long as that, is as tall as the heatmap
        xaxis=dict(
            title=dict(text="head"),
            tickmode="linear",
            dtick=1 if heads <= 24 else None,
            showgrid=False,
            zeroline=False,
            range=[-0.5, heads - 0.5],
        ),
        yaxis=dict(
            title=dict(text="layer"),
            range=[rows - 0.5, -0.5],
            tickmode="array",
            tickvals=list(range(rows)),
            ticktext=[str(layer) for layer in layers],
            showgrid=False,
            zeroline=False,
        ),
    )


def layer_contributions(
    per_layer: np.ndarray,
    *,
    title: str | None,
    unit: str = "logit",
    names: Sequence[str] = ("attention (heads + bias)", "MLP"),
    height: int = 300,
) -> go.Figure:
    """``per_layer (L, parts)`` as grouped bars per layer (e.g. each block's attention and MLP
    terms of the direct logit attribution).

    Parameters
    ----------
    per_layer : numpy.ndarray
        ``(L, parts)`` signed contributions, row ``l`` layer ``l``.
    title : str or None
        Figure title; ``None``, none.
    unit : str, default "logit"
        The values' unit, in the y axis title and the hover.
    names : sequence of str, default ("attention (heads + bias)", "MLP")
        One name per part (column of ``per_layer``), at most six; only the named parts are drawn.
    height : int, default 300
        Figure height (px).

    Returns
    -------
    plotly.graph_objects.Figure
        One bar trace per part, grouped by layer.
    """
    per_layer = np.asarray(per_layer, dtype=np.float64)
    layers = list(range(per_layer.shape[0]))
    traces = [
        dict(
            type="bar",
            x=layers,
            y=per_layer[:, part],
            name=name,
            marker=dict(color=SERIES_COLOURS[part]),
            hovertemplate=f"layer %{{x}} · {name}: %{{y:+.4g}} {unit}<extra></extra>",
        )
        for part, name in enumerate(names)
    ]
    return styled_figure(
        traces,
        title=title,
        height=height,
        barmode="group",
        xaxis=dict(title=dict(text="layer"), tickmode="linear", dtick=1),
        yaxis=dict(title=dict(text=f"direct contribution ({unit})"), zeroline=True),
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0),
    )


def ablation_curve(
    curve: np.ndarray, labels: Sequence[str], *, title: str | None, clean: float | None = None, height: int = 300
) -> go.Figure:
    """``curve (K + 1,)`` the target logit with the first ``k`` heads of ``labels`` removed.

    Parameters
    ----------
    curve : numpy.ndarray
        ``(K + 1,)``: entry ``k`` the target logit with the first ``k`` heads removed (entry 0,
        none removed).
    labels : sequence of str
        The ``K`` removed heads' labels, in the order removed (shown in the hover).
    title : str or None
        Figure title; ``None``, none.
    clean : float or None, default None
        The clean run's logit, drawn as a dotted horizontal line; ``None``, no line.
    height : int, default 300
        Figure height (px).

    Returns
    -------
    plotly.graph_objects.Figure
        One line-and-marker trace against the number of heads removed.
    """
    curve = np.asarray(curve, dtype=np.float64)
    hover = ["none removed", *[f"+ {label}" for label in labels]]
    traces = [
        dict(
            type="scatter",
            x=list(range(len(curve))),
            y=curve,
            mode="lines+markers",
            name="target logit",
            line=dict(color=SERIES_COLOURS[0]),
            text=hover,
            hovertemplate="%{x} heads removed (%{text})<br>logit %{y:.4g}<extra></extra>",
        )
    ]
    shapes = (
        []
        if clean is None
        else [
            dict(
                type="line", xref="paper", x0=0, x1=1, y0=clean, y1=clean, line=dict(color="#888", dash="dot", width=1)
            )
        ]
    )
    return styled_figure(
        traces,
        title=title,
        height=height,
        shapes=shapes,
        xaxis=dict(title=dict(text="heads removed, most important first"), tickmode="linear", dtick=1),
        yaxis=dict(title=dict(text="target logit")),
    )


def patching_heatmap(
    effect: np.ndarray,
    token_labels: Sequence[str],
    *,
    title: str | None,
    layers: Sequence[int] | None = None,
    height: int = 360,
) -> go.Figure:
    """``effect (rows, T)``, the normalised patching effect of each (layer, token), on the
    diverging scale with range ``±max|v|`` (1 = the clean answer fully restored).

    Parameters
    ----------
    effect : numpy.ndarray
        ``(rows, T)`` normalised effects, one row per layer, one column per token (prefix, then
        patches row-major).
    token_labels : sequence of str
        The ``T`` tokens' labels (or ``(rows, T)`` of them), shown in the hover.
    title : str or None
        Figure title; ``None``, none.
    layers : sequence of int or None, default None
        The model layer of each row; ``None``, ``0..rows−1``.
    height : int, default 360
        Figure height (px).

    Returns
    -------
    plotly.graph_objects.Figure
        One heatmap, the first row at the top.
    """
    effect = np.asarray(effect, dtype=np.float64)
    layers = list(range(effect.shape[0])) if layers is None else [int(layer) for layer in layers]
    limit = symmetric_limit(effect)
    text = np.broadcast_to(np.asarray(token_labels, dtype=object), effect.shape)
    traces = [
        dict(
            type="heatmap",
            z=effect,
            y=layers,
            zmin=-limit,
            zmax=limit,
            zmid=0,
            colorscale=colour_stops(DIVERGING),
            text=text,
            colorbar=image_colorbar(f"restored share of the clean answer (±{limit:.3g})"),
            hovertemplate="layer %{y}, %{text}<br>effect %{z:+.3f}<extra></extra>",
        )
    ]
    return styled_figure(
        traces,
        title=title,
        height=height,
        xaxis=dict(title=dict(text="token (prefix, then patches row-major)"), showgrid=False, zeroline=False),
        yaxis=dict(title=dict(text="layer"), autorange="reversed", type="category", showgrid=False),
    )
