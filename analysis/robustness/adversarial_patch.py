"""Universal adversarial patches: one square of pixels that, pasted anywhere on any image, fools a model.

Naseer et al. 2021 ("Intriguing Properties of Vision Transformers", Figure 1 and Section 3.3) paste
an adversarial patch on the object and compare how ViTs and CNNs hold up. The patch here is the
universal patch of Brown et al. 2017 ("Adversarial Patch"): one ``(C, s, s)`` square ``p`` in the
``[0, 1]`` image space, trained over an image set, pasted at random positions ``t`` (or one fixed
position) by :func:`paste_patch` (``A(p, x, t)``: the square replaces the pixels it covers):

* untargeted: ``max_p  E_{x, t} CE(f(A(p, x, t)), y)`` (the true class's cross-entropy raised);
* targeted: ``min_p  E_{x, t} CE(f(A(p, x, t)), target)``,

with Adam, or signed-gradient steps ``p ← clip(p ± α·sign(∇ₚ L), 0, 1)``; after each Adam step the
patch is clipped to ``[0, 1]`` again. Each model sees the patched image through its own
normalisation ``(x − mean) / std`` (as :mod:`analysis.robustness.attacks` does), so one patch is
the same picture for every model. The patch side is ``round(√(share · H · W))`` pixels for a
``share`` of the image area.

Training is a step budget: ``steps`` optimiser steps, each on a mini-batch of ``batch_size`` images
drawn without replacement from a seeded shuffle of the set (a new shuffle after each pass), each image
at its own random position; the loss of every step is kept (:attr:`AdversarialPatch.losses`). The
defaults (:data:`PATCH_SHARE`, :data:`PATCH_STEPS`, :data:`PATCH_BATCH_SIZE`, on
:data:`PATCH_TRAIN_SCENES` demo scenes) train a patch that beats the noise control on held-out scenes
(docs/guides/robustness.md has the numbers); :func:`demo_patch_scenes` gives training and held-out demo
scenes that are disjoint.

The fooling rate is the share of images whose top-1 prediction changes when the patch is pasted
(Moosavi-Dezfooli et al. 2017); the target rate (targeted patches) the share of patched images
predicted as the target; the control is a uniform-noise patch of the same size at the same
positions. :func:`patch_attention_share` measures where a ViT's attention goes once the patch is
pasted: the class token's attention (mean over heads) on the tokens of the patches the square
covers, per layer, patched against clean.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..attention.maps import attention_map
from ..base.errors import AnalysisError
from ..base.progress import Progress, tell, within
from ..demo.data import generate_arrays
from ..engine.capture import capture_attention
from ..model.loading.loaded import LoadedModel
from ..model.windowed_support import require_global_attention
from ..records.attention import AttentionRecord

__all__ = [
    "PATCH_OPTIMISERS",
    "PATCH_TRAIN_SEED",
    "PATCH_SHARE",
    "PATCH_STEPS",
    "PATCH_BATCH_SIZE",
    "PATCH_TRAIN_SCENES",
    "PatchError",
    "AdversarialPatch",
    "PatchScenes",
    "PatchEvaluation",
    "PatchCurve",
    "PatchAttention",
    "patch_side",
    "paste_patch",
    "random_patch_positions",
    "demo_patch_scenes",
    "unit_images",
    "model_input",
    "train_patch",
    "noise_patch",
    "evaluate_patch",
    "patch_size_curve",
    "patch_transfer_matrix",
    "patch_tokens",
    "patch_attention_share",
    "measures_patch_attention",
]

#: the demo scene stream the command line and the Robustness page train patches on (not a training,
#: validation or held-out stream of the demo models)
PATCH_TRAIN_SEED = 5151

#: the default share of the image area (a 15 px square on the 48 px demo scenes)
PATCH_SHARE = 0.1
#: the default step budget: optimiser steps, and images per step
PATCH_STEPS, PATCH_BATCH_SIZE = 150, 32
#: the demo scenes of stream PATCH_TRAIN_SEED the command line and the Robustness page train on
PATCH_TRAIN_SCENES = 512

#: optimiser name -> what one step does
PATCH_OPTIMISERS = {
    "adam": "Adam on the patch, clipped to [0, 1] after each step",
    "sign": "signed-gradient steps p ← clip(p ± α·sign(∇ₚL), 0, 1)",
}


class PatchError(AnalysisError):
    """An adversarial patch's arguments are out of range: a share of the image area outside (0, 1),
    a patch larger than the image, no images, a position off the image, an unknown optimiser."""


@dataclass(frozen=True)
class AdversarialPatch:
    """A trained universal patch (:func:`train_patch`); ``side`` is its side in pixels.

    Attributes
    ----------
    patch : torch.Tensor
        ``(C, side, side)`` float32 in ``[0, 1]`` on the CPU (a picture: paste it with
        :func:`paste_patch` into images in ``[0, 1]``).
    share : float
        The share of the image area asked for (``side² / (H·W)`` is the exact share).
    image_size : tuple of int
        ``(H, W)`` of the images it was trained on.
    target : int or None
        The target class, or ``None`` (untargeted).
    position : tuple of int or None
        The fixed ``(top, left)`` it was trained at, or ``None`` (random positions).
    model_name : str
        The model it was optimised against.
    losses : tuple of float
        The training loss of each step, in order: the mini-batch's mean cross-entropy of the true
        class (untargeted: raised) or of the target (targeted: lowered), with the patch as it was
        before the step.
    """

    patch: torch.Tensor
    share: float
    image_size: tuple[int, int]
    target: int | None
    position: tuple[int, int] | None
    model_name: str
    losses: tuple[float, ...]

    @property
    def side(self) -> int:
        return int(self.patch.shape[-1])

    @property
    def steps(self) -> int:
        """The optimiser steps it was trained for (one loss each)."""
        return len(self.losses)


@dataclass(frozen=True)
class PatchScenes:
    """Demo scenes to train a patch on and disjoint held-out scenes to score it on (:func:`demo_patch_scenes`).

    Attributes
    ----------
    train_images : list of PIL.Image.Image
        The training scenes, samples ``0 .. n−1`` of stream :data:`PATCH_TRAIN_SEED`.
    train_labels : list of int
        Their classes.
    held_out_images : list of PIL.Image.Image
        The held-out scenes, samples ``0 .. m−1`` of stream ``held_out_seed``; none equals a
        training scene pixel for pixel.
    held_out_labels : list of int
        Their classes.
    held_out_seed : int
        The held-out stream.
    """

    train_images: list
    train_labels: list[int]
    held_out_images: list
    held_out_labels: list[int]
    held_out_seed: int


@dataclass(frozen=True)
class PatchEvaluation:
    """One patch on one model over an image set (the same positions for every patch compared).

    Attributes
    ----------
    clean_accuracy : float
        Top-1 accuracy without the patch.
    accuracy : float
        Top-1 accuracy with the patch pasted.
    fooling_rate : float
        Share of images whose top-1 prediction changed when the patch was pasted.
    target_rate : float or None
        Share of patched images predicted as the target class (``None`` untargeted).
    """

    clean_accuracy: float
    accuracy: float
    fooling_rate: float
    target_rate: float | None


@dataclass(frozen=True)
class PatchCurve:
    """Accuracy and fooling rate against patch size, each model with its own trained patch and with a
    noise patch of the same size at the same positions (:func:`patch_size_curve`). Arrays are
    ``(len(shares),)`` float64 per model name.

    Attributes
    ----------
    shares : tuple of float
        The shares of the image area.
    accuracy : dict of str to numpy.ndarray
        Top-1 accuracy with the model's own adversarial patch.
    fooling_rate : dict of str to numpy.ndarray
        Fooling rate of the model's own adversarial patch.
    noise_accuracy : dict of str to numpy.ndarray
        Top-1 accuracy with the uniform-noise control patch.
    noise_fooling_rate : dict of str to numpy.ndarray
        Fooling rate of the uniform-noise control patch.
    clean_accuracy : dict of str to float
        Per model, the accuracy without any patch.
    patches : dict of str to tuple of AdversarialPatch
        Per model, its trained patch at each share.
    images : int
        The number of images evaluated.
    target : int or None
        The target class of the patches, or ``None`` (untargeted).
    target_rate : dict of str to numpy.ndarray or None
        Targeted patches: per model, ``(len(shares),)`` the share of the patched images predicted as
        ``target`` (images of the target class count too); ``None`` untargeted.
    noise_target_rate : dict of str to numpy.ndarray or None
        The same share with the noise patch pasted instead (the rate a patch that knows nothing of
        the target gets); ``None`` untargeted.
    """

    shares: tuple[float, ...]
    accuracy: dict[str, np.ndarray]
    fooling_rate: dict[str, np.ndarray]
    noise_accuracy: dict[str, np.ndarray]
    noise_fooling_rate: dict[str, np.ndarray]
    clean_accuracy: dict[str, float]
    patches: dict[str, tuple[AdversarialPatch, ...]]
    images: int
    target: int | None = None
    target_rate: dict[str, np.ndarray] | None = None
    noise_target_rate: dict[str, np.ndarray] | None = None


@dataclass(frozen=True)
class PatchAttention:
    """Where a ViT's class token looks once the patch is pasted, per captured layer (:func:`patch_attention_share`).

    Attributes
    ----------
    layers : tuple of int
        Model layer index of each entry.
    patched_share : numpy.ndarray
        ``(L, B)`` float32: the class token's attention (mean over heads) on the tokens of the
        patches the square covers, in the patched images.
    clean_share : numpy.ndarray
        ``(L, B)`` float32: the same tokens' share in the clean images.
    tokens : tuple of int
        The token indices (prefix tokens first, then patches row-major) the square covers.
    patched : AttentionRecord
        The attention record of the patched images (for maps and rollout).
    clean : AttentionRecord
        The attention record of the clean images.
    patched_pixels : torch.Tensor
        ``(B, 3, H, W)`` the patched images as the model's preprocessed input, on the CPU.
    """

    layers: tuple[int, ...]
    patched_share: np.ndarray
    clean_share: np.ndarray
    tokens: tuple[int, ...]
    patched: AttentionRecord
    clean: AttentionRecord
    patched_pixels: torch.Tensor


# --- geometry --------------------------------------------------------------------------------------


def patch_side(image_size: Sequence[int], share: float) -> int:
    """The side ``round(√(share · H · W))`` in pixels (at least 1) of a square patch covering ``share`` of an
    ``(H, W)`` image.

    Parameters
    ----------
    image_size : Sequence of int
        ``(H, W)``.
    share : float
        The share of the image area, strictly between 0 and 1.

    Returns
    -------
    int
        The side in pixels.

    Raises
    ------
    PatchError
        ``share`` outside (0, 1), or a square that does not fit in the image.
    """
    height, width = (int(v) for v in image_size)
    if not isinstance(share, (int, float)) or not math.isfinite(share) or not 0 < share < 1:
        raise PatchError(
            f"share={share!r}: a patch covers a share of the image area strictly between 0 and 1 (e.g. 0.05 for 5%)."
        )
    side = max(1, int(round(math.sqrt(share * height * width))))
    if side > min(height, width):
        raise PatchError(
            f"A {share:.0%} patch is a {side}×{side} px square, larger than the {height}×{width} image: "
            "choose a smaller share."
        )
    return side


def _check_position(position: Sequence[int], side: int, image_size: Sequence[int]) -> tuple[int, int]:
    top, left = (int(v) for v in position)
    height, width = (int(v) for v in image_size)
    if not (0 <= top <= height - side and 0 <= left <= width - side):
        raise PatchError(
            f"position=(top={top}, left={left}): a {side} px patch must lie inside the {height}×{width} "
            f"image (top in 0..{height - side}, left in 0..{width - side})."
        )
    return top, left


def random_patch_positions(
    count: int, image_size: Sequence[int], side: int, *, generator: torch.Generator
) -> torch.Tensor:
    """Random positions, uniform over the places where a ``side`` px square fits in an ``(H, W)`` image.

    Parameters
    ----------
    count : int
        How many positions.
    image_size : Sequence of int
        ``(H, W)``.
    side : int
        The square's side in pixels.
    generator : torch.Generator
        The (CPU) generator they are drawn from.

    Returns
    -------
    torch.Tensor
        ``(count, 2)`` int64 ``(top, left)`` positions.

    Raises
    ------
    PatchError
        The square does not fit in the image.
    """
    height, width = (int(v) for v in image_size)
    if side > min(height, width):
        raise PatchError(f"A {side} px patch does not fit in the {height}×{width} image: choose a smaller patch.")
    tops = torch.randint(0, height - side + 1, (count,), generator=generator)
    lefts = torch.randint(0, width - side + 1, (count,), generator=generator)
    return torch.stack([tops, lefts], dim=1)


def demo_patch_scenes(held_out_scenes: int, seed: int, *, train_scenes: int = PATCH_TRAIN_SCENES) -> PatchScenes:
    """Demo scenes to train a patch on (``train_scenes`` of stream :data:`PATCH_TRAIN_SEED`) and
    ``held_out_scenes`` held-out ones of stream ``seed`` to score it on, checked disjoint: no held-out
    scene equals a training scene pixel for pixel (what the command line and the Robustness page
    train and score on).

    Parameters
    ----------
    held_out_scenes : int
        Held-out scenes, 1 or more.
    seed : int
        Their stream; not :data:`PATCH_TRAIN_SEED`.
    train_scenes : int, default PATCH_TRAIN_SCENES
        Training scenes, 1 or more.

    Returns
    -------
    PatchScenes
        The two sets, PIL images at the demo models' 48 px with their classes.

    Raises
    ------
    PatchError
        A count below 1, ``seed`` equal to :data:`PATCH_TRAIN_SEED` (the held-out scenes would be
        the training scenes), or a held-out scene equal to a training scene.
    """
    from PIL import Image

    if int(train_scenes) < 1 or int(held_out_scenes) < 1:
        raise PatchError(
            f"train_scenes={train_scenes!r}, held_out_scenes={held_out_scenes!r}: train on one scene and score "
            "on one scene at least."
        )
    if int(seed) == PATCH_TRAIN_SEED:
        raise PatchError(
            f"seed={seed}: stream {PATCH_TRAIN_SEED} is the one the patches train on, so its scenes are not held "
            "out; score on another seed."
        )
    train, train_labels, _ = generate_arrays(int(train_scenes), PATCH_TRAIN_SEED)
    held, held_labels, _ = generate_arrays(int(held_out_scenes), int(seed))
    seen = {image.tobytes() for image in train}
    shared = [i for i, image in enumerate(held) if image.tobytes() in seen]
    if shared:
        raise PatchError(f"Held-out scenes {shared[:5]} of stream {seed} equal training scenes: score on another seed.")
    return PatchScenes(
        train_images=[Image.fromarray(image, "RGB") for image in train],
        train_labels=[int(v) for v in train_labels],
        held_out_images=[Image.fromarray(image, "RGB") for image in held],
        held_out_labels=[int(v) for v in held_labels],
        held_out_seed=int(seed),
    )


def paste_patch(images: torch.Tensor, patch: torch.Tensor, positions) -> torch.Tensor:
    """The images ``(B, C, H, W)`` with the square ``patch`` ``(C, s, s)`` replacing the pixels
    ``[top : top + s, left : left + s]`` of image ``b``, ``positions[b] = (top, left)`` (``(B, 2)``,
    or one ``(top, left)`` for every image). A pure function (the inputs are not modified),
    differentiable with respect to ``images`` and ``patch``:

        out[b, c, y, x] = patch[c, y − top_b, x − left_b]   if the pixel lies under the square,
                          images[b, c, y, x]                  otherwise.

    Parameters
    ----------
    images : torch.Tensor
        ``(B, C, H, W)`` images (in ``[0, 1]``, as :func:`unit_images` gives them).
    patch : torch.Tensor
        ``(C, s, s)`` the square.
    positions : array-like of int
        ``(B, 2)`` ``(top, left)`` per image, or one ``(top, left)`` for every image.

    Returns
    -------
    torch.Tensor
        ``(B, C, H, W)``, the dtype and device of ``images``.

    Raises
    ------
    PatchError
        Images that are not 4-D or a patch that is not 3-D, a patch larger than the images, a position
        off the image or a position count that is neither ``B`` nor one, a channel mismatch.
    """
    if images.ndim != 4 or patch.ndim != 3:
        raise PatchError(
            f"paste_patch takes images (B, C, H, W) and a patch (C, s, s); got {tuple(images.shape)} "
            f"and {tuple(patch.shape)}."
        )
    batch, channels, height, width = images.shape
    side_y, side_x = int(patch.shape[1]), int(patch.shape[2])
    if patch.shape[0] != channels:
        raise PatchError(f"The patch has {patch.shape[0]} channels, the images {channels}.")
    if side_y > height or side_x > width:
        raise PatchError(
            f"A {side_y}×{side_x} patch is larger than the {height}×{width} images: choose a smaller "
            "share of the image area."
        )
    where = torch.as_tensor(positions, dtype=torch.long).reshape(-1, 2)
    if where.shape[0] == 1:
        where = where.expand(batch, 2)
    if where.shape[0] != batch:
        raise PatchError(f"{where.shape[0]} positions for {batch} images: give one (top, left) per image, or one.")
    tops, lefts = where[:, 0], where[:, 1]
    if bool((tops < 0).any() or (lefts < 0).any() or (tops > height - side_y).any() or (lefts > width - side_x).any()):
        raise PatchError(
            f"Positions must keep the {side_y}×{side_x} patch inside the {height}×{width} images "
            f"(top in 0..{height - side_y}, left in 0..{width - side_x})."
        )
    device = images.device
    rows = torch.arange(height, device=device)[None, :] - tops.to(device)[:, None]  # (B, H): y − top
    cols = torch.arange(width, device=device)[None, :] - lefts.to(device)[:, None]  # (B, W): x − left
    inside = ((rows >= 0) & (rows < side_y))[:, :, None] & ((cols >= 0) & (cols < side_x))[:, None, :]  # (B, H, W)
    canvas = patch.to(device, images.dtype)[
        :, rows.clamp(0, side_y - 1)[:, :, None], cols.clamp(0, side_x - 1)[:, None, :]
    ]  # (C, B, H, W)
    return torch.where(inside[:, None], canvas.permute(1, 0, 2, 3), images)


# --- models in [0, 1] image space ------------------------------------------------------------------


def model_input(model, unit: torch.Tensor) -> torch.Tensor:
    """Images in ``[0, 1]`` normalised as the model's preprocessing does, ``(x − mean) / std``, on the
    model's device: what its forward takes (:meth:`~analysis.base.preprocessing.Preprocessing.normalise`,
    the one rule).

    Parameters
    ----------
    model : LoadedViT or LoadedCNN
        The model whose normalisation is applied.
    unit : torch.Tensor
        ``(B, C, H, W)`` images in ``[0, 1]`` (as :func:`unit_images` gives them, a patch pasted or not).

    Returns
    -------
    torch.Tensor
        ``(B, C, H, W)`` normalised, on the model's device.
    """
    return model.preprocessing.normalise(unit.to(model.device))


def unit_images(model, images: Sequence) -> torch.Tensor:
    """PIL ``images`` resized and cropped by the model's own preprocessing, the normalisation undone
    (``x·std + mean``, clipped to ``[0, 1]``).

    Parameters
    ----------
    model : LoadedViT or LoadedCNN
        The model whose preprocessing is used.
    images : Sequence
        ``B`` PIL images; at least one.

    Returns
    -------
    torch.Tensor
        ``(B, C, H, W)`` float32 in ``[0, 1]`` on the model's device, ``(H, W)`` its input size.

    Raises
    ------
    PatchError
        No images.
    """
    if not len(images):
        raise PatchError("No images: give at least one image (and its label).")
    pixels = torch.cat([model.preprocess(image) for image in images]).to(model.device, torch.float32)
    return model.preprocessing.unnormalise(pixels).clamp(0, 1)


def _logits(model, unit: torch.Tensor) -> torch.Tensor:
    """Logits ``(B, classes)`` of images in ``[0, 1]`` fed through the model's own normalisation."""
    out = model.model(model_input(model, unit))
    if not isinstance(out, torch.Tensor) or out.ndim != 2:
        raise PatchError(f"{model.name} returns no class logits (a headless backbone?): a patch needs a classifier.")
    return out.float()


