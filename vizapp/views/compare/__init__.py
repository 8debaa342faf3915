"""The Compare layers page: compare.py draws it (a script that Streamlit runs); this module says how the
app shows it and which of its settings are kept."""

from vizapp.views import PageInfo

PAGE = PageInfo(
    title="Compare layers",
    icon=":material/view_column:",
    order=3,
    kept_keys=("opacity", "cmp_layers", "cmp_all", "cmp_model2", "cmp_model2_other", "cmp_separate"),
    transient_keys=("cmp_view",),
    screenshot=("/compare", "Compare layers on one colour scale"),
)
