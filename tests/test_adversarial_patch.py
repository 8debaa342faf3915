"""Universal adversarial patches (analysis.robustness.adversarial_patch): pasting against explicit slicing, the
attention share on the patch against an explicit loop over the record, a trained patch against a noise patch
on held-out demo scenes, and the typed errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from analysis import load_vit
from analysis.demo.data import render_sample
from analysis.robustness import load_cnn
from analysis.robustness.adversarial_patch import (
    AdversarialPatch,
    PatchError,
    evaluate_patch,
    noise_patch,
    paste_patch,
    patch_attention_share,
    patch_side,
    patch_size_curve,
    patch_tokens,
    patch_transfer_matrix,
    random_patch_positions,
    train_patch,
)

TRAIN_SEED = 5151  # the patch's training scenes: not a training or validation stream of the demo models
HELD_OUT_SEED = 4242  # the scenes it is scored on: another stream again


@pytest.fixture(scope="module")
def demo_vit():
    return load_vit("demo")


def scenes(seed: int, count: int, size: int):
    found = [render_sample(seed, i, size) for i in range(count)]
    return [Image.fromarray(image) for image, _, _ in found], [label for _, label, _ in found]


def test_paste_equals_explicit_slicing():
    generator = torch.Generator().manual_seed(0)
    images = torch.rand((4, 3, 20, 17), generator=generator)
    patch = torch.rand((3, 5, 5), generator=generator)
    positions = torch.tensor([[0, 0], [15, 12], [7, 3], [2, 9]])  # corners included
    expected = images.clone()
    for b, (top, left) in enumerate(positions.tolist()):
        for y in range(5):
            for x in range(5):
                expected[b, :, top + y, left + x] = patch[:, y, x]
    before = images.clone()
    pasted = paste_patch(images, patch, positions)
    assert torch.equal(pasted, expected)
    assert torch.equal(images, before)  # pure: the input is untouched
    assert torch.equal(paste_patch(images, patch, (2, 3)), paste_patch(images, patch, torch.tensor([[2, 3]] * 4)))


def test_paste_is_differentiable_in_the_patch():
    patch = torch.zeros((3, 4, 4), requires_grad=True)
    pasted = paste_patch(torch.rand((2, 3, 10, 10)), patch, torch.tensor([[0, 0], [6, 6]]))
    (gradient,) = torch.autograd.grad(pasted.sum(), patch)
    assert torch.equal(gradient, torch.full((3, 4, 4), 2.0))  # each patch pixel lands once in each of 2 images


def test_patch_side_and_tokens():
    assert patch_side((48, 48), 0.1) == round((0.1 * 48 * 48) ** 0.5) == 15
    assert patch_side((224, 224), 0.01) == 22

    class Spec:  # a 4x5 grid of 6 px patches after one class token
        img_size, patch_size, grid_size, num_prefix_tokens = (24, 30), (6, 6), (4, 5), 1

    # a 7 px square at (5, 11) covers pixel rows 5..11 (patch rows 0..1) and columns 11..17 (patch columns 1..2)
    assert patch_tokens(Spec, (5, 11), 7) == tuple(1 + r * 5 + c for r in (0, 1) for c in (1, 2))


def test_attention_share_equals_a_loop_over_the_record(demo_vit):
    images, _ = scenes(HELD_OUT_SEED, 2, demo_vit.spec.img_size[0])
    patch = noise_patch(13, seed=3)
    found = patch_attention_share(demo_vit, images, patch, (10, 20))
    spec = demo_vit.spec
    (ph, pw), (gh, gw), prefix = spec.patch_size, spec.grid_size, spec.num_prefix_tokens
    covered = [
        prefix + r * gw + c
        for r in range(gh)
        for c in range(gw)
        if r * ph < 10 + 13 and 10 < (r + 1) * ph and c * pw < 20 + 13 and 20 < (c + 1) * pw
    ]
    assert found.tokens == tuple(covered)
    for share, record in ((found.patched_share, found.patched), (found.clean_share, found.clean)):
        assert share.shape == (spec.num_layers, 2)
        for position, _layer in enumerate(record.layers):
            for b in range(2):
                total = 0.0
                for token in covered:
                    total += (
                        sum(float(record.attentions[position, b, h, 0, token]) for h in range(spec.num_heads))
                        / spec.num_heads
                    )
                assert share[position, b] == pytest.approx(total, abs=1e-5)
    # the patched pass really had the patch in it, the clean pass did not
    assert not torch.equal(found.patched.attentions, found.clean.attentions)


def test_a_trained_patch_beats_a_noise_patch_on_held_out_scenes(demo_vit):
    """Trained on 48 scenes (seed 5151), 5 epochs of batches of 8, Adam at 0.1, 10% of the image area
    (15 px on the 48 px scenes), random positions; scored on 150 held-out scenes (seed 4242) at the same
    random positions as a uniform-noise patch of the same size. Measured: clean 0.940, noise patch 0.720,
    trained patch 0.680, a margin of 4 points (fooling rate 0.260 against 0.227). The margin depends on the
    training seed (seeds 1, 2, 3: 0.693, 0.707, 0.707; seed 2000, as patch_size_curve trains at 10%: 0.733,
    no better than noise). The demo ViT reads the object's shape, and a 15 px square of noise already hides
    much of it, so the margin is small: the assertion is "strictly lower" at seed 0, and the numbers are
    printed (pytest -s)."""
    size = demo_vit.spec.img_size[0]
    train_images, train_labels = scenes(TRAIN_SEED, 48, size)
    test_images, test_labels = scenes(HELD_OUT_SEED, 150, size)
    calls = []
    patch = train_patch(
        demo_vit,
        train_images,
        train_labels,
        share=0.1,
        epochs=5,
        batch_size=8,
        step_size=0.1,
        seed=0,
        progress=lambda done, total: calls.append((done, total)),
    )
    assert calls == [(done, 30) for done in range(1, 31)]  # 5 epochs of 6 batches of 8
    assert patch.patch.shape == (3, 15, 15) and 0 <= float(patch.patch.min()) and float(patch.patch.max()) <= 1
    trained = evaluate_patch(demo_vit, test_images, test_labels, patch, seed=1)
    noise = evaluate_patch(demo_vit, test_images, test_labels, noise_patch(patch.side, seed=2), seed=1)
    print(
        f"clean {trained.clean_accuracy:.3f}  noise patch {noise.accuracy:.3f}  trained patch {trained.accuracy:.3f}  "
        f"fooling {trained.fooling_rate:.3f} vs {noise.fooling_rate:.3f}"
    )
    assert trained.accuracy < noise.accuracy < trained.clean_accuracy


def test_size_curve_scores_each_models_own_patch_and_the_noise_control(demo_vit):
    images, labels = scenes(TRAIN_SEED, 8, demo_vit.spec.img_size[0])
    held, held_labels = scenes(HELD_OUT_SEED, 8, demo_vit.spec.img_size[0])
    calls = []
    curve = patch_size_curve(
        {"vit": demo_vit},
        images,
        labels,
        shares=(0.02, 0.05),
        eval_images=held,
        eval_labels=held_labels,
        epochs=1,
        batch_size=8,
        seed=3,
        progress=lambda done, total: calls.append((done, total)),
    )
    # per share: its one mini-batch of training, then its evaluation
    assert calls == [(1, 4), (2, 4), (3, 4), (4, 4)]
    for k, share in enumerate(curve.shares):
        found = curve.patches["vit"][k]
        assert found.side == patch_side((48, 48), share)
        own = evaluate_patch(demo_vit, held, held_labels, found, seed=3 + 1)
        noise = evaluate_patch(demo_vit, held, held_labels, noise_patch(found.side, seed=3 + 2), seed=3 + 1)
        assert curve.accuracy["vit"][k] == pytest.approx(own.accuracy)
        assert curve.fooling_rate["vit"][k] == pytest.approx(own.fooling_rate)
        assert curve.noise_accuracy["vit"][k] == pytest.approx(noise.accuracy)
        assert curve.noise_fooling_rate["vit"][k] == pytest.approx(noise.fooling_rate)
    assert curve.clean_accuracy["vit"] == pytest.approx(own.clean_accuracy)


def test_training_is_seeded_and_a_fixed_position_stays_put(demo_vit):
    images, labels = scenes(TRAIN_SEED, 4, demo_vit.spec.img_size[0])
    one = train_patch(demo_vit, images, labels, share=0.05, epochs=1, batch_size=4, optimiser="sign", seed=7)
    two = train_patch(demo_vit, images, labels, share=0.05, epochs=1, batch_size=4, optimiser="sign", seed=7)
    assert torch.equal(one.patch, two.patch)
    fixed = train_patch(demo_vit, images, labels, share=0.05, epochs=1, batch_size=4, position=(0, 0), target=2)
    assert fixed.position == (0, 0) and fixed.target == 2


def test_transfer_matrix_diagonal_is_each_models_own_accuracy(demo_vit):
    cnn = load_cnn("demo")
    images, labels = scenes(HELD_OUT_SEED, 12, demo_vit.spec.img_size[0])
    patches = {"vit": noise_patch(11, seed=0), "cnn": noise_patch(11, seed=1)}
    calls = []
    names, matrix = patch_transfer_matrix(
        {"vit": demo_vit, "cnn": cnn},
        patches,
        images,
        labels,
        seed=3,
        progress=lambda done, total: calls.append((done, total)),
    )
    assert names == ["vit", "cnn"] and calls == [(1, 4), (2, 4), (3, 4), (4, 4)]
    for i, source in enumerate(names):
        for j, model in enumerate((demo_vit, cnn)):
            assert matrix[i, j] == pytest.approx(
                evaluate_patch(model, images, labels, patches[source], seed=3).accuracy
            )


def test_typed_errors(demo_vit):
    images, labels = scenes(HELD_OUT_SEED, 2, demo_vit.spec.img_size[0])
    for share in (0, 1, -0.1, 1.5, float("nan")):
        with pytest.raises(PatchError, match="share"):
            patch_side((48, 48), share)
    with pytest.raises(PatchError, match="larger than"):
        paste_patch(torch.zeros((1, 3, 8, 8)), torch.zeros((3, 9, 9)), (0, 0))
    with pytest.raises(PatchError, match="inside"):
        paste_patch(torch.zeros((1, 3, 8, 8)), torch.zeros((3, 4, 4)), (5, 0))
    with pytest.raises(PatchError, match="No images"):
        train_patch(demo_vit, [], [], share=0.05)
    with pytest.raises(PatchError, match="share"):
        train_patch(demo_vit, images, labels, share=1.2)
    with pytest.raises(PatchError, match="larger than"):
        evaluate_patch(demo_vit, images, labels, torch.zeros((3, 60, 60)))
    with pytest.raises(PatchError, match="optimiser"):
        train_patch(demo_vit, images, labels, optimiser="sgd")
    with pytest.raises(PatchError, match="no attention"):
        patch_attention_share(load_cnn("demo"), images, torch.zeros((3, 4, 4)), (0, 0))
    assert issubclass(PatchError, Exception) and isinstance(
        AdversarialPatch(torch.zeros((3, 2, 2)), 0.01, (48, 48), None, None, "x", ()).side, int
    )
    assert np.isfinite(patch_side((48, 48), 0.5))


def test_evaluate_patch_at_given_positions_equals_the_seeded_draw_and_refuses_bad_ones(demo_vit):
    """positions= (one (top, left) per image) gives what the seed's own draw gives at those positions;
    a wrong count or a position off the image is a PatchError naming it."""
    images, labels = scenes(HELD_OUT_SEED, 6, demo_vit.spec.img_size[0])
    patch = noise_patch(11, seed=4)
    size = tuple(demo_vit.spec.img_size)
    drawn = random_patch_positions(6, size, 11, generator=torch.Generator().manual_seed(9))
    assert evaluate_patch(demo_vit, images, labels, patch, positions=drawn) == evaluate_patch(
        demo_vit, images, labels, patch, seed=9
    )
    with pytest.raises(PatchError, match="5 positions for 6 images"):
        evaluate_patch(demo_vit, images, labels, patch, positions=drawn[:5])
    off = drawn.clone()
    off[2] = torch.tensor([size[0] - 5, 0])
    with pytest.raises(PatchError, match="off the"):
        evaluate_patch(demo_vit, images, labels, patch, positions=off)