def _predict(model, unit: torch.Tensor, batch_size: int = 64) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat(
            [_logits(model, unit[i : i + batch_size]).argmax(-1).cpu() for i in range(0, unit.shape[0], batch_size)]
        )


def _label_tensor(labels, count: int) -> torch.Tensor:
    labels = torch.as_tensor(list(labels), dtype=torch.long).reshape(-1)
    if labels.numel() != count:
        raise PatchError(f"{labels.numel()} labels for {count} images: give one label per image.")
    return labels


# --- training --------------------------------------------------------------------------------------


def train_patch(
    model,
    images: Sequence,
    labels: Sequence[int],
    *,
    share: float = PATCH_SHARE,
    target: int | None = None,
    steps: int | None = None,
    batch_size: int = PATCH_BATCH_SIZE,
    epochs: int | None = None,
    optimiser: str = "adam",
    step_size: float | None = None,
    position: Sequence[int] | None = None,
    seed: int = 0,
    progress: Progress | None = None,
) -> AdversarialPatch:
    """Optimise a universal patch against ``model`` over ``images`` (see the module docstring) for a
    budget of ``steps`` optimiser steps of ``batch_size`` images each.

    The images are drawn in passes over a seeded shuffle of the set (a new shuffle for each pass; the
    last mini-batch of a pass holds what is left), until the budget is spent. On one CPU core the
    defaults take about 20 s on the demo ViT and 5 s on the demo CNN.

    Parameters
    ----------
    model : LoadedViT or LoadedCNN
        A :class:`~analysis.LoadedViT` or :class:`~analysis.robustness.LoadedCNN` with class logits.
    images : Sequence
        PIL images, through the model's own resize and crop (:func:`unit_images`).
    labels : Sequence of int
        Their true classes (indices in the model's classes), one per image.
    share : float, default PATCH_SHARE
        The share of the image area the square covers, in (0, 1) (:func:`patch_side`; 0.1).
    target : int or None, default None
        A class index to push every image towards, or ``None`` (untargeted: the true class's
        cross-entropy is raised).
    steps : int or None, default None
        Optimiser steps, 1 or more; ``None``: :data:`PATCH_STEPS` (150), or ``epochs`` passes.
    batch_size : int, default PATCH_BATCH_SIZE
        Images per step, 1 or more (32).
    epochs : int or None, default None
        Instead of ``steps``: this many whole passes over the images, ``epochs · ⌈N / batch_size⌉``
        steps.
    optimiser : str, default "adam"
        ``"adam"`` or ``"sign"``; see :data:`PATCH_OPTIMISERS`.
    step_size : float or None, default None
        Adam's learning rate (``None``: 0.1), or the signed step in ``[0, 1]`` units (``None``: 2/255).
    position : Sequence of int or None, default None
        A fixed ``(top, left)`` in pixels, or ``None`` for random positions at every step.
    seed : int, default 0
        Seeds the starting patch (uniform noise), the shuffles and the positions.
    progress : Progress or None, default None
        Called as ``progress(done, steps)`` after each step (:mod:`analysis.base.progress`).

    Returns
    -------
    AdversarialPatch
        The patch, ``(C, side, side)`` float32 in ``[0, 1]`` on the CPU, with its settings and the loss
        of each step.

    Raises
    ------
    PatchError
        No images, a label count that does not match, a share outside (0, 1), a patch larger than the
        image, a position off the image, an unknown optimiser, fewer than one step or epoch, both
        ``steps`` and ``epochs``, an empty batch, a target outside the model's classes, a model
        without class logits.
    """
    if optimiser not in PATCH_OPTIMISERS:
        raise PatchError(f"Unknown optimiser {optimiser!r}: choose one of {', '.join(PATCH_OPTIMISERS)}.")
    if steps is not None and epochs is not None:
        raise PatchError(f"steps={steps!r} and epochs={epochs!r}: give the budget one way, steps or epochs.")
    if int(batch_size) < 1 or (steps is not None and int(steps) < 1) or (epochs is not None and int(epochs) < 1):
        raise PatchError(
            f"steps={steps!r}, epochs={epochs!r}, batch_size={batch_size!r}: train for at least one step (or "
            "epoch) of batches of at least one image."
        )
    unit = unit_images(model, images)  # (N, C, H, W) in [0, 1]
    truth = _label_tensor(labels, unit.shape[0])
    image_size = (int(unit.shape[-2]), int(unit.shape[-1]))  # (H, W)
    side = patch_side(image_size, share)
    fixed = None if position is None else _check_position(position, side, image_size)
    classes = int(model.spec.num_outputs)
    if target is not None and not 0 <= int(target) < max(classes, 1):
        raise PatchError(f"target={target!r}: the model has classes 0..{classes - 1}.")
    count, size = int(unit.shape[0]), int(batch_size)
    if epochs is not None:
        total = int(epochs) * math.ceil(count / size)
    else:
        total = PATCH_STEPS if steps is None else int(steps)
    generator = torch.Generator().manual_seed(int(seed))
    patch = torch.rand((unit.shape[1], side, side), generator=generator).to(unit.device).requires_grad_(True)
    step = (0.1 if optimiser == "adam" else 2 / 255) if step_size is None else float(step_size)
    adam = torch.optim.Adam([patch], lr=step) if optimiser == "adam" else None
    sign = -1.0 if target is None else 1.0  # minimise sign · CE
    losses: list[float] = []
    while len(losses) < total:
        order = torch.randperm(count, generator=generator)  # one pass
        for start in range(0, count, size):
            if len(losses) == total:
                break
            chosen = order[start : start + size]
            where = (
                torch.tensor([fixed])
                if fixed is not None
                else random_patch_positions(len(chosen), image_size, side, generator=generator)
            )
            goal = truth[chosen] if target is None else torch.full((len(chosen),), int(target), dtype=torch.long)
            with torch.enable_grad():
                logits = _logits(model, paste_patch(unit[chosen], patch, where))
                loss = F.cross_entropy(logits, goal.to(logits.device))
                (gradient,) = torch.autograd.grad(sign * loss, patch)
            with torch.no_grad():
                if adam is not None:
                    patch.grad = gradient
                    adam.step()
                else:
                    patch -= step * gradient.sign()
                patch.clamp_(0, 1)
            losses.append(float(loss.detach()))
            tell(progress, len(losses), total)
    return AdversarialPatch(
        patch=patch.detach().cpu().float(),
        share=float(share),
        image_size=image_size,
        target=None if target is None else int(target),
        position=fixed,
        model_name=str(getattr(model, "name", type(model).__name__)),
        losses=tuple(losses),
    )


