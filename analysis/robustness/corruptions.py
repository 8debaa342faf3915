"""Natural corruptions at graded severities, ImageNet-C style (Hendrycks & Dietterich 2019, "Benchmarking
Neural Network Robustness to Common Corruptions and Perturbations"), as Naseer et al. 2021 use them to
compare ViTs with CNNs.

The corruptions are the ``imagecorruptions`` package's own (Michaelis et al. 2019, the ImageNet-C code
packaged for any image size): :func:`corrupt_image` calls ``imagecorruptions.corrupt(image,
corruption_name=name, severity=s)`` for ``s`` in 1–5; severity 0 is the clean image. The package is an
optional extra: ``pip install "vit-explorer[corruptions]"``.

Where the corruption is applied (``protocol``, :func:`model_corruption`):

* ``"imagenet-c"`` (the default): to the model's own input, its resized and centre-cropped image at its
  input size (:meth:`~analysis.model.loading.loaded.LoadedModel.model_input_image`), then only
  normalised, as ImageNet-C was made (the corruptions' severities are calibrated on 224×224 crops);
* ``"native"``: to the image at its own size, then through the model's preprocessing (a blur or noise
  then shrinks or grows with the resize).

Scores:

* accuracy against severity, per model and corruption (:func:`corruption_curve`);
* the corruption error of a model relative to a baseline, ``CE_c = Σ_{s=1..5} err_{s,c}(model) /
  Σ_{s=1..5} err_{s,c}(baseline)``, and ``mCE = mean_c CE_c`` (Hendrycks & Dietterich 2019, Section 3).
  The paper's baseline is AlexNet; here it is the comparison CNN (:func:`corruption_errors`), so an
  ``mCE`` below 1 reads "fewer corruption errors than the CNN".
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sys
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image

from ..base.errors import AnalysisError
from ..base.progress import Progress, tell
from ..model.loading.loaded import LoadedModel

__all__ = [
    "CorruptionError",
    "CorruptionsUnavailableError",
    "FAST_CORRUPTIONS",
    "SEVERITIES",
    "corruption_names",
    "corrupt_image",
    "model_corruption",
    "PROTOCOLS",
    "CorruptionCurve",
    "corruption_curve",
    "corruption_errors",
]

#: where a corruption is applied: the model's input crop (ImageNet-C's rule) or the image at its own size
PROTOCOLS = ("imagenet-c", "native")
#: severity 0 (clean) and the package's five graded severities
SEVERITIES = (0, 1, 2, 3, 4, 5)
#: corruptions that take milliseconds on a 224×224 image (glass blur and a few others take seconds)
FAST_CORRUPTIONS = (
    "gaussian_noise",
    "shot_noise",
    "impulse_noise",
    "defocus_blur",
    "motion_blur",
    "contrast",
    "pixelate",
    "jpeg_compression",
)
INSTALL = 'pip install "vit-explorer[corruptions]"'


class CorruptionError(AnalysisError):
    """A corruption's arguments are out of range (severity outside 0–5, an unknown name) or the package's
    corruption fails with the installed libraries."""


class CorruptionsUnavailableError(CorruptionError):
    """The optional ``imagecorruptions`` package is not installed."""


def _resource_filename(module_name: str, path: str) -> str:
    """``pkg_resources.resource_filename`` for a module's data file (the only call the package makes)."""
    module_file = sys.modules[module_name].__file__
    assert module_file is not None  # imagecorruptions is a package on disk, not a namespace
    return os.path.normpath(os.path.join(os.path.dirname(module_file), path))


@functools.cache
def _package():
    """The ``imagecorruptions`` module. Its 1.1.2 imports ``pkg_resources`` for one function, which
    setuptools ≥ 81 no longer ships: a stand-in with that function is offered during the import only."""
    if importlib.util.find_spec("imagecorruptions") is None:
        raise CorruptionsUnavailableError(
            f"Natural corruptions need the optional imagecorruptions package: {INSTALL} "
            "(or pip install imagecorruptions)."
        )
    stand_in = None
    if "pkg_resources" not in sys.modules and importlib.util.find_spec("pkg_resources") is None:
        stand_in = types.ModuleType("pkg_resources")
        stand_in.resource_filename = _resource_filename
        sys.modules["pkg_resources"] = stand_in
    try:
        import imagecorruptions  # type: ignore[import-untyped]  # no py.typed marker, no stubs
    finally:
        if stand_in is not None and sys.modules.get("pkg_resources") is stand_in:
            del sys.modules["pkg_resources"]
    return imagecorruptions


