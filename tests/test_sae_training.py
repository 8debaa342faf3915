"""SAE training's token order, input normalisation and inactive fraction against slow references:
the batches a run trains on against a hand-written permutation of the token rows, data-parallel
ranks (threads summing through a barrier) against one process, the normalised SAE's encode, decode,
splice, metrics, class effect and SAELens folder against the formulas written out, and the
training log's inactive fraction against the initial SAE run by hand."""

from __future__ import annotations

import json
import math
import threading

import pytest
import torch
from PIL import Image

import analysis.sae.training as training
from analysis import load_vit
from analysis.demo.data import render_sample
from analysis.engine.activations import run_with_cache, run_with_hooks
from analysis.sae import (
    SAEConfig,
    SAEConfigError,
    SAEFolderError,
    SparseAutoencoder,
    load_sae,
    sae_metrics,
    save_sae,
    splice,
    train_sae,
    train_sae_on_activations,
)
from analysis.sae.features import feature_class_effect
from analysis.sae.parallel import DataParallel

POINT = "blocks.2.resid_post"
PARAMETERS = ("W_enc", "W_dec", "b_enc", "b_dec")


@pytest.fixture(scope="module")
def vit():
    return load_vit("demo")


@pytest.fixture(scope="module")
def pixels(vit):
    """(7, 3, H, W) preprocessed demo scenes."""
    images = [Image.fromarray(render_sample(5, i, vit.spec.img_size[0])[0]) for i in range(7)]
    return torch.cat([vit.preprocess(image) for image in images])


def patch_tokens(vit, pixels) -> torch.Tensor:
    """(N, T, D) each image's patch tokens at POINT, read one image a forward pass."""
    prefix = vit.spec.num_prefix_tokens
    return torch.cat(
        [run_with_cache(vit, pixels[i : i + 1], names=[POINT])[POINT][:, prefix:] for i in range(len(pixels))]
    )


def recorded_batches(monkeypatch, run) -> list[torch.Tensor]:
    """The token batches ``run()`` hands to sae_step, in order (the step itself skipped)."""
    seen: list[torch.Tensor] = []

    def record(sae, optimizer, x, state, **_):
        seen.append(x.detach().clone())
        state.step += 1
        return 0.0, 0.0

    monkeypatch.setattr(training, "sae_step", record)
    run()
    return seen


