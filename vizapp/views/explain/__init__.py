"""The Why this class? page: explain.py draws it (a script that Streamlit runs); this module says how the
app shows it and which of its settings are kept."""

from vizapp.views import PageInfo

PAGE = PageInfo(
    title="Why this class?",
    icon=":material/help:",
    order=2,
    kept_keys=(
        "explain_methods",
        "explain_target",
        "explain_compare",
        "explain_target2",
        "ig_steps",
        "ig_baseline",
        "explain_rollout_stage",
    ),
    transient_keys=(),
    screenshot=("/explain", "Why this class? Explanations and their deletion / insertion curves"),
)
