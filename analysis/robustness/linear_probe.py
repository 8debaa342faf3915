"""Off-the-shelf tokens: a linear probe on each block's class token, accuracy against depth.

Naseer et al. 2021 ("Intriguing Properties of Vision Transformers", Section 3.5 and Figure 10) read
the class token of every block of a ViT as a feature, fit a linear classifier on it, and find the
accuracy rising with depth; concatenating the last few blocks' class tokens does better still.

Here the feature of block ``l`` is its output (the residual stream after the block,
``blocks.{l}.resid_post`` of :func:`analysis.engine.activations.run_with_cache`, read through
:func:`analysis.capture_tokens`): the class token when the model has one
(``spec.prefix_names``), else the mean over the patch tokens (a windowed model: over its stage
grid). The probe is **closed-form ridge regression on one-hot targets** (deterministic; no
optimiser): the features are standardised with the training split's mean and standard deviation,
then, with ``X`` the ``(n, D)`` standardised training features and ``Y`` the ``(n, K)`` one-hot
targets, both centred on their training means,

    W = (XᵀX + λ·I)⁻¹ XᵀY,      b = ȳ            (the bias is not penalised)

and an image is assigned ``argmax_k (x·W + b)_k``. The split into a training and a test part is a
seeded permutation; the two parts are disjoint, and the result says which images are in which.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..base.errors import AnalysisError
from ..base.images import load_image
from ..base.progress import Progress, tell, within
from ..model.loading.loaded import LoadedModel
from ..tokens import capture_tokens

__all__ = [
    "ProbeError",
    "ImageFolderSet",
    "LinearProbeCurve",
    "load_image_folder",
    "split_indices",
    "block_features",
    "RidgeProbe",
    "fit_ridge_probe",
    "probe_accuracy",
    "linear_probe_curve",
    "linear_probe_curves",
    "probe_curve",
    "folder_labels",
    "probe_feature",
]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif")


class ProbeError(AnalysisError):
    """A linear probe's input is unusable: a folder without class subfolders, too few images to split,
    a test share outside (0, 1), labels that do not match the images."""


@dataclass(frozen=True)
class ImageFolderSet:
    """A labelled image set read from a folder with one subfolder per class (:func:`load_image_folder`).

    Attributes
    ----------
    images : list of PIL.Image.Image
        The decoded RGB images, class by class (subfolders in sorted order, files sorted).
    labels : list of int
        The index of each image's class in ``class_names``.
    class_names : list of str
        The subfolder names, sorted.
    paths : list of pathlib.Path
        Each image's file.
    """

    images: list
    labels: list[int]
    class_names: list[str]
    paths: list[Path]


@dataclass(frozen=True)
class LinearProbeCurve:
    """Linear-probe accuracy by depth for one model.

    Attributes
    ----------
    layers : tuple of int
        Model layer index of each entry of ``accuracy``.
    accuracy : numpy.ndarray
        ``(len(layers),)`` float64 test accuracy of the probe on each block's token.
    concat_k : tuple of int
        The ``k`` of each entry of ``concat_accuracy`` (those of the request between 1 and the number
        of blocks).
    concat_accuracy : numpy.ndarray
        ``(len(concat_k),)`` float64 test accuracy on the last ``k`` blocks' tokens concatenated.
    model_accuracy : float or None
        The model's own top-1 accuracy on the test split (``None`` for a headless model or
        when its classes are not the labels'; pass ``model_labels=False`` to skip it).
    feature : str
        ``"class token"`` or ``"mean patch token"``.
    train_indices : numpy.ndarray
        Sorted int64 indices of the images that fitted the probe.
    test_indices : numpy.ndarray
        Sorted int64 indices of the images that scored it (disjoint from ``train_indices``).
    ridge : float
        The ridge penalty λ.
    """

    layers: tuple[int, ...]
    accuracy: np.ndarray
    concat_k: tuple[int, ...]
    concat_accuracy: np.ndarray
    model_accuracy: float | None
    feature: str
    train_indices: np.ndarray
    test_indices: np.ndarray
    ridge: float


def load_image_folder(folder: str | os.PathLike, *, max_per_class: int | None = None) -> ImageFolderSet:
    """The images of ``folder``'s class subfolders (``folder/<class>/<image>``), labelled by subfolder.

    Class subfolders are the non-hidden subfolders, sorted; images are the files ending in
    ``.png``, ``.jpg``, ``.jpeg``, ``.webp``, ``.bmp`` or ``.gif``, sorted.

    Parameters
    ----------
    folder : str or os.PathLike
        The root folder (``~`` expanded).
    max_per_class : int or None, default None
        Keep at most the first this many images of each class; ``None``, all.

    Returns
    -------
    ImageFolderSet
        The decoded images with their labels, class names and paths.

    Raises
    ------
    ProbeError
        The folder does not exist, has no class subfolders, or they hold no images.
    """
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise ProbeError(f"{root} is not a folder: give a folder with one subfolder of images per class.")
    classes = sorted(entry for entry in root.iterdir() if entry.is_dir() and not entry.name.startswith("."))
    if not classes:
        raise ProbeError(
            f"{root} has no class subfolders: put each class's images in a subfolder named after the "
            "class (folder/<class>/<image>.png)."
        )
    images, labels, paths = [], [], []
    for index, sub in enumerate(classes):
        files = sorted(p for p in sub.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        for path in files[:max_per_class]:
            images.append(load_image(path))
            labels.append(index)
            paths.append(path)
    if not images:
        raise ProbeError(f"The class subfolders of {root} hold no images ({', '.join(IMAGE_SUFFIXES)}).")
    return ImageFolderSet(images=images, labels=labels, class_names=[c.name for c in classes], paths=paths)


def split_indices(count: int, test_share: float = 0.5, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A seeded split of ``range(count)`` into a training and a test part.

    Parameters
    ----------
    count : int
        How many images.
    test_share : float, default 0.5
        Share of the images in the test part, strictly between 0 and 1.
    seed : int, default 0
        Seed of the permutation that draws the test part.

    Returns
    -------
    tuple of (numpy.ndarray, numpy.ndarray)
        ``(train, test)``: disjoint sorted int64 index arrays covering ``range(count)``, the test part
        ``round(test_share · count)`` images.

    Raises
    ------
    ProbeError
        A test share outside (0, 1), or fewer than one image on either side.
    """
    if not 0 < float(test_share) < 1:
        raise ProbeError(f"test_share={test_share!r}: the test part is a share of the images strictly between 0 and 1.")
    tested = int(round(float(test_share) * count))
    if tested < 1 or tested >= count:
        raise ProbeError(f"{count} images cannot be split {1 - test_share:.0%} / {test_share:.0%}: give more images.")
    order = np.random.default_rng(int(seed)).permutation(count)
    return np.sort(order[tested:]), np.sort(order[:tested])