def reference_order(seed: int, epoch: int, images: int, per_buffer: int, per_image: int, batch_images: int):
    """The rule of the module docstring written out: per epoch one generator seeded by
    seed·1000003 + epoch draws the image order, then per buffer of per_buffer images the order of its
    m·T rows; each batch_images·T consecutive rows are a step. Returns per step the (image, token)
    pairs it holds, in order."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(images, generator=generator).tolist()
    steps = []
    for start in range(0, images, per_buffer):
        held = order[start : start + per_buffer]
        rows = torch.randperm(len(held) * per_image, generator=generator).tolist()
        for at in range(0, len(rows), batch_images * per_image):
            steps.append(
                [(held[row // per_image], row % per_image) for row in rows[at : at + batch_images * per_image]]
            )
    return steps


def test_train_sae_batches_are_the_hand_written_permutation_of_the_token_rows(vit, pixels, monkeypatch):
    """7 images, batches of 2, buffers of 2 batches (4 images): two epochs of 4 steps each, every
    step the rows the reference names, a step's tokens from more than its 2 images' worth of images."""
    tokens = patch_tokens(vit, pixels)  # (7, T, D)
    T = tokens.shape[1]
    kwargs = dict(k=4, expansion=2, warmup_steps=1, batch_size=2, buffer_batches=2, seed=5, epochs=2)
    batches = recorded_batches(monkeypatch, lambda: train_sae(vit, pixels, POINT, **kwargs))
    expected = reference_order(5, 0, 7, 4, T, 2) + reference_order(5, 1, 7, 4, T, 2)
    assert len(batches) == len(expected) == 8
    for batch, pairs in zip(batches, expected):
        hand = torch.stack([tokens[image, token] for image, token in pairs])  # (n, D)
        torch.testing.assert_close(batch, hand, rtol=0, atol=1e-5)
    first_buffer_images = {image for pairs in expected[:2] for image, _ in pairs}
    assert all(len({image for image, _ in pairs}) > 2 for pairs in expected[:2])  # a step mixes > 2 images
    assert len(first_buffer_images) == 4
    # every token of every image once per epoch
    for epoch in (expected[:4], expected[4:]):
        assert sorted(pair for pairs in epoch for pair in pairs) == [(i, t) for i in range(7) for t in range(T)]


def test_train_sae_on_activations_batches_are_a_seeded_permutation_of_all_rows(monkeypatch):
    acts = torch.arange(23 * 3, dtype=torch.float32).reshape(23, 3)  # row r holds 3r, 3r + 1, 3r + 2
    run = lambda: train_sae_on_activations(acts, k=2, expansion=2, batch_size=5, epochs=2, seed=9)  # noqa: E731
    batches = recorded_batches(monkeypatch, run)
    assert [len(b) for b in batches] == [5, 5, 5, 5, 3] * 2
    for epoch in range(2):
        order = torch.randperm(23, generator=torch.Generator().manual_seed(9 * 1_000_003 + epoch))
        rows = torch.cat(batches[5 * epoch : 5 * epoch + 5])[:, 0] / 3
        assert rows.long().tolist() == order.tolist()


def test_the_same_seed_gives_bit_identical_saes_and_another_seed_does_not(vit, pixels):
    kwargs = dict(k=4, expansion=2, warmup_steps=1, batch_size=2, buffer_batches=2, epochs=2, normalise=True)
    a, _ = train_sae(vit, pixels, POINT, seed=1, **kwargs)
    b, _ = train_sae(vit, pixels, POINT, seed=1, **kwargs)
    c, _ = train_sae(vit, pixels, POINT, seed=2, **kwargs)
    assert a.config == b.config
    for name in PARAMETERS:
        assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert not torch.equal(getattr(a, name), getattr(c, name)), name
    acts = torch.randn(300, 8, generator=torch.Generator().manual_seed(0))
    x, _ = train_sae_on_activations(acts, k=2, expansion=2, batch_size=32, seed=4, epochs=2)
    y, _ = train_sae_on_activations(acts, k=2, expansion=2, batch_size=32, seed=4, epochs=2)
    z, _ = train_sae_on_activations(acts, k=2, expansion=2, batch_size=32, seed=5, epochs=2)
    for name in PARAMETERS:
        assert torch.equal(getattr(x, name), getattr(y, name)) and not torch.equal(getattr(x, name), getattr(z, name))


class ThreadRanks:
    """``world`` threads as data-parallel ranks: each rank's ``sum`` waits for the others and returns
    the same sum, in rank order, on all."""

    def __init__(self, world: int) -> None:
        self.world, self.barrier, self.slots = world, threading.Barrier(world), [None] * world

    def parallel(self, rank: int) -> DataParallel:
        def total(tensor: torch.Tensor) -> torch.Tensor:
            self.slots[rank] = tensor.clone()
            self.barrier.wait()
            out = sum(self.slots[1:], self.slots[0].clone())
            self.barrier.wait()
            return out

        return DataParallel(rank, self.world, total)


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_train_the_weights_of_one_process(vit, pixels, world):
    """2 or 3 ranks (threads) with 7 images in buffers of 4: some ranks hold no row of some steps."""
    kwargs = dict(k=4, expansion=2, warmup_steps=1, batch_size=2, buffer_batches=2, epochs=2, seed=3, dead_after=2)
    alone, log = train_sae(vit, pixels, POINT, normalise=True, **kwargs)
    ranks, results = ThreadRanks(world), [None] * world

    def work(rank: int) -> None:
        results[rank] = train_sae(vit, pixels, POINT, normalise=True, parallel=ranks.parallel(rank), **kwargs)

    threads = [threading.Thread(target=work, args=(rank,)) for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    for sae, rank_log in results:
        assert sae.config.norm_scaling_factor == pytest.approx(alone.config.norm_scaling_factor, rel=1e-12)
        for name in PARAMETERS:
            torch.testing.assert_close(getattr(sae, name), getattr(alone, name), rtol=0, atol=1e-5)
        assert rank_log.mse == pytest.approx(log.mse, rel=1e-5)


def test_rank_rows_split_every_batch_between_the_ranks():
    """Each rank's local rows, mapped through its own token tensor, are the batch's rows of its images."""
    per_image, images = 3, 7
    everything = torch.arange(images * per_image)  # global row ids as the "tokens"
    rows = torch.randperm(images * per_image, generator=torch.Generator().manual_seed(0))[:10]
    for world in (1, 2, 3):
        got = []
        for rank in range(world):
            parallel = DataParallel(rank, world, lambda t: t)
            mine = torch.cat([everything[p * per_image : (p + 1) * per_image] for p in range(rank, images, world)])
            local = training._rank_rows(rows, per_image, parallel)
            assert ((mine[local] // per_image) % world == rank).all()
            got += mine[local].tolist()
        assert sorted(got) == sorted(rows.tolist())


# ----------------------------------------------------------------------------------- normalisation


def normalised_sae(d_in=8, d_sae=16, k=3, scale=0.37, **extra) -> SparseAutoencoder:
    config = SAEConfig(d_in=d_in, d_sae=d_sae, k=k, norm_scaling_factor=scale, **extra)
    sae = SparseAutoencoder(config, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        sae.W_enc.copy_(torch.randn(d_in, d_sae, generator=g))
        sae.b_enc.copy_(torch.randn(d_sae, generator=g) * 0.3)
        sae.b_dec.copy_(torch.randn(d_in, generator=g))
    return sae


def hand_forward(sae: SparseAutoencoder, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Token by token in float64: pre = (s·x − b_dec) W_enc + b_enc, TopK by a sort, then
    x̂ = (f W_dec + b_dec) / s."""
    s = float(sae.config.norm_scaling_factor or 1.0)
    W_enc, b_enc = sae.W_enc.detach().double(), sae.b_enc.detach().double()
    W_dec, b_dec = sae.W_dec.detach().double(), sae.b_dec.detach().double()
    fs, outs = [], []
    for row in x.double():
        pre = [
            float(sum((s * row[i] - b_dec[i]) * W_enc[i, j] for i in range(len(row))) + b_enc[j])
            for j in range(W_enc.shape[1])
        ]
        keep = sorted(range(len(pre)), key=lambda j: -pre[j])[: sae.config.k]
        f = torch.tensor([max(pre[j], 0.0) if j in keep else 0.0 for j in range(len(pre))], dtype=torch.float64)
        fs.append(f)
        outs.append((f @ W_dec + b_dec) / s)
    return torch.stack(outs), torch.stack(fs)