def noise_patch(side: int, *, channels: int = 3, seed: int = 0) -> torch.Tensor:
    """The control: a patch of uniform noise in ``[0, 1]``, drawn from ``seed``.

    Parameters
    ----------
    side : int
        The side in pixels.
    channels : int, default 3
        Colour channels.
    seed : int, default 0
        Seed of the noise.

    Returns
    -------
    torch.Tensor
        ``(channels, side, side)`` float32 on the CPU.
    """
    return torch.rand((channels, int(side), int(side)), generator=torch.Generator().manual_seed(int(seed)))


# --- evaluation ------------------------------------------------------------------------------------


def _evaluation(
    model,
    unit: torch.Tensor,
    truth: torch.Tensor,
    patch: torch.Tensor,
    positions: torch.Tensor,
    target: int | None,
    clean: torch.Tensor | None = None,
) -> PatchEvaluation:
    clean = _predict(model, unit) if clean is None else clean
    patched = _predict(model, paste_patch(unit, patch, positions))
    return PatchEvaluation(
        clean_accuracy=float((clean == truth).float().mean()),
        accuracy=float((patched == truth).float().mean()),
        fooling_rate=float((patched != clean).float().mean()),
        target_rate=None if target is None else float((patched == int(target)).float().mean()),
    )


def _positions(count: int, image_size: Sequence[int], side: int, position, seed: int) -> torch.Tensor:
    if position is not None:
        return torch.tensor([_check_position(position, side, image_size)]).expand(count, 2)
    return random_patch_positions(count, image_size, side, generator=torch.Generator().manual_seed(int(seed)))


