"""Random weights that are the same on every load.

``load_vit(name, pretrained=False)`` (the app's and the command line's ``random:<name>``),
``load_cnn(..., pretrained=False)`` and ``load_clip("hf:…", pretrained=False)`` build their
model under :func:`seeded_random_weights`: torch's CPU random state is forked, seeded with
:data:`RANDOM_WEIGHTS_SEED` for the build and restored afterwards. So a random-weight model is
a fixed baseline: the app, a notebook and ``python -m analysis`` see the same weights, a model
loaded again after a cache eviction is the one whose results were cached, and the caller's own
random stream is untouched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["RANDOM_WEIGHTS_SEED", "seeded_random_weights"]

#: the seed of every random-weight build
RANDOM_WEIGHTS_SEED = 0


@contextlib.contextmanager
def seeded_random_weights(seed: int = RANDOM_WEIGHTS_SEED, *, enabled: bool = True) -> Iterator[None]:
    """Build under ``torch.manual_seed(seed)``, restoring the caller's CPU random state after
    (models are initialised on the CPU).

    Parameters
    ----------
    seed : int, default RANDOM_WEIGHTS_SEED
        The seed of the build (:data:`RANDOM_WEIGHTS_SEED`, 0).
    enabled : bool, default True
        ``False``: do nothing (pretrained weights).

    Yields
    ------
    None
        Control to the ``with`` block that builds the model.
    """
    if not enabled:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield
