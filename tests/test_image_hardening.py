"""Images from strangers: every mode becomes RGB, orientation is applied, bad data is refused fast."""

from __future__ import annotations

import io
import struct
import time
import zlib

import numpy as np
import pytest
from PIL import Image

from analysis import ImageLoadError, ImageTooLargeError, load_image
from analysis.base.images import MAX_DECODE_BYTES, MAX_IMAGE_PIXELS, decode_peak_bytes


def _encode(image: Image.Image, fmt: str, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()


def test_exif_orientation_is_applied():
    image = Image.new("RGB", (40, 20), (200, 0, 0))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90° clockwise to display
    loaded = load_image(_encode(image, "JPEG", exif=exif.tobytes()))
    assert loaded.size == (20, 40)


@pytest.mark.parametrize(
    "mode, color, expected",
    [
        ("LA", (0, 0), (255, 255, 255)),  # fully transparent -> white
        ("RGBA", (255, 0, 0, 255), (255, 0, 0)),
        ("L", 128, (128, 128, 128)),
        ("1", 1, (255, 255, 255)),
    ],
)
def test_modes_become_rgb(mode, color, expected):
    loaded = load_image(_encode(Image.new(mode, (5, 5), color), "PNG"))
    assert loaded.mode == "RGB" and loaded.getpixel((2, 2)) == expected


def test_palette_with_transparency_and_cmyk():
    palette = Image.new("P", (4, 4), 0)
    palette.putpalette([10, 20, 30] + [0, 0, 0] * 255)
    loaded = load_image(_encode(palette, "PNG", transparency=0))
    assert loaded.getpixel((0, 0)) == (255, 255, 255)
    cmyk = load_image(_encode(Image.new("CMYK", (4, 4), (0, 255, 255, 0)), "JPEG"))
    r, g, b = cmyk.getpixel((1, 1))
    assert r > 200 and g < 60 and b < 60


def test_sixteen_bit_greyscale_uses_the_full_range():
    array = np.array([[0, 1000], [30000, 65535]], dtype=np.uint16)
    image = Image.fromarray(array)
    assert image.mode.startswith("I;16")
    loaded = load_image(_encode(image, "PNG"))
    assert loaded.getpixel((0, 0))[0] == 0 and loaded.getpixel((1, 1))[0] == 255
    assert 100 < loaded.getpixel((0, 1))[0] < 130  # 30000 / 65535 * 255 ≈ 117, not clipped to 255


def test_animated_gif_gives_its_first_frame():
    frames = [Image.new("RGB", (6, 6), c) for c in ((255, 0, 0), (0, 0, 255))]
    data = _encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=50)
    r, g, b = load_image(data).getpixel((3, 3))
    assert r > 200 and b < 50


@pytest.mark.parametrize("size", [(1, 1), (1, 3000), (3000, 1)])
def test_tiny_and_extreme_aspect_images_load(size):
    assert load_image(_encode(Image.new("RGB", size, (1, 2, 3)), "PNG")).size == size


def test_webp_and_bmp():
    for fmt in ("WEBP", "BMP"):
        assert load_image(_encode(Image.new("RGB", (8, 8), (0, 128, 0)), fmt)).size == (8, 8)


def blank_png(width: int, height: int) -> bytes:
    """A valid 1-bit greyscale PNG of ``width × height`` black pixels, written row by row through
    zlib (a 20,000 × 20,000 one is about 50 kB, built in well under a second, never held whole)."""
    row = b"\x00" * (1 + (width + 7) // 8)  # filter byte + the packed bits
    compressor = zlib.compressobj(9)
    body = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)  # 1-bit greyscale, no interlace
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", body) + chunk(b"IEND", b"")


def test_blank_png_is_what_pil_reads():
    with Image.open(io.BytesIO(blank_png(37, 5))) as image:
        assert image.size == (37, 5) and image.mode == "1"
        assert np.asarray(image).shape == (5, 37) and not np.asarray(image).any()


