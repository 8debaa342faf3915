"""load_image basics: every source kind, every mode to RGB, clear errors."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from analysis import ImageLoadError, load_image


def _png(mode="RGB", size=(8, 6), color=(10, 20, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size, color).save(buffer, format="PNG")
    return buffer.getvalue()


def test_bytes_path_and_file_object(tmp_path):
    data = _png()
    path = tmp_path / "x.png"
    path.write_bytes(data)
    for source in (data, path, str(path), io.BytesIO(data), open(path, "rb")):
        image = load_image(source)
        assert image.mode == "RGB" and image.size == (8, 6)
        assert image.getpixel((0, 0)) == (10, 20, 30)


def test_transparency_is_composited_on_white():
    image = load_image(_png("RGBA", color=(0, 0, 0, 0)))
    assert image.getpixel((1, 1)) == (255, 255, 255)


def test_greyscale_becomes_rgb():
    assert load_image(_png("L", color=77)).getpixel((0, 0)) == (77, 77, 77)


@pytest.mark.parametrize(
    "data, message",
    [(b"", "empty"), (b"not an image at all", "not an image"), (_png()[:40], "truncated|corrupt|not an image")],
)
def test_bad_inputs_raise_image_load_error(data, message):
    with pytest.raises(ImageLoadError, match=message):
        load_image(data)
    assert issubclass(ImageLoadError, ValueError)


def test_missing_path(tmp_path):
    with pytest.raises(ImageLoadError, match="No image file"):
        load_image(tmp_path / "missing.png")
