"""The Attention distance page: distance.py draws it (a script that Streamlit runs); this module says how the
app shows it and which of its settings are kept."""

from vizapp.views import PageInfo

PAGE = PageInfo(
    title="Attention distance",
    icon=":material/straighten:",
    order=9,
    kept_keys=(
        "dist_set",
        "dist_model2",
        "dist_model2_other",
        "dist_unit",
        "dist_cka",
        "dist_cka_with",
        "dist_cka_cnn",
    ),
    transient_keys=(),
    screenshot=("/distance", "Mean attention distance against depth (Figure 7 right)"),
)