def probe_feature(spec) -> str:
    """The token :func:`block_features` reads for a model of ``spec``.

    Parameters
    ----------
    spec : ViTSpec
        The model's geometry.

    Returns
    -------
    str
        ``"class token"``, or ``"mean patch token"`` (no class token, or a windowed model's stage grid).
    """
    return "class token" if spec.has_class_token else "mean patch token"


def block_features(
    model,
    images: Sequence,
    *,
    layers: Sequence[int] | None = None,
    batch_size: int = 64,
    progress: Progress | None = None,
) -> tuple[tuple[int, ...], list[torch.Tensor], torch.Tensor]:
    """Each block's output token of every image, and the model's logits, read in batches.

    The feature of block ``l`` is its output's class token when the model has one, else the mean
    patch token (a windowed model: the mean over its stage grid).

    Parameters
    ----------
    model : LoadedViT
        A ViT or a windowed model (Swin, SAM); a model without blocks (a CNN) is refused.
    images : Sequence
        ``N`` PIL images, each fed through ``model.preprocess``.
    layers : Sequence of int or None, default None
        Model layer indices (negative count from the end), in the order asked; ``None``, all, increasing.
    batch_size : int, default 64
        Images per forward pass.
    progress : Progress or None, default None
        Called as ``progress(done, total)`` (images read, ``N``) after each batch.

    Returns
    -------
    tuple of (tuple of int, list of torch.Tensor, torch.Tensor)
        ``(layers, features, logits)``: the layers read; per layer ``(N, D_l)`` float32 features on
        the CPU; the model's ``(N, outputs)`` float32 logits (``(N, 0)`` for a headless model).

    Raises
    ------
    ProbeError
        No images; a model without transformer blocks.
    AnalysisError
        A layer the model does not have.
    """
    if not len(images):
        raise ProbeError("No images: give at least one image per class.")
    if int(model.spec.num_layers) < 1:
        raise ProbeError(
            f"{getattr(model, 'name', 'This model')} has no transformer blocks (a CNN?): the probe reads "
            "each block's tokens; give a ViT or a Swin."
        )
    per_layer: list[list[torch.Tensor]] = []
    logits: list[torch.Tensor] = []
    chosen: tuple[int, ...] = ()
    for start in range(0, len(images), int(batch_size)):
        pixels = torch.cat([model.preprocess(image) for image in images[start : start + int(batch_size)]])
        record = capture_tokens(model, pixels, layers=layers)
        chosen = tuple(record.layers)
        if not per_layer:
            per_layer = [[] for _ in chosen]
        for position, layer in enumerate(chosen):
            tokens = record.layer_tokens(layer) if hasattr(record, "layer_tokens") else record.tokens[position]
            per_layer[position].append(_pooled(tokens, record.spec))
        with torch.no_grad():
            out = model.model(pixels.to(model.device))
        logits.append(
            out.float().cpu() if isinstance(out, torch.Tensor) and out.ndim == 2 else torch.zeros((pixels.shape[0], 0))
        )
        tell(progress, start + pixels.shape[0], len(images))
    return chosen, [torch.cat(parts).float() for parts in per_layer], torch.cat(logits)


