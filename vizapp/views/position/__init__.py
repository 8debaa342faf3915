"""The Position embeddings page: position.py draws it (a script that Streamlit runs); this module says how the
app shows it and which of its settings are kept."""

from vizapp.views import PageInfo

PAGE = PageInfo(
    title="Position embeddings",
    icon=":material/grid_on:",
    order=7,
    kept_keys=(
        "pos_rs_row",
        "pos_rs_col",
        "pos_kind",
        "pos_row",
        "pos_col",
        "pos_resample",
        "pos_grid_h",
        "pos_grid_w",
        "pos_bias_layer",
    ),
    transient_keys=(),
    screenshot=("/position", "Position-embedding similarity (Figure 7 centre)"),
)
