"""The Attention distance page's "Reproduce in Python": the public ``analysis`` calls that recompute what it
shows, ending with its arrays under the names of its ``.npz`` download (:mod:`vizapp.python_snippet`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from vizapp.python_snippet import Source, forward_lines, script

__all__ = ["distance_code"]


def distance_code(
    source: Source,
    *,
    unit: str,
    image_set: Sequence[Path] | None,
    image_set_names: Sequence[str] = (),
    windowed: bool = False,
) -> str:
    """The Attention distance page (first model): ``current_image`` ``(L, heads)``,
    ``uniform_reference`` and, over an image set, ``set_per_image`` ``(N, L, heads)`` and
    ``set_mean`` ``(L, heads)``, all in ``unit``. ``image_set``: the bundled samples' paths,
    or None for uploaded files (named by ``image_set_names``). ``windowed`` (Swin, SAM): the
    reference is one value per layer, ``(L,)``, and layers with fewer heads are NaN."""
    uniform = (
        "analysis.uniform_attention_distance_by_layer(vit.spec).numpy() * to_unit  # (L,): each layer's window"
        if windowed
        else "analysis.uniform_attention_distance(vit.spec) * to_unit"
    )
    lines = [
        *forward_lines(source),
        "",
        f"to_unit = 1.0 / analysis.distance_unit_length(vit.spec, {unit!r})  # pixels -> {unit}",
        "current_image = analysis.mean_attention_distance(record).numpy() * to_unit  # (L, heads)"
        + (", NaN beyond a layer's heads" if windowed else ""),
        f"uniform_reference = {uniform}",
    ]
    if image_set is not None:
        lines += ["", "IMAGE_SET = [  # the bundled samples", *(f"    {str(p)!r}," for p in image_set), "]"]
    elif image_set_names:
        lines += [
            "",
            "IMAGE_SET = [  # the images you uploaded: fill in their paths on your machine",
            *(f"    {name!r}," for name in image_set_names),
            "]",
        ]
    if image_set is not None or image_set_names:
        lines += [
            "set_per_image = analysis.dataset_attention_distance(",
            "    vit, IMAGE_SET, per_image=True, on_error='skip',",
            ").numpy() * to_unit  # (N, L, heads); undecodable images are skipped",
            "set_mean = set_per_image.mean(axis=0)  # (L, heads)"
            + (", NaN beyond a layer's heads" if windowed else ""),
        ]
    return script(lines)