def _pooled(tokens: torch.Tensor, spec) -> torch.Tensor:
    """``(B, T, D)`` block output -> ``(B, D)``: the class token, or the mean of the patch tokens
    (a windowed model's ``(B, gh·gw, C)`` stage tokens have no prefix: the mean of every cell)."""
    if spec.has_class_token:
        return tokens[:, spec.prefix_names.index("class")].float()
    return tokens[:, spec.num_prefix_tokens :].float().mean(dim=1)


@dataclass(frozen=True)
class RidgeProbe:
    """A fitted closed-form ridge probe (:func:`fit_ridge_probe`): ``scores = ((x − mean) / std) · weight + bias``,
    the predicted class ``classes[argmax scores]`` (:meth:`predict`).

    Attributes
    ----------
    mean : torch.Tensor
        ``(D,)`` float64, the training features' mean.
    std : torch.Tensor
        ``(D,)`` float64, their standard deviation (population, at least ``1e-8``).
    weight : torch.Tensor
        ``(D, K)`` float64, ``W``.
    bias : torch.Tensor
        ``(K,)`` float64, the one-hot targets' mean.
    classes : torch.Tensor
        ``(K,)`` int64, the distinct training labels, sorted.
    """

    mean: torch.Tensor
    std: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor
    classes: torch.Tensor

    def predict(self, features: torch.Tensor) -> torch.Tensor:
        """The class (from ``classes``) of each row of ``features`` ``(n, D)``."""
        scores = ((features.double() - self.mean) / self.std) @ self.weight + self.bias
        return self.classes[scores.argmax(-1)]


def fit_ridge_probe(features: torch.Tensor, labels, *, ridge: float = 1.0) -> RidgeProbe:
    """Closed-form ridge regression on one-hot targets, in float64 (see the module docstring):
    ``W = (XᵀX + λI)⁻¹ XᵀY`` on standardised, centred features ``X`` ``(n, D)`` and centred one-hot
    targets ``Y`` ``(n, K)``, the bias the targets' mean. ``K`` runs over the distinct labels.

    Parameters
    ----------
    features : torch.Tensor
        ``(n, D)`` training features (any real dtype; array-likes are accepted).
    labels : array-like of int
        ``(n,)`` the class of each row.
    ridge : float, default 1.0
        The penalty λ, 0 or more.

    Returns
    -------
    RidgeProbe
        The fitted probe, in float64.

    Raises
    ------
    ProbeError
        A negative penalty, features that are not 2-D, or a label count that does not match the rows.
    """
    if not float(ridge) >= 0:
        raise ProbeError(f"ridge={ridge!r}: the penalty λ is 0 or more.")
    x = torch.as_tensor(features).double()
    y = torch.as_tensor(list(labels) if not isinstance(labels, torch.Tensor) else labels).long().reshape(-1)
    if x.ndim != 2 or y.numel() != x.shape[0]:
        raise ProbeError(f"{y.numel()} labels for {tuple(x.shape)} features: give one label per row.")
    classes, index = torch.unique(y, return_inverse=True)
    mean = x.mean(0)
    std = x.std(0, unbiased=False).clamp_min(1e-8)
    standard = (x - mean) / std  # (n, D)
    onehot = torch.nn.functional.one_hot(index, len(classes)).double()  # (n, K)
    target_mean = onehot.mean(0)
    gram = standard.T @ standard + float(ridge) * torch.eye(x.shape[1], dtype=torch.float64)  # (D, D)
    weight = torch.linalg.solve(gram, standard.T @ (onehot - target_mean))  # (D, K)
    return RidgeProbe(mean=mean, std=std, weight=weight, bias=target_mean, classes=classes)


def probe_accuracy(
    train_features: torch.Tensor, train_labels, test_features: torch.Tensor, test_labels, *, ridge: float = 1.0
) -> float:
    """Test accuracy of a ridge probe (:func:`fit_ridge_probe`) fitted on the training features.

    Parameters
    ----------
    train_features : torch.Tensor
        ``(n, D)`` features the probe is fitted on.
    train_labels : array-like of int
        ``(n,)`` their classes.
    test_features : torch.Tensor
        ``(m, D)`` features it is scored on.
    test_labels : array-like of int
        ``(m,)`` their classes.
    ridge : float, default 1.0
        The penalty λ, 0 or more.

    Returns
    -------
    float
        The share of test rows predicted right, in ``[0, 1]``.

    Raises
    ------
    ProbeError
        As :func:`fit_ridge_probe`.
    """
    probe = fit_ridge_probe(train_features, train_labels, ridge=ridge)
    truth = torch.as_tensor(list(test_labels)).long()
    return float((probe.predict(torch.as_tensor(test_features)) == truth).double().mean())


def folder_labels(model, folder: ImageFolderSet, model_labels: bool = True) -> tuple[list, list[int], bool]:
    """The images and labels of a folder, labelled in the model's own classes where they can be.

    Parameters
    ----------
    model : LoadedModel
        The model whose ``class_names`` the subfolders are matched against.
    folder : ImageFolderSet
        The labelled folder.
    model_labels : bool, default True
        Try the model's own class indices; ``False``, always the subfolder indices.

    Returns
    -------
    tuple of (list, list of int, bool)
        ``(images, labels, model_labels)``: the labels are the model's own class indices when
        ``model_labels`` and every subfolder is named after one of the model's classes (then the model's
        own accuracy can be reported, and the third value is True), else the subfolder indices.
    """
    names = list(getattr(model, "class_names", None) or [])
    if model_labels and names and all(name in names for name in folder.class_names):
        return folder.images, [names.index(folder.class_names[label]) for label in folder.labels], True
    return folder.images, list(folder.labels), False


def _image_count(images) -> int:
    """How many images ``images`` holds: the images of an :class:`ImageFolderSet`, else ``len(images)``.

    Parameters
    ----------
    images : Sequence or ImageFolderSet
        PIL images, or a labelled folder.

    Returns
    -------
    int
        The number of images.

    Raises
    ------
    ProbeError
        ``images`` is neither an :class:`ImageFolderSet` nor a sized, indexable sequence (e.g. a
        generator, which the features of each model could not read again).
    """
    if isinstance(images, ImageFolderSet):
        return len(images.images)
    if not isinstance(images, Sequence) and not (hasattr(images, "__len__") and hasattr(images, "__getitem__")):
        raise ProbeError(
            f"images must be a sequence of PIL images or an ImageFolderSet (load_image_folder), got "
            f"{type(images).__name__}: make it a list."
        )
    return len(images)


