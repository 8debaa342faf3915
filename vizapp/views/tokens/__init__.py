"""The Tokens page: tokens.py draws it (a script that Streamlit runs); this module says how the
app shows it and which of its settings are kept."""

from vizapp.views import PageInfo

PAGE = PageInfo(
    title="Tokens",
    icon=":material/scatter_plot:",
    order=4,
    kept_keys=("layer", "tok_kind", "tok_foreground", "tok_other"),
    transient_keys=("tok_other_upload", "tok_view"),
    screenshot=("/tokens?query=patch&patch=27", "Tokens: feature PCA, similarity, norms, logit lens"),
)