def corruption_names() -> tuple[str, ...]:
    """The package's corruptions (``get_corruption_names("all")``: the 15 of ImageNet-C and 4 extra).

    Returns
    -------
    tuple of str
        The 19 corruption names, in the package's order.

    Raises
    ------
    CorruptionsUnavailableError
        The optional ``imagecorruptions`` package is not installed.
    """
    return tuple(_package().get_corruption_names("all"))


def _check(name: str, severity: int) -> None:
    if int(severity) != severity or not 0 <= int(severity) <= 5:
        raise CorruptionError(f"severity={severity!r}: ImageNet-C severities are 1–5, and 0 is the clean image.")
    names = corruption_names()
    if name not in names:
        raise CorruptionError(f"Unknown corruption {name!r}: choose one of {', '.join(names)}.")


def corrupt_image(image, name: str, severity: int, *, seed: int | None = None) -> np.ndarray:
    """``image`` corrupted by the package's ``corrupt(image, corruption_name=name, severity=severity)``.

    The package's random corruptions (noise, snow, spatter, …) draw from NumPy's global generator:
    with ``seed``, that generator is seeded with it for the call and restored afterwards, so the
    result is reproducible and the caller's random stream is left as it was. ``impulse_noise`` draws
    through scikit-image without a generator (operating-system entropy, whatever NumPy's seed): with
    ``seed`` it is drawn from ``numpy.random.default_rng(seed)`` instead, the package's rule otherwise.

    Parameters
    ----------
    image : PIL.Image.Image or numpy.ndarray
        A PIL image (converted to RGB) or an ``(H, W, 3)`` uint8 array.
    name : str
        One of :func:`corruption_names`.
    severity : int
        1–5; 0 returns a copy of the image unchanged.
    seed : int or None, default None
        Seed of the random corruptions, as above; ``None``, the package's own randomness.

    Returns
    -------
    numpy.ndarray
        ``(H, W, 3)`` uint8.

    Raises
    ------
    CorruptionsUnavailableError
        The optional ``imagecorruptions`` package is not installed (also for ``severity=0``: the
        name is checked against it).
    CorruptionError
        ``severity`` outside 0–5 or not whole; an unknown ``name``; the package's corruption fails
        with the installed libraries.
    """
    _check(name, severity)
    array = np.asarray(image.convert("RGB") if isinstance(image, Image.Image) else image, dtype=np.uint8)
    if severity == 0:
        return array.copy()
    corrupt = _package().corrupt
    if name == "impulse_noise" and seed is not None:
        return _seeded_impulse_noise(array, severity, seed)
    state = np.random.get_state() if seed is not None else None
    try:
        if seed is not None:
            np.random.seed(int(seed))
        out = corrupt(array, corruption_name=name, severity=int(severity))
    except Exception as exc:  # noqa: BLE001 - the package's own failure, named with its cause
        raise CorruptionError(
            f"imagecorruptions' {name} fails with the installed libraries ({type(exc).__name__}: "
            f"{exc}): choose another corruption."
        ) from exc
    finally:
        if state is not None:
            np.random.set_state(state)
    return np.asarray(out, dtype=np.uint8)


# ImageNet-C's salt-and-pepper amounts per severity (Hendrycks & Dietterich 2019; imagecorruptions' impulse_noise).
IMPULSE_AMOUNTS = (0.03, 0.06, 0.09, 0.17, 0.27)


def _seeded_impulse_noise(array: np.ndarray, severity: int, seed: int) -> np.ndarray:
    """The package's ``impulse_noise``, ``clip(random_noise(x / 255, "s&p", amount=c), 0, 1)·255`` as uint8,
    drawn from a generator seeded with ``seed``: the package calls scikit-image's ``random_noise``
    without one, which then draws from the operating system's entropy whatever NumPy's seed is."""
    from skimage.util import random_noise

    noisy = random_noise(
        array / 255.0, mode="s&p", amount=IMPULSE_AMOUNTS[severity - 1], rng=np.random.default_rng(int(seed))
    )
    return np.uint8(np.clip(noisy, 0, 1) * 255)


