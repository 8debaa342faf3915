"""Robustness perturbations: identities at level 0, exact selections, seeds, typed errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import analysis
from analysis import AnalysisError, capture_attention
from analysis.robustness import (
    IMAGENET_1K_CNNS,
    drop_pixels,
    gaussian_blur,
    gaussian_noise,
    patch_drop_indices,
    shuffle_grids,
    shuffle_patches,
    token_drop,
)
from conftest import random_pixels

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def demo():
    return analysis.load_vit("demo", device="cpu")


def test_token_drop_at_fraction_zero_and_shuffle_at_one_are_the_clean_logits(demo, vits):
    for vit in (demo, vits["registers"], vits["no_class_token"]):
        pixels = random_pixels(vit)
        with torch.no_grad():
            clean = vit.model(pixels)
            with token_drop(vit, patch_drop_indices(vit.spec, 0.0)):
                dropped = vit.model(pixels)
            shuffled = vit.model(shuffle_patches(pixels, vit.spec, 1))
        assert torch.equal(dropped, clean) and torch.equal(shuffled, clean)
        for module in vit.model.modules():
            assert not module._forward_hooks


def test_token_drop_removes_exactly_the_chosen_tokens(demo, vits):
    vit = vits["registers"]
    spec = vit.spec
    pixels = random_pixels(vit)
    dropped = patch_drop_indices(spec, 0.5, seed=3)
    seen = []
    handle = vit.model.blocks[0].register_forward_pre_hook(lambda m, a: seen.append(a[0].shape[1]))
    try:
        with torch.no_grad(), token_drop(vit, dropped):
            vit.model(pixels)
        with torch.no_grad(), token_drop(vit, patch_drop_indices(spec, 1.0)):
            vit.model(pixels)  # everything dropped: only the prefix tokens remain
    finally:
        handle.remove()
    assert seen == [spec.num_tokens - len(dropped), spec.num_prefix_tokens]
    # the kept tokens are the reference model's own tokens at those positions
    keep = torch.ones(spec.num_tokens, dtype=torch.bool)
    keep[spec.num_prefix_tokens + dropped] = False
    model = vit.model
    with torch.no_grad():
        x = model._pos_embed(model.patch_embed(pixels))[:, keep]
        x = model.norm_pre(x)
        for block in model.blocks:
            x = block(x)
        expected = model.forward_head(model.norm(x))
        with token_drop(vit, dropped):
            got = model(pixels)
    torch.testing.assert_close(got, expected)


def test_random_drops_are_reproducible_by_seed(demo):
    spec = demo.spec
    a, b, c = (patch_drop_indices(spec, 0.3, seed=s) for s in (7, 7, 8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert len(a) == round(0.3 * spec.num_patches) and len(set(a.tolist())) == len(a)
    assert len(patch_drop_indices(spec, 1.0)) == spec.num_patches and len(patch_drop_indices(spec, 0.0)) == 0


def test_foreground_drop_on_a_demo_scene_removes_exactly_the_mask(demo):
    from analysis.demo.data import generate_samples
    from analysis.faithfulness import patch_mask

    images, _, masks = generate_samples(1, 99)
    spec = demo.spec
    object_patches = patch_mask(masks[0], spec.patch_size, spec.grid_size)
    dropped = patch_drop_indices(spec, 1.0, selection="foreground", mask=object_patches)
    assert sorted(dropped.tolist()) == np.flatnonzero(object_patches).tolist()
    pixels = demo.preprocess(images[0])
    out = drop_pixels(pixels, spec, dropped)
    (ph, pw), gw = spec.patch_size, spec.grid_size[1]
    for index in range(spec.num_patches):
        r, c = divmod(index, gw)
        block = out[..., r * ph : (r + 1) * ph, c * pw : (c + 1) * pw]
        original = pixels[..., r * ph : (r + 1) * ph, c * pw : (c + 1) * pw]
        assert torch.equal(block, torch.zeros_like(block) if object_patches.flat[index] else original)
    background = patch_drop_indices(spec, 1.0, selection="background", mask=object_patches)
    assert set(background.tolist()) | set(dropped.tolist()) == set(range(spec.num_patches))
    assert not set(background.tolist()) & set(dropped.tolist())


def test_salient_drops_follow_the_map(demo):
    saliency = torch.arange(demo.spec.num_patches, dtype=torch.float32).reshape(demo.spec.grid_size)
    most = patch_drop_indices(demo.spec, 0.25, selection="most_salient", saliency=saliency)
    least = patch_drop_indices(demo.spec, 0.25, selection="least_salient", saliency=saliency)
    n = demo.spec.num_patches
    assert most.tolist() == list(range(n - 1, n - 1 - len(most), -1)) and least.tolist() == list(range(len(least)))


def test_shuffle_permutes_whole_blocks(demo):
    spec = demo.spec  # 8 x 8 patches
    assert shuffle_grids(spec) == [1, 2, 4, 8]
    pixels = torch.arange(2 * 3 * 48 * 48, dtype=torch.float32).reshape(2, 3, 48, 48)
    shuffled = shuffle_patches(pixels, spec, 4, seed=1)

    def blocks(x):
        return {
            tuple(x[0, :, r * 12 : (r + 1) * 12, c * 12 : (c + 1) * 12].flatten()[:3].tolist())
            for r in range(4)
            for c in range(4)
        }

    assert blocks(shuffled) == blocks(pixels) and not torch.equal(shuffled, pixels)
    assert torch.equal(shuffle_patches(pixels, spec, 4, seed=1), shuffled)
    assert sorted(shuffled.flatten().tolist()) == sorted(pixels.flatten().tolist())


def test_noise_and_blur():
    pixels = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    assert torch.equal(gaussian_noise(pixels, 0.0), pixels) and torch.equal(gaussian_blur(pixels, 0), pixels)
    noisy = gaussian_noise(pixels, 0.5, seed=2)
    assert torch.equal(noisy, gaussian_noise(pixels, 0.5, seed=2))
    assert float((noisy - pixels).std()) == pytest.approx(0.5, rel=0.15)
    constant = torch.full((1, 3, 16, 16), 0.7)
    torch.testing.assert_close(gaussian_blur(constant, 2.0), constant)  # a blur keeps flat images flat
    assert float(gaussian_blur(pixels, 2.0).std()) < float(pixels.std())


def test_bad_perturbations_are_typed_errors(demo):
    from families import FAMILIES

    spec = demo.spec
    with pytest.raises(AnalysisError, match=r"\[0, 1\]"):
        patch_drop_indices(spec, 1.5)
    with pytest.raises(AnalysisError, match="use one of \\[1, 2, 4, 8\\]"):
        shuffle_patches(torch.zeros(1, 3, 48, 48), spec, 3)
    with pytest.raises(AnalysisError, match="saliency"):
        patch_drop_indices(spec, 0.5, selection="most_salient")
    with pytest.raises(AnalysisError, match="CNN"):
        with token_drop(object(), []):
            pass
    arch, kwargs, _, _ = FAMILIES["eva02"]
    eva = analysis.load_vit(arch, pretrained=False, device="cpu", **kwargs)
    with pytest.raises(AnalysisError, match="Drop pixels instead"):
        with token_drop(eva, []):
            pass
    with pytest.raises(AnalysisError, match="sigma"):
        gaussian_noise(torch.zeros(1), -1.0)
    capture_attention(demo, random_pixels(demo))  # the model still works afterwards


def test_a_curve_starts_at_the_clean_accuracy_and_matches_a_loop(demo):
    from analysis.demo.data import generate_samples
    from analysis.robustness import robustness_curve

    images, labels, _ = generate_samples(6, 123)
    pixels = [demo.preprocess(image)[0] for image in images]
    with torch.no_grad():
        predictions = [int(demo.model(p[None]).argmax()) for p in pixels]
    clean_accuracy = np.mean([p == y for p, y in zip(predictions, labels)])
    done = []
    curve = robustness_curve(
        demo, images, "token_drop", [0.0, 0.5, 1.0], labels, seed=5, progress=lambda d, t: done.append((d, t))
    )
    assert curve.metric == "accuracy" and curve.images == 6 and done[-1] == (6, 6)
    assert curve.score[0] == pytest.approx(clean_accuracy)
    # the shorter sequence's attention summary; at fraction 1 no patch is left to summarise
    assert np.isfinite(curve.attention_distance[:2]).all() and np.isnan(curve.attention_distance[2])
    assert np.isnan(curve.rollout_entropy[2])
    first = demo.preprocess(images[0])
    clean_record = capture_attention(demo, first)
    one = robustness_curve(demo, [first[0]], "token_drop", [0.0], None)
    assert one.attention_distance[0] == pytest.approx(float(analysis.mean_attention_distance(clean_record).mean()))
    # level 0.5 by a loop over the images with the same seeds
    hits = 0
    for i, p in enumerate(pixels):
        with torch.no_grad(), token_drop(demo, patch_drop_indices(demo.spec, 0.5, seed=5 + i)):
            hits += int(demo.model(p[None]).argmax()) == labels[i]
    assert curve.score[1] == pytest.approx(hits / 6)
    agreement = robustness_curve(demo, pixels, "pixel_drop", [0.0, 0.25], None)
    assert agreement.metric == "agreement" and agreement.score[0] == 1.0
    assert np.isfinite(agreement.attention_distance).all() and np.isfinite(agreement.rollout_entropy).all()
    # entropy: a uniform rollout over N patches has log N nats
    from analysis.robustness.curves import _entropy

    assert float(_entropy(torch.ones(1, 4, 4))[0]) == pytest.approx(np.log(16))


def test_bad_curves_are_typed_errors(demo, vits):
    from analysis.robustness import robustness_curve

    image = demo.preprocess(analysis.load_image(REPO / "assets" / "samples" / "scene_0_bar.png"))[0]
    with pytest.raises(AnalysisError, match="perturbation"):
        robustness_curve(demo, [image], "rotate", [0])
    with pytest.raises(AnalysisError, match="levels is empty"):
        robustness_curve(demo, [image], "noise", [])
    with pytest.raises(AnalysisError, match="whole grid"):
        robustness_curve(demo, [image], "shuffle", [2.5])
    with pytest.raises(AnalysisError, match="class head"):
        robustness_curve(vits["registers"], [random_pixels(vits["registers"])[0]], "noise", [0.0])
    with pytest.raises(AnalysisError, match=r"\[0, 1\]"):
        robustness_curve(demo, [image], "pixel_drop", [1.2])


def test_the_demo_cnn_runs_the_pixel_probes_and_refuses_token_drop(demo):
    from analysis.demo.data import generate_samples
    from analysis.robustness import load_cnn, robustness_curve

    cnn = load_cnn("demo")
    assert cnn.spec.grid_size == demo.spec.grid_size and cnn.spec.patch_size == demo.spec.patch_size
    assert cnn.class_names == demo.class_names
    images, labels, _ = generate_samples(5, 321)
    pixels = [cnn.preprocess(image)[0] for image in images]
    with torch.no_grad():
        clean = np.mean([int(cnn.model(p[None]).argmax()) == y for p, y in zip(pixels, labels)])
    curve = robustness_curve(cnn, images, "pixel_drop", [0.0, 0.5], labels)
    assert curve.score[0] == pytest.approx(clean) and np.isnan(curve.attention_distance).all()
    shuffled = robustness_curve(cnn, images, "shuffle", [1, 2], labels)
    assert shuffled.score[0] == pytest.approx(clean)
    with pytest.raises(AnalysisError, match="drop pixels"):
        robustness_curve(cnn, images, "token_drop", [0.5], labels)
    with pytest.raises(analysis.ModelLoadError, match="transformer"):
        load_cnn("vit_tiny_patch16_224", pretrained=False)
    random_cnn = load_cnn("test_resnet", pretrained=False)
    assert random_cnn.spec.patch_size == (16, 16) and random_cnn.spec.num_outputs == 1000


def test_token_drop_attention_reads_the_shorter_sequence(demo, vits):
    from analysis.robustness import kept_attention_distance, kept_rollout, token_drop_attention

    for vit in (demo, vits["registers"]):
        pixels = random_pixels(vit, batch=2)
        clean = token_drop_attention(vit, pixels, [])  # nothing dropped: the full capture exactly
        record = capture_attention(vit, pixels)
        assert torch.equal(clean.logits, record.logits) and torch.equal(clean.attentions, record.attentions)
        assert torch.allclose(kept_rollout(clean), analysis.attention_rollout(record), atol=1e-6)
        assert torch.allclose(kept_attention_distance(clean), analysis.mean_attention_distance(record))
        dropped = patch_drop_indices(vit.spec, 0.5, seed=4)
        passed = token_drop_attention(vit, pixels, dropped)
        prefix = vit.spec.num_prefix_tokens
        kept_tokens = prefix + vit.spec.num_patches - len(dropped)
        assert passed.attentions.shape == (vit.spec.num_layers, 2, vit.spec.num_heads, kept_tokens, kept_tokens)
        with torch.no_grad(), token_drop(vit, dropped):  # P·v from the recorded P: equal to float rounding
            torch.testing.assert_close(passed.logits, vit.model(pixels), rtol=1e-5, atol=1e-5)
        # reference: the class row of a hand-rolled product over the kept tokens, by explicit loops
        reference = None
        for layer in range(vit.spec.num_layers):
            a = passed.attentions[layer].double().mean(1)  # (B, T', T')
            a = 0.5 * a + 0.5 * torch.eye(kept_tokens, dtype=torch.float64)
            a = a / a.sum(-1, keepdim=True)
            reference = a if reference is None else a @ reference
        grid = kept_rollout(passed)  # (B, gh, gw)
        flat = grid.reshape(2, -1)
        assert flat.isnan().sum(1).tolist() == [len(dropped)] * 2
        assert torch.isnan(flat[:, dropped]).all()
        kept_patches = [p for p in range(vit.spec.num_patches) if p not in set(dropped.tolist())]
        assert torch.allclose(flat[:, kept_patches].double(), reference[:, 0, prefix:], atol=1e-6)
        # distance reference: explicit loops over kept patch queries and keys, original centres
        ph, pw = vit.spec.patch_size
        gw = vit.spec.grid_size[1]
        centre = {p: ((p // gw + 0.5) * ph, (p % gw + 0.5) * pw) for p in kept_patches}
        expected = torch.zeros(vit.spec.num_layers, vit.spec.num_heads, dtype=torch.float64)
        for layer in range(vit.spec.num_layers):
            for head in range(vit.spec.num_heads):
                total = 0.0
                for b in range(2):
                    for qi, q in enumerate(kept_patches):
                        row = passed.attentions[layer, b, head, prefix + qi, prefix:].double()
                        row = row / row.sum()
                        total += sum(
                            float(row[ki]) * float(np.hypot(centre[q][0] - centre[k][0], centre[q][1] - centre[k][1]))
                            for ki, k in enumerate(kept_patches)
                        )
                expected[layer, head] = total / (2 * len(kept_patches))
        assert torch.allclose(kept_attention_distance(passed), expected, atol=1e-9)
        for module in vit.model.modules():
            assert not module._forward_hooks and not module._forward_pre_hooks


def test_cnn_gradcam_is_the_class_activation_map_for_a_pooled_linear_head():
    """For global average pooling then a linear layer, Grad-CAM's weights are W[target] / (h·w),
    so the map is relu(Σ_c W[target, c] F_c) / (h·w): Zhou et al.'s CAM."""
    from analysis.robustness import cnn_gradcam, load_cnn

    cnn = load_cnn("demo")
    pixels = torch.randn(3, 3, *cnn.spec.img_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        features = cnn.model.forward_features(pixels)  # (B, C, h, w)
        predicted = cnn.model(pixels).argmax(-1)
    weight = cnn.model.get_classifier().weight  # (classes, C)
    h, w = features.shape[-2:]
    for target in (None, 2):
        maps = cnn_gradcam(cnn, pixels, target)
        classes = predicted if target is None else torch.full((3,), target)
        expected = torch.relu(torch.einsum("bc,bchw->bhw", weight[classes], features)) / (h * w)
        assert maps.shape == (3, h, w) and torch.allclose(maps, expected, atol=1e-6)
    with pytest.raises(AnalysisError, match="classes"):
        cnn_gradcam(cnn, pixels, 99)


def test_the_benchmark_command_prints_the_table(capsys):  # the demo pair: the same 6 classes
    from analysis.robustness.__main__ import main

    assert main(["--n", "6"]) == 0
    out = capsys.readouterr().out
    for row in ("ViT token drop", "ViT pixel drop", "CNN pixel drop", "ViT shuffle", "CNN shuffle", "chance"):
        assert row in out
    assert "90%" in out and "g=8" in out


def test_the_benchmark_command_refuses_models_with_different_classes(capsys, monkeypatch, tmp_path):
    import analysis.robustness.__main__ as command

    imagenet_vit = analysis.load_vit("vit_tiny_patch16_224", pretrained=False, img_size=32)  # 1000 ImageNet classes
    monkeypatch.setattr(analysis, "load_vit", lambda source: imagenet_vit)
    with pytest.raises(SystemExit):
        command.main(["--vit", "an-imagenet-vit", "--cnn", "demo", "--images", str(tmp_path)])
    error = capsys.readouterr().err
    assert (
        "The ViT predicts the 1000 ImageNet-1k classes; the CNN predicts 6 classes (circle, ring, bar, triangle, "
        "cross, star): not the same classes"
    ) in error and "--cnn" in error


@pytest.mark.parametrize("name", IMAGENET_1K_CNNS)
def test_the_offered_imagenet_cnns_predict_imagenet_1k_and_give_a_grad_cam(name):
    """What the app offers beside an ImageNet-1k ViT: each is a timm CNN with pretrained ImageNet-1k
    weights on the hub (here built with random weights, offline), named with the ImageNet-1k classes."""
    import timm

    from analysis import IMAGENET_1K, label_space
    from analysis.robustness import cnn_gradcam, load_cnn

    architecture, _, tag = name.partition(".")
    assert tag.endswith("in1k") and name in timm.list_pretrained(f"{architecture}.*")
    cnn = load_cnn(name, pretrained=False)
    assert label_space(cnn).known == IMAGENET_1K
    cam = cnn_gradcam(cnn, torch.randn(1, 3, *cnn.spec.img_size))
    assert cam.ndim == 3 and cam.shape[0] == 1 and torch.isfinite(cam).all()


def test_probe_shows_what_the_model_saw(demo):
    from analysis.robustness import check_token_drop, load_cnn, probe

    cnn = load_cnn("demo")
    image = analysis.load_image(REPO / "assets" / "samples" / "scene_1_star.png")
    pixels = demo.preprocess(image)
    record = capture_attention(demo, pixels)
    clean = probe(demo, pixels, "pixel_drop", 0.0)
    assert torch.equal(clean.logits, record.logits) and torch.equal(clean.pixels, pixels) and len(clean.dropped) == 0
    assert torch.allclose(clean.saliency, analysis.attention_rollout(record)[0])
    dropped = probe(demo, pixels, "token_drop", 0.5, seed=3)
    assert torch.equal(dropped.pixels, pixels) and len(dropped.dropped) == 32
    assert torch.isnan(dropped.saliency.reshape(-1)[dropped.dropped]).all()
    salient = probe(demo, pixels, "pixel_drop", 0.25, selection="most_salient", saliency=clean.saliency)
    assert set(salient.dropped.tolist()) == set(torch.argsort(-clean.saliency.reshape(-1))[:16].tolist())
    cnn_pixels = cnn.preprocess(image)
    on_cnn = probe(cnn, cnn_pixels, "pixel_drop", 0.5, seed=3)
    assert torch.equal(on_cnn.dropped, dropped.dropped)  # the same grid and seed: the same patches
    assert on_cnn.saliency.shape == (2, 2)
    for bad in (lambda: probe(cnn, cnn_pixels, "token_drop", 0.5), lambda: check_token_drop(cnn)):
        with pytest.raises(AnalysisError, match="drop pixels"):
            bad()


def test_to_image_inverts_the_preprocessing_exactly(demo, vits):
    """What the Robustness page shows as the model's input: x·std + mean, back to uint8."""
    image = analysis.load_image(REPO / "assets" / "samples" / "cat_chelsea.jpg")
    for vit in (demo, vits["registers"]):
        shown = vit.preprocessing.to_image(vit.preprocess(image))
        np.testing.assert_array_equal(shown, np.asarray(vit.model_input_image(image)))
