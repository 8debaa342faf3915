"""FGSM and PGD (analysis.robustness.attacks) against a reference written out here, on the bundled demo ViT and CNN."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from analysis import load_vit
from analysis.demo.data import render_sample
from analysis.robustness import load_cnn
from analysis.robustness.attacks import AttackError, attack_curve, fgsm, pgd, transfer_matrix

HELD_OUT_SEED = 4242  # not a training or validation stream of the demo models


@pytest.fixture(scope="module")
def demo_vit():
    return load_vit("demo")


@pytest.fixture(scope="module")
def demo_cnn():
    return load_cnn("demo")


@pytest.fixture(scope="module")
def scenes(demo_vit):
    """8 held-out demo scenes at the demo ViT's input size, and their classes."""
    size = demo_vit.spec.img_size[0]
    found = [render_sample(HELD_OUT_SEED, i, size) for i in range(8)]
    return [Image.fromarray(image) for image, _, _ in found], [label for _, label, _ in found]


def reference_pgd(model, pixels, labels, *, epsilon, steps, alpha, start_noise):
    """PGD written out step by step on the [0, 1] image: x₀ = clip(x + noise), then for each step
    the signed gradient of the summed cross-entropy, the projection onto the ε-ball around x
    (elementwise, with explicit where) and the clip to [0, 1]."""
    mean = torch.tensor(model.preprocessing.mean).view(1, -1, 1, 1)
    std = torch.tensor(model.preprocessing.std).view(1, -1, 1, 1)
    x = (pixels * std + mean).clamp(0, 1)
    eps, step = epsilon / 255, alpha / 255
    adv = (x + start_noise).clamp(0, 1)
    for _ in range(steps):
        adv = adv.detach().clone().requires_grad_(True)
        loss = F.cross_entropy(model.model((adv - mean) / std), labels, reduction="sum")
        loss.backward()
        moved = adv.detach() + step * torch.sign(adv.grad)
        moved = torch.where(moved > x + eps, x + eps, moved)
        moved = torch.where(moved < x - eps, x - eps, moved)
        adv = torch.where(moved > 1, torch.ones_like(moved), torch.where(moved < 0, torch.zeros_like(moved), moved))
    return (adv.detach() - mean) / std


@pytest.mark.parametrize("which", ["demo_vit", "demo_cnn"])
def test_pgd_equals_the_reference_written_out(which, request, scenes):
    model = request.getfixturevalue(which)
    images, labels = scenes
    pixels = torch.cat([model.preprocess(image) for image in images[:3]])
    truth = torch.tensor(labels[:3])
    epsilon, steps = 6.0, 4
    ours = pgd(model, pixels, truth, epsilon=epsilon, steps=steps, seed=5)
    generator = torch.Generator().manual_seed(5)
    noise = (torch.rand(pixels.shape, generator=generator) * 2 - 1) * (epsilon / 255)
    expected = reference_pgd(
        model, pixels, truth, epsilon=epsilon, steps=steps, alpha=2.5 * epsilon / steps, start_noise=noise
    )
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-5)
    mean = torch.tensor(model.preprocessing.mean).view(1, -1, 1, 1)
    std = torch.tensor(model.preprocessing.std).view(1, -1, 1, 1)
    change = ((ours * std + mean) - (pixels * std + mean).clamp(0, 1)).abs().amax()
    assert change <= epsilon / 255 + 1e-6 and change > 0.9 * epsilon / 255  # uses its budget, never more


