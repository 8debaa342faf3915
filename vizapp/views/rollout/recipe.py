"""The Rollout page's "Reproduce in Python": the public ``analysis`` calls that recompute what it
shows, ending with its arrays under the names of its ``.npz`` download (:mod:`vizapp.python_snippet`)."""

from __future__ import annotations

from vizapp.python_snippet import Source, forward_lines, script

__all__ = ["rollout_code"]


def rollout_code(
    source: Source,
    *,
    fusion: str,
    discard_ratio: float,
    start_layer: int,
    query: str | int | tuple[int, int],
    stage: int | None = None,
    merge: str | None = None,
    windowed: bool = False,
) -> str:
    """The Rollout page: ``after_each_layer`` ``(L - start, gh, gw)``, ``rollout`` (the last of
    them, the map shown) and ``figure6`` (the input times the upsampled rollout). A windowed
    model (``windowed``: Swin, SAM; no instant view): ``query`` a pixel ``(y, x)`` or
    ``"mean"``; ``stage`` (its layers only, exact) or ``start_layer`` with ``merge``
    (``"mean_2x2"``: across patch merging, an approximation). A ViT's script ends with the
    page's instant view as a notebook widget."""
    span = f"stage={int(stage)}" if stage is not None else f"start_layer={int(start_layer)}"
    extra = f", merge={merge!r}" if merge is not None else ""
    return script(
        [
            *forward_lines(source),
            "",
            "after_each_layer = analysis.attention_rollout_by_layer(",
            f"    record, head_fusion={fusion!r}, discard_ratio={float(discard_ratio)!r}, "
            f"{span}, query={query!r}{extra},",
            ")[:, 0].numpy()  # (steps, gh, gw): the rollout after each layer",
            "rollout = after_each_layer[-1]  # (gh, gw): through the last layer, the map shown",
            "figure6 = analysis.masked_image(vit.model_input_image(image), rollout, 'bilinear')  # (H, W, 3) uint8",
            *([] if windowed else _rollout_view_lines(fusion, discard_ratio, start_layer, query)),
        ]
    )


def _rollout_view_lines(fusion: str, discard_ratio: float, start_layer: int, query) -> list[str]:
    """The Rollout page's instant view as a notebook widget (:func:`analysis.views.widgets.rollout_view`; a ViT)."""
    return [
        "",
        '# the page\'s instant rollout view in a notebook (pip install "vit-explorer[notebook]")',
        "from analysis.views.widgets import rollout_view",
        f"view = rollout_view(record, vit.model_input_image(image), head_fusion={fusion!r}, "
        f"discard_ratio={float(discard_ratio)!r}, start_layer={int(start_layer)}, query={query!r})",
        "view  # a notebook cell shows the widget of its last line",
    ]