@pytest.mark.parametrize("size", [(12_000, 6_000), (20_000, 20_000)])  # above our limit; above twice PIL's own
def test_a_too_large_image_is_refused_quickly_naming_its_size_and_the_limit(size):
    width, height = size
    bomb = blank_png(width, height)
    assert len(bomb) < 200_000
    start = time.monotonic()
    with pytest.raises(ImageTooLargeError) as caught:
        load_image(bomb)
    assert time.monotonic() - start < 3
    error = caught.value
    assert (error.width, error.height, error.limit) == (width, height, MAX_IMAGE_PIXELS)
    assert str(error).startswith(
        f"the uploaded data is too large: {width:,} × {height:,} = {width * height:,} pixels, "
        f"above the limit of {MAX_IMAGE_PIXELS:,} pixels"
    )
    assert "Downscale" in str(error) and "Error" not in str(error)  # the cause in words, not a class name


def test_a_too_large_image_file_names_the_file(tmp_path):
    path = tmp_path / "huge.png"
    path.write_bytes(blank_png(20_000, 20_000))
    with pytest.raises(ImageTooLargeError, match=r"^huge.png is too large: 20,000 × 20,000"):
        load_image(path)


def test_a_too_large_image_whose_size_cannot_be_read_still_says_too_large(monkeypatch):
    import analysis.base.images

    monkeypatch.setattr(analysis.base.images, "declared_image", lambda data: None)
    with pytest.raises(ImageTooLargeError, match=f"too large: above the limit of {MAX_IMAGE_PIXELS:,} pixels"):
        load_image(blank_png(20_000, 20_000))