def test_a_normalised_sae_encodes_and_decodes_in_the_models_units_as_a_hand_computation():
    sae = normalised_sae()
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(2)) * 5
    x_hat, f = sae(x)
    hand_hat, hand_f = hand_forward(sae, x)
    torch.testing.assert_close(f.double(), hand_f, rtol=0, atol=1e-5)
    torch.testing.assert_close(x_hat.double(), hand_hat, rtol=0, atol=1e-4)
    assert torch.equal(sae.decode(f), sae.decode_scaled(f) / 0.37)
    plain = SparseAutoencoder(SAEConfig(d_in=8, d_sae=16, k=3))
    plain.load_state_dict(sae.state_dict())
    assert torch.equal(plain.encode(x * 0.37), f)  # the scale is only on the way in and out


def test_norm_scaling_factor_must_be_finite_and_positive():
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(SAEConfigError, match="norm_scaling_factor"):
            SAEConfig(d_in=4, d_sae=8, k=2, norm_scaling_factor=bad)


def test_training_estimates_the_scale_as_sqrt_d_over_the_mean_norm(vit, pixels):
    acts = torch.randn(200, 8, generator=torch.Generator().manual_seed(3)) * 7 + 2
    sae, _ = train_sae_on_activations(acts, k=2, expansion=2, batch_size=32, normalise=True, lr=0.0)
    mean_norm = sum(math.sqrt(sum(float(v) ** 2 for v in row)) for row in acts) / len(acts)
    assert sae.config.norm_scaling_factor == pytest.approx(math.sqrt(8) / mean_norm, rel=1e-9)
    # lr 0: b_dec is where it started, s times the mean row
    torch.testing.assert_close(
        sae.b_dec.double(), acts.double().mean(0) * sae.config.norm_scaling_factor, rtol=1e-6, atol=1e-6
    )
    plain, _ = train_sae_on_activations(acts, k=2, expansion=2, batch_size=32, lr=0.0)
    assert plain.config.norm_scaling_factor is None
    # from images: over the first buffer's tokens, here all 7 images (16 batches of 2)
    trained, _ = train_sae(vit, pixels, POINT, k=4, expansion=2, batch_size=2, normalise=True, lr=0.0)
    tokens = patch_tokens(vit, pixels).reshape(-1, vit.spec.embed_dim).double()
    expected = math.sqrt(vit.spec.embed_dim) / float(tokens.norm(dim=1).mean())
    assert trained.config.norm_scaling_factor == pytest.approx(expected, rel=1e-6)


