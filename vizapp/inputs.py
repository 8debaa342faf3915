"""The app's input images: bundled samples, uploads, and zip archives of uploads.

An uploaded zip is read once per upload (keyed by Streamlit's file id) with the bounds of
:func:`analysis.read_image_archive`: entries, decompressed bytes, compression ratio and
entry names are all checked before anything is decompressed in full.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from analysis import ArchiveError, ArchiveLimits, load_image, read_image_archive
from analysis.base.assets import asset_path
from vizapp.limits import MAX_ARCHIVE_BYTES, MAX_DATASET_IMAGES, MAX_RESULTS
from vizapp.refs import ImageRef

__all__ = [
    "SAMPLES_DIR",
    "IMAGE_SUFFIXES",
    "sample_paths",
    "read_sample",
    "decode_image",
    "images_from_uploads",
    "image_set",
    "is_demo_scene",
]

SAMPLES_DIR = asset_path("samples")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif")
ARCHIVE_LIMITS = ArchiveLimits(max_entries=MAX_DATASET_IMAGES, max_total_bytes=MAX_ARCHIVE_BYTES)


def sample_paths() -> list[Path]:
    """The bundled sample images, demo scenes first."""
    if not SAMPLES_DIR.is_dir():
        return []
    files = [p for p in SAMPLES_DIR.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES]
    return sorted(files, key=lambda p: (not p.name.startswith("scene_"), p.name))


@st.cache_data(show_spinner=False, max_entries=MAX_RESULTS)
def read_sample(name: str) -> bytes:
    return (SAMPLES_DIR / name).read_bytes()


def is_demo_scene(image: ImageRef) -> bool:
    """Whether the image is one of the bundled synthetic demo scenes (same bytes as a
    ``scene_*`` sample), the kind of image the demo models were trained on."""
    return any(path.name.startswith("scene_") and read_sample(path.name) == image.data for path in sample_paths())


@st.cache_data(show_spinner=False, max_entries=MAX_RESULTS)
def decode_image(digest: str, _image_bytes: bytes) -> tuple[int, int]:
    """Decode once to validate; returns (width, height). Raises ImageLoadError."""
    image = load_image(_image_bytes)
    return image.size


@st.cache_resource(show_spinner="Reading the archive…", max_entries=4)
def _archive_images(file_id: str, name: str, _data: bytes) -> tuple[tuple[ImageRef, ...], tuple[str, ...]]:
    """The images of one uploaded zip (read once per upload, shared read-only), and problems."""
    try:
        archive = read_image_archive(_data, label=name, limits=ARCHIVE_LIMITS)
    except ArchiveError as exc:
        return (), (str(exc),)
    images = tuple(ImageRef.from_bytes(f"{name}/{entry}", content) for entry, content in archive.images)
    return images, archive.skipped


def images_from_uploads(files) -> tuple[list[ImageRef], list[str]]:
    """Images (and images inside .zip archives) from uploaded files; returns (images, problems)."""
    images: list[ImageRef] = []
    problems: list[str] = []
    for file in files or []:
        if file.name.lower().endswith(".zip"):
            archive_images, archive_problems = _archive_images(file.file_id, file.name, file.getvalue())
            images.extend(archive_images)
            problems.extend(archive_problems)
        else:
            images.append(ImageRef.from_bytes(file.name, file.getvalue()))
    if len(images) > MAX_DATASET_IMAGES:
        problems.append(f"Only the first {MAX_DATASET_IMAGES} of {len(images)} images are used.")
        images = images[:MAX_DATASET_IMAGES]
    return images, problems


def image_set(which: str, files_key: str, *, scenes: bool = True) -> tuple[list[ImageRef], list[str]]:
    """The images of a page's image-set choice, and the problems found: ``"mine"`` draws an
    uploader of images or .zip archives (widget key ``files_key``); anything else gives the
    bundled samples, without the synthetic demo scenes (``scene_*``, what the demo models were
    trained on) when ``scenes`` is False: the set for any other model is the bundled photos."""
    if which == "mine":
        files = st.file_uploader(
            "Images or a .zip of images",
            type=[s.lstrip(".") for s in IMAGE_SUFFIXES] + ["zip"],
            accept_multiple_files=True,
            key=files_key,
        )
        return images_from_uploads(files)
    return [ImageRef.from_bytes(p.name, read_sample(p.name)) for p in bundled_set(scenes=scenes)], []


def bundled_set(*, scenes: bool = True) -> list[Path]:
    """The bundled samples of an image set: every one, or (``scenes=False``, for any model but
    the demo models) the photos alone, without the synthetic ``scene_*`` images."""
    return [p for p in sample_paths() if scenes or not p.name.startswith("scene_")]
