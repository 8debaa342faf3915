"""The one loop over an image set: pieces of :data:`vizapp.resources.SET_CHUNK` images, each
computed by a cached resource, a progress bar between pieces, skipped images named.

Pages call :func:`over_image_set`; the loop itself (:func:`each_piece`) knows nothing of
Streamlit and reports progress through a callback, so it is tested on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import streamlit as st

from vizapp.refs import ImageRef
from vizapp.resources import SET_CHUNK

__all__ = ["each_piece", "over_image_set"]

#: ``compute(piece, start)`` -> ``(result, skipped)``: ``piece`` is ``images[start : start + size]``,
#: ``skipped`` holds ``(index in the piece, reason)`` for each image that could not be used.
PieceFunction = Callable[[Sequence[ImageRef], int], tuple[Any, Sequence[tuple[int, str]]]]


def each_piece(
    images: Sequence[ImageRef],
    compute: PieceFunction,
    problems: list[str],
    *,
    progress: Callable[[int, int], object] | None = None,  # its return value is ignored
    size: int = SET_CHUNK,
) -> list:
    """``compute`` on ``images`` in order, ``size`` at a time; returns the results, one per piece.

    Each skipped image is appended to ``problems`` as ``"<name>: <reason> (skipped)"``;
    ``progress(done, total)`` is called after each piece with the images done so far.
    """
    results = []
    for start in range(0, len(images), size):
        piece = images[start : start + size]
        result, skipped = compute(piece, start)
        results.append(result)
        problems.extend(f"{piece[index].name}: {reason} (skipped)" for index, reason in skipped)
        if progress is not None:
            progress(start + len(piece), len(images))
    return results


def over_image_set(images: Sequence[ImageRef], label: str, compute: PieceFunction, problems: list[str]) -> list:
    """:func:`each_piece` with a Streamlit progress bar ``"<label>: done / total images"``,
    removed when the loop ends."""
    bar = st.progress(0.0, text=f"{label}: 0 / {len(images)} images")
    try:
        return each_piece(
            images,
            compute,
            problems,
            progress=lambda done, total: bar.progress(done / total, text=f"{label}: {done} / {total} images"),
        )
    finally:
        bar.empty()