def test_splice_with_a_normalised_sae_equals_a_hand_written_hook(vit, pixels):
    sae = normalised_sae(d_in=vit.spec.embed_dim, d_sae=64, k=4, scale=0.21, hook_name=POINT, tokens="all")
    assert sae.config.tokens == "all"

    def by_hand(keep_error: bool, ablate: int | None):
        def hook(activation):  # (B, T, D): every token is the SAE's
            s = 0.21
            with torch.no_grad():
                pre = (s * activation - sae.b_dec) @ sae.W_enc + sae.b_enc
                top = pre.topk(4, dim=-1)
                f = torch.zeros_like(pre).scatter(-1, top.indices, top.values.relu())
                g = f.clone()
                if ablate is not None:
                    g[..., ablate] = 0.0
                new = (g @ sae.W_dec + sae.b_dec) / s
                return activation + new - (f @ sae.W_dec + sae.b_dec) / s if keep_error else new

        return {POINT: hook}

    feature = int((sae.encode(run_with_cache(vit, pixels[:2], names=[POINT])[POINT]) > 0).sum((0, 1)).argmax())
    for keep_error, ablate in ((False, None), (True, feature), (False, feature)):
        scale = None if ablate is None else {ablate: 0.0}
        ours = run_with_hooks(vit, pixels[:2], splice(vit, sae, scale=scale, keep_error=keep_error))
        torch.testing.assert_close(
            ours, run_with_hooks(vit, pixels[:2], by_hand(keep_error, ablate)), rtol=1e-5, atol=1e-5
        )
    assert torch.equal(
        run_with_hooks(vit, pixels[:2], splice(vit, sae, keep_error=True)), run_with_hooks(vit, pixels[:2], {})
    )


def test_metrics_of_a_normalised_sae_are_in_the_models_units(vit, pixels):
    sae = normalised_sae(d_in=vit.spec.embed_dim, d_sae=64, k=4, scale=0.21, hook_name=POINT, tokens="patches")
    m = sae_metrics(vit, sae, pixels, batch_size=3)
    x = patch_tokens(vit, pixels).reshape(-1, vit.spec.embed_dim).double()  # model units
    with torch.no_grad():
        f = sae.encode(x.float())
        x_hat = (f.double() @ sae.W_dec.double() + sae.b_dec.double()) / 0.21  # by hand
    fve = 1 - ((x - x_hat) ** 2).sum() / ((x - x.mean(0)) ** 2).sum()
    assert m.fraction_variance_explained == pytest.approx(float(fve), rel=1e-5, abs=1e-6)
    assert m.l0 == pytest.approx(4.0)


