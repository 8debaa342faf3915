"""Attention distance: mean distance between a query patch and the patches it attends to,
per head and layer (ViT paper, Figure 7 right)."""

from __future__ import annotations

import numpy as np
import streamlit as st

from vizapp import figures, inputs, resources
from vizapp.refs import ImageRef, ModelRef
from vizapp.messages import error_text, escape_markdown
from vizapp.state import current, second_model_control
from vizapp.ui import download_csv, download_npz, show_chart

cur = current()
SETS = {"samples": "bundled sample images", "mine": "my images (files or a .zip)"}

st.header("Attention distance", divider="gray")
st.caption(
    "For each head: Σ_k a_qk·‖c_q − c_k‖ over patch keys (attention renormalised over patches), "
    "averaged over all patch queries, in input pixels. The dashed line is the value under "
    "uniform attention on this grid."
)

c1, c2 = st.columns([2, 3], gap="medium")
with c1:
    which = st.radio("Image set to average over", list(SETS), format_func=SETS.get, key="dist_set")
    if which == "mine":
        files = st.file_uploader(
            "Images or a .zip of images", type=["jpg", "jpeg", "png", "webp", "bmp", "gif", "zip"],
            accept_multiple_files=True, key="dist_files",
        )
        images, problems = inputs.images_from_uploads(files)
    else:
        images = [ImageRef.from_bytes(p.name, inputs.read_sample(p.name)) for p in inputs.sample_paths()]
        problems = []
with c2:
    loaded = second_model_control("dist_model2", "Overlay a second model (optional)", cur.model)


def set_average(ref: ModelRef, label: str) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Mean over the image set, ``(L, heads)``, and the per-image stack ``(N, L, heads)``.

    :func:`analysis.dataset_attention_distance` runs per piece of ``SET_CHUNK`` images (each
    piece cached), so the progress bar advances; undecodable images are skipped and named.
    """
    if not images:
        return None, None
    bar = st.progress(0.0, text=f"{label}: 0 / {len(images)} images")
    pieces = []
    for start in range(0, len(images), resources.SET_CHUNK):
        chunk = images[start : start + resources.SET_CHUNK]
        per_image, skipped = resources.set_chunk_distances(
            ref, tuple(i.digest for i in chunk), tuple(i.data for i in chunk)
        )
        pieces.append(per_image)
        problems.extend(f"{chunk[index].name}: {reason} (skipped)" for index, reason in skipped)
        done = start + len(chunk)
        bar.progress(done / len(images), text=f"{label}: {done} / {len(images)} images")
    bar.empty()
    stack = np.concatenate(pieces)
    if not len(stack):
        return None, None
    return stack.mean(axis=0), stack


series: list[tuple[str, np.ndarray]] = []
references: list[tuple[str, float]] = []
arrays: dict[str, np.ndarray] = {}

name1 = cur.model.source.split("/")[-1]
current_image = resources.image_attention_distance(*cur.args)
series.append((f"{name1} · {cur.image.name}", current_image))
arrays["current_image"] = current_image
mean1, stack1 = set_average(cur.model, name1)
if mean1 is not None:
    series.append((f"{name1} · mean over {len(stack1)} images", mean1))
    arrays["set_mean"], arrays["set_per_image"] = mean1, stack1
gh, gw = cur.spec.grid_size
references.append((f"uniform ({gh}×{gw} grid)", resources.uniform_distance(*cur.args)))

if loaded is not None:
    ref2, vit2 = loaded
    try:
        args2 = (ref2, cur.image.digest, cur.image.data)
        name2 = ref2.source.split("/")[-1]
        second_image = resources.image_attention_distance(*args2)
        series.append((f"{name2} · {cur.image.name}", second_image))
        arrays["second_current_image"] = second_image
        mean2, stack2 = set_average(ref2, name2)
        if mean2 is not None:
            series.append((f"{name2} · mean over {len(stack2)} images", mean2))
            arrays["second_set_mean"] = mean2
        uniform2 = resources.uniform_distance(*args2)
        if abs(uniform2 - references[0][1]) > 1e-6:
            g = vit2.spec.grid_size
            references.append((f"uniform ({g[0]}×{g[1]} grid)", uniform2))
    except Exception as exc:  # noqa: BLE001 - the first model's series still show
        st.error(f"**{escape_markdown(ref2.label)}** could not process the images: {error_text(exc)}")

for problem in problems:
    st.warning(escape_markdown(problem))
if which == "mine" and not images:
    st.info("Upload images (or a .zip of images) to average over them.")

show_chart(figures.attention_distance_scatter(series, references=references), "dist_scatter",
           filename="mean_attention_distance")
d1, d2, _ = st.columns([1, 1, 4])
with d1:
    download_npz("dist_data", "mean_attention_distance", **arrays,
                 uniform_reference=np.array([v for _, v in references]))
with d2:
    rows = [
        (name, layer, head, float(values[layer, head]))
        for name, values in series for layer in range(values.shape[0]) for head in range(values.shape[1])
    ]
    download_csv("dist_csv", "mean_attention_distance", ["series", "layer", "head", "distance_px"], rows)