def evaluate_patch(
    model,
    images: Sequence,
    labels: Sequence[int],
    patch,
    *,
    position: Sequence[int] | None = None,
    seed: int = 0,
    positions: torch.Tensor | None = None,
    target: int | None = None,
) -> PatchEvaluation:
    """Accuracy and fooling rate of ``model`` on ``images`` with ``patch`` pasted (an
    :class:`AdversarialPatch` or a ``(C, s, s)`` tensor in ``[0, 1]``), at ``position`` or at random
    positions drawn from ``seed`` (the same positions for every patch of the same size), or at
    ``positions``, ``(N, 2)`` ``(top, left)`` per image (for example this shard's rows of
    :func:`random_patch_positions` over a whole set).

    Parameters
    ----------
    model : LoadedViT or LoadedCNN
        A model with class logits.
    images : Sequence
        ``N`` PIL images.
    labels : Sequence of int
        Their true classes, one per image.
    patch : AdversarialPatch or torch.Tensor
        The patch; an :class:`AdversarialPatch` also gives the target for ``target_rate``.
    position : Sequence of int or None, default None
        One fixed ``(top, left)`` for every image; ``None``, random positions.
    seed : int, default 0
        Seed of the random positions.
    positions : torch.Tensor or None, default None
        ``(N, 2)`` ``(top, left)`` per image; overrides ``position`` and ``seed``.
    target : int or None, default None
        The class whose rate ``target_rate`` reports (e.g. a noise patch's rate of a targeted patch's
        class); ``None``: the :class:`AdversarialPatch`'s own target.

    Returns
    -------
    PatchEvaluation
        Clean and patched accuracy, fooling rate and (a target) target rate.

    Raises
    ------
    PatchError
        No images, a patch larger than the images, a label count that does not match,
        positions of another count than the images or off the image, a model without class logits.
    """
    tensor = patch.patch if isinstance(patch, AdversarialPatch) else torch.as_tensor(patch, dtype=torch.float32)
    if target is None and isinstance(patch, AdversarialPatch):
        target = patch.target
    unit = unit_images(model, images)
    truth = _label_tensor(labels, unit.shape[0])
    if tensor.shape[-1] > min(unit.shape[-2:]):
        raise PatchError(f"A {tensor.shape[-1]} px patch is larger than the {tuple(unit.shape[-2:])} images.")
    side = int(tensor.shape[-1])
    if positions is None:
        where = _positions(unit.shape[0], unit.shape[-2:], side, position, seed)
    else:
        where = torch.as_tensor(positions, dtype=torch.long).reshape(-1, 2)
        height, width = (int(v) for v in unit.shape[-2:])
        if where.shape[0] != unit.shape[0]:
            raise PatchError(f"{where.shape[0]} positions for {unit.shape[0]} images: give one (top, left) per image.")
        if bool(((where < 0) | (where[:, :1] > height - side) | (where[:, 1:] > width - side)).any()):
            raise PatchError(f"A position puts the {side} px patch off the {height}×{width} image.")
    return _evaluation(model, unit, truth, tensor, where, target)


