"""The Robustness page's cached computations: what only this page computes, beside it (the adversarial
patches). The shared ones (a model, the pasted patch on this image) are :mod:`vizapp.resources`'."""

from __future__ import annotations

import numpy as np
import streamlit as st

from vizapp import resources  # looked up at each call: a test may replace one
from vizapp.records import RecordStore

__all__ = ["PATCH_RESULTS", "stored_patch_curve", "compute_patch_curve"]

PATCH_RESULTS = 4  # adversarial-patch trainings kept (the least recently used is dropped first)


@st.cache_resource(show_spinner=False)
def _patch_results() -> RecordStore:
    """Adversarial-patch trainings so far, process-wide and locked (sessions share them): key -> dict."""
    return RecordStore(PATCH_RESULTS, 2**62, size=lambda value: 0)


def stored_patch_curve(key: tuple):
    """The patch curve of ``key`` (:func:`compute_patch_curve`'s arguments but ``progress``), if trained."""
    return _patch_results().peek(key)


def compute_patch_curve(
    model_keys: tuple[tuple, ...],
    shares: tuple[float, ...],
    train_scenes: int,
    held_out_scenes: int,
    steps: int,
    batch_size: int,
    target: int | None,
    seed: int,
    progress=None,
) -> dict:
    """Each model's own universal patch per share, trained for ``steps`` steps of ``batch_size`` scenes on
    ``train_scenes`` demo scenes (stream ``PATCH_TRAIN_SEED``) and scored with the noise control on
    ``held_out_scenes`` held-out ones (stream ``seed``, checked disjoint:
    :func:`analysis.robustness.demo_patch_scenes`; :func:`analysis.robustness.patch_size_curve`), untargeted
    or towards class ``target``, and the transfer matrix of the largest share's patches
    (:func:`analysis.robustness.patch_transfer_matrix`). Kept for later runs and sessions.
    ``progress(done, total)``: the training's progress (of the session that trains)."""
    key = (model_keys, shares, train_scenes, held_out_scenes, steps, batch_size, target, seed)
    return _patch_results().get(
        key,
        lambda: _patch_curve(
            model_keys, shares, train_scenes, held_out_scenes, steps, batch_size, target, seed, progress
        ),
    )


def _patch_curve(model_keys, shares, train_scenes, held_out_scenes, steps, batch_size, target, seed, progress) -> dict:
    from analysis.robustness import demo_patch_scenes, patch_size_curve, patch_transfer_matrix

    models = {str(i): resources.loaded_model(key) for i, key in enumerate(model_keys)}
    scenes = demo_patch_scenes(held_out_scenes, seed, train_scenes=train_scenes)
    held, held_labels = scenes.held_out_images, scenes.held_out_labels
    curve = patch_size_curve(
        models, scenes.train_images, scenes.train_labels, shares=shares, eval_images=held, eval_labels=held_labels,
        target=target, steps=steps, batch_size=batch_size, seed=seed, progress=progress,
    )  # fmt: skip
    largest = {name: patches[-1] for name, patches in curve.patches.items()}
    sizes = {tuple(int(v) for v in model.spec.img_size) for model in models.values()}
    matrix = patch_transfer_matrix(models, largest, held, held_labels, seed=seed + 1)[1] if len(sizes) == 1 else None
    order = list(models)
    hits, noise_hits = curve.target_rate, curve.noise_target_rate  # None untargeted
    return {
        "accuracy": np.stack([curve.accuracy[n] for n in order]),  # (models, shares)
        "noise_accuracy": np.stack([curve.noise_accuracy[n] for n in order]),
        "fooling_rate": np.stack([curve.fooling_rate[n] for n in order]),
        "clean_accuracy": np.array([curve.clean_accuracy[n] for n in order]),
        # targeted: (models, shares) the share of patched held-out scenes predicted as the target; else None
        "target_rate": None if hits is None else np.stack([hits[n] for n in order]),
        "noise_target_rate": None if noise_hits is None else np.stack([noise_hits[n] for n in order]),
        "losses": np.array([[p.losses for p in curve.patches[n]] for n in order]),  # (models, shares, steps)
        "largest_patches": [largest[n].patch.numpy() for n in order],  # (C, s, s) each, in [0, 1]
        "transfer": matrix,  # (models, models) or None (input sizes differ)
    }
