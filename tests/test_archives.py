"""Image archives: read once, with limits on entries, total bytes and compression ratio."""

from __future__ import annotations

import io
import struct
import zipfile

import numpy as np
import pytest
from PIL import Image

from analysis import ArchiveError, ArchiveLimits, ImageLoadError, read_image_archive


def _png(seed: int = 0, size: int = 16) -> bytes:
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def _zip(entries: dict[str, bytes], compression=zipfile.ZIP_DEFLATED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=compression) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def test_images_come_back_in_order_and_other_entries_are_ignored():
    a, b = _png(0), _png(1)
    data = _zip({"set/a.png": a, "notes.txt": b"hello", "__MACOSX/set/._a.png": b"x", "set/b.PNG": b, "set/": b""})
    archive = read_image_archive(data, label="set.zip")
    assert archive.images == (("set/a.png", a), ("set/b.PNG", b))
    assert archive.skipped == ()


def test_a_declared_zip_bomb_is_refused_before_decompressing():
    bomb = _zip({"bomb.png": b"\0" * 20_000_000})  # ~20 MB of zeros compress about 1000:1
    assert len(bomb) < 100_000
    with pytest.raises(ArchiveError, match="zip bomb"):
        read_image_archive(bomb, label="bomb.zip")


def _lying_zip(real: bytes, declared_size: int) -> bytes:
    """A zip whose headers declare ``declared_size`` bytes for an entry that inflates to ``real``."""
    data = _zip({"liar.png": real})
    fake = struct.pack("<I", declared_size)
    # local header: uncompressed size at offset 22; central directory entry: at offset 24
    data = data[:22] + fake + data[26:]
    central = data.rindex(b"PK\x01\x02")
    return data[: central + 24] + fake + data[central + 28 :]


def test_a_header_that_lies_never_yields_more_than_it_declares():
    real = b"\0" * 5_000_000
    liar = _lying_zip(real, declared_size=1000)
    archive = read_image_archive(liar, label="liar.zip")  # decompression stops at the declared size
    assert archive.images == ()
    assert len(archive.skipped) == 1 and "unreadable" in archive.skipped[0]


def test_total_budget_and_entry_count():
    entries = {f"{i}.png": _png(i, size=64) for i in range(5)}
    data = _zip(entries, compression=zipfile.ZIP_STORED)
    per_entry = len(entries["0.png"])
    with pytest.raises(ArchiveError, match="expand to"):
        read_image_archive(data, limits=ArchiveLimits(max_total_bytes=3 * per_entry))
    with pytest.raises(ArchiveError, match="holds 5 images; at most 4"):
        read_image_archive(data, limits=ArchiveLimits(max_entries=4))
    assert len(read_image_archive(data).images) == 5


def test_an_oversized_entry_is_skipped_not_read():
    small, big = _png(0), _png(1, size=256)
    data = _zip({"small.png": small, "big.png": big}, compression=zipfile.ZIP_STORED)
    archive = read_image_archive(data, limits=ArchiveLimits(max_entry_bytes=len(small) + 1))
    assert [name for name, _ in archive.images] == ["small.png"]
    assert len(archive.skipped) == 1 and archive.skipped[0].startswith("big.png")


@pytest.mark.parametrize("name", ["../escape.png", "/etc/evil.png", "a/../../evil.png", "C:/evil.png", "..\\evil.png"])
def test_path_traversal_names_are_refused(name):
    data = _zip({"fine.png": _png(0), name: _png(1)})
    with pytest.raises(ArchiveError, match="leave the archive"):
        read_image_archive(data, label="evil.zip")


def test_not_a_zip():
    with pytest.raises(ArchiveError, match="not a readable zip") as info:
        read_image_archive(b"PK but not really", label="x.zip")
    assert isinstance(info.value, ImageLoadError)  # the app treats it like any bad upload


def test_an_archive_of_more_pixels_than_its_budget_is_refused_from_the_headers(monkeypatch):
    """Four 56-megapixel PNGs (224 MP) are within the default budget of 256 MP and come back undecoded;
    a fifth refuses the archive, before any pixel is decoded: decoding them would cost the server
    minutes (a zip of a hundred 64 MP images took 157 s of one core)."""
    from test_image_hardening import blank_png

    big = blank_png(8_000, 7_000)
    loads, load = [], Image.Image.load
    monkeypatch.setattr(Image.Image, "load", lambda self: loads.append(self.size) or load(self))
    four = read_image_archive(_zip({f"{i}.png": big for i in range(4)}))
    assert [name for name, _ in four.images] == ["0.png", "1.png", "2.png", "3.png"]
    with pytest.raises(ArchiveError, match="more than 256 megapixels of images in all"):
        read_image_archive(_zip({f"{i}.png": big for i in range(5)}))
    assert loads == []
    small = ArchiveLimits(max_total_pixels=100)  # the bound is the one given
    with pytest.raises(ArchiveError, match="more than 0 megapixels"):
        read_image_archive(_zip({"a.png": _png()}), limits=small)
