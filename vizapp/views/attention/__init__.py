"""The Attention page: attention.py draws it (a script that Streamlit runs); this module says how the
app shows it and which of its settings are kept."""

from vizapp.views import PageInfo

PAGE = PageInfo(
    title="Attention",
    icon=":material/visibility:",
    order=0,
    kept_keys=("layer", "attn_stage", "head", "opacity", "thumb_scale", "dino_show", "dino_mass"),
    transient_keys=("attn_view",),
    screenshot=("/?query=patch&patch=27", "Attention: one patch's query, layers × heads"),
)