def linear_probe_curve(
    model,
    images: Sequence,
    labels: Sequence[int] | None,
    *,
    test_share: float = 0.5,
    concat_k: Sequence[int] = (2, 4),
    ridge: float = 1.0,
    seed: int = 0,
    model_labels: bool = True,
    progress: Progress | None = None,
) -> LinearProbeCurve:
    """Linear-probe accuracy against depth for ``model`` on ``images`` (PIL images, or an
    :class:`ImageFolderSet` with ``labels=None``): each block's token (:func:`block_features`), the probe
    fitted on a seeded training split and scored on the disjoint test split (:func:`split_indices`),
    and the last ``k`` blocks' tokens concatenated for each ``k`` in ``concat_k`` (those up to the
    number of blocks).

    Parameters
    ----------
    model : LoadedViT
        A ViT or a windowed model (Swin, SAM); not a CNN.
    images : Sequence or ImageFolderSet
        PIL images, or an :class:`ImageFolderSet` (then ``labels`` is ignored and taken from the folder,
        :func:`folder_labels`).
    labels : Sequence of int or None
        One class per image; ``None`` only with an :class:`ImageFolderSet`.
    test_share : float, default 0.5
        Share of the images in the test split, strictly between 0 and 1.
    concat_k : Sequence of int, default (2, 4)
        Each ``k``: the probe on the last ``k`` blocks' tokens concatenated.
    ridge : float, default 1.0
        The ridge penalty λ, 0 or more.
    seed : int, default 0
        Seed of the split.
    model_labels : bool, default True
        The labels are indices in the model's own classes, so its own accuracy on the test split is
        reported beside the probe's (a folder: when its subfolders are named after the model's classes).
    progress : Progress or None, default None
        Called as ``progress(done, total)`` while the features are read (:func:`block_features`).

    Returns
    -------
    LinearProbeCurve
        The probe's accuracy per block and per concatenation, and the split.

    Raises
    ------
    ProbeError
        No images, ``images`` neither a sequence nor an :class:`ImageFolderSet`, labels that do not
        match, too few images to split, a model without blocks, a negative ``ridge``.
    """
    if isinstance(images, ImageFolderSet):
        images, labels, model_labels = folder_labels(model, images, model_labels)
    count = _image_count(images)
    if labels is None or len(labels) != count:
        raise ProbeError(f"{0 if labels is None else len(labels)} labels for {count} images: give one label per image.")
    layers, features, logits = block_features(model, images, progress=progress)
    return probe_curve(
        layers,
        features,
        logits,
        labels,
        feature=probe_feature(model.spec),
        test_share=test_share,
        concat_k=concat_k,
        ridge=ridge,
        seed=seed,
        model_labels=model_labels,
    )


