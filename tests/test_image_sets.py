"""The app's one loop over an image set (vizapp/image_sets.py), used by the Distance and
Robustness pages."""

from __future__ import annotations

from vizapp.image_sets import each_piece
from vizapp.refs import ImageRef


def test_each_piece_covers_every_image_once_in_order_and_names_the_skipped():
    images = [ImageRef.from_bytes(f"img{i}.png", bytes([i])) for i in range(7)]
    seen, calls = [], []

    def compute(piece, start):
        seen.append((start, [image.name for image in piece]))
        skipped = [(1, "broken")] if start == 3 else []  # the second image of the second piece
        return sum(image.data[0] for image in piece), skipped

    problems: list[str] = []
    results = each_piece(images, compute, problems, progress=lambda done, total: calls.append((done, total)), size=3)
    assert seen == [
        (0, ["img0.png", "img1.png", "img2.png"]),
        (3, ["img3.png", "img4.png", "img5.png"]),
        (6, ["img6.png"]),
    ]
    assert results == [0 + 1 + 2, 3 + 4 + 5, 6]
    assert problems == ["img4.png: broken (skipped)"]
    assert calls == [(3, 7), (6, 7), (7, 7)]
    assert each_piece([], compute, problems) == []
