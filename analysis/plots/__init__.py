"""Plotly figures of the analyses: numpy in, ``plotly.graph_objects.Figure`` out.

The app's pages, ``python -m analysis report`` and notebooks draw with these same builders,
so a figure keeps the app's colour stops (explicit ``rgb(...)`` stops of the named scale),
stated ranges (the colour bar's title says what 0 and the maximum mean) and units (input
pixels, patches, percent) wherever it is shown. No streamlit, no torch needed::

    >>> import numpy as np
    >>> from analysis import load_vit, load_image, capture_attention, attention_map, plots
    >>> vit = load_vit("demo")
    >>> image = load_image("assets/samples/scene_1_star.png")
    >>> record = capture_attention(vit, vit.preprocess(image))
    >>> shown = attention_map(record, 3, query="cls")[0].numpy()
    >>> lo, hi, label = plots.colour_range("robust", shown, uniform=1 / vit.spec.num_tokens)
    >>> figure = plots.attention_overlay(
    ...     np.asarray(vit.model_input_image(image)), vit.spec.img_size, shown, vit.spec.patch_size,
    ...     zmin=lo, zmax=hi, colorbar_title=f"attention probability ({label})")
    >>> figure.show()  # doctest: +SKIP

The app's default colour range, ``"robust"`` (:func:`colour_range`), tops out at the map's 99th
percentile without the image's outlier tokens (``left_out=analysis.outlier_patches(...)``);
:func:`attention_overlay` and :func:`map_panels` outline every cell above ``zmax``.
"""

from .charts import (
    LABEL_WIDTH,
    attention_distance_scatter,
    cka_heatmap,
    explained_variance,
    grouped_bars,
    perturbation_curves,
    predictions_bar,
    robustness_curves,
    similarity_vs_distance,
    transfer_heatmap,
    wrap_label,
)
from .circuits import DIVERGING, ablation_curve, head_heatmap, layer_contributions, patching_heatmap, symmetric_limit
from .features import activation_histogram, class_effect_bars
from .layout import CHART_WIDTH_PX, column_width
from .mae import HIDDEN_GREY, clipped_fraction, mae_loss_by_ratio, mae_panels, mae_patch_map, unit_to_uint8
from .mosaics import (
    colorized_png,
    filter_components_grid,
    mosaic,
    position_similarity_mosaic,
    rgb_patch_grid,
    similarity_tile,
)
from .overlays import attention_overlay, map_panels
from .quantise import QuantisedMaps, quantise_maps
from .ranges import (
    MAP_RANGES,
    ROBUST_QUANTILE,
    UNIFORM_FLOOR,
    clipped_cells,
    colour_bar_ticks,
    colour_range,
    layer_scaled,
    robust_scaled,
    robust_top,
)
from .style import (
    COLORSCALES,
    HIGHLIGHT,
    colorize,
    colour_lut,
    colour_stops,
    image_data_uri,
    patch_centres,
    styled_layout,
)

__all__ = [
    "activation_histogram",
    "class_effect_bars",
    "CHART_WIDTH_PX",
    "column_width",
    "HIDDEN_GREY",
    "clipped_fraction",
    "mae_loss_by_ratio",
    "mae_panels",
    "mae_patch_map",
    "unit_to_uint8",
    "DIVERGING",
    "ablation_curve",
    "head_heatmap",
    "layer_contributions",
    "patching_heatmap",
    "symmetric_limit",
    "MAP_RANGES",
    "ROBUST_QUANTILE",
    "UNIFORM_FLOOR",
    "clipped_cells",
    "colour_bar_ticks",
    "robust_scaled",
    "robust_top",
    "colour_range",
    "QuantisedMaps",
    "quantise_maps",
    "colour_lut",
    "layer_scaled",
    "COLORSCALES",
    "HIGHLIGHT",
    "LABEL_WIDTH",
    "attention_distance_scatter",
    "attention_overlay",
    "colorize",
    "colorized_png",
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
    "transfer_heatmap",
    "cka_heatmap",
    "grouped_bars",
    "similarity_tile",
    "similarity_vs_distance",
    "styled_layout",
    "wrap_label",
]
