"""The Rollout page: rollout.py draws it (a script that Streamlit runs); this module says how the
app shows it and which of its settings are kept."""

from vizapp.views import PageInfo

PAGE = PageInfo(
    title="Rollout",
    icon=":material/layers:",
    order=1,
    kept_keys=("opacity", "fusion", "discard_ratio", "start_layer", "rollout_norm", "rollout_span", "rollout_merge"),
    transient_keys=("rollout_view",),
    screenshot=("/rollout", "Rollout and the Figure 6 view"),
)