def test_class_effect_of_a_normalised_sae_is_per_unit_of_the_feature_in_the_models_units(vit):
    sae = normalised_sae(d_in=vit.spec.embed_dim, d_sae=64, k=4, scale=0.25, hook_name=POINT)
    plain = SparseAutoencoder(SAEConfig(d_in=vit.spec.embed_dim, d_sae=64, k=4, hook_name=POINT))
    plain.load_state_dict(sae.state_dict())
    torch.testing.assert_close(feature_class_effect(vit, sae, 5), feature_class_effect(vit, plain, 5) / 0.25)


def test_a_normalised_sae_is_saved_folded_for_saelens_and_loads_back(tmp_path):
    sae = normalised_sae(hook_name=POINT, model_name="demo")
    folder = save_sae(sae, tmp_path / "n")
    cfg = json.loads((folder / "cfg.json").read_text())
    assert cfg["normalize_activations"] == "none" and cfg["metadata"]["norm_scaling_factor"] == 0.37
    from safetensors.torch import load_file

    disk = load_file(str(folder / "sae_weights.safetensors"))
    assert torch.equal(disk["W_enc"], sae.W_enc.detach() * 0.37)
    assert torch.equal(disk["W_dec"], sae.W_dec.detach() / 0.37) and torch.equal(
        disk["b_dec"], sae.b_dec.detach() / 0.37
    )
    x = torch.randn(9, 8, generator=torch.Generator().manual_seed(4)) * 3
    # the folded weights on raw activations: SAELens's encode and decode written out
    pre = (x - disk["b_dec"]) @ disk["W_enc"] + disk["b_enc"]
    top = pre.topk(3, dim=-1)
    f = torch.zeros_like(pre).scatter(-1, top.indices, top.values.relu())
    torch.testing.assert_close(f, sae.encode(x), rtol=0, atol=1e-5)
    torch.testing.assert_close(f @ disk["W_dec"] + disk["b_dec"], sae(x)[0], rtol=0, atol=1e-5)
    back = load_sae(folder)
    assert back.config == sae.config
    for name in PARAMETERS:
        torch.testing.assert_close(getattr(back, name), getattr(sae, name), rtol=1e-6, atol=0)
    # an unnormalised SAE is written and read bit for bit, with no scale in its folder
    plain = SparseAutoencoder(SAEConfig(d_in=8, d_sae=16, k=3), generator=torch.Generator().manual_seed(0))
    plain_folder = save_sae(plain, tmp_path / "p")
    assert "norm_scaling_factor" not in json.loads((plain_folder / "cfg.json").read_text())["metadata"]
    for name in PARAMETERS:
        assert torch.equal(getattr(load_sae(plain_folder), name), getattr(plain, name))


def test_a_folder_that_normalises_without_its_factor_is_refused(tmp_path):
    folder = save_sae(normalised_sae(scale=None), tmp_path / "x")
    cfg = json.loads((folder / "cfg.json").read_text())
    (folder / "cfg.json").write_text(json.dumps({**cfg, "normalize_activations": "expected_average_only_in"}))
    with pytest.raises(SAEFolderError, match="does not hold the scale"):
        load_sae(folder)


def test_a_normalised_run_resumes_to_the_uninterrupted_weights(vit, pixels, tmp_path):
    kwargs = dict(k=4, expansion=2, warmup_steps=2, batch_size=2, buffer_batches=2, seed=3, normalise=True)
    whole, _ = train_sae(vit, pixels, POINT, epochs=2, **kwargs)
    train_sae(vit, pixels, POINT, epochs=1, checkpoint_dir=tmp_path, **kwargs)
    resumed, _ = train_sae(vit, pixels, POINT, epochs=2, checkpoint_dir=tmp_path, resume=True, **kwargs)
    assert resumed.config == whole.config and whole.config.norm_scaling_factor is not None
    for name in PARAMETERS:
        assert torch.equal(getattr(resumed, name), getattr(whole, name)), name


# ----------------------------------------------------------------------------------- inactive fraction