def patch_size_curve(
    models: Mapping[str, LoadedModel],
    images: Sequence,
    labels: Sequence[int],
    *,
    shares: Sequence[float] = (0.01, 0.02, 0.05, 0.1),
    eval_images: Sequence | None = None,
    eval_labels: Sequence[int] | None = None,
    target: int | None = None,
    steps: int | None = None,
    batch_size: int = PATCH_BATCH_SIZE,
    epochs: int | None = None,
    optimiser: str = "adam",
    position: Sequence[int] | None = None,
    seed: int = 0,
    progress: Progress | None = None,
) -> PatchCurve:
    """Accuracy and fooling rate against patch size, for several models side by side: each model
    (``{name: loaded model}``) gets its own patch per share, trained on ``images`` (:func:`train_patch`),
    and is scored on ``eval_images`` (default: the training images) with that patch and with a noise
    patch of the same size, at the same positions (drawn from ``seed + 1``, or ``position``).

    Parameters
    ----------
    models : Mapping of str to LoadedModel
        ``{name: loaded model}``, classifiers; at least one.
    images : Sequence
        PIL training images.
    labels : Sequence of int
        Their true classes.
    shares : Sequence of float, default (0.01, 0.02, 0.05, 0.1)
        Shares of the image area, each in (0, 1).
    eval_images : Sequence or None, default None
        PIL images the patches are scored on; ``None``, the training images.
    eval_labels : Sequence of int or None, default None
        Their classes; ``None``, ``labels``.
    target : int or None, default None
        As :func:`train_patch`'s; the curve then has the target rates too.
    steps : int or None, default None
        As :func:`train_patch`'s (``None``: :data:`PATCH_STEPS`, or ``epochs`` passes), per patch.
    batch_size : int, default PATCH_BATCH_SIZE
        As :func:`train_patch`'s.
    epochs : int or None, default None
        As :func:`train_patch`'s.
    optimiser : str, default "adam"
        As :func:`train_patch`'s (:data:`PATCH_OPTIMISERS`).
    position : Sequence of int or None, default None
        A fixed ``(top, left)`` for training and scoring; ``None``, random positions.
    seed : int, default 0
        Share ``k`` trains with ``seed + 1000·k``; the scoring positions use ``seed + 1``, the noise
        patch ``seed + 2``.
    progress : Progress or None, default None
        Called as ``progress(done, total)`` over every training mini-batch and evaluation
        (:mod:`analysis.base.progress`).

    Returns
    -------
    PatchCurve
        Per model and share: accuracy and fooling rate (targeted: and target rate) with its own patch
        and with the noise patch.

    Raises
    ------
    PatchError
        No models, no images, a share outside (0, 1), a patch larger than an image; as
        :func:`train_patch`.
    """
    if not models:
        raise PatchError("No models: give at least one {name: model}.")
    for share in shares:
        patch_side((10**6, 10**6), share)  # the share's range, before any training
    held_out = images if eval_images is None else eval_images
    held_labels = labels if eval_labels is None else eval_labels
    # progress: per (model, share), its training's steps and one step for the evaluation
    if epochs is not None:
        training = int(epochs) * math.ceil(len(images) / int(batch_size)) if int(batch_size) > 0 else 0
    else:
        training = PATCH_STEPS if steps is None else int(steps)
    total, done = len(models) * len(shares) * (training + 1), 0
    keys = ("acc", "fool", "noise_acc", "noise_fool", "target", "noise_target")
    fields: dict[str, dict[str, np.ndarray]] = {key: {} for key in keys}
    clean_accuracy, patches = {}, {}
    for name, model in models.items():
        unit = unit_images(model, held_out)
        truth = _label_tensor(held_labels, unit.shape[0])
        clean = _predict(model, unit)
        rows: dict[str, list[float]] = {key: [] for key in fields}
        trained = []
        for k, share in enumerate(shares):
            found = train_patch(
                model,
                images,
                labels,
                share=share,
                target=target,
                steps=steps,
                batch_size=batch_size,
                epochs=epochs,
                optimiser=optimiser,
                position=position,
                seed=seed + 1000 * k,
                progress=within(progress, done, training, total),
            )
            trained.append(found)
            where = _positions(unit.shape[0], unit.shape[-2:], found.side, position, seed + 1)
            adversarial = _evaluation(model, unit, truth, found.patch, where, target, clean)
            control = _evaluation(
                model, unit, truth, noise_patch(found.side, channels=unit.shape[1], seed=seed + 2), where, target, clean
            )
            rows["acc"].append(adversarial.accuracy)
            rows["fool"].append(adversarial.fooling_rate)
            rows["noise_acc"].append(control.accuracy)
            rows["noise_fool"].append(control.fooling_rate)
            rows["target"].append(np.nan if adversarial.target_rate is None else adversarial.target_rate)
            rows["noise_target"].append(np.nan if control.target_rate is None else control.target_rate)
            done += training + 1
            tell(progress, done, total)
        for key in fields:
            fields[key][name] = np.asarray(rows[key])
        clean_accuracy[name] = float((clean == truth).float().mean())
        patches[name] = tuple(trained)
    return PatchCurve(
        shares=tuple(float(s) for s in shares),
        accuracy=fields["acc"],
        fooling_rate=fields["fool"],
        noise_accuracy=fields["noise_acc"],
        noise_fooling_rate=fields["noise_fool"],
        clean_accuracy=clean_accuracy,
        patches=patches,
        images=len(held_out),
        target=None if target is None else int(target),
        target_rate=None if target is None else fields["target"],
        noise_target_rate=None if target is None else fields["noise_target"],
    )


