"""The Circuits page: circuits.py draws it (a script that Streamlit runs); this module says how the
app shows it and which of its settings are kept."""

from vizapp.views import PageInfo

PAGE = PageInfo(
    title="Circuits",
    icon=":material/account_tree:",
    order=6,
    kept_keys=(
        "circ_target",
        "circ_layer",
        "circ_head",
        "circ_method",
        "circ_reference",
        "circ_ablate",
        "circ_cumulative",
        "circ_corruption",
        "circ_sample",
        "circ_level",
        "circ_point",
        "circ_patch",
        "circ_patch_layer",
    ),
    transient_keys=(),
    screenshot=("/circuits", "Circuits: direct logit attribution, head ablation and activation patching"),
)
