"""Universal adversarial patches (analysis.robustness.adversarial_patch): pasting against explicit slicing, the
attention share on the patch against an explicit loop over the record, the step budget against a loop written
out, the default patches against a noise patch on held-out demo scenes (disjoint from the training scenes), a
targeted patch's loss and its target-hit rate against a count by hand, and the typed errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from analysis import load_vit
from analysis.cli.robustness import BENCHMARK_SEED
from analysis.demo.data import render_sample
from analysis.robustness import load_cnn
from analysis.robustness.adversarial_patch import (
    PATCH_SHARE,
    PATCH_STEPS,
    PATCH_TRAIN_SCENES,
    PATCH_TRAIN_SEED,
    AdversarialPatch,
    PatchError,
    demo_patch_scenes,
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
    unit_images,
)

TRAIN_SEED = 5151  # the patch's training scenes: not a training or validation stream of the demo models
HELD_OUT_SEED = 4242  # the scenes it is scored on: another stream again
RING = 1  # the target class of the targeted patches (a demo class every demo model can be pushed towards)


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


def test_default_patches_beat_a_noise_patch_on_held_out_scenes(demo_vit):
    """The default settings (a 10% patch, 15 px on the 48 px scenes; 150 Adam steps of 32 of the 512
    training scenes of stream 5151) against the same-size noise patch at the same random positions, on 200
    held-out scenes of the command line's stream (20261204), for the demo ViT and the demo CNN: what
    ``python -m analysis robustness patch --model demo --cnn demo --demo-scenes 200 --out patch.npz``
    prints. Measured: ViT 0.615 against noise 0.695 (8.0 points), CNN 0.625 against 0.785 (16.0 points),
    clean 0.925 and 1.000. The acceptance: the trained patch lowers held-out accuracy at least 5 points
    more than the noise patch on one of the two models at least (pytest -s prints the numbers)."""
    scenes = demo_patch_scenes(200, BENCHMARK_SEED)
    calls = []
    curve = patch_size_curve(
        {"ViT": demo_vit, "CNN": load_cnn("demo")},
        scenes.train_images,
        scenes.train_labels,
        shares=(PATCH_SHARE,),
        eval_images=scenes.held_out_images,
        eval_labels=scenes.held_out_labels,
        seed=BENCHMARK_SEED,
        progress=lambda done, total: calls.append((done, total)),
    )
    total = 2 * (PATCH_STEPS + 1)  # per model: its training's steps, then its evaluation
    assert calls[-1] == (total, total) and [d for d, _ in calls] == sorted(d for d, _ in calls)
    margins = {}
    for name in ("ViT", "CNN"):
        (found,) = curve.patches[name]
        assert found.side == 15 and found.steps == PATCH_STEPS
        own, noise = float(curve.accuracy[name][0]), float(curve.noise_accuracy[name][0])
        margins[name] = noise - own
        print(
            f"{name}: clean {curve.clean_accuracy[name]:.3f}  trained patch {own:.3f}  noise patch {noise:.3f}  "
            f"margin {100 * margins[name]:.1f} points"
        )
    assert max(margins.values()) >= 0.05, margins


def test_a_targeted_patch_lowers_its_loss(demo_vit):
    """The loss of a targeted patch is the target's cross-entropy, lowered: at the default settings on the demo
    ViT (class 1, ring; the default 512 training scenes; seed 0), the mean over the last 10 of the 150 steps
    lies well below the mean over the first 10 (measured 2.695 and 1.738; the command line's targeted run,
    another seed, hits ring on 0.495 of its held-out scenes against 0.275 with the noise patch)."""
    scenes = demo_patch_scenes(1, BENCHMARK_SEED)
    found = train_patch(demo_vit, scenes.train_images, scenes.train_labels, target=RING, seed=0)
    losses = np.array(found.losses)
    assert found.target == RING and losses.shape == (PATCH_STEPS,) and np.isfinite(losses).all()
    first, last = losses[:10].mean(), losses[-10:].mean()
    print(f"targeted loss: first 10 steps {first:.3f}, last 10 steps {last:.3f}")
    assert last < first - 0.3, (first, last)


def test_the_target_hit_rate_is_a_count_of_the_predictions():
    """target_rate is the share of patched images whose top-1 prediction is the target, counted here by hand
    over the predictions (the patch written into each image by slicing, at the same positions), for a
    targeted patch of the demo CNN (60 steps) and for the noise patch; patch_size_curve's target rates are
    the same counts."""
    cnn = load_cnn("demo")
    train, train_labels = scenes(TRAIN_SEED, 128, 48)
    images, labels = scenes(HELD_OUT_SEED, 40, 48)
    patch = train_patch(cnn, train, train_labels, target=RING, steps=60, seed=0)
    where = random_patch_positions(40, (48, 48), patch.side, generator=torch.Generator().manual_seed(5))
    noise = noise_patch(patch.side, seed=6)

    def hand_count(square) -> tuple[float, int]:
        hits = 0
        for b, image in enumerate(images):
            unit = unit_images(cnn, [image])
            top, left = (int(v) for v in where[b])
            unit[0, :, top : top + patch.side, left : left + patch.side] = square
            with torch.no_grad():
                predicted = int(cnn.model(cnn.preprocessing.normalise(unit)).argmax(-1))
            hits += predicted == RING
        return hits / len(images), hits

    own, own_hits = hand_count(patch.patch)
    control, _ = hand_count(noise)
    assert evaluate_patch(cnn, images, labels, patch, positions=where).target_rate == pytest.approx(own, abs=1e-6)
    assert evaluate_patch(cnn, images, labels, noise, positions=where, target=RING).target_rate == pytest.approx(
        control, abs=1e-6
    )
    assert evaluate_patch(cnn, images, labels, noise, positions=where).target_rate is None  # no target, no rate
    print(f"target-hit rate {own:.3f} ({own_hits} of 40), noise {control:.3f}")
    assert own > control  # the targeted patch hits its target more often than noise does
    # patch_size_curve: one short targeted training, its rates against counts at its own positions
    curve = patch_size_curve(
        {"cnn": cnn}, train[:8], train_labels[:8], shares=(0.05,), eval_images=images, eval_labels=labels,
        target=RING, steps=2, batch_size=4, seed=3,
    )  # fmt: skip
    (short,) = curve.patches["cnn"]
    drawn = random_patch_positions(40, (48, 48), short.side, generator=torch.Generator().manual_seed(3 + 1))
    for square, rate in (
        (short.patch, curve.target_rate),
        (noise_patch(short.side, seed=3 + 2), curve.noise_target_rate),
    ):
        pasted = paste_patch(unit_images(cnn, images), square, drawn)
        with torch.no_grad():
            predicted = cnn.model(cnn.preprocessing.normalise(pasted)).argmax(-1)
        assert rate is not None and rate["cnn"][0] == pytest.approx(int((predicted == RING).sum()) / 40, abs=1e-6)
    assert curve.target == RING
    untargeted = patch_size_curve({"cnn": cnn}, train[:8], train_labels[:8], shares=(0.05,), steps=1, batch_size=8)
    assert untargeted.target is None and untargeted.target_rate is None and untargeted.noise_target_rate is None


def test_held_out_scenes_are_disjoint_from_the_training_scenes():
    """demo_patch_scenes: the training scenes are samples 0..n−1 of stream 5151, the held-out ones samples
    0..m−1 of the seed's stream, and no held-out scene equals a training scene pixel for pixel (here: the
    command line's default sets); the training stream as the held-out one is refused."""
    found = demo_patch_scenes(200, BENCHMARK_SEED)
    assert len(found.train_images) == PATCH_TRAIN_SCENES == 512 and len(found.held_out_images) == 200
    train = [np.asarray(image) for image in found.train_images]
    held = [np.asarray(image) for image in found.held_out_images]
    for i in (0, 511):
        image, label, _ = render_sample(PATCH_TRAIN_SEED, i)
        assert np.array_equal(train[i], image) and found.train_labels[i] == label
    image, label, _ = render_sample(BENCHMARK_SEED, 199)
    assert np.array_equal(held[199], image) and found.held_out_labels[199] == label
    assert not {a.tobytes() for a in train} & {a.tobytes() for a in held}
    assert len({a.tobytes() for a in held}) == 200  # and 200 different scenes
    with pytest.raises(PatchError, match="train on"):
        demo_patch_scenes(10, PATCH_TRAIN_SEED)
    with pytest.raises(PatchError, match="at least"):
        demo_patch_scenes(0, 1)