def patch_transfer_matrix(
    models: Mapping[str, LoadedModel],
    patches: Mapping[str, object],
    images: Sequence,
    labels: Sequence[int],
    *,
    position: Sequence[int] | None = None,
    seed: int = 0,
    progress: Progress | None = None,
) -> tuple[list[str], np.ndarray]:
    """``(names, accuracy)``: ``accuracy[i, j]`` is model ``j``'s top-1 accuracy on ``images`` with the
    patch of model ``i`` (``patches[names[i]]``, an :class:`AdversarialPatch` or a tensor) pasted, the
    same positions for every pair (the diagonal: white-box). Each model reads the patched picture
    through its own preprocessing, so the models must share an input size.

    Parameters
    ----------
    models : Mapping of str to LoadedModel
        ``{name: loaded model}``, classifiers with one input size.
    patches : Mapping of str to AdversarialPatch or torch.Tensor
        One patch per model name (e.g. from :func:`train_patch`).
    images : Sequence
        PIL images.
    labels : Sequence of int
        Their true classes.
    position : Sequence of int or None, default None
        One fixed ``(top, left)``; ``None``, random positions drawn from ``seed``.
    seed : int, default 0
        Seed of the random positions.
    progress : Progress or None, default None
        Called as ``progress(done, total)`` after each pair (:mod:`analysis.base.progress`).

    Returns
    -------
    tuple of (list of str, numpy.ndarray)
        ``(names, accuracy)``: the model names in order and ``(M, M)`` float64, ``accuracy[i, j]``
        model ``j``'s top-1 accuracy with model ``i``'s patch.

    Raises
    ------
    PatchError
        Models with different input sizes, a model without a patch, no images, a label count that
        does not match, a position off the image, a model without class logits.
    """
    names = list(models)
    missing = [name for name in names if name not in patches]
    if missing:
        raise PatchError(f"No patch for {missing}: give one patch per model (e.g. from train_patch).")
    sizes = {tuple(models[n].spec.img_size) for n in names}
    if len(sizes) > 1:
        raise PatchError(f"The models take different input sizes {sorted(sizes)}: a transfer needs one size.")
    units = {name: unit_images(models[name], images) for name in names}
    truth = _label_tensor(labels, len(images))
    matrix = np.zeros((len(names), len(names)))
    for i, source in enumerate(names):
        found = patches[source]
        tensor = found.patch if isinstance(found, AdversarialPatch) else torch.as_tensor(found, dtype=torch.float32)
        where = _positions(len(images), units[source].shape[-2:], int(tensor.shape[-1]), position, seed)
        for j, name in enumerate(names):
            patched = _predict(models[name], paste_patch(units[name], tensor, where))
            matrix[i, j] = float((patched == truth).float().mean())
            tell(progress, i * len(names) + j + 1, len(names) ** 2)
    return names, matrix


