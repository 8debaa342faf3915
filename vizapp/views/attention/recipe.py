"""The Attention page's "Reproduce in Python": the public ``analysis`` calls that recompute what it
shows, ending with its arrays under the names of its ``.npz`` download (:mod:`vizapp.python_snippet`)."""

from __future__ import annotations

from vizapp.python_snippet import Source, forward_lines, script

__all__ = ["attention_code"]


def attention_code(
    source: Source, *, layer: int, head: str | int, query: str | int | tuple[int, int], view: bool = True
) -> str:
    """The Attention page's map: ``attention`` ``(gh, gw)``, one head's (or the mean over
    heads) attention of ``query`` over the patches at ``layer``; with ``view``, the page's instant
    view as a notebook widget (:func:`analysis.views.widgets.attention_view`) on the same layer, head and query."""
    head_arg = "None" if head == "mean" else str(int(head))
    lines = [
        *forward_lines(source),
        "",
        f"# layer {layer}, {'mean over heads' if head == 'mean' else f'head {head}'}, query {query!r}",
        f"attention = analysis.attention_map(record, {int(layer)}, head={head_arg}, query={query!r})[0].numpy()"
        "  # (gh, gw)",
    ]
    if view:
        lines += [
            "",
            '# the page\'s instant view in a notebook (pip install "vit-explorer[notebook]"): hover, step heads and layers',
            "from analysis.views.widgets import attention_view",
            f"view = attention_view(record, vit.model_input_image(image), layer={int(layer)}, head={head!r}, "
            f"query={query!r})",
            "view  # a notebook cell shows the widget of its last line",
        ]
    return script(lines)
