"""The Patch-embedding filters page's "Reproduce in Python": the public ``analysis`` calls that recompute what it
shows, ending with its arrays under the names of its ``.npz`` download (:mod:`vizapp.python_snippet`)."""

from __future__ import annotations

from vizapp.python_snippet import load_model_lines, script
from vizapp.refs import ModelRef

__all__ = ["filters_code"]


def filters_code(model: ModelRef, *, mode: str, n: int) -> str:
    """The Patch-embedding filters page: ``components`` ``(n, C, ph, pw)`` and
    ``explained_variance_ratio`` ``(n,)`` (mode ``"pca"``), or the first ``n`` ``filters``."""
    lines = ["import analysis", "", *load_model_lines(model)]
    if mode == "pca":
        lines += [
            f"components, explained_variance_ratio = analysis.patch_embedding_components(vit, n_components={int(n)})",
            "components, explained_variance_ratio = components.numpy(), explained_variance_ratio.numpy()"
            "  # (n, C, ph, pw), (n,)",
        ]
    else:
        lines.append(f"filters = analysis.patch_embedding_filters(vit)[:{int(n)}].numpy()  # (n, C, ph, pw)")
    return script(lines)
