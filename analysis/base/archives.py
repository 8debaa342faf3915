"""Reading image sets out of ``.zip`` archives with hard limits, never extracting to disk.

A zip's header can claim anything, so every limit is checked twice: against the sizes the
central directory declares (to refuse a bomb before decompressing it) and against the bytes
actually produced while decompressing (a header that lies is caught mid-stream):

* at most ``max_entries`` image entries;
* at most ``max_entry_bytes`` per entry and ``max_total_bytes`` in all, decompressed;
* at most ``max_ratio`` : 1 decompressed to compressed bytes per entry (zip bombs reach
  1000 : 1 and more; real JPEG/PNG files compress about 1 : 1).

Entry names that are absolute or climb out of the archive (``../``) are refused: nothing is
written to disk here, but such a name is a sign of a crafted archive.
"""

from __future__ import annotations

import io
import posixpath
import zipfile
from dataclasses import dataclass, field

from .errors import ArchiveError
from .images import declared_image

__all__ = ["ArchiveLimits", "ImageArchive", "read_image_archive", "IMAGE_SUFFIXES"]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class ArchiveLimits:
    """Bounds on what one archive may expand to.

    Each is checked against the sizes the archive's central directory declares and again against the
    bytes actually decompressed (:func:`read_image_archive`).

    Attributes
    ----------
    max_entries : int, default 256
        The most image entries one archive may hold; more refuse the whole archive.
    max_entry_bytes : int, default 50_000_000
        The most decompressed bytes per image entry. An entry that declares more is skipped (and named in
        ``ImageArchive.skipped``); one that produces more than it may while decompressing refuses the archive.
    max_total_bytes : int, default 512_000_000
        The most decompressed bytes of all image entries together, declared or produced.
    max_ratio : float, default 100.0
        The most decompressed bytes per compressed byte of one entry (``max_ratio : 1``). Zip bombs reach
        1000 : 1 and more; real JPEG/PNG files compress about 1 : 1.
    max_total_pixels : int, default 256_000_000
        The most pixels the image entries declare together (read from each header, nothing decoded): the
        decoding time an archive may cost, about four 64-megapixel images (a few seconds of one core);
        more refuse the archive.
    """

    max_entries: int = 256
    max_entry_bytes: int = 50_000_000
    max_total_bytes: int = 512_000_000
    max_ratio: float = 100.0
    max_total_pixels: int = 256_000_000


@dataclass(frozen=True)
class ImageArchive:
    """The images of an archive: ``(name, bytes)`` in archive order, and what was left out.

    Attributes
    ----------
    images : tuple of (str, bytes)
        ``(name, bytes)`` of each image entry read, in archive order, the bytes undecoded.
    skipped : tuple of str, default ()
        One sentence per image entry left out (declared larger than ``max_entry_bytes``, or unreadable
        inside the archive).
    """

    images: tuple[tuple[str, bytes], ...]
    skipped: tuple[str, ...] = field(default=())


def _unsafe_name(name: str) -> bool:
    normalized = posixpath.normpath(name.replace("\\", "/"))
    return name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":") or normalized.split("/")[0] == ".."


def _read_bounded(archive: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int, ratio: float, label: str) -> bytes:
    """Decompress one entry, stopping as soon as it exceeds ``limit`` bytes or ``ratio``."""
    allowed = min(limit, int(max(info.compress_size, 1) * ratio))
    out = io.BytesIO()
    with archive.open(info) as stream:
        while chunk := stream.read(_CHUNK):
            out.write(chunk)
            if out.tell() > allowed:
                raise ArchiveError(
                    f"{label}: {info.filename} expands beyond what its header declares or beyond the limits "
                    f"({limit / 1e6:.0f} MB per image, {ratio:.0f}:1 compression): the archive looks crafted "
                    "(a zip bomb), so it was not read. Upload the images themselves or a normal zip."
                )
    return out.getvalue()


