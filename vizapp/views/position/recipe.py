"""The Position embeddings page's "Reproduce in Python": the public ``analysis`` calls that recompute what it
shows, ending with its arrays under the names of its ``.npz`` download (:mod:`vizapp.python_snippet`)."""

from __future__ import annotations

from vizapp.python_snippet import load_model_lines, script
from vizapp.refs import ModelRef

__all__ = ["position_code"]


def position_code(model: ModelRef, *, kind: str, resampled_grid: tuple[int, int] | None) -> str:
    """The Position embeddings page: ``similarity`` ``(gh, gw, gh, gw)`` and, when resampled,
    ``resampled_similarity`` on ``resampled_grid``."""
    lines = [
        "import analysis",
        "",
        *load_model_lines(model),
        f"similarity = analysis.position_embedding_similarity(vit, kind={kind!r}).numpy()  # (gh, gw, gh, gw)",
    ]
    if resampled_grid is not None:
        h, w = (int(v) for v in resampled_grid)
        lines.append(
            f"resampled_similarity = analysis.position_embedding_similarity(vit, grid_size=({h}, {w}), "
            f"kind={kind!r}).numpy()  # ({h}, {w}, {h}, {w})"
        )
    return script(lines)
