"""The Patch-embedding filters page: filters.py draws it (a script that Streamlit runs); this module says how the
app shows it and which of its settings are kept."""

from vizapp.views import PageInfo

PAGE = PageInfo(
    title="Patch-embedding filters",
    icon=":material/filter:",
    order=8,
    kept_keys=("filt_mode", "filt_n"),
    transient_keys=(),
    screenshot=("/filters", "Patch-embedding filter components (Figure 7 left)"),
)
