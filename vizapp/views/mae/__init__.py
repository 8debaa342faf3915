"""The Masked autoencoder page: mae.py draws it (a script that Streamlit runs); this module says how the
app shows it and which of its settings are kept."""

from vizapp.views import PageInfo

PAGE = PageInfo(
    title="Masked autoencoder",
    icon=":material/auto_fix_high:",
    order=10,
    kept_keys=("mae_source", "mae_other", "mae_ratio", "mae_seed", "mae_layer", "mae_head", "mae_curves"),
    transient_keys=("mae_cls_query", "mae_reset"),
    screenshot=("/mae", "Masked autoencoder: the demo MAE's reconstruction of a 75%-masked scene (MAE Figure 2)"),
)
