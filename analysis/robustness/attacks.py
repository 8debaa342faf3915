"""Sample-specific adversarial attacks: FGSM and PGD under an L∞ budget, in the pixel units of the image.

Naseer et al. 2021 ("Intriguing Properties of Vision Transformers", Section 3.3) compare how ViTs and CNNs
resist, and transfer, adversarial examples. The attacks here are the standard ones:

* **FGSM** (Goodfellow et al. 2015): ``x' = clip(x + ε·sign(∇ₓ L(f(x), y)))``;
* **PGD** (Madry et al. 2018): from ``x₀ = x`` (or ``x + U(−ε, ε)`` with ``random_start``),
  ``xₜ₊₁ = Π(xₜ + α·sign(∇ₓ L(f(xₜ), y)))`` for ``steps`` steps, where ``Π`` clips to the
  ε-ball around ``x`` and then to the valid image ``[0, 1]``. Targeted: ``−α`` towards the target's loss.

``L`` is the cross-entropy of the model's logits. The budget ``epsilon`` is given in the **0–255 pixel
units** of the image (the papers' ε = 4/255 is ``epsilon=4``): the attack runs on the image in ``[0, 1]``
(``x·std + mean`` of the model's own normalisation) and feeds the model ``(x' − mean) / std``, so the same
ε means the same pixel change for every model, whatever its normalisation. Each model is attacked through
its own forward and gradient: nothing is registered on it, so one loaded model serves many threads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..base.errors import AnalysisError
from ..base.progress import Progress, tell
from ..model.loading.loaded import LoadedModel

__all__ = ["AttackError", "fgsm", "pgd", "attack", "AttackCurve", "attack_curve", "transfer_matrix", "ATTACKS"]

#: attack name -> what it is
ATTACKS = {
    "fgsm": "one signed-gradient step of ε (Goodfellow et al. 2015)",
    "pgd": "projected gradient descent, L∞, α = 2.5·ε/steps, random start (Madry et al. 2018)",
}


class AttackError(AnalysisError):
    """An attack's arguments are out of range (a negative ε, no steps) or the model has no classes."""


def _check(epsilon: float, steps: int = 1) -> None:
    if not np.isfinite(epsilon) or epsilon < 0:
        raise AttackError(
            f"epsilon={epsilon!r}: the L∞ budget is a pixel change in 0–255 units, 0 or more "
            "(e.g. 4 for the papers' 4/255)."
        )
    if int(steps) < 1:
        raise AttackError(f"steps={steps!r}: an attack takes at least one step.")


def _logits_of(model) -> Callable[[torch.Tensor], torch.Tensor]:
    """``unit image (B, C, H, W) in [0, 1] -> logits (B, classes)`` through the model's own normalisation."""
    normalise = model.preprocessing.normalise

    def logits(unit: torch.Tensor) -> torch.Tensor:
        out = model.model(normalise(unit))
        if not isinstance(out, torch.Tensor) or out.ndim != 2:
            raise AttackError(
                f"{model.name} returns no class logits (a headless backbone?): an attack needs a classifier."
            )
        return out.float()

    return logits


def _labels(labels, batch: int, device: torch.device) -> torch.Tensor:
    labels = torch.as_tensor(labels, dtype=torch.long, device=device).reshape(-1)
    if labels.numel() != batch:
        raise AttackError(f"{labels.numel()} labels for {batch} images: give one label per image.")
    return labels