def test_inactive_fraction_is_the_share_of_features_silent_in_the_last_dead_after_steps():
    """One step over all rows with dead_after = 1: the inactive features are those the initial SAE
    (the seed's weights, b_dec at the mean row) fires on for no row."""
    acts = torch.randn(6, 8, generator=torch.Generator().manual_seed(6))  # 6 rows · k = 2 < 32 features
    sae, log = train_sae_on_activations(acts, k=2, expansion=4, batch_size=6, seed=2, dead_after=1)
    initial = SparseAutoencoder(sae.config, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        initial.b_dec.copy_(acts.double().mean(0).float())
    fired = (initial.encode(acts) > 0).any(0)  # (32,)
    assert 0 < float(fired.float().mean()) < 1
    assert log.inactive_fraction == [pytest.approx(1 - float(fired.float().mean()))]
    _, never = train_sae_on_activations(acts, k=2, expansion=4, batch_size=8, epochs=2, dead_after=10**9)
    assert never.inactive_fraction == [0.0, 0.0]
    assert not hasattr(never, "dead_fraction")


# ----------------------------------------------------------------------------------- argument checks


class _Unreadable:
    """An image source that fails the test if anything reads it (not even its length)."""

    def __len__(self):
        raise AssertionError("the images were touched before the sizes were checked")

    def __getitem__(self, index):
        raise AssertionError("the images were touched before the sizes were checked")


BAD_SIZES = [
    # (argument, value, the message check_int writes for it, spelt out)
    ("batch_size", 0, "batch_size must be at least 1, got 0."),
    ("batch_size", -3, "batch_size must be at least 1, got -3."),
    ("batch_size", 2.5, "batch_size must be an integer, got 2.5 (float)."),
    ("batch_size", True, "batch_size must be an integer, got True (bool)."),
    ("buffer_batches", 0, "buffer_batches must be at least 1, got 0."),
    ("epochs", 0, "epochs must be at least 1, got 0."),
    ("epochs", -1, "epochs must be at least 1, got -1."),
    ("expansion", 0, "expansion must be at least 1, got 0."),
    ("dead_after", 0, "dead_after must be at least 1, got 0."),
    ("warmup_steps", -1, "warmup_steps must be at least 0, got -1."),
]


@pytest.mark.parametrize(("argument", "value", "message"), BAD_SIZES)
def test_train_sae_refuses_a_bad_size_before_reading_any_image(vit, argument, value, message):
    with pytest.raises(SAEConfigError) as caught:
        train_sae(vit, _Unreadable(), POINT, k=4, **{"expansion": 2, argument: value})
    assert str(caught.value) == message


@pytest.mark.parametrize(("argument", "value", "message"), [s for s in BAD_SIZES if s[0] != "buffer_batches"])
def test_train_sae_on_activations_refuses_the_same_bad_sizes(argument, value, message):
    acts = torch.ones(4, 3)
    with pytest.raises(SAEConfigError) as caught:
        train_sae_on_activations(acts, k=1, **{"expansion": 2, argument: value})
    assert str(caught.value) == message


def test_zero_warmup_steps_is_no_warm_up_and_numpy_sizes_are_plain_integers():
    """warmup_steps = 0 and 1 both give step s the rate lr · min(1, (s + 1) / max(1, w)) = lr, so
    the same weights; a numpy integer batch size trains as the same Python integer."""
    import numpy as np

    acts = torch.randn(12, 4, generator=torch.Generator().manual_seed(1))
    kwargs = dict(k=2, expansion=2, epochs=2, seed=3)
    none, _ = train_sae_on_activations(acts, warmup_steps=0, batch_size=5, **kwargs)
    one, _ = train_sae_on_activations(acts, warmup_steps=1, batch_size=5, **kwargs)
    numpy_size, log = train_sae_on_activations(acts, warmup_steps=0, batch_size=np.int64(5), **kwargs)
    assert len(log.loss) == 2 * math.ceil(12 / 5)
    for name in PARAMETERS:
        assert torch.equal(getattr(none, name), getattr(one, name)), name
        assert torch.equal(getattr(numpy_size, name), getattr(none, name)), name