def test_truncated_and_non_image_files_are_refused_quickly():
    jpeg = _encode(Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)), "JPEG")
    start = time.monotonic()
    for data, pattern in (
        (jpeg[: len(jpeg) // 2], "truncated|corrupt"),
        (b"%PDF-1.4 hello", "not an image"),
        (b"\x00" * 1000, "not an image"),
        (b"", "empty"),
    ):
        with pytest.raises(ImageLoadError, match=pattern):
            load_image(data)
    assert time.monotonic() - start < 3


def test_text_mode_file_objects_and_other_types_are_explained(tmp_path):
    path = tmp_path / "x.png"
    path.write_bytes(_encode(Image.new("RGB", (2, 2)), "PNG"))
    with open(path, encoding="latin-1") as handle, pytest.raises(ImageLoadError, match="text mode"):
        load_image(handle)
    with pytest.raises(ImageLoadError, match="int"):
        load_image(12)


@pytest.mark.parametrize("pil_format", ["TIFF", "EPS", "PPM", "ICO"])
def test_only_the_accepted_formats_are_decoded_whatever_the_name(tmp_path, monkeypatch, pil_format):
    """Bytes of another format named .png are refused as not an image we read; PIL's other decoders
    (here TIFF, EPS, PPM, ICO) are never opened on them (each plugin's opener would record it)."""
    from PIL import Image as PILImage

    buffer = io.BytesIO()
    image = Image.new("RGB", (32, 32), (200, 10, 10))
    if pil_format == "EPS":  # writing EPS needs no Ghostscript; reading it would
        buffer.write(b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 32 32\nshowpage\n")
    else:
        image.save(buffer, format=pil_format)
    path = tmp_path / "photo.png"
    path.write_bytes(buffer.getvalue())
    PILImage.init()
    opened = []
    factory, accept = PILImage.OPEN[pil_format]
    monkeypatch.setitem(PILImage.OPEN, pil_format, (lambda *a, **k: opened.append(1) or factory(*a, **k), accept))
    with pytest.raises(ImageLoadError, match="not an image we can read"):
        load_image(path)
    assert opened == []
    # PNG, JPEG, WebP, BMP and GIF bytes still load, under any name
    for accepted in ("PNG", "JPEG", "WEBP", "BMP", "GIF"):
        data = io.BytesIO()
        image.save(data, format=accepted)
        (tmp_path / "named.tif").write_bytes(data.getvalue())
        assert load_image(tmp_path / "named.tif").size == (32, 32)


def png_header(width: int, height: int, bit_depth: int, colour_type: int) -> bytes:
    """A PNG that declares ``width × height`` pixels of a colour type (2: RGB, 6: RGBA) and holds one
    empty row: enough for a header, never decodable whole."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, bit_depth, colour_type, 0, 0, 0)
    body = zlib.compress(b"\x00" * (1 + width * 8))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", body) + chunk(b"IEND", b"")


def test_an_image_whose_decode_would_exceed_the_budget_is_refused_before_a_pixel_is_decoded(monkeypatch):
    """A 16-bit RGBA PNG under the pixel limit (7,600 × 7,600 = 57.8 MP) would take 8 bytes a pixel
    to decode and composite (462 MB): refused from its header. The same size in RGB (4 bytes a pixel)
    is within the budget: it goes on to decode (and this one, holding one row, is then refused as
    truncated)."""
    width = height = 7_600
    assert width * height < MAX_IMAGE_PIXELS
    assert decode_peak_bytes(width, height, "RGBA") > MAX_DECODE_BYTES >= decode_peak_bytes(width, height, "RGB")
    loads, load = [], Image.Image.load
    monkeypatch.setattr(Image.Image, "load", lambda self: loads.append(self.mode) or load(self))
    start = time.monotonic()
    with pytest.raises(ImageTooLargeError, match=r"7,600 × 7,600 pixels in mode RGBA take about 441 MiB to decode"):
        load_image(png_header(width, height, 16, 6))
    assert time.monotonic() - start < 3 and loads == []
    with pytest.raises(ImageLoadError, match="truncated or corrupt"):
        load_image(png_header(width, height, 8, 2))


PEAK_SCRIPT = """
import io, os, resource, sys
import numpy as np
from PIL import Image
from analysis.base.images import decode_peak_bytes, load_image

side = int(sys.argv[1])
blocks = np.random.default_rng(0).integers(0, 255, (side // 40, side // 40, 4), dtype=np.uint8)
base = Image.fromarray(blocks, "RGBA").resize((side, side), Image.Resampling.NEAREST)
palette = base.convert("RGB").convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
grey16 = Image.fromarray(np.asarray(base.convert("L"), dtype=np.uint16) * 257)
images = {"RGB": base.convert("RGB"), "RGBA": base, "LA": base.convert("LA"), "L": base.convert("L"),
          "P": palette, "I;16": grey16}
encoded = {}
for mode, image in images.items():
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", **({"transparency": 0} if mode == "P" else {}))
    encoded[mode] = buffer.getvalue()
buffer = io.BytesIO(); images["RGB"].save(buffer, format="JPEG", quality=90); encoded["JPEG"] = buffer.getvalue()
del images, base, palette, grey16, blocks
import ctypes, gc
gc.collect()
Image.core.clear_cache()  # PIL's cached blocks, then the C heap's free pages: a decode below takes fresh ones
ctypes.CDLL("libc.so.6").malloc_trim(0)
for name, data in encoded.items():
    read, write = os.pipe()
    if os.fork() == 0:  # a child: its peak starts at what it holds now
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        image = load_image(data)
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
        with Image.open(io.BytesIO(data)) as opened:
            stated = decode_peak_bytes(*opened.size, opened.mode)
        os.write(write, f"{name} {grown / side**2:.3f} {stated / side**2:.3f}".encode())
        os._exit(0)
    os.close(write)
    print(os.read(read, 200).decode())
    os.wait()
"""


def test_each_modes_decode_peak_stays_within_what_decode_peak_bytes_states():
    """Measured: the peak resident memory a decode adds, in a forked process per image (8 MP each),
    at most what :func:`decode_peak_bytes` states (which the budget check uses), and not far below it
    (the statement is the pipeline's, not a loose bound)."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", PEAK_SCRIPT, "2800"], capture_output=True, text=True, timeout=240, check=True
    )
    rows = [line.split() for line in result.stdout.splitlines() if line.strip()]
    measured = {name: (float(grown), float(stated)) for name, grown, stated in rows}
    assert set(measured) == {"RGB", "RGBA", "LA", "L", "P", "I;16", "JPEG"}, result.stdout
    for name, (grown, stated) in measured.items():
        fixed = 2 * 2**20 / 2800**2  # the decoders' own buffers, about 2 MiB whatever the size
        assert grown <= stated + fixed, f"{name}: {grown:.2f} bytes a pixel at the peak, stated {stated}"
        assert grown >= stated - 1.5, f"{name}: {grown:.2f} bytes a pixel at the peak, stated {stated} (too loose)"
