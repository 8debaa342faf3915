"""The Features page: features.py draws it (a script that Streamlit runs); this module says how the
app shows it and which of its settings are kept."""

from vizapp.views import PageInfo

PAGE = PageInfo(
    title="Features",
    icon=":material/category:",
    order=12,
    kept_keys=("feat_source", "feat_folder", "feat_patch", "feat_feature", "feat_mode", "feat_scale", "feat_clamp"),
    transient_keys=("feat_pick",),  # the patch's feature list only sets feat_feature, which is kept
    screenshot=("/features", "Features: the demo SAE's features on a patch, one feature over the demo scenes"),
)
