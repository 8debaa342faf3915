"""Patch-embedding filters: principal components of the linear patch projection
(ViT paper, Figure 7 left), or the raw filters."""

from __future__ import annotations

import streamlit as st

from analysis import plots
from vizapp.messages import error_text
from vizapp.python_snippet import show_code
from vizapp.state import current
from vizapp.ui import clamp_state, download_csv, download_npz, end_page, show_chart
from vizapp.views.filters import compute
from vizapp.views.filters.recipe import filters_code

cur = current()
spec = cur.spec
MODES = {"pca": "principal components", "raw": "raw filters"}

st.header("Patch-embedding filters", divider="gray")
st.caption(
    "Each filter of the patch projection maps a patch of pixels to one embedding dimension. "
    "Shown as RGB patches, each scaled to its own min–max."
)

try:
    filters = compute.patch_filters(cur.model)  # (D, C, ph, pw)
except ValueError as exc:  # AnalysisError: hybrid stems have no pixel filters
    st.info(error_text(exc))
    end_page()
count = filters.shape[0]

c1, c2, _ = st.columns([2, 2, 3])
with c1:
    mode = st.radio("Show", list(MODES), format_func=MODES.get, horizontal=True, key="filt_mode")
    assert mode is not None, "a radio with options and no index=None always has a value"
with c2:
    most = min(64, count)
    st.session_state.setdefault("filt_n", min(28, most))
    clamp_state("filt_n", (1, most), min(28, most))
    n = st.slider("How many", 1, most, step=1, key="filt_n") if most > 1 else 1

ph, pw = filters.shape[-2:]
if mode == "pca":
    components, ratio = compute.patch_components(cur.model, int(n))
    left, right = st.columns([3, 2], gap="medium")
    with left:
        st.markdown(f"**First {len(ratio)} principal components** of {count} filters of {pw}×{ph} px")
        grid = plots.filter_components_grid(components, ratio)
        show_chart(grid, "filt_grid", filename="patch_embedding_components")
    with right:
        st.markdown("**Explained variance**")
        show_chart(plots.explained_variance(ratio), "filt_variance", filename="patch_embedding_variance")
    d1, d2, _ = st.columns([1, 1, 4])
    with d1:
        download_npz("filt_data", "patch_embedding_components", components=components, explained_variance_ratio=ratio)
    with d2:
        download_csv(
            "filt_csv",
            "patch_embedding_variance",
            ["component", "explained_variance_ratio"],
            [(i + 1, float(r)) for i, r in enumerate(ratio)],
        )
else:
    shown = filters[: int(n)]
    st.markdown(f"**First {len(shown)} of {count} filters** ({pw}×{ph} px, {filters.shape[1]} channels)")
    grid = plots.rgb_patch_grid(shown, 8, tile_names=[f"filter {i} (embedding dim {i})" for i in range(len(shown))])
    show_chart(grid, "filt_grid", filename="patch_embedding_filters")
    download_npz("filt_data", "patch_embedding_filters", filters=shown)
show_code(filters_code(cur.model, mode=mode, n=int(n)))