def probe_curve(
    layers: Sequence[int],
    features: Sequence[torch.Tensor],
    logits: torch.Tensor,
    labels: Sequence[int],
    *,
    feature: str,
    test_share: float = 0.5,
    concat_k: Sequence[int] = (2, 4),
    ridge: float = 1.0,
    seed: int = 0,
    model_labels: bool = True,
) -> LinearProbeCurve:
    """:func:`linear_probe_curve` from features already read: ``layers`` and ``features`` (per block
    ``(N, D_l)``) and ``logits`` ``(N, outputs)`` as :func:`block_features` gives them (for example
    gathered from the ranks of a ``torchrun`` job).

    Parameters
    ----------
    layers : Sequence of int
        The model layer index of each entry of ``features``.
    features : Sequence of torch.Tensor
        Per block, ``(N, D_l)`` features.
    logits : torch.Tensor
        ``(N, outputs)`` the model's logits (``(N, 0)`` for a headless model).
    labels : Sequence of int
        ``(N,)`` one class per image.
    feature : str
        The token's name, ``"class token"`` or ``"mean patch token"`` (:func:`probe_feature`).
    test_share : float, default 0.5
        Share of the images in the test split, strictly between 0 and 1.
    concat_k : Sequence of int, default (2, 4)
        Each ``k``: the probe on the last ``k`` blocks' features concatenated (those up to the number of
        blocks).
    ridge : float, default 1.0
        The ridge penalty λ, 0 or more.
    seed : int, default 0
        Seed of the split.
    model_labels : bool, default True
        Report the model's own test accuracy (when its logits cover every label).

    Returns
    -------
    LinearProbeCurve
        The probe's accuracy per block and per concatenation, and the split.

    Raises
    ------
    ProbeError
        Labels that do not match the features, too few images to split, a negative ``ridge``.
    """
    if len(labels) != int(logits.shape[0]) or any(int(f.shape[0]) != len(labels) for f in features):
        raise ProbeError(
            f"{len(labels)} labels for features of {[int(f.shape[0]) for f in features]} images: give one label per image."
        )
    train, test = split_indices(len(labels), test_share, seed=seed)
    layers = tuple(int(layer) for layer in layers)
    features = list(features)
    truth = torch.as_tensor(list(labels)).long()
    accuracy = [probe_accuracy(f[train], truth[train], f[test], truth[test], ridge=ridge) for f in features]
    ks = tuple(int(k) for k in concat_k if 1 <= int(k) <= len(features))
    concat = [
        probe_accuracy(
            torch.cat(features[-k:], 1)[train],
            truth[train],
            torch.cat(features[-k:], 1)[test],
            truth[test],
            ridge=ridge,
        )
        for k in ks
    ]
    own = None
    if model_labels and logits.shape[1] > int(truth.max()):
        own = float((logits[test].argmax(-1) == truth[test]).double().mean())
    return LinearProbeCurve(
        layers=layers,
        accuracy=np.asarray(accuracy),
        concat_k=ks,
        concat_accuracy=np.asarray(concat),
        model_accuracy=own,
        feature=feature,
        train_indices=train,
        test_indices=test,
        ridge=float(ridge),
    )


def linear_probe_curves(
    models: Mapping[str, LoadedModel],
    images: Sequence,
    labels: Sequence[int] | None = None,
    *,
    test_share: float = 0.5,
    concat_k: Sequence[int] = (2, 4),
    ridge: float = 1.0,
    seed: int = 0,
    model_labels: bool = True,
    progress: Progress | None = None,
) -> dict[str, LinearProbeCurve]:
    """:func:`linear_probe_curve` for several models (``{name: loaded model}``) on the same images and the
    same split, side by side.

    Parameters
    ----------
    models : Mapping of str to LoadedModel
        ``{name: loaded model}``, ViTs or windowed models; at least one.
    images : Sequence or ImageFolderSet
        PIL images, or an :class:`ImageFolderSet` (then ``labels`` is ignored and each model's labels
        are taken from the folder, :func:`folder_labels`).
    labels : Sequence of int or None, default None
        One class per image; ``None`` only with an :class:`ImageFolderSet`.
    test_share : float, default 0.5
        Share of the images in the test split, strictly between 0 and 1.
    concat_k : Sequence of int, default (2, 4)
        Each ``k``: the probe on the last ``k`` blocks' tokens concatenated.
    ridge : float, default 1.0
        The ridge penalty λ, 0 or more.
    seed : int, default 0
        Seed of the split, the same for every model.
    model_labels : bool, default True
        The labels are indices in the models' own classes (each model's own accuracy is reported).
    progress : Progress or None, default None
        Called as ``progress(done, total)``, each model one equal share of the total.

    Returns
    -------
    dict of str to LinearProbeCurve
        One curve per model, by name.

    Raises
    ------
    ProbeError
        No models; ``images`` neither a sequence nor an :class:`ImageFolderSet`; as
        :func:`linear_probe_curve`.
    """
    if not models:
        raise ProbeError("No models: give at least one {name: model}.")
    curves = {}
    steps = _image_count(images)  # each model's share: one step per image read
    for number, (name, model) in enumerate(models.items()):
        curves[name] = linear_probe_curve(
            model,
            images,
            labels,
            test_share=test_share,
            concat_k=concat_k,
            ridge=ridge,
            seed=seed,
            model_labels=model_labels,
            progress=within(progress, number * steps, steps, len(models) * steps),
        )
    return curves
