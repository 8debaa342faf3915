"""The Text prompts page: text_prompts.py draws it (a script that Streamlit runs); this module says how the
app shows it and which of its settings are kept."""

from vizapp.views import PageInfo

PAGE = PageInfo(
    title="Text prompts",
    icon=":material/text_fields:",
    order=11,
    kept_keys=(
        "tp_source",
        "tp_other",
        "tp_mode",
        "tp_prompts",
        "tp_template",
        "tp_classes",
        "tp_methods",
        "tp_mapped",
        "tp_focus",
        "tp_head",
        "tp_curve_method",
        "tp_set",
        "tp_texts_per_head",
    ),
    transient_keys=("tp_describe",),
    screenshot=(
        "/text_prompts?img=scene_1_star.png",
        "Text prompts: the demo CLIP's zero-shot probabilities and where each prompt matches",
    ),
)