def test_fgsm_is_one_full_step_without_random_start(demo_vit, scenes):
    images, labels = scenes
    pixels = torch.cat([demo_vit.preprocess(image) for image in images[:2]])
    truth = torch.tensor(labels[:2])
    expected = reference_pgd(demo_vit, pixels, truth, epsilon=3, steps=1, alpha=3, start_noise=torch.zeros_like(pixels))
    torch.testing.assert_close(fgsm(demo_vit, pixels, truth, epsilon=3), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("attack", ["fgsm", "pgd"])
def test_epsilon_zero_leaves_every_prediction_unchanged(attack, demo_vit, demo_cnn, scenes):
    images, labels = scenes
    for model in (demo_vit, demo_cnn):
        pixels = torch.cat([model.preprocess(image) for image in images])
        truth = torch.tensor(labels)
        adversarial = (
            fgsm(model, pixels, truth, epsilon=0) if attack == "fgsm" else pgd(model, pixels, truth, epsilon=0, steps=3)
        )
        torch.testing.assert_close(adversarial, pixels, rtol=0, atol=1e-5)
        with torch.no_grad():
            assert torch.equal(model.model(adversarial).argmax(-1), model.model(pixels).argmax(-1))


def test_pgd_lowers_the_demo_vits_accuracy_and_the_curve_starts_at_the_clean_accuracy(demo_vit, demo_cnn, scenes):
    images, labels = scenes
    curve = attack_curve({"ViT": demo_vit, "CNN": demo_cnn}, images, labels, epsilons=(0, 8), steps=5)
    for name, model in (("ViT", demo_vit), ("CNN", demo_cnn)):
        pixels = torch.cat([model.preprocess(image) for image in images])
        with torch.no_grad():
            clean = float((model.model(pixels).argmax(-1) == torch.tensor(labels)).float().mean())
        assert curve.accuracy[name][0] == clean
        assert curve.accuracy[name][1] < clean, (name, curve.accuracy[name])
    assert curve.images == len(images) and curve.epsilons == (0.0, 8.0)


def test_the_transfer_matrix_diagonal_is_the_white_box_accuracy(demo_vit, demo_cnn, scenes):
    images, labels = scenes
    models = {"ViT": demo_vit, "CNN": demo_cnn}
    names, matrix = transfer_matrix(models, images, labels, epsilon=8, steps=5)
    curve = attack_curve(models, images, labels, epsilons=(8,), steps=5)
    assert names == ["ViT", "CNN"]
    np.testing.assert_array_equal(np.diag(matrix), [curve.accuracy["ViT"][0], curve.accuracy["CNN"][0]])
    assert ((matrix >= 0) & (matrix <= 1)).all()
    # the off-diagonal entries, by hand: the CNN's images, fed to the ViT
    pixels = torch.cat([demo_cnn.preprocess(image) for image in images])
    adversarial = pgd(demo_cnn, pixels, torch.tensor(labels), epsilon=8, steps=5)
    unit = adversarial * torch.tensor(demo_cnn.preprocessing.std).view(1, -1, 1, 1) + torch.tensor(
        demo_cnn.preprocessing.mean
    ).view(1, -1, 1, 1)
    to_vit = (unit.clamp(0, 1) - torch.tensor(demo_vit.preprocessing.mean).view(1, -1, 1, 1)) / torch.tensor(
        demo_vit.preprocessing.std
    ).view(1, -1, 1, 1)
    with torch.no_grad():
        assert matrix[1, 0] == float((demo_vit.model(to_vit).argmax(-1) == torch.tensor(labels)).float().mean())


def test_bad_arguments_get_typed_errors(demo_vit, scenes):
    images, labels = scenes
    pixels = demo_vit.preprocess(images[0])
    with pytest.raises(AttackError, match="0–255 units, 0 or more"):
        pgd(demo_vit, pixels, [labels[0]], epsilon=-1)
    with pytest.raises(AttackError, match="at least one step"):
        pgd(demo_vit, pixels, [labels[0]], epsilon=2, steps=0)
    with pytest.raises(AttackError, match="one label per image"):
        pgd(demo_vit, pixels, labels[:2], epsilon=2)
    with pytest.raises(AttackError, match="Unknown attack"):
        attack_curve({"ViT": demo_vit}, images[:1], labels[:1], attack_name="cw")


@pytest.mark.attack_library
def test_our_pgd_equals_torchattacks_pgd(demo_vit, scenes):
    """Cross-check with torchattacks' PGD (the model wrapped with its normalisation, inputs in
    [0, 1]; no random start so both begin at the clean image). CI installs torchattacks in its
    own step (its pinned requests conflicts with the docs tools): ``pytest -m attack_library``."""
    if os.environ.get("CI") == "true":  # CI installs it for this step: a missing package fails, never skips
        import torchattacks
    else:
        torchattacks = pytest.importorskip("torchattacks")
    images, labels = scenes
    pixels = torch.cat([demo_vit.preprocess(image) for image in images[:4]])
    truth = torch.tensor(labels[:4])
    mean = torch.tensor(demo_vit.preprocessing.mean).view(1, -1, 1, 1)
    std = torch.tensor(demo_vit.preprocessing.std).view(1, -1, 1, 1)

    class Normalised(torch.nn.Module):
        def forward(self, unit):
            return demo_vit.model((unit - mean) / std)

    theirs = torchattacks.PGD(Normalised().eval(), eps=6 / 255, alpha=1.5 / 255, steps=4, random_start=False)
    adv_unit = theirs(pixels * std + mean, truth)
    ours = pgd(demo_vit, pixels, truth, epsilon=6, steps=4, step_size=1.5, random_start=False)
    torch.testing.assert_close(ours * std + mean, adv_unit, rtol=0, atol=1e-5)
