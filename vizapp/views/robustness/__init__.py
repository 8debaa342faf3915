"""The Robustness page: robustness.py draws it (a script that Streamlit runs); this module says how the
app shows it and which of its settings are kept."""

from vizapp.views import PageInfo

PAGE = PageInfo(
    title="Robustness",
    icon=":material/shield:",
    order=5,
    kept_keys=(
        "rob_perturbation",
        "rob_fraction",
        "rob_selection",
        "rob_grid",
        "rob_noise",
        "rob_blur",
        "rob_seed",
        "rob_cnn",
        "rob_cnn_other",
        "rob_set",
        "rob_curves",
        "rob_swin",
    ),
    transient_keys=(),
    screenshot=("/robustness", "Robustness: token drop on one image, the ViT beside the demo CNN"),
)