def pgd(
    model,
    pixels: torch.Tensor,
    labels,
    *,
    epsilon: float,
    steps: int = 10,
    step_size: float | None = None,
    random_start: bool = True,
    targeted: bool = False,
    seed: int = 0,
) -> torch.Tensor:
    """The PGD adversarial images of ``pixels`` (the model's preprocessed input), as
    preprocessed input again (feed them to the model as they are).

    ``xₜ₊₁ = Π(xₜ + α·sign(∇ₓ L(f(xₜ), y)))`` on the image in ``[0, 1]``, ``Π`` the clip to the
    ε-ball around ``x`` and then to ``[0, 1]`` (Madry et al. 2018; see the module docstring).
    ``epsilon=0`` returns the input image (every prediction unchanged).

    Parameters
    ----------
    model : LoadedViT or LoadedCNN
        A :class:`~analysis.LoadedViT` or :class:`~analysis.robustness.LoadedCNN` with class logits.
    pixels : torch.Tensor
        ``(B, 3, H, W)`` preprocessed input (the model's normalisation).
    labels : array-like of int
        ``(B,)`` the true classes (untargeted: the loss is raised), or with ``targeted`` the
        target classes (the loss is lowered).
    epsilon : float
        L∞ budget in 0–255 pixel units, 0 or more (the papers' 4/255 is ``4``).
    steps : int, default 10
        Signed-gradient steps, at least 1.
    step_size : float or None, default None
        α in the same 0–255 units; ``None``, ``2.5·ε/steps``.
    random_start : bool, default True
        Start from ``x + U(−ε, ε)`` (clipped to the image), drawn from ``seed``.
    targeted : bool, default False
        Step towards ``labels`` (lower their loss) instead of away from them.
    seed : int, default 0
        Seed of the random start.

    Returns
    -------
    torch.Tensor
        ``(B, 3, H, W)`` adversarial input, normalised as ``pixels``, of ``pixels``' dtype, on the
        model's device.

    Raises
    ------
    AttackError
        ``epsilon`` negative or not finite; ``steps < 1``; not one label per image; a model without
        class logits ``(B, classes)``.
    """
    _check(epsilon, steps)
    forward = _logits_of(model)
    clean = model.preprocessing.unnormalise(pixels.to(model.device, torch.float32)).clamp(
        0, 1
    )  # (B, C, H, W) in [0, 1]
    target = _labels(labels, clean.shape[0], clean.device)
    eps = float(epsilon) / 255.0
    alpha = (2.5 * eps / int(steps)) if step_size is None else float(step_size) / 255.0
    sign = -1.0 if targeted else 1.0
    adversarial = clean.clone()
    if random_start and eps > 0:
        generator = torch.Generator(device="cpu").manual_seed(int(seed))
        noise = (torch.rand(clean.shape, generator=generator) * 2 - 1).to(clean.device) * eps
        adversarial = (clean + noise).clamp(0, 1)
    for _ in range(int(steps)):
        adversarial = adversarial.detach().requires_grad_(True)
        with torch.enable_grad():
            loss = F.cross_entropy(forward(adversarial), target, reduction="sum")
            (gradient,) = torch.autograd.grad(loss, adversarial)
        stepped = adversarial.detach() + sign * alpha * gradient.sign()
        adversarial = torch.minimum(torch.maximum(stepped, clean - eps), clean + eps).clamp(0, 1)
    return model.preprocessing.normalise(adversarial.detach()).to(pixels.dtype)


def fgsm(model, pixels: torch.Tensor, labels, *, epsilon: float, targeted: bool = False) -> torch.Tensor:
    """FGSM: one PGD step of size ε from the clean image (no random start); see :func:`pgd`.

    ``x' = clip(x + ε·sign(∇ₓ L(f(x), y)))`` (Goodfellow et al. 2015).

    Parameters
    ----------
    model : LoadedViT or LoadedCNN
        A model with class logits.
    pixels : torch.Tensor
        ``(B, 3, H, W)`` preprocessed input.
    labels : array-like of int
        ``(B,)`` the true classes, or with ``targeted`` the target classes.
    epsilon : float
        L∞ budget (and step) in 0–255 pixel units.
    targeted : bool, default False
        Step towards ``labels`` instead of away from them.

    Returns
    -------
    torch.Tensor
        ``(B, 3, H, W)`` adversarial input, normalised as ``pixels``, on the model's device.

    Raises
    ------
    AttackError
        As :func:`pgd`.
    """
    return pgd(
        model, pixels, labels, epsilon=epsilon, steps=1, step_size=epsilon, random_start=False, targeted=targeted
    )


def attack(
    name: str, model, pixels: torch.Tensor, labels, *, epsilon: float, steps: int = 10, seed: int = 0
) -> torch.Tensor:
    """:func:`fgsm` or :func:`pgd` by ``name`` (a key of :data:`ATTACKS`), untargeted; PGD with its
    default step size ``2.5·ε/steps`` and a random start.

    Parameters
    ----------
    name : str
        ``"fgsm"`` or ``"pgd"``.
    model : LoadedViT or LoadedCNN
        A model with class logits.
    pixels : torch.Tensor
        ``(B, 3, H, W)`` preprocessed input.
    labels : array-like of int
        ``(B,)`` the true classes.
    epsilon : float
        L∞ budget in 0–255 pixel units.
    steps : int, default 10
        PGD's steps (FGSM ignores it).
    seed : int, default 0
        Seed of PGD's random start (FGSM ignores it).

    Returns
    -------
    torch.Tensor
        ``(B, 3, H, W)`` adversarial input, normalised as ``pixels``, on the model's device.

    Raises
    ------
    AttackError
        An unknown ``name``; as :func:`pgd`.
    """
    if name == "fgsm":
        return fgsm(model, pixels, labels, epsilon=epsilon)
    if name == "pgd":
        return pgd(model, pixels, labels, epsilon=epsilon, steps=steps, seed=seed)
    raise AttackError(f"Unknown attack {name!r}: choose one of {', '.join(ATTACKS)}.")


def _predict(model, pixels: torch.Tensor) -> torch.Tensor:
    """Top-1 classes ``(B,)`` (CPU) of preprocessed ``pixels``."""
    with torch.no_grad():
        out = model.model(pixels.to(model.device, torch.float32))
    return out.argmax(-1).cpu()


