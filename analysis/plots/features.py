"""Figures of a sparse autoencoder's features (:mod:`analysis.sae`): a feature's activation
histogram and the classes its decoder direction pushes up and down."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from .layout import wrap_label
from .style import SERIES_COLOURS, styled_figure

__all__ = ["activation_histogram", "class_effect_bars"]


def activation_histogram(values: np.ndarray, zeros: int, *, bins: int = 40, height: int = 300) -> go.Figure:
    """The nonzero activations of one feature over an image set's tokens, as a histogram of token
    counts (log scale); the title gives the share of tokens it fires on.

    Parameters
    ----------
    values : numpy.ndarray
        ``(n,)`` the feature's nonzero activations, one per token where it fires.
    zeros : int
        The number of tokens where it is 0 (named in the title, not drawn).
    bins : int, default 40
        The most histogram bins (plotly's ``nbinsx``).
    height : int, default 300
        Figure height (px).

    Returns
    -------
    plotly.graph_objects.Figure
        One histogram trace on a log-scale y axis.
    """
    values = np.asarray(values, dtype=np.float64)
    fired = len(values)
    total = fired + int(zeros)
    title = f"fires on {fired:,} of {total:,} patch tokens ({100 * fired / max(1, total):.2f} %)"
    trace = dict(
        type="histogram",
        x=values,
        nbinsx=int(bins),
        marker=dict(color=SERIES_COLOURS[0]),
        hovertemplate="activation %{x}<br>%{y} tokens<extra></extra>",
        name="tokens",
    )
    return styled_figure(
        [trace],
        title=title,
        height=height,
        bargap=0.05,
        xaxis=dict(title=dict(text="activation (where it fires)"), showgrid=True),
        yaxis=dict(title=dict(text="patch tokens"), type="log", showgrid=True),
    )


def class_effect_bars(names: Sequence[str], effects: np.ndarray, *, k: int = 5, height: int = 300) -> go.Figure:
    """The ``k`` classes a direction pushes up most and the ``k`` it pushes down most (all of them
    when there are at most ``2k``), as horizontal bars, largest on top (red up, blue down).

    Parameters
    ----------
    names : sequence of str
        The ``C`` class names.
    effects : numpy.ndarray
        ``(C,)`` logit change of each class per unit of the direction.
    k : int, default 5
        How many classes to show at each end.
    height : int, default 300
        Figure height (px) at least; it grows with the number of bars.

    Returns
    -------
    plotly.graph_objects.Figure
        One horizontal bar trace, each bar labelled with its signed effect.
    """
    effects = np.asarray(effects, dtype=np.float64)
    order = np.argsort(-effects, kind="stable")
    chosen = order if len(order) <= 2 * k else np.concatenate([order[:k], order[-k:]])
    shown = chosen[::-1]  # plotly draws the first bar at the bottom
    labels = [wrap_label(str(names[i])) for i in shown]
    trace = dict(
        type="bar",
        x=effects[shown],
        y=list(range(len(shown))),
        orientation="h",
        marker=dict(color=["#b2182b" if effects[i] > 0 else "#2166ac" for i in shown]),
        customdata=[str(names[i]) for i in shown],
        text=[f"{effects[i]:+.3f}" for i in shown],
        textposition="auto",
        hovertemplate="%{customdata}: %{x:+.4f}<extra></extra>",
    )
    return styled_figure(
        [trace],
        title=None,
        height=max(height, 40 + 22 * len(shown)),
        xaxis=dict(title=dict(text="logit change per unit of the feature's direction"), showgrid=True, zeroline=True),
        yaxis=dict(automargin=True, tickmode="array", tickvals=list(range(len(shown))), ticktext=labels),
    )
