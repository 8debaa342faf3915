"""Decode user images safely into RGB."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import BinaryIO

from PIL import Image, ImageOps, UnidentifiedImageError
from PIL.ExifTags import Base as ExifBase

from .errors import ImageLoadError, ImageTooLargeError

__all__ = [
    "load_image",
    "to_rgb",
    "MAX_IMAGE_PIXELS",
    "MAX_DECODE_BYTES",
    "ACCEPTED_FORMATS",
    "decode_peak_bytes",
    "declared_image",
    "too_large_error",
]

# The formats an image is decoded as, recognised from its bytes whatever its name: PIL's other decoders
# (TIFF, EPS through Ghostscript, PSD, ...) are never tried on what a visitor uploads.
ACCEPTED_FORMATS = ("JPEG", "PNG", "WEBP", "BMP", "GIF")
MAX_IMAGE_PIXELS = 64_000_000  # about 8000 x 8000; larger images are refused (decompression bombs)
# The most memory one decode may take at its peak (decode_peak_bytes): a 64-megapixel RGB photo (4 bytes
# a pixel in PIL's memory, decoded in place, and the JPEG decoder's buffers) fits; one with transparency,
# whose compositing needs a second image of its size, is refused above about 52 megapixels.
MAX_DECODE_BYTES = 400 * 2**20
# Bytes a pixel takes at the peak of load_image, by the mode PIL decodes into: the decoded pixels
# (PIL keeps 1, 2 or 4 bytes a pixel) and the images to_rgb makes while they are held. Measured
# (tests/test_image_hardening.py, peak resident memory of a decode in a fresh process).
_PEAK_BYTES_PER_PIXEL = {"1": 5, "L": 5, "P": 9, "I;16": 7, "I;16B": 7, "I;16L": 7, "I;16N": 7, "RGB": 5, "RGBA": 8}
ORIENTATION = ExifBase.Orientation.value  # the EXIF tag of an image's rotation (274)
_PEAK_BYTES_OTHER = 12  # LA, PA, CMYK, YCbCr, I, F, ...: a conversion to RGBA or RGB beside the decoded pixels


def too_large_error(label: str, width: int, height: int, limit: int = MAX_IMAGE_PIXELS) -> ImageTooLargeError:
    """The error for an image that declares ``width × height`` pixels, above ``limit``: its size,
    the limit, and what to do.

    Parameters
    ----------
    label : str
        What to call the image in the message (its file name, or "the uploaded data").
    width : int
        The declared width in pixels.
    height : int
        The declared height in pixels.
    limit : int, default MAX_IMAGE_PIXELS
        The most pixels accepted (:data:`MAX_IMAGE_PIXELS`, 64,000,000).

    Returns
    -------
    ImageTooLargeError
        The error, not raised; it carries ``width``, ``height`` and ``limit``.
    """
    return ImageTooLargeError(
        f"{label} is too large: {width:,} × {height:,} = {width * height:,} pixels, above the limit of "
        f"{limit:,} pixels (about {int(limit**0.5):,} × {int(limit**0.5):,}; larger images are refused "
        "unread, as protection against decompression bombs). Downscale it first.",
        width,
        height,
        limit,
    )


def declared_image(data: bytes) -> tuple[int, int, str] | None:
    """The size and mode an image file declares in its header, read without decoding a pixel and
    without PIL's decompression-bomb check (which refuses very large images before saying how
    large): the first format of :data:`ACCEPTED_FORMATS` that accepts the data opens it lazily.

    Parameters
    ----------
    data : bytes
        The encoded image.

    Returns
    -------
    tuple of (int, int, str) or None
        ``(width, height, mode)`` as the header declares them (``mode`` is the one PIL decodes into),
        or ``None`` when no accepted format reads the header.
    """
    Image.init()
    prefix = data[:16]
    for name in ACCEPTED_FORMATS:
        factory, accept = Image.OPEN[name]
        accepted = accept(prefix) if accept else True  # as PIL decides (a str: a warning, not a match)
        if isinstance(accepted, str) or not accepted:
            continue
        try:
            with factory(io.BytesIO(data), "") as header:
                return header.size[0], header.size[1], header.mode
        except Exception:  # noqa: BLE001 - not this format: try the next
            continue
    return None


def _declared_orientation(opened: Image.Image) -> int | None:
    """The EXIF orientation an opened image declares before its pixels (JPEG and WebP carry EXIF in
    their header; a PNG only when its eXIf chunk precedes the pixels: PIL's ``getexif`` would decode a
    PNG whole to look further), or None."""
    if opened.format in ("JPEG", "WEBP"):
        return opened.getexif().get(ORIENTATION)
    exif = opened.info.get("exif")
    if not exif:
        return None
    declared = Image.Exif()
    declared.load(exif)
    return declared.get(ORIENTATION)


def decode_peak_bytes(width: int, height: int, mode: str, *, rotated: bool = False) -> int:
    """The most memory :func:`load_image` takes to decode an image: its pixels as PIL holds them,
    and the images the conversion to RGB makes while they are held,

        peak = width · height · b(mode)   (+ width · height · 4 when an EXIF rotation is applied)

    with ``b`` 5 bytes a pixel for RGB (decoded and returned in place; 4, and the JPEG decoder's
    buffers), 8 for RGBA (the white
    background it is composited on), 5 for L, 9 for P, 7 for 16-bit greyscale and 12 for the other
    modes (measured in tests/test_image_hardening.py, where each decode stays within it and about
    2 MiB of the decoders' own buffers).

    Parameters
    ----------
    width : int
        Width in pixels, as the file declares it.
    height : int
        Height in pixels.
    mode : str
        The PIL mode the file decodes into (:func:`declared_image`).
    rotated : bool, default False
        Whether an EXIF orientation turns the image (a transposed copy beside it).

    Returns
    -------
    int
        Bytes.
    """
    per_pixel = _PEAK_BYTES_PER_PIXEL.get(mode, _PEAK_BYTES_OTHER) + (4 if rotated else 0)
    return int(width) * int(height) * per_pixel


def _read_bytes(source) -> tuple[bytes, str]:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source), "the uploaded data"
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_file():
            raise ImageLoadError(f"No image file at {path}.")
        return path.read_bytes(), path.name
    if hasattr(source, "read"):
        if hasattr(source, "seek"):
            try:
                source.seek(0)
            except (OSError, ValueError):
                pass
        data = source.read()
        if isinstance(data, str):
            raise ImageLoadError("The file object was opened in text mode; open it with 'rb'.")
        return data, getattr(source, "name", "the file")
    raise ImageLoadError(f"Cannot read an image from a {type(source).__name__}; pass bytes, a path or a file object.")


def to_rgb(image: Image.Image) -> Image.Image:
    """Any PIL mode to RGB: transparency composited on white, 16/32-bit greyscale rescaled.

    Parameters
    ----------
    image : PIL.Image.Image
        An image of any mode (``"RGBA"``, ``"LA"`` and ``"P"`` with transparency are composited on white;
        ``"I;16*"`` and ``"I"`` have their used range rescaled to 8 bits; ``"F"`` goes through ``"L"``).

    Returns
    -------
    PIL.Image.Image
        Mode ``"RGB"``, same size; ``image`` itself when it already is RGB.
    """
    if image.mode == "RGB":
        return image
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image if image.mode == "RGBA" else image.convert("RGBA")
        composed = Image.new("RGB", rgba.size, (255, 255, 255))  # white, painted over by alpha
        composed.paste(rgba, (0, 0), rgba)
        return composed
    if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        # 16/32-bit greyscale: rescale the used range to 8 bits instead of clipping.
        extrema = image.getextrema()
        low, high = extrema if isinstance(extrema[0], (int, float)) else (0, 65535)
        scale = 255.0 / max(high - low, 1)
        image = image.point(lambda v: (v - low) * scale).convert("L")
    if image.mode == "F":
        image = image.convert("L")
    return image.convert("RGB")


def load_image(source: bytes | str | os.PathLike | BinaryIO) -> Image.Image:
    """Decode bytes, a path or a binary file object into an RGB ``PIL.Image``.

    EXIF orientation is applied, transparency is composited on white, animated images
    give their first frame. The format is recognised from the bytes, whatever the name, and only
    :data:`ACCEPTED_FORMATS` (JPEG, PNG, WebP, BMP, GIF) are decoded.

    Parameters
    ----------
    source : bytes, str, os.PathLike or binary file object
        The encoded image: its bytes (``bytearray`` and ``memoryview`` too), the path of an image file,
        or a file object opened in binary mode (read from its start when it can seek).

    Returns
    -------
    PIL.Image.Image
        Mode ``"RGB"``, ``W × H`` pixels as stored (after the EXIF rotation), a copy independent of
        ``source``.

    Raises
    ------
    ImageLoadError
        (a ``ValueError``, with a message meant for people) for anything that is not a decodable image:
        empty data, a missing file, a text-mode file object, an unrecognised format, truncated or corrupt data.
    ImageTooLargeError
        (an :class:`ImageLoadError`) for an image of more than :data:`MAX_IMAGE_PIXELS` pixels
        (64,000,000, about 8000 × 8000), or whose decode would take more than :data:`MAX_DECODE_BYTES`
        (:func:`decode_peak_bytes`), refused unread as protection against decompression bombs.
    """
    data, label = _read_bytes(source)
    if not data:
        raise ImageLoadError(f"{label} is empty (0 bytes). Choose an image file (JPEG, PNG, WebP, BMP or GIF).")
    try:
        # not closed: closing frees the decoded pixels, which are returned in place for an RGB image
        opened = Image.open(io.BytesIO(data), formats=ACCEPTED_FORMATS)  # no other decoder is tried
        if opened.width * opened.height > MAX_IMAGE_PIXELS:
            raise too_large_error(label, opened.width, opened.height)
        rotated = _declared_orientation(opened) not in (None, 1)
        peak = decode_peak_bytes(opened.width, opened.height, opened.mode, rotated=rotated)
        if peak > MAX_DECODE_BYTES:
            raise ImageTooLargeError(
                f"{label} is too large to decode: {opened.width:,} × {opened.height:,} pixels in mode "
                f"{opened.mode} take about {peak / 2**20:,.0f} MiB to decode, above the limit of "
                f"{MAX_DECODE_BYTES / 2**20:,.0f} MiB. Downscale it first (or save it without transparency).",
                opened.width,
                opened.height,
                MAX_DECODE_BYTES // max(decode_peak_bytes(1, 1, opened.mode, rotated=rotated), 1),
            )
        opened.seek(0)  # first frame of animations
        opened.load()
        ImageOps.exif_transpose(opened, in_place=True)
        return to_rgb(opened)
    except ImageLoadError:
        raise
    except Image.DecompressionBombError as exc:  # PIL's own, stricter refusal (above twice its limit)
        declared = declared_image(data)
        if declared is not None:
            raise too_large_error(label, *declared[:2]) from exc
        raise ImageTooLargeError(
            f"{label} is too large: above the limit of {MAX_IMAGE_PIXELS:,} pixels ({exc}). Downscale it first.",
            limit=MAX_IMAGE_PIXELS,
        ) from exc
    except UnidentifiedImageError as exc:
        raise ImageLoadError(
            f"{label} is not an image we can read ({exc.__class__.__name__}). Use JPEG, PNG, WebP, BMP or GIF."
        ) from exc
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise ImageLoadError(f"{label} looks truncated or corrupt and cannot be decoded: {exc}.") from exc
