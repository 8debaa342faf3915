"""Direct logit attribution, head ablation and activation patching (issue 26, step 2), each
against a slow reference: explicit loops over tokens and heads, a deep copy with edited
weights, and single unbatched runs."""

from __future__ import annotations

import copy

import pytest
import torch

from analysis import AnalysisError, load_vit
from analysis.circuits import (
    activation_patching,
    cumulative_head_ablation,
    direct_logit_attribution,
    head_ablation,
    heads_by_effect,
)
from analysis.engine.activations import run_with_cache, run_with_hooks
from families import family_pixels

LINEAR_READOUT = ["vit", "hybrid", "clip", "beit", "relpos", "srelpos", "rope_reg1_gap", "rope_mixed", "naflex"]


@pytest.fixture(scope="module")
def demo():
    return load_vit("demo")


def _demo_pixels(count: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randn(count, 3, 48, 48, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", LINEAR_READOUT)
def test_direct_logit_attribution_sums_to_the_logit(family, family_vits):
    vit = family_vits[family]
    attribution = direct_logit_attribution(vit, family_pixels(family))
    torch.testing.assert_close(attribution.total(), attribution.target_logit, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        logits = vit.model(family_pixels(family)).float()
    torch.testing.assert_close(attribution.target_logit, logits.max(-1).values, rtol=1e-5, atol=1e-5)


def _frozen_layer_norm_linear(norm, vector, sigma):
    """γ ⊙ (v − mean v) / σ, one vector at a time (no shift)."""
    if norm is None or isinstance(norm, torch.nn.Identity):
        return vector
    return norm.weight * (vector - vector.mean()) / sigma


@pytest.mark.parametrize("family", ["vit", "beit"])  # class-token readout; mean pooling + fc_norm
def test_each_heads_term_equals_an_explicit_loop_over_tokens(family, family_vits):
    vit = family_vits[family]
    pixels = family_pixels(family, batch=1)
    attribution = direct_logit_attribution(vit, pixels)
    model, layers = vit.model, vit.spec.num_layers
    cache = run_with_cache(vit, pixels, names=[f"blocks.{layers - 1}.resid_post", "blocks.1.attn.z"])
    final = cache[f"blocks.{layers - 1}.resid_post"][0]  # (T, D)
    z = cache["blocks.1.attn.z"][0]  # (T, heads, d)
    target = int(attribution.targets[0])
    norm = model.norm if not isinstance(model.norm, torch.nn.Identity) else None
    fc_norm = model.fc_norm if not isinstance(model.fc_norm, torch.nn.Identity) else None
    tokens = final.shape[0]
    prefix = vit.spec.num_prefix_tokens
    pooled_tokens = [0] if model.global_pool == "token" else list(range(prefix, tokens))
    sigma = [((final[t].var(unbiased=False) + norm.eps).sqrt() if norm is not None else None) for t in range(tokens)]
    normed = torch.stack([norm(final[t]) if norm is not None else final[t] for t in range(tokens)])
    pooled = normed[pooled_tokens].mean(0)
    fc_sigma = (pooled.var(unbiased=False) + fc_norm.eps).sqrt() if fc_norm is not None else None
    block = model.blocks[1]
    gamma = (
        block.ls1.gamma if hasattr(block, "ls1") and hasattr(block.ls1, "gamma") else getattr(block, "gamma_1", None)
    )
    heads, dim = z.shape[1], z.shape[2]
    weight = block.attn.proj.weight
    for head in range(heads):
        for token in range(tokens):
            written = sum(weight[:, head * dim + j] * z[token, head, j] for j in range(dim))  # (D,)
            if gamma is not None:
                written = written * gamma
            expected = 0.0
            if token in pooled_tokens:
                share = _frozen_layer_norm_linear(norm, written, sigma[token]) / len(pooled_tokens)
                expected = float(model.head.weight[target] @ _frozen_layer_norm_linear(fc_norm, share, fc_sigma))
            assert attribution.heads[0, 1, head, token].item() == pytest.approx(expected, abs=1e-5)


def test_a_logit_difference_is_the_difference_of_two_attributions(demo):
    pixels = _demo_pixels()
    both = direct_logit_attribution(demo, pixels, target=2, versus=5)
    first, second = direct_logit_attribution(demo, pixels, target=2), direct_logit_attribution(demo, pixels, target=5)
    torch.testing.assert_close(both.heads, first.heads - second.heads, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(both.total(), both.target_logit, rtol=1e-4, atol=1e-4)
    assert both.targets.tolist() == [[2, 5], [2, 5]]


@pytest.mark.parametrize(
    "family, reason",
    [
        ("relpos_rpn", "post-norm"),
        ("deit_distilled", "distilled"),
        ("siglip", "none head"),
        ("pe_core", "embedding head"),
    ],
)
def test_direct_logit_attribution_refuses_readouts_that_are_not_linear(family, reason, family_vits):
    with pytest.raises(AnalysisError, match=reason):
        direct_logit_attribution(family_vits[family], family_pixels(family))


def test_an_attention_pooling_classifier_is_refused_with_the_reason():
    vit = load_vit("vit_tiny_patch16_224", pretrained=False, img_size=32, depth=1, global_pool="map", num_classes=3)
    with pytest.raises(AnalysisError, match="pools its tokens with attention"):
        direct_logit_attribution(vit, torch.randn(1, 3, 32, 32))


def test_zero_ablation_equals_zeroed_projection_columns(demo):
    pixels = _demo_pixels()
    ablation = head_ablation(demo, pixels, method="zero")
    assert ablation.delta_logit.shape == (2, 4, 4)
    dim = demo.model.blocks[0].attn.proj.in_features // 4
    for layer, head in [(0, 0), (2, 3), (3, 1)]:
        twin = copy.deepcopy(demo.model)
        with torch.no_grad():
            twin.blocks[layer].attn.proj.weight[:, head * dim : (head + 1) * dim] = 0
            logits = twin(pixels).float()
        expected = logits.gather(1, ablation.targets[:, None])[:, 0] - ablation.clean_logit
        torch.testing.assert_close(ablation.delta_logit[:, layer, head], expected, rtol=1e-5, atol=1e-5)
        probability = logits.softmax(-1).gather(1, ablation.targets[:, None])[:, 0] - ablation.clean_probability
        torch.testing.assert_close(ablation.delta_probability[:, layer, head], probability, rtol=1e-5, atol=1e-6)


def test_mean_ablation_equals_a_per_token_bias_built_from_explicit_loops(demo):
    """Replacing head h's output by its mean m over the reference images adds W_h·m_t at token
    t: reproduced on a copy with h's columns zeroed and that bias added by a plain hook."""
    pixels, reference = _demo_pixels(2, seed=1), _demo_pixels(3, seed=2)
    layer, head = 1, 2
    ablation = head_ablation(demo, pixels, method="mean", reference=reference)
    per_image = [
        run_with_cache(demo, reference[i : i + 1], names=[f"blocks.{layer}.attn.z"])[f"blocks.{layer}.attn.z"][0]
        for i in range(3)
    ]
    mean = sum(per_image) / 3  # (T, heads, d)
    projection = demo.model.blocks[layer].attn.proj
    dim = projection.in_features // 4
    twin = copy.deepcopy(demo.model)
    columns = projection.weight[:, head * dim : (head + 1) * dim].detach().clone()
    with torch.no_grad():
        twin.blocks[layer].attn.proj.weight[:, head * dim : (head + 1) * dim] = 0
    added = mean[:, head] @ columns.T  # (T, D)
    handle = twin.blocks[layer].attn.proj.register_forward_hook(lambda m, a, out: out + added)
    with torch.no_grad():
        logits = twin(pixels).float()
    handle.remove()
    expected = logits.gather(1, ablation.targets[:, None])[:, 0] - ablation.clean_logit
    torch.testing.assert_close(ablation.delta_logit[:, layer, head], expected, rtol=1e-5, atol=1e-5)


def test_resample_ablation_takes_the_other_images_head_output(demo):
    pixels, other = _demo_pixels(1, seed=3), _demo_pixels(1, seed=4)
    ablation = head_ablation(demo, pixels, method="resample", reference=other)
    other_z = run_with_cache(demo, other, names=["blocks.3.attn.z"])["blocks.3.attn.z"]

    def swap(z):
        z = z.clone()
        z[:, :, 0] = other_z[:, :, 0]
        return z

    logits = run_with_hooks(demo, pixels, {"blocks.3.attn.z": swap})
    expected = logits[0, int(ablation.targets[0])] - ablation.clean_logit[0]
    assert ablation.delta_logit[0, 3, 0].item() == pytest.approx(expected.item(), abs=1e-5)
    with pytest.raises(AnalysisError, match="reference"):
        head_ablation(demo, pixels, method="resample")
    with pytest.raises(AnalysisError, match="method must be one of"):
        head_ablation(demo, pixels, method="noise")


def test_cumulative_ablation_starts_clean_and_ends_with_whole_layers_removed(demo):
    pixels = _demo_pixels(1)
    ablation = head_ablation(demo, pixels)
    order = heads_by_effect(ablation)
    effects = [ablation.delta_logit[0, layer, head].item() for layer, head in order]
    assert effects == sorted(effects) and len(order) == 16  # largest drop first
    layer_three = [(3, head) for head in range(4)]
    curve = cumulative_head_ablation(demo, pixels, layer_three)
    assert curve.shape == (5, 1)
    assert curve[0, 0].item() == pytest.approx(ablation.clean_logit[0].item(), abs=1e-6)
    assert (curve[1, 0] - curve[0, 0]).item() == pytest.approx(ablation.delta_logit[0, 3, 0].item(), abs=1e-5)
    twin = copy.deepcopy(demo.model)
    with torch.no_grad():
        twin.blocks[3].attn.proj.weight.zero_()  # every head of block 3 removed, its bias kept
        expected = twin(pixels).float()[0, int(ablation.targets[0])]
    assert curve[4, 0].item() == pytest.approx(expected.item(), abs=1e-5)


@pytest.mark.parametrize("point", ["resid_pre", "attn.z"])
def test_batched_patching_equals_one_patched_run_at_a_time(point, demo):
    clean, corrupted = _demo_pixels(1, seed=5), _demo_pixels(1, seed=6)
    result = activation_patching(demo, clean, corrupted, point=point, batch_size=3 if point == "attn.z" else 40)
    width = demo.spec.num_tokens if point == "resid_pre" else 4
    assert result.effect.shape == (4, width)
    source = run_with_cache(demo, clean, names=[f"blocks.{layer}.{point}" for layer in range(4)])
    target = result.target[0]
    for layer in range(4):
        for index in (0, 17, 39, 40, 64) if point == "resid_pre" else range(4):  # both chunks' edges; every head

            def patch(x, layer=layer, index=index):
                x = x.clone()
                clean_value = source[f"blocks.{layer}.{point}"]
                if point == "resid_pre":
                    x[:, index] = clean_value[:, index]
                else:
                    x[:, :, index] = clean_value[:, :, index]
                return x

            logit = run_with_hooks(demo, corrupted, {f"blocks.{layer}.{point}": patch})[0, target].item()
            assert result.patched[layer, index].item() == pytest.approx(logit, abs=1e-5)
            assert result.effect[layer, index].item() == pytest.approx(
                (logit - result.corrupted) / (result.clean - result.corrupted), abs=1e-4
            )


def test_patching_every_token_at_block_zero_restores_the_clean_answer(demo):
    clean, corrupted = _demo_pixels(1, seed=7), _demo_pixels(1, seed=8)
    result = activation_patching(demo, clean, corrupted, point="attn.z")
    source = run_with_cache(demo, clean, names=["blocks.0.resid_pre"])
    restored = run_with_hooks(demo, corrupted, {"blocks.0.resid_pre": lambda x: source["blocks.0.resid_pre"]})
    assert restored[0, result.target[0]].item() == pytest.approx(result.clean, abs=1e-5)
    with pytest.raises(AnalysisError, match=r"\(1, 3, H, W\)"):
        activation_patching(demo, _demo_pixels(2), _demo_pixels(2))
    with pytest.raises(AnalysisError, match="nothing to restore"):
        activation_patching(demo, clean, clean)


def test_heads_command_on_two_ranks_equals_one_process_and_the_api(tmp_path):
    """``python -m analysis heads``: torchrun on 2 ranks, one process and the API give the same
    means; an unreadable file is skipped and named."""
    import subprocess
    import sys
    from pathlib import Path

    import numpy as np

    from analysis.circuits import dataset_head_effects
    from analysis.demo.data import generate_samples

    repo = Path(__file__).resolve().parent.parent
    folder = tmp_path / "scenes"
    folder.mkdir()
    images, _, _ = generate_samples(5, 99)
    for i, image in enumerate(images):
        image.save(folder / f"scene_{i}.png")
    (folder / "broken.png").write_bytes(b"not an image")
    env = {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}

    def heads(*prefix, out):
        return subprocess.run(
            [
                sys.executable,
                *prefix,
                "-m",
                "analysis",
                "heads",
                "--model",
                "demo",
                "--images",
                str(folder),
                "--out",
                str(out),
                "--batch-size",
                "2",
            ],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    single = heads(out=tmp_path / "one.npz")
    assert single.returncode == 0, single.stderr
    ranks = heads("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", out=tmp_path / "two.npz")
    assert ranks.returncode == 0, ranks.stderr
    one, two = np.load(tmp_path / "one.npz"), np.load(tmp_path / "two.npz")
    sums = dataset_head_effects(load_vit("demo"), sorted(folder.glob("scene_*.png")))
    assert int(one["count"]) == int(two["count"]) == sums.count == 5
    for key, value in (("ablation_delta_logit", sums.delta_logit), ("direct_logit_attribution", sums.direct_logit)):
        np.testing.assert_allclose(one[key], (value / 5).numpy(), atol=1e-5)
        np.testing.assert_allclose(two[key], one[key], atol=1e-5)
    assert int(one["skipped"]) == 1 and "broken.png" in str(one["skipped_images"][0]) and "broken.png" in single.stderr


def test_a_subset_of_layers_gives_the_same_rows(demo):
    pixels = _demo_pixels(1, seed=9)
    whole = head_ablation(demo, pixels)
    some = head_ablation(demo, pixels, layers=[3, 1])
    assert some.layers == (1, 3) and whole.layers == (0, 1, 2, 3)
    torch.testing.assert_close(some.delta_logit, whole.delta_logit[:, [1, 3]])
    assert heads_by_effect(some)[0][0] in (1, 3)
    clean, corrupted = _demo_pixels(1, seed=10), _demo_pixels(1, seed=11)
    full = activation_patching(demo, clean, corrupted, point="attn.z")
    part = activation_patching(demo, clean, corrupted, point="attn.z", layers=[2])
    assert part.layers == (2,)
    torch.testing.assert_close(part.effect, full.effect[[2]])


def test_heads_mixed_by_an_inner_norm_are_refused_with_the_reason():
    """BEiT-3 normalises the heads' joint output before the projection: attn.z is that norm's
    output, so no single head can be removed, patched or attributed."""
    torch.manual_seed(0)
    vit = load_vit(
        "beit3_base_patch16_224", pretrained=False, img_size=32, depth=1, embed_dim=32, num_heads=2, num_classes=3
    )
    pixels = torch.randn(1, 3, 32, 32)
    for call in (
        lambda: head_ablation(vit, pixels),
        lambda: direct_logit_attribution(vit, pixels),
        lambda: cumulative_head_ablation(vit, pixels, [(0, 0)]),
        lambda: activation_patching(vit, pixels, pixels + 1, point="attn.z"),
    ):
        with pytest.raises(AnalysisError, match="normalises the heads' joint output"):
            call()


def test_bad_arguments_are_typed_errors(demo):
    pixels = _demo_pixels(1)
    with pytest.raises(AnalysisError, match="needs reference="):
        head_ablation(demo, pixels, method="mean")  # the image itself would make every effect 0
    with pytest.raises(AnalysisError, match="head=7 does not exist"):
        cumulative_head_ablation(demo, pixels, [(0, 7)])
    with pytest.raises(AnalysisError, match=r"\(layer, head\) pairs"):
        cumulative_head_ablation(demo, pixels, [3])
    with pytest.raises(AnalysisError, match="preprocessed images"):
        activation_patching(demo, pixels, [1, 2])
    curve = cumulative_head_ablation(demo, pixels, [(-1, 0)])  # negative layers count from the end
    single = head_ablation(demo, pixels, layers=[3])
    assert (curve[1, 0] - curve[0, 0]).item() == pytest.approx(single.delta_logit[0, 0, 0].item(), abs=1e-5)


def test_heads_command_counts_archive_entries_left_out_before_decoding(tmp_path, monkeypatch, capsys):
    """Entries an archive leaves out before decoding (e.g. too large) are named and counted as
    skipped, as the distance command does."""
    import dataclasses

    import numpy as np

    import analysis.cli.sources as sources
    from analysis.cli import main
    from analysis.demo.data import generate_samples

    images, _, _ = generate_samples(2, 7)
    for i, image in enumerate(images):
        image.save(tmp_path / f"scene_{i}.png")
    resolve = sources.resolve_images
    monkeypatch.setattr(
        sources,
        "resolve_images",
        lambda text: dataclasses.replace(resolve(text), problems=("set.zip/huge.png: larger than the archive limit",)),
    )
    assert main(["heads", "--model", "demo", "--images", str(tmp_path), "--out", str(tmp_path / "h.npz")]) == 0
    result = np.load(tmp_path / "h.npz")
    assert int(result["count"]) == 2 and int(result["skipped"]) == 1
    assert "huge.png" in str(result["skipped_images"][0]) and "huge.png" in capsys.readouterr().err
