"""Memory bounds of one app server shared by many sessions (documented in docs/app/index.md and
docs/deployment.md).

Least-recently-used entries are evicted beyond these counts, and models and captured passes beyond
the one byte budget they share.
"""

from __future__ import annotations

import os

__all__ = [
    "MAX_MODELS",
    "MAX_FORWARDS",
    "MEMORY_BUDGET_BYTES",
    "FLOAT16_RECORD_BYTES",
    "MAX_RESULTS",
    "MAX_DATASET_IMAGES",
    "MAX_ARCHIVE_BYTES",
    "MAX_VIEW_BYTES",
]


def _limit(name: str, default: int) -> int:
    """A positive integer from the environment, else ``default``."""
    try:
        return max(1, int(os.environ.get(name, default)))
    except ValueError:
        return default


MAX_MODELS = _limit("VIZAPP_MAX_MODELS", 4)  # loaded models kept (resources.memory_store)
MAX_FORWARDS = _limit("VIZAPP_MAX_FORWARDS", 8)  # captured forward passes (full attention records)
MEMORY_BUDGET_BYTES = _limit("VIZAPP_MEMORY_MB", 6144) * 2**20  # what models and passes hold together
FLOAT16_RECORD_BYTES = _limit("VIZAPP_FLOAT16_RECORD_MB", 1024) * 2**20  # larger records are kept in float16
MAX_RESULTS = _limit("VIZAPP_MAX_RESULTS", 64)  # small derived arrays per analysis
MAX_DATASET_IMAGES = 256  # images averaged over on the distance page
MAX_ARCHIVE_BYTES = 200_000_000  # decompressed images read from one uploaded zip
MAX_VIEW_BYTES = _limit("VIZAPP_VIEW_MB", 12) * 2**20  # the instant view's data: all layers, else the current one