def model_corruption(
    model: LoadedModel, image, name: str, severity: int, *, seed: int | None = None, protocol: str = "imagenet-c"
) -> np.ndarray:
    """The corrupted image as ``model`` is fed it under ``protocol`` (:data:`PROTOCOLS`, the module docstring).

    Parameters
    ----------
    model : LoadedModel
        The model whose input crop ``"imagenet-c"`` corrupts (a ViT or a CNN).
    image : PIL.Image.Image or numpy.ndarray
        A PIL image or an ``(H, W, 3)`` uint8 array.
    name : str
        One of :func:`corruption_names`.
    severity : int
        0 (clean) to 5.
    seed : int or None, default None
        As :func:`corrupt_image`'s.
    protocol : str, default "imagenet-c"
        ``"imagenet-c"`` corrupts ``model.model_input_image(image)`` (``spec.img_size``; pass the
        result to ``model.top1(..., cropped=True)``); ``"native"`` the image itself (pass it to
        ``model.top1``).

    Returns
    -------
    numpy.ndarray
        ``(H, W, 3)`` uint8: ``spec.img_size`` under ``"imagenet-c"``, the image's own size under
        ``"native"``.

    Raises
    ------
    CorruptionError
        An unknown ``protocol``; as :func:`corrupt_image`.
    CorruptionsUnavailableError
        The optional ``imagecorruptions`` package is not installed.
    """
    _check_protocol(protocol)
    picture = image if isinstance(image, Image.Image) else Image.fromarray(np.asarray(image, dtype=np.uint8))
    source = model.model_input_image(picture) if protocol == "imagenet-c" else picture
    return corrupt_image(source, name, severity, seed=seed)


def _check_protocol(protocol: str) -> None:
    if protocol not in PROTOCOLS:
        raise CorruptionError(f"Unknown protocol {protocol!r}: one of {', '.join(PROTOCOLS)}.")


@dataclass(frozen=True)
class CorruptionCurve:
    """Top-1 accuracy per model, corruption and severity (:func:`corruption_curve`).

    Attributes
    ----------
    corruptions : tuple of str
        The ``C`` corruptions, rows of each accuracy table.
    severities : tuple of int
        The ``S`` severities, its columns.
    accuracy : dict of str to numpy.ndarray
        Model name -> ``(C, S)`` float64 top-1 accuracy; a severity-0 column is the clean accuracy.
    images : int
        How many images were scored.
    scored_against : str, default "labels"
        ``"labels"``, or ``"clean prediction"`` when no labels were given (each model's own clean
        prediction is its target).
    protocol : str, default "imagenet-c"
        Where the corruptions were applied (:data:`PROTOCOLS`).
    """

    corruptions: tuple[str, ...]
    severities: tuple[int, ...]
    accuracy: dict[str, np.ndarray]
    images: int
    scored_against: str = "labels"
    protocol: str = "imagenet-c"