# --- attention on the patch ------------------------------------------------------------------------


def patch_tokens(spec, position: Sequence[int], side: int) -> tuple[int, ...]:
    """Token indices (``spec.num_prefix_tokens + row·gw + col``) of the patches whose ``ph × pw`` pixel
    cell overlaps a ``side`` px square at ``position = (top, left)`` (at least one pixel in common).

    Parameters
    ----------
    spec : ViTSpec
        The model's geometry (``img_size``, ``patch_size``, ``grid_size``).
    position : Sequence of int
        ``(top, left)`` of the square, in input pixels.
    side : int
        The square's side in pixels.

    Returns
    -------
    tuple of int
        The token indices, row-major.

    Raises
    ------
    PatchError
        The square does not lie inside ``spec.img_size``.
    """
    top, left = _check_position(position, side, spec.img_size)
    (ph, pw), (gh, gw) = spec.patch_size, spec.grid_size
    rows = range(top // ph, min(gh, (top + side - 1) // ph + 1))
    cols = range(left // pw, min(gw, (left + side - 1) // pw + 1))
    return tuple(spec.num_prefix_tokens + r * gw + c for r in rows for c in cols)


def measures_patch_attention(model) -> bool:
    """Whether :func:`patch_attention_share` is defined for ``model``: a ViT with attention layers
    that attend over the whole image (False for a CNN, which has none, and for a windowed model,
    whose attention is per window).

    Parameters
    ----------
    model : LoadedViT or LoadedCNN
        Any loaded model (one without a ``spec`` gives False).

    Returns
    -------
    bool
        True for a global-attention ViT.
    """
    try:
        _refuse_patch_attention(model)
    except (PatchError, AttributeError):
        return False
    return True


def _refuse_patch_attention(vit) -> None:
    """PatchError unless :func:`patch_attention_share` is defined for ``vit`` (:func:`measures_patch_attention`)."""
    spec = vit.spec
    if int(spec.num_layers) < 1:
        raise PatchError(
            f"{getattr(vit, 'name', 'This model')} has no attention (a CNN?): the share of attention on "
            "the patch is defined for ViTs."
        )
    require_global_attention(
        spec,
        lambda spec: PatchError(
            f"{spec.family} attends within windows: the class-token share on the patch is defined for "
            "global-attention ViTs. Compare its accuracy with patch_size_curve instead."
        ),
    )


def patch_attention_share(vit, images: Sequence, patch, position: Sequence[int]) -> PatchAttention:
    """Per layer, the share of the class token's attention (mean over heads) that lands on the tokens of
    the patches the square covers (:func:`patch_tokens`), once ``patch`` is pasted at ``position`` and in
    the clean images:

        share[l, b] = Σ_{t ∈ covered} mean_h A[l, b, h, cls, t]

    (the class token when the model has one, else the mean over patch queries, as
    :func:`analysis.attention_map` reads it). The records of both passes come back for maps and rollout.

    Parameters
    ----------
    vit : LoadedViT
        A global-attention ViT (:func:`measures_patch_attention`).
    images : Sequence
        ``B`` PIL images.
    patch : AdversarialPatch or torch.Tensor
        The patch, ``(C, s, s)`` in ``[0, 1]``.
    position : Sequence of int
        ``(top, left)`` where it is pasted in every image, in input pixels.

    Returns
    -------
    PatchAttention
        The shares ``(L, B)`` patched and clean, the covered tokens and both records.

    Raises
    ------
    PatchError
        A model without attention layers (a CNN), a windowed model (its attention is per window), no
        images, a patch off the image.
    """
    _refuse_patch_attention(vit)
    spec = vit.spec
    tensor = patch.patch if isinstance(patch, AdversarialPatch) else torch.as_tensor(patch, dtype=torch.float32)
    side = int(tensor.shape[-1])
    tokens = patch_tokens(spec, position, side)
    unit = unit_images(vit, images)
    clean_pixels = model_input(vit, unit).cpu()
    patched_pixels = model_input(vit, paste_patch(unit, tensor, tuple(position))).cpu()
    clean = capture_attention(vit, clean_pixels)
    patched = capture_attention(vit, patched_pixels)
    cells = torch.as_tensor([t - spec.num_prefix_tokens for t in tokens], dtype=torch.long)

    def shares(record: AttentionRecord) -> np.ndarray:
        per_layer = [attention_map(record, layer).flatten(1)[:, cells].sum(-1) for layer in record.layers]
        return torch.stack(per_layer).numpy()  # (L, B)

    return PatchAttention(
        layers=tuple(clean.layers),
        patched_share=shares(patched),
        clean_share=shares(clean),
        tokens=tokens,
        patched=patched,
        clean=clean,
        patched_pixels=patched_pixels,
    )