def read_image_archive(data: bytes, *, label: str = "archive", limits: ArchiveLimits = ArchiveLimits()) -> ImageArchive:
    """The image files inside a zip archive given as bytes.

    Non-image entries, folders and macOS ``__MACOSX`` metadata are ignored; an image entry is one whose
    name ends in one of :data:`IMAGE_SUFFIXES` (``.jpg``, ``.jpeg``, ``.png``, ``.webp``, ``.bmp``,
    ``.gif``, any case). Nothing is extracted to disk. Images beyond the limits of a normal archive are
    never decompressed.

    Parameters
    ----------
    data : bytes
        The whole ``.zip`` file.
    label : str, default "archive"
        What to call the archive in error messages (e.g. the uploaded file's name).
    limits : ArchiveLimits, default ArchiveLimits()
        The bounds on entries, bytes and compression ratio (:class:`ArchiveLimits`).

    Returns
    -------
    ImageArchive
        ``images``: ``(name, bytes)`` of each image entry, in archive order, the bytes undecoded;
        ``skipped``: one sentence per image entry left out (declared larger than
        ``limits.max_entry_bytes``, or unreadable inside the archive).

    Raises
    ------
    ArchiveError
        For an unreadable archive, an unsafe entry name (absolute or ``../``), too many images or a zip bomb
        (declared or actual sizes over ``limits``), or images of more pixels together than
        ``limits.max_total_pixels``.
    """
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError) as exc:
        raise ArchiveError(f"{label} is not a readable zip archive ({exc}).") from exc
    with archive:
        infos = archive.infolist()
        unsafe = [info.filename for info in infos if _unsafe_name(info.filename)]
        if unsafe:
            raise ArchiveError(
                f"{label} has entries whose names leave the archive ({unsafe[0]!r}): it looks crafted, so it "
                "was not read. Zip the images with relative names."
            )
        wanted = [
            info
            for info in infos
            if not info.is_dir() and info.filename.lower().endswith(IMAGE_SUFFIXES) and "__MACOSX" not in info.filename
        ]
        if len(wanted) > limits.max_entries:
            raise ArchiveError(
                f"{label} holds {len(wanted)} images; at most {limits.max_entries} are read from one archive. "
                "Split it or upload fewer images."
            )
        declared = sum(info.file_size for info in wanted)
        if declared > limits.max_total_bytes:
            raise ArchiveError(
                f"{label} would expand to {declared / 1e6:.0f} MB of images; at most "
                f"{limits.max_total_bytes / 1e6:.0f} MB are read from one archive. Upload fewer or smaller images."
            )
        images: list[tuple[str, bytes]] = []
        skipped: list[str] = []
        total = pixels = 0
        for info in wanted:
            if info.file_size > limits.max_entry_bytes:
                skipped.append(f"{info.filename}: larger than {limits.max_entry_bytes / 1e6:.0f} MB, skipped.")
                continue
            if info.file_size > max(info.compress_size, 1) * limits.max_ratio:
                raise ArchiveError(
                    f"{label}: {info.filename} declares {info.file_size / max(info.compress_size, 1):.0f}:1 "
                    f"compression (at most {limits.max_ratio:.0f}:1 is accepted): the archive looks like a zip "
                    "bomb, so it was not read."
                )
            try:
                content = _read_bounded(archive, info, limits.max_entry_bytes, limits.max_ratio, label)
            except (zipfile.BadZipFile, EOFError, OSError, NotImplementedError, RuntimeError) as exc:
                skipped.append(f"{info.filename}: unreadable in the archive ({exc}), skipped.")
                continue
            total += len(content)
            if total > limits.max_total_bytes:
                raise ArchiveError(
                    f"{label} expands beyond {limits.max_total_bytes / 1e6:.0f} MB of images: it looks crafted, "
                    "so it was not read."
                )
            header = declared_image(content)  # from the header alone: no pixel is decoded here
            pixels += header[0] * header[1] if header is not None else 0
            if pixels > limits.max_total_pixels:
                raise ArchiveError(
                    f"{label} holds more than {limits.max_total_pixels / 1e6:,.0f} megapixels of images in all "
                    f"(decoding them would take minutes of the server's time): upload fewer or smaller images."
                )
            images.append((info.filename, content))
    return ImageArchive(images=tuple(images), skipped=tuple(skipped))
