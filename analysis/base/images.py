"""Decode user images safely into RGB."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import BinaryIO

from PIL import Image, ImageOps, UnidentifiedImageError

from .errors import ImageLoadError, ImageTooLargeError

__all__ = ["load_image", "to_rgb", "MAX_IMAGE_PIXELS", "ACCEPTED_FORMATS", "too_large_error"]

# The formats an image is decoded as, recognised from its bytes whatever its name: PIL's other decoders
# (TIFF, EPS through Ghostscript, PSD, ...) are never tried on what a visitor uploads.
ACCEPTED_FORMATS = ("JPEG", "PNG", "WEBP", "BMP", "GIF")
MAX_IMAGE_PIXELS = 64_000_000  # about 8000 x 8000; larger images are refused (decompression bombs)


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


def _declared_size(data: bytes) -> tuple[int, int] | None:
    """The size an image file declares in its header, read without PIL's decompression-bomb
    check (which refuses very large images before saying how large): the first registered
    format of :data:`ACCEPTED_FORMATS` that accepts the data opens it lazily, no pixel is decoded.
    ``None`` if none does."""
    Image.init()
    prefix = data[:16]
    for name in ACCEPTED_FORMATS:
        factory, accept = Image.OPEN[name]
        accepted = accept(prefix) if accept else True  # as PIL decides (a str: a warning, not a match)
        if isinstance(accepted, str) or not accepted:
            continue
        try:
            with factory(io.BytesIO(data), "") as header:
                return header.size
        except Exception:  # noqa: BLE001 - not this format: try the next
            continue
    return None


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
    if image.mode in ("RGBA", "LA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
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
        (64,000,000, about 8000 × 8000), refused unread as protection against decompression bombs.
    """
    data, label = _read_bytes(source)
    if not data:
        raise ImageLoadError(f"{label} is empty (0 bytes). Choose an image file (JPEG, PNG, WebP, BMP or GIF).")
    try:
        with Image.open(io.BytesIO(data), formats=ACCEPTED_FORMATS) as opened:  # no other decoder is tried
            if opened.width * opened.height > MAX_IMAGE_PIXELS:
                raise too_large_error(label, opened.width, opened.height)
            opened.seek(0)  # first frame of animations
            opened.load()
            image = ImageOps.exif_transpose(opened) or opened
            return to_rgb(image).copy()
    except ImageLoadError:
        raise
    except Image.DecompressionBombError as exc:  # PIL's own, stricter refusal (above twice its limit)
        size = _declared_size(data)
        if size is not None:
            raise too_large_error(label, *size) from exc
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
