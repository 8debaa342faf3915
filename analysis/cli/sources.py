"""What ``--images`` names: a folder (searched recursively), a zip archive, or a glob pattern,
resolved once into a sorted list of named images, so every rank of a distributed run sees the
same list and takes its own share of it."""

from __future__ import annotations

import glob
from dataclasses import dataclass
from pathlib import Path

from ..base.archives import IMAGE_SUFFIXES, ArchiveLimits, read_image_archive
from ..base.errors import AnalysisError

__all__ = ["ImageSource", "CLI_ARCHIVE_LIMITS", "resolve_images"]

#: a zip is read into memory: beyond this, unpack it into a folder (read one image at a time)
CLI_ARCHIVE_LIMITS = ArchiveLimits(
    max_entries=1_000_000, max_entry_bytes=100_000_000, max_total_bytes=4_000_000_000, max_ratio=100.0
)


@dataclass(frozen=True)
class ImageSource:
    """The images ``--images`` names, resolved once (:func:`resolve_images`), sorted by name.

    Attributes
    ----------
    description : str
        What was named, for messages: ``"folder …"``, ``"archive …"``, ``"file …"`` or ``"pattern …"``
        (with ``"(rank r of w)"`` for a shard).
    names : tuple of str
        One per image: paths, or ``archive.zip/entry``.
    items : tuple
        What :func:`~analysis.dataset_attention_distance` reads, one per image: paths
        (``pathlib.Path``), or the archive entries' bytes.
    problems : tuple of str, default ()
        Entries left out before decoding (e.g. too large inside the archive), as ``"name: reason"``.
    """

    description: str
    names: tuple[str, ...]
    items: tuple
    problems: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.items)

    def shard(self, rank: int, world: int) -> ImageSource:
        """Every ``world``-th image from ``rank``: balanced to one image, each image once."""
        return ImageSource(
            f"{self.description} (rank {rank} of {world})",
            self.names[rank::world],
            self.items[rank::world],
            self.problems if rank == 0 else (),
        )


def resolve_images(text: str) -> ImageSource:
    """A folder, a ``.zip`` or a glob pattern -> its images, sorted by name.

    Parameters
    ----------
    text : str
        A folder (searched recursively for image files), a ``.zip`` archive (read into memory within
        :data:`CLI_ARCHIVE_LIMITS`), one image file, or a glob pattern (``**`` recursive); ``~`` is
        expanded.

    Returns
    -------
    ImageSource
        The images, with their names and what was left out of an archive.

    Raises
    ------
    AnalysisError
        Nothing matches (a folder or archive without images, a pattern matching none, a path that
        does not exist), with what to do.
    ArchiveError
        The ``.zip`` is unreadable, unsafe or over :data:`CLI_ARCHIVE_LIMITS`.
    """
    path = Path(text).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise AnalysisError(f"{text}: no images in this folder or below it ({', '.join(IMAGE_SUFFIXES)}).")
        return ImageSource(f"folder {text}", tuple(str(p) for p in files), tuple(files))
    if path.is_file() and path.suffix.lower() == ".zip":
        archive = read_image_archive(path.read_bytes(), label=path.name, limits=CLI_ARCHIVE_LIMITS)
        if not archive.images:
            raise AnalysisError(f"{text}: the archive holds no images ({', '.join(IMAGE_SUFFIXES)}).")
        return ImageSource(
            f"archive {text}",
            tuple(f"{path.name}/{name}" for name, _ in archive.images),
            tuple(data for _, data in archive.images),
            tuple(archive.skipped),
        )
    if path.is_file():
        return ImageSource(f"file {text}", (str(path),), (path,))
    matches = sorted(Path(p) for p in glob.glob(str(path), recursive=True))
    files = [p for p in matches if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]
    if not files:
        if any(ch in text for ch in "*?["):
            raise AnalysisError(f"{text}: the pattern matches no images ({', '.join(IMAGE_SUFFIXES)}).")
        raise AnalysisError(f"{text}: no such folder, zip archive, image or glob pattern.")
    return ImageSource(f"pattern {text}", tuple(str(p) for p in files), tuple(files))