@dataclass(frozen=True)
class AttackCurve:
    """Top-1 accuracy of each model on its own adversarial images, per ε (0–255 units).

    Attributes
    ----------
    attack : str
        The attack's name (a key of :data:`ATTACKS`).
    epsilons : tuple of float
        The budgets, 0–255 units.
    accuracy : dict of str to numpy.ndarray
        Model name -> ``(len(epsilons),)`` float64 top-1 accuracy; the ε = 0 entry is the clean
        accuracy.
    images : int
        How many images were attacked.
    """

    attack: str
    epsilons: tuple[float, ...]
    accuracy: dict[str, np.ndarray]
    images: int


def attack_curve(
    models: Mapping[str, LoadedModel],
    images: Sequence,
    labels: Sequence[int],
    *,
    epsilons: Sequence[float] = (0, 1, 2, 4, 8),
    attack_name: str = "pgd",
    steps: int = 10,
    seed: int = 0,
    progress: Progress | None = None,
) -> AttackCurve:
    """Accuracy against ε for each model on its own (white-box) adversarial images.

    Parameters
    ----------
    models : Mapping of str to LoadedModel
        ``{name: loaded model}``, classifiers (ViTs and CNNs).
    images : Sequence
        PIL images, each preprocessed by each model.
    labels : Sequence of int
        The true classes (indices in each model's classes), one per image.
    epsilons : Sequence of float, default (0, 1, 2, 4, 8)
        L∞ budgets in 0–255 pixel units.
    attack_name : str, default "pgd"
        A key of :data:`ATTACKS`.
    steps : int, default 10
        PGD's steps.
    seed : int, default 0
        Seed of PGD's random start.
    progress : Progress or None, default None
        Called as ``progress(done, total)`` after each (model, ε) (:mod:`analysis.base.progress`).

    Returns
    -------
    AttackCurve
        ``accuracy[name]`` ``(len(epsilons),)`` per model.

    Raises
    ------
    AttackError
        No images, or not one label per image; a negative ε or ``steps < 1``; an unknown attack; a
        model without class logits.
    """
    if len(images) != len(labels) or not images:
        raise AttackError(f"{len(images)} images and {len(labels)} labels: give one label per image, at least one.")
    for eps in epsilons:
        _check(eps, steps)
    truth = torch.as_tensor(list(labels), dtype=torch.long)
    accuracy: dict[str, np.ndarray] = {}
    total, done = len(models) * len(epsilons), 0
    for name, model in models.items():
        pixels = torch.cat([model.preprocess(image) for image in images])
        row = []
        for eps in epsilons:
            adversarial = attack(attack_name, model, pixels, truth, epsilon=eps, steps=steps, seed=seed)
            row.append(float((_predict(model, adversarial) == truth).float().mean()))
            done += 1
            tell(progress, done, total)
        accuracy[name] = np.asarray(row)
    return AttackCurve(attack_name, tuple(float(e) for e in epsilons), accuracy, len(images))


def transfer_matrix(
    models: Mapping[str, LoadedModel],
    images: Sequence,
    labels: Sequence[int],
    *,
    epsilon: float,
    attack_name: str = "pgd",
    steps: int = 10,
    seed: int = 0,
) -> tuple[list[str], np.ndarray]:
    """How adversarial images made against one model fool the others.

    The images cross between models as pictures in ``[0, 1]`` as the source model saw them (its
    resize and crop; each model normalises them its own way), so the models must share input size
    and classes.

    Parameters
    ----------
    models : Mapping of str to LoadedModel
        ``{name: loaded model}``, classifiers with one input size and the same classes.
    images : Sequence
        PIL images, preprocessed by each source model.
    labels : Sequence of int
        The true classes, one per image.
    epsilon : float
        L∞ budget in 0–255 pixel units.
    attack_name : str, default "pgd"
        A key of :data:`ATTACKS`.
    steps : int, default 10
        PGD's steps.
    seed : int, default 0
        Seed of PGD's random start.

    Returns
    -------
    tuple of (list of str, numpy.ndarray)
        ``(names, accuracy)``: the model names in order and ``(M, M)`` float64, ``accuracy[i, j]``
        model ``j``'s top-1 accuracy on the adversarial images made against model ``i`` (the
        diagonal: white-box).

    Raises
    ------
    AttackError
        The models take different input sizes (the classes are not checked); a negative ε or
        ``steps < 1``; an unknown attack; not one label per image; a model without class logits.
    """
    _check(epsilon, steps)
    names = list(models)
    sizes = {tuple(models[n].spec.img_size) for n in names}
    if len(sizes) > 1:
        raise AttackError(f"The models take different input sizes {sorted(sizes)}: a transfer needs one size.")
    truth = torch.as_tensor(list(labels), dtype=torch.long)
    matrix = np.zeros((len(names), len(names)))
    for i, source in enumerate(names):
        model = models[source]
        pixels = torch.cat([model.preprocess(image) for image in images])
        adversarial = attack(attack_name, model, pixels, truth, epsilon=epsilon, steps=steps, seed=seed)
        unit = model.preprocessing.unnormalise(adversarial.to(model.device)).clamp(0, 1).cpu()
        for j, target_name in enumerate(names):
            target = models[target_name]
            matrix[i, j] = float((_predict(target, target.preprocessing.normalise(unit)) == truth).float().mean())
    return names, matrix