def corruption_curve(
    models: Mapping[str, LoadedModel],
    images: Sequence,
    labels: Sequence[int] | None = None,
    *,
    corruptions: Sequence[str] = FAST_CORRUPTIONS,
    severities: Sequence[int] = SEVERITIES,
    seed: int = 0,
    image_seeds: Sequence[int] | None = None,
    progress: Progress | None = None,
    protocol: str = "imagenet-c",
) -> CorruptionCurve:
    """Accuracy against severity for each model (``{name: loaded model}``) on ``images`` (PIL or uint8).

    ``protocol="imagenet-c"``: each image is corrupted once per (corruption, severity) as each model's
    input crop (models with the same crop share it), then only normalised; ``"native"``: at its own size,
    and every model sees that same corrupted image through its own preprocessing
    (:func:`model_corruption`).

    Parameters
    ----------
    models : Mapping of str to LoadedModel
        ``{name: loaded model}``, ViTs and CNNs alike.
    images : Sequence
        PIL images or ``(H, W, 3)`` uint8 arrays; at least one.
    labels : Sequence of int or None, default None
        The true classes (indices in every model's classes), one per image; ``None``, each model is
        scored against its own clean prediction.
    corruptions : Sequence of str, default FAST_CORRUPTIONS
        Names from :func:`corruption_names`.
    severities : Sequence of int, default SEVERITIES
        Each in 0–5 (0, the clean image).
    seed : int, default 0
        Image ``i``'s random corruptions use seed ``seed + i``, the same for every corruption and severity.
    image_seeds : Sequence of int or None, default None
        One seed per image instead of ``seed + i`` (a shard of a larger set passes the whole set's seeds).
    progress : Progress or None, default None
        Called as ``progress(done, total)`` after each (corruption, severity) (:mod:`analysis.base.progress`).
    protocol : str, default "imagenet-c"
        Where the corruptions are applied (:data:`PROTOCOLS`).

    Returns
    -------
    CorruptionCurve
        ``accuracy[name]`` ``(len(corruptions), len(severities))`` per model.

    Raises
    ------
    CorruptionError
        No images; labels given but not one per image; ``image_seeds`` not one per image; an unknown
        ``protocol``, corruption or severity; a corruption that fails with the installed libraries.
    CorruptionsUnavailableError
        The optional ``imagecorruptions`` package is not installed.
    """
    if not images or (labels is not None and len(labels) != len(images)):
        raise CorruptionError(
            f"{len(images)} images and {0 if labels is None else len(labels)} labels: give at "
            "least one image and, if any labels, one per image."
        )
    _check_protocol(protocol)
    for name in corruptions:
        for severity in severities:
            _check(name, severity)
    seeds = list(image_seeds) if image_seeds is not None else [seed + i for i in range(len(images))]
    if len(seeds) != len(images):
        raise CorruptionError(f"{len(seeds)} image seeds for {len(images)} images: give one seed per image.")
    clean = [np.asarray(i.convert("RGB") if isinstance(i, Image.Image) else i, dtype=np.uint8) for i in images]
    cropped = protocol == "imagenet-c"
    inputs: dict[bytes, list[np.ndarray]] = {}  # the clean images each group of models corrupts, by content
    group_of: dict[str, bytes] = {}
    for m, model in models.items():
        own = (
            [np.asarray(model.model_input_image(Image.fromarray(i)), dtype=np.uint8) for i in clean]
            if cropped
            else clean
        )
        key = hashlib.sha1(b"".join(np.ascontiguousarray(i).tobytes() for i in own)).digest() if cropped else b""
        inputs.setdefault(key, own)
        group_of[m] = key
    targets = {
        m: np.asarray(labels) if labels is not None else model.top1(inputs[group_of[m]], cropped=cropped)
        for m, model in models.items()
    }
    accuracy = {m: np.zeros((len(corruptions), len(severities))) for m in models}
    total, done = len(corruptions) * len(severities), 0
    for c, name in enumerate(corruptions):
        for s, severity in enumerate(severities):
            corrupted = {
                key: [corrupt_image(image, name, severity, seed=seed) for image, seed in zip(own, seeds)]
                for key, own in inputs.items()
            }
            for m, model in models.items():
                predicted = model.top1(corrupted[group_of[m]], cropped=cropped)
                accuracy[m][c, s] = float((predicted == targets[m]).mean())
            done += 1
            tell(progress, done, total)
    return CorruptionCurve(
        tuple(corruptions),
        tuple(int(s) for s in severities),
        accuracy,
        len(images),
        "labels" if labels is not None else "clean prediction",
        protocol,
    )


def corruption_errors(curve: CorruptionCurve, baseline: str) -> dict[str, tuple[np.ndarray, float]]:
    """Corruption errors relative to ``baseline``:
    ``CE_c = Σ_{s≥1} (1 − acc_{s,c}) / Σ_{s≥1} (1 − acc^{baseline}_{s,c})``, ``mCE`` their mean
    (Hendrycks & Dietterich 2019; severity 0, the clean image, is left out). The baseline's own CE is 1.
    A corruption the baseline never gets wrong has no CE (NaN), left out of the mean.

    Parameters
    ----------
    curve : CorruptionCurve
        A :func:`corruption_curve` result with at least one severity in 1–5.
    baseline : str
        One of ``curve``'s models (the comparison CNN, in place of the paper's AlexNet).

    Returns
    -------
    dict of str to tuple of (numpy.ndarray, float)
        ``{model: (CE, mCE)}`` for every model of ``curve``: ``CE`` ``(len(corruptions),)`` float64
        (NaN where the baseline makes no error), ``mCE`` a float (NaN when no CE is finite).

    Raises
    ------
    CorruptionError
        ``baseline`` is not a model of ``curve``; the curve has no severity 1–5.
    """
    if baseline not in curve.accuracy:
        raise CorruptionError(f"No baseline {baseline!r} in the curve: choose one of {', '.join(curve.accuracy)}.")
    graded = np.asarray(curve.severities) >= 1
    if not graded.any():
        raise CorruptionError("The curve has no severity 1–5: the corruption error sums over severities 1–5.")
    reference = (1.0 - curve.accuracy[baseline][:, graded]).sum(1)  # (corruptions,)
    result = {}
    for name, accuracy in curve.accuracy.items():
        errors = (1.0 - accuracy[:, graded]).sum(1)
        with np.errstate(divide="ignore", invalid="ignore"):
            ce = np.where(reference > 0, errors / np.where(reference > 0, reference, 1.0), np.nan)
        result[name] = (ce, float(np.nanmean(ce)) if np.isfinite(ce).any() else float("nan"))
    return result