def test_a_held_out_scene_equal_to_a_training_scene_is_refused(monkeypatch):
    """Another stream whose scene 2 were training scene 7 (pixel for pixel) is refused, naming it."""
    from analysis.demo.data import generate_arrays
    from analysis.robustness import adversarial_patch

    def colliding(n, seed, **kwargs):
        images, labels, masks = generate_arrays(n, seed, **kwargs)
        if seed != PATCH_TRAIN_SEED:
            images[2] = generate_arrays(1, PATCH_TRAIN_SEED, start=7)[0][0]
        return images, labels, masks

    monkeypatch.setattr(adversarial_patch, "generate_arrays", colliding)
    with pytest.raises(PatchError, match=r"Held-out scenes \[2\] of stream 4242 equal training scenes"):
        demo_patch_scenes(5, HELD_OUT_SEED, train_scenes=10)


def test_the_step_budget_equals_a_reference_loop(demo_vit):
    """steps=5 of batch_size=2 over 3 images crosses two passes (batches of 2, 1 | 2, 1 | 2), each pass a new
    seeded shuffle, each image at its own random position: the patch and the losses equal a loop written out
    here (signed steps, so the reference is exact). epochs=2 is 2·⌈3/2⌉ = 4 steps, the same start."""
    images, labels = scenes(TRAIN_SEED, 3, 48)
    unit = unit_images(demo_vit, images)
    truth = torch.tensor(labels)
    side, step = patch_side((48, 48), 0.05), 0.01
    generator = torch.Generator().manual_seed(11)
    patch = torch.rand((3, side, side), generator=generator)
    expected = []
    while len(expected) < 5:
        order = torch.randperm(3, generator=generator)
        for batch in (order[:2], order[2:]):
            if len(expected) == 5:
                break
            where = random_patch_positions(len(batch), (48, 48), side, generator=generator)
            square = patch.clone().requires_grad_(True)
            logits = demo_vit.model(demo_vit.preprocessing.normalise(paste_patch(unit[batch], square, where)))
            loss = torch.nn.functional.cross_entropy(logits, truth[batch])
            (gradient,) = torch.autograd.grad(-loss, square)
            patch = (patch - step * gradient.sign()).clamp(0, 1)
            expected.append(float(loss.detach()))
    calls = []
    found = train_patch(
        demo_vit, images, labels, share=0.05, steps=5, batch_size=2, optimiser="sign", step_size=step, seed=11,
        progress=lambda done, total: calls.append((done, total)),
    )  # fmt: skip
    assert torch.allclose(found.patch, patch, atol=1e-6)
    np.testing.assert_allclose(found.losses, expected, rtol=1e-5)
    assert calls == [(done, 5) for done in range(1, 6)]
    by_epochs = train_patch(
        demo_vit, images, labels, share=0.05, epochs=2, batch_size=2, optimiser="sign", step_size=step, seed=11
    )
    assert by_epochs.steps == 4
    np.testing.assert_allclose(by_epochs.losses, expected[:4], rtol=1e-5)
    with pytest.raises(PatchError, match="one way"):
        train_patch(demo_vit, images, labels, steps=2, epochs=1)
    with pytest.raises(PatchError, match="at least one step"):
        train_patch(demo_vit, images, labels, steps=0)


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
