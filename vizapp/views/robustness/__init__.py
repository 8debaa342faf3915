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
    # the attack, corruption, texture and patch sections (sections.py): not kept across a page switch
    # (their choices depend on the models the page has loaded; each section starts from its defaults)
    transient_keys=(
        "rob_attack",
        "rob_epsilon",
        "rob_steps",
        "rob_transfer_epsilon",
        "rob_attack_run",
        "rob_corruption",
        "rob_severity",
        "rob_corruption_set",
        "rob_corruption_run",
        "rob_texture_probe",
        "rob_texture_run",
        "rob_shape_bias_models",
        "rob_shape_bias_run",
        "rob_patch_target",
        "rob_patch_run",
    ),
    screenshot=("/robustness", "Robustness: token drop on one image, the ViT beside the demo CNN"),
)
