""" "Reproduce in Python": the few public ``analysis`` calls that recompute what a page shows.

One generator per page, in the page's folder (``vizapp/views/<name>/recipe.py``), built from the
pieces here. Each takes the page's settings and returns the source of a self-contained script that
ends with the page's arrays under the names its ``.npz`` download uses (``attention``, ``rollout``,
``current_image``, ...), so a notebook gets the same numbers as the screen::

    code = attention_code(Source.of(cur), layer=3, head=2, query=21)  # vizapp.views.attention.recipe
    namespace = {}; exec(code, namespace); namespace["attention"]   # (gh, gw)

Only public ``analysis`` names are used (``analysis.__all__`` and ``LoadedViT`` methods).
A bundled sample is named by its real path; an uploaded image by its file name, with a
comment asking for its path (the server never sees the user's path).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from vizapp.inputs import SAMPLES_DIR
from vizapp.refs import ImageRef, ModelRef

__all__ = [
    "Source",
    "sample_path",
    "load_model_lines",
    "image_path_line",
    "forward_lines",
    "script",
    "show_code",
]


def sample_path(image: ImageRef) -> Path | None:
    """The bundled sample file ``image`` was read from, or None (an upload)."""
    path = SAMPLES_DIR / Path(image.name).name
    try:
        if path.is_file() and path.stat().st_size == len(image.data) and path.read_bytes() == image.data:
            return path
    except OSError:
        return None
    return None


@dataclass(frozen=True)
class Source:
    """What a script needs to rebuild the app's forward pass: the model, the image's path
    (None for an upload, then ``image_name`` is shown), whether the app keeps the
    attention in float16 (big models, ``resources.record_dtype``) and whether the model's layers
    attend inside windows of their own stage grids (``windowed``: Swin, SAM; the scripts read each
    layer on its grid), the default of every ``windowed`` argument below."""

    model: ModelRef
    image_name: str
    image_path: Path | None
    float16: bool = False
    windowed: bool = False

    @classmethod
    def of(cls, cur) -> Source:
        """From the app's ``state.Current``."""
        return cls.of_model(cur, cur.model, cur.spec)

    @classmethod
    def of_model(cls, cur, model: ModelRef, spec) -> Source:
        """``model`` (whose spec is ``spec``) on the app's image: a second model beside ``cur``'s."""
        import torch

        from vizapp.resources import record_dtype

        float16 = record_dtype(spec) == torch.float16
        from analysis.views.attention_view import view_layout

        return cls(model, cur.image.name, sample_path(cur.image), float16, view_layout(spec) != "tokens")


def load_model_lines(model: ModelRef) -> list[str]:
    """The line that loads ``model`` as ``vit`` (with a comment when its weights are random)."""
    args = [repr(model.source)]
    if not model.pretrained:
        args.append("pretrained=False")
    if model.arch:
        args.append(f"arch={model.arch!r}")
    if model.img_size:
        args.append(f"img_size={model.img_size}")
    lines = [f"vit = analysis.load_vit({', '.join(args)})"]
    if not model.pretrained:
        lines[0] += "  # random weights: each load draws new ones, so values differ from the app's"
    return lines


def image_path_line(source: Source) -> str:
    """The line naming the image as ``IMAGE``: a bundled sample's path, or an upload's name to fill in."""
    if source.image_path is not None:
        return f"IMAGE = {str(source.image_path)!r}  # the bundled sample shown in the app"
    return f"IMAGE = {source.image_name!r}  # the image you uploaded: fill in its path on your machine"


def forward_lines(source: Source, *, imports: Sequence[str] = (), record: bool = True) -> list[str]:
    """Load the model and the image; with ``record``, run one forward pass capturing every
    layer's attention."""
    lines = [*imports, "import analysis"]
    if source.float16 and record:
        lines.append("import torch")
    lines += [
        "",
        *load_model_lines(source.model),
        image_path_line(source),
        "image = analysis.load_image(IMAGE)",
        "pixels = vit.preprocess(image)  # (1, 3, H, W): resized and normalised as the model expects",
    ]
    if record:
        dtype = ", dtype=torch.float16" if source.float16 else ""
        note = "  # kept in float16, as the app does for big models" if source.float16 else ""
        lines.append(f"record = analysis.capture_attention(vit, pixels{dtype}){note}  # every layer's attention")
    return lines


def script(lines: Sequence[str]) -> str:
    """The script of ``lines``, one per line."""
    return "\n".join(lines) + "\n"


def show_code(code: str) -> None:
    """An expander with the script (Streamlit's code block has a copy button)."""
    with st.expander("Reproduce in Python", icon=":material/code:"):
        st.caption(
            "The public `analysis` calls that recompute this view's data "
            "(the arrays carry the names of the page's .npz download)."
        )
        st.code(code, language="python")
