"""Sparse autoencoders (analysis.sae) against slow, obviously correct references: per-token loops of
the formulas, an SAE that is exactly the identity, hand-computed metrics, sparse recovery of known
directions, SAELens's own loader (when installed)."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from PIL import Image

from analysis import load_vit
from analysis.base.errors import AnalysisError
from analysis.demo.data import render_sample
from analysis.engine.activations import run_with_cache, run_with_hooks
from analysis.sae import (
    NoImagesError,
    SAEConfig,
    SAEConfigError,
    SAEFeatureError,
    SAEFolderError,
    SAEWidthError,
    SparseAutoencoder,
    UnknownPointError,
    feature_activations,
    load_sae,
    sae_metrics,
    save_sae,
    splice,
    top_activating,
    train_sae,
    train_sae_on_activations,
)

POINT = "blocks.2.resid_post"


@pytest.fixture(scope="module")
def vit():
    return load_vit("demo")


@pytest.fixture(scope="module")
def pixels(vit):
    """(6, 3, H, W) preprocessed demo scenes."""
    images = [Image.fromarray(render_sample(0, i, vit.spec.img_size[0])[0]) for i in range(6)]
    return torch.cat([vit.preprocess(image) for image in images])


def random_sae(architecture="topk", d_in=8, d_sae=16, k=3, seed=0, **extra) -> SparseAutoencoder:
    config = SAEConfig(
        d_in=d_in, d_sae=d_sae, architecture=architecture, k=k if architecture == "topk" else None, **extra
    )
    sae = SparseAutoencoder(config, generator=torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # non-trivial biases and an untied encoder
        sae.W_enc.copy_(torch.randn(d_in, d_sae, generator=g))
        sae.b_enc.copy_(torch.randn(d_sae, generator=g) * 0.3)
        sae.b_dec.copy_(torch.randn(d_in, generator=g))
    return sae


def loop_encode(sae: SparseAutoencoder, x: torch.Tensor) -> torch.Tensor:
    """The formulas token by token, feature by feature: pre_j = Σ_i (x_i − b_dec,i) W_enc[i, j] + b_enc,j;
    ReLU; TopK keeps the k largest by a full sort."""
    out = torch.zeros(x.shape[0], sae.config.d_sae, dtype=torch.float64)
    W, b_enc, b_dec = (sae.W_enc.detach().double(), sae.b_enc.detach().double(), sae.b_dec.detach().double())
    for t in range(x.shape[0]):
        pre = [
            sum((x[t, i].double() - b_dec[i]) * W[i, j] for i in range(sae.config.d_in)) + b_enc[j]
            for j in range(sae.config.d_sae)
        ]
        acts = [max(float(p), 0.0) for p in pre]
        if sae.config.architecture == "topk":
            keep = sorted(range(len(acts)), key=lambda j: -acts[j])[: sae.config.k]
            acts = [a if j in keep else 0.0 for j, a in enumerate(acts)]
        out[t] = torch.tensor(acts, dtype=torch.float64)
    return out


@pytest.mark.parametrize("architecture", ["topk", "relu"])
def test_encode_decode_equal_per_token_loops(architecture):
    sae = random_sae(architecture)
    x = torch.randn(10, 8, generator=torch.Generator().manual_seed(5))
    f = sae.encode(x)
    assert torch.allclose(f.double(), loop_encode(sae, x), atol=1e-5)
    expected = torch.stack(
        [sum(f[t, j].double() * sae.W_dec[j].double() for j in range(16)) + sae.b_dec.double() for t in range(10)]
    )
    assert torch.allclose(sae.decode(f).double(), expected, atol=1e-5)
    x_hat, f2 = sae(x)
    assert torch.equal(f2, f) and torch.equal(x_hat, sae.decode(f))
    if architecture == "topk":
        assert ((f != 0).sum(-1) == 3).all()  # every token has ≥ 3 positive pre-activations here
        assert ((sae.pre_activation(x) > 0).sum(-1) >= 3).all()


def test_decoder_norm_and_parallel_gradient_removed():
    sae = random_sae()
    with torch.no_grad():
        sae.W_dec.mul_(3.0)
    sae.normalise_decoder()
    assert torch.allclose(sae.W_dec.norm(dim=1), torch.ones(16), atol=1e-6)
    sae.W_dec.grad = torch.randn(16, 8, generator=torch.Generator().manual_seed(2))
    sae.remove_parallel_gradient()
    assert (sae.W_dec.grad * sae.W_dec).sum(1).abs().max() < 1e-6


def test_sparse_recovery_of_known_directions():
    """64 unit directions in 32 dims, 3 active per sample with weights in [0.5, 1.5]: the TopK SAE's
    decoder rows find ≥ 90% of them with cosine ≥ 0.9 (random rows reach ~0.6)."""
    g = torch.Generator().manual_seed(1234)  # not the SAE's seed: its initial rows would be the truth
    d, m, active, n = 32, 64, 3, 20000
    truth = torch.randn(m, d, generator=g)
    truth = truth / truth.norm(dim=1, keepdim=True)  # (m, d)
    which = torch.stack([torch.randperm(m, generator=g)[:active] for _ in range(n)])  # (n, 3)
    weights = torch.rand(n, active, generator=g) + 0.5  # (n, 3)
    acts = (weights[..., None] * truth[which]).sum(1)  # (n, d)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is ~15x faster than several on a shared machine
    try:
        sae, log = train_sae_on_activations(
            acts, k=3, expansion=4, lr=3e-3, warmup_steps=50, epochs=4, batch_size=256, seed=0, dead_after=50
        )
    finally:
        torch.set_num_threads(threads)
    best = (truth @ sae.W_dec.detach().T).max(dim=1).values  # (m,) best-matching decoder row
    assert (best >= 0.9).float().mean() >= 0.9
    initial = SparseAutoencoder(sae.config, generator=torch.Generator().manual_seed(0)).W_dec.detach()
    assert ((truth @ initial.T).max(dim=1).values >= 0.9).float().mean() < 0.1  # training found them
    assert log.mse[-1] < log.mse[0]


def identity_sae(vit, pixels, architecture="relu") -> SparseAutoencoder:
    """An exact identity on these activations: expansion 1, W_enc = W_dec = I, b_enc = 0 and
    b_dec = −c·1 with c = 1 + max|x|, so pre = x + c > 0, f = relu(pre) = x + c and
    x̂ = f − c = x (float64, so the cast back to float32 is x exactly). TopK with k = d_in keeps
    every (positive) feature, so it is the same map."""
    d = vit.spec.embed_dim
    acts = run_with_cache(vit, pixels, names=[POINT])[POINT]
    c = 1.0 + float(acts.abs().max())
    config = SAEConfig(
        d_in=d,
        d_sae=d,
        architecture=architecture,
        k=d if architecture == "topk" else None,
        hook_name=POINT,
        tokens="all",
        dtype="float64",
    )
    sae = SparseAutoencoder(config)
    with torch.no_grad():
        sae.W_enc.copy_(torch.eye(d))
        sae.W_dec.copy_(torch.eye(d))
        sae.b_enc.zero_()
        sae.b_dec.fill_(-c)
    assert (sae.pre_activation(acts) > 0).all()  # relu is the identity on these: really x̂ = x
    return sae


@pytest.mark.parametrize("architecture", ["relu", "topk"])
def test_identity_sae_spliced_reproduces_logits(vit, pixels, architecture):
    sae = identity_sae(vit, pixels, architecture)
    clean = run_with_hooks(vit, pixels, {})
    spliced = run_with_hooks(vit, pixels, splice(vit, sae))
    assert torch.allclose(spliced, clean, atol=1e-5, rtol=0)
    assert torch.equal(run_with_hooks(vit, pixels, splice(vit, sae, keep_error=True)), clean)
    # the hook is really in the pass: zeroing a feature (one coordinate of the stream) moves the logits
    ablated = run_with_hooks(vit, pixels, splice(vit, sae, scale={0: 0.0}))
    assert not torch.allclose(ablated, clean, atol=1e-3)
    metrics = sae_metrics(vit, sae, pixels)
    assert abs(metrics.kl_divergence) < 1e-9 and metrics.top1_agreement == 1.0
    assert metrics.fraction_variance_explained == pytest.approx(1.0, abs=1e-9)


def test_keep_error_without_intervention_is_exact_and_ablation_is_not(vit, pixels):
    sae = random_sae(d_in=vit.spec.embed_dim, d_sae=256, k=8, hook_name=POINT, tokens="patches")
    clean = run_with_hooks(vit, pixels, {})
    assert torch.equal(run_with_hooks(vit, pixels, splice(vit, sae, keep_error=True)), clean)
    # an ablation with the error kept changes exactly the ablated feature's contribution
    f = feature_activations(vit, pixels, sae)  # (B, 64, 256)
    feature = int(f.sum((0, 1)).argmax())
    steered = run_with_cache(vit, pixels, names=[POINT], hooks=splice(vit, sae, scale={feature: 0.0}, keep_error=True))[
        POINT
    ]
    original = run_with_cache(vit, pixels, names=[POINT])[POINT]
    patches = slice(vit.spec.num_prefix_tokens, None)
    expected = original[:, patches] - f[..., feature, None] * sae.W_dec[feature].detach()
    assert torch.allclose(steered[:, patches], expected, atol=1e-4)
    assert torch.equal(steered[:, : vit.spec.num_prefix_tokens], original[:, : vit.spec.num_prefix_tokens])
    assert not torch.allclose(run_with_hooks(vit, pixels, splice(vit, sae)), clean, atol=1e-3)


def test_metrics_against_hand_computation(vit, pixels):
    sae = random_sae(d_in=vit.spec.embed_dim, d_sae=256, k=8, hook_name=POINT, tokens="patches")
    m = sae_metrics(vit, sae, pixels, labels=[0, 1, 2, 3, 4, 0], batch_size=4)
    prefix = vit.spec.num_prefix_tokens
    x = run_with_cache(vit, pixels, names=[POINT])[POINT][:, prefix:].reshape(-1, vit.spec.embed_dim).double()
    with torch.no_grad():
        x_hat, f = sae(x.float())
    fve = 1 - ((x - x_hat.double()) ** 2).sum() / ((x - x.mean(0)) ** 2).sum()
    assert m.fraction_variance_explained == pytest.approx(float(fve), rel=1e-6, abs=1e-9)
    assert m.l0 == pytest.approx(float((f != 0).sum()) / x.shape[0])
    assert m.l0 == pytest.approx(8.0)
    rate = (f != 0).double().mean(0)
    assert m.dead_fraction == pytest.approx(float((rate == 0).double().mean()))
    assert m.dense_fraction == pytest.approx(float((rate > 0.1).double().mean()))
    clean, spliced = run_with_hooks(vit, pixels, {}), run_with_hooks(vit, pixels, splice(vit, sae))
    kl = 0.0
    for b in range(pixels.shape[0]):
        p, q = torch.softmax(clean[b].double(), -1), torch.softmax(spliced[b].double(), -1)
        kl += sum(float(p[c] * (math.log(p[c]) - math.log(q[c]))) for c in range(p.shape[0]))
    assert m.kl_divergence == pytest.approx(kl / pixels.shape[0], rel=1e-6)
    assert m.kl_divergence > 0
    assert m.top1_agreement == pytest.approx(float((clean.argmax(-1) == spliced.argmax(-1)).double().mean()))


def test_save_load_round_trip(tmp_path):
    for architecture in ("topk", "relu"):
        sae = random_sae(architecture, l1_coefficient=1e-3, hook_name=POINT, model_name="demo")
        folder = save_sae(sae, tmp_path / architecture)
        cfg = json.loads((folder / "cfg.json").read_text())
        assert cfg["architecture"] == {"topk": "topk", "relu": "standard"}[architecture]
        assert cfg["metadata"]["hook_name"] == POINT and cfg["d_in"] == 8 and cfg["d_sae"] == 16
        back = load_sae(folder)
        assert back.config == sae.config
        for name in ("W_enc", "W_dec", "b_enc", "b_dec"):
            assert torch.allclose(getattr(back, name), getattr(sae, name), atol=1e-7, rtol=0)
        x = torch.randn(5, 8)
        assert torch.allclose(back.encode(x), sae.encode(x), atol=1e-7)


def test_loads_a_hand_written_pre_6_saelens_topk_folder(tmp_path):
    """SAELens < 6 wrote hook_point at the top level and TopK as activation_fn_kwargs."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(3)
    weights = {
        "W_enc": torch.randn(4, 6, generator=g),
        "W_dec": torch.randn(6, 4, generator=g),
        "b_enc": torch.randn(6, generator=g),
        "b_dec": torch.randn(4, generator=g),
    }
    save_file(weights, str(tmp_path / "sae_weights.safetensors"))
    cfg = {
        "d_in": 4,
        "d_sae": 6,
        "dtype": "float32",
        "hook_point": "blocks.1.resid_post",
        "model_name": "m",
        "activation_fn_str": "topk",
        "activation_fn_kwargs": {"k": 2},
    }
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    sae = load_sae(tmp_path)
    assert sae.config.architecture == "topk" and sae.config.k == 2 and sae.config.hook_name == "blocks.1.resid_post"
    x = torch.randn(3, 4, generator=g)
    pre = (x - weights["b_dec"]) @ weights["W_enc"] + weights["b_enc"]
    top = pre.topk(2, dim=-1)
    expected = torch.zeros_like(pre).scatter(-1, top.indices, top.values.relu())
    assert torch.allclose(sae.encode(x), expected, atol=1e-6)


@pytest.mark.sae_lens
def test_saelens_loads_our_folder_and_encodes_the_same(tmp_path):
    """SAELens's own loader opens our folder and encodes and decodes as we do; a folder SAELens saves
    loads here. CI installs sae-lens in a venv of its own (it brings its own dependencies):
    ``pytest -m sae_lens``."""
    if os.environ.get("CI") == "true":  # CI installs it for this step: a missing package fails, never skips
        import sae_lens
    else:
        sae_lens = pytest.importorskip("sae_lens")
    for architecture in ("topk", "relu"):
        ours = random_sae(architecture, d_in=8, d_sae=32, k=4, hook_name=POINT, model_name="demo")
        folder = save_sae(ours, tmp_path / architecture)
        theirs = sae_lens.SAE.load_from_disk(str(folder))
        x = torch.randn(20, 8, generator=torch.Generator().manual_seed(9))
        assert torch.allclose(theirs.encode(x), ours.encode(x), atol=1e-6, rtol=0)
        assert torch.allclose(theirs.decode(ours.encode(x)), ours.decode(ours.encode(x)), atol=1e-6, rtol=0)
        theirs.save_model(str(tmp_path / f"{architecture}_back"))
        back = load_sae(tmp_path / f"{architecture}_back")
        assert torch.allclose(back.encode(x), ours.encode(x), atol=1e-6, rtol=0)
    # an SAE with input normalisation: written folded (normalize_activations "none"), so SAELens reads
    # raw model activations to our features and decodes to the model's units
    normalised = random_sae("topk", d_in=8, d_sae=32, k=4, hook_name=POINT, norm_scaling_factor=0.3)
    theirs = sae_lens.SAE.load_from_disk(str(save_sae(normalised, tmp_path / "normalised")))
    x = torch.randn(20, 8, generator=torch.Generator().manual_seed(9)) * 4
    f = normalised.encode(x)
    assert torch.allclose(theirs.encode(x), f, atol=1e-5, rtol=0)
    assert torch.allclose(theirs.decode(f), normalised.decode(f), atol=1e-5, rtol=0)


def test_train_sae_checkpoints_and_resumes_to_the_same_weights(vit, pixels, tmp_path):
    kwargs = dict(k=4, expansion=2, lr=1e-3, warmup_steps=2, batch_size=2, seed=3, dead_after=2)
    calls = []
    whole, log = train_sae(vit, pixels, POINT, epochs=2, progress=lambda d, t: calls.append((d, t)), **kwargs)
    assert calls[-1] == (6, 6) and len(log.loss) == 6
    first, _ = train_sae(vit, pixels, POINT, epochs=1, checkpoint_dir=tmp_path, **kwargs)
    assert (tmp_path / "last" / "cfg.json").is_file() and (tmp_path / "last" / "optimizer.safetensors").is_file()
    resumed, log2 = train_sae(vit, pixels, POINT, epochs=2, checkpoint_dir=tmp_path, resume=True, **kwargs)
    assert len(log2.loss) == 3  # only the second epoch ran
    for name in ("W_enc", "W_dec", "b_enc", "b_dec"):
        assert torch.equal(getattr(resumed, name), getattr(whole, name)), name
        assert not torch.equal(getattr(first, name), getattr(whole, name)), name
    assert resumed.config.hook_name == POINT and resumed.config.d_in == vit.spec.embed_dim
    assert torch.allclose(resumed.W_dec.norm(dim=1), torch.ones(resumed.config.d_sae), atol=1e-5)
    # b_dec started at the first buffer's mean patch token: here the buffer (16 batches of 2) holds all 6 images
    fresh, _ = train_sae(vit, pixels, POINT, epochs=1, **{**kwargs, "lr": 0.0})
    first_buffer = run_with_cache(vit, pixels, names=[POINT])[POINT][:, vit.spec.num_prefix_tokens :]
    first_buffer = first_buffer.reshape(-1, vit.spec.embed_dim)
    assert torch.allclose(fresh.b_dec, first_buffer.mean(0), atol=1e-6)


def test_top_activating_against_a_loop(vit, pixels):
    sae = random_sae(d_in=vit.spec.embed_dim, d_sae=256, k=8, hook_name=POINT, tokens="patches")
    f = feature_activations(vit, pixels, sae)  # (6, 64, 256)
    assert f.shape == (6, vit.spec.num_patches, 256)
    feature = int((f > 0).sum((0, 1)).argmax())
    top = top_activating(vit, sae, pixels, feature, k=3, batch_size=4)
    peaks = [float(f[i, :, feature].max()) for i in range(6)]
    order = sorted(range(6), key=lambda i: -peaks[i])[:3]
    assert top.indices.tolist() == order
    gh, gw = vit.spec.grid_size
    for row, image in enumerate(order):
        for p in range(gh * gw):
            assert float(top.maps[row, p // gw, p % gw]) == pytest.approx(float(f[image, p, feature]), abs=1e-5)


def test_typed_errors(vit, pixels, tmp_path):
    assert issubclass(SAEConfigError, AnalysisError)
    with pytest.raises(UnknownPointError, match="blocks.9"):
        train_sae(vit, pixels, "blocks.9.resid_post", k=2)
    with pytest.raises(UnknownPointError, match="not an SAE input"):
        train_sae(vit, pixels, "blocks.1.attn.probs", k=2)
    with pytest.raises(SAEWidthError, match="64-wide"):
        splice(vit, random_sae(d_in=64, d_sae=128, hook_name=POINT))
    with pytest.raises(SAEConfigError, match="k ≤ 16"):
        SAEConfig(d_in=8, d_sae=16, architecture="topk", k=17)
    with pytest.raises(SAEConfigError, match="k ≤"):
        train_sae(vit, pixels, POINT, k=1000, expansion=1)
    with pytest.raises(NoImagesError):
        train_sae(vit, [], POINT, k=2)
    with pytest.raises(NoImagesError):
        sae_metrics(vit, random_sae(d_in=vit.spec.embed_dim, d_sae=256, hook_name=POINT), pixels[:0])
    with pytest.raises(SAEFolderError, match="cfg.json"):
        load_sae(tmp_path)
    sae = random_sae(d_in=vit.spec.embed_dim, d_sae=256, hook_name=POINT)
    with pytest.raises(SAEFeatureError, match="0..255"):
        splice(vit, sae, scale={256: 0.0})
    with pytest.raises(SAEFeatureError):
        top_activating(vit, sae, pixels, -1)


def test_class_token_sae_touches_only_the_class_token(vit, pixels):
    sae = random_sae(d_in=vit.spec.embed_dim, d_sae=256, k=8, hook_name=POINT, tokens="class")
    f = feature_activations(vit, pixels, sae)
    assert f.shape == (pixels.shape[0], 1, 256)
    original = run_with_cache(vit, pixels, names=[POINT])[POINT]
    spliced = run_with_cache(vit, pixels, names=[POINT], hooks=splice(vit, sae))[POINT]
    at = vit.spec.token_names.index("class")
    with torch.no_grad():
        assert torch.allclose(spliced[:, at], sae(original[:, at])[0], atol=1e-5)
    others = [t for t in range(original.shape[1]) if t != at]
    assert torch.equal(spliced[:, others], original[:, others])


def test_auxk_loss_of_one_step_against_a_hand_computation():
    """Every feature dead: loss = mean‖e‖² + (1/32)·mean‖e − ê‖², ê from the k_aux = d_in // 2
    largest relu(pre) (a sort per token), e = x − x̂."""
    from analysis.sae.training import TrainingState, sae_step

    sae = random_sae(d_in=8, d_sae=16, k=3)
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(4))
    pre = sae.pre_activation(x).detach().double()
    W_dec, b_dec = sae.W_dec.detach().double(), sae.b_dec.detach().double()
    total = 0.0
    for t in range(6):
        order = sorted(range(16), key=lambda j: -float(pre[t, j]))
        f = torch.zeros(16, dtype=torch.float64)
        f[order[:3]] = pre[t, order[:3]].clamp_min(0)
        e = x[t].double() - (f @ W_dec + b_dec)
        aux = torch.zeros(16, dtype=torch.float64)
        aux[order[:4]] = pre[t, order[:4]].clamp_min(0)
        total += float(e @ e) + float(((e - aux @ W_dec) ** 2).sum()) / 32
    optimizer = torch.optim.Adam(sae.parameters(), lr=1e-3)
    state = TrainingState(step=0, since_fired=torch.full((16,), 10, dtype=torch.long))
    loss, mse = sae_step(sae, optimizer, x, state, lr=1e-3, warmup_steps=1, dead_after=5)
    assert loss == pytest.approx(total / 6, rel=1e-5)
    assert loss > mse
    fired = (sae.encode(x) > 0).any(0)  # after the step; since_fired is 0 exactly where the step's f fired
    assert state.step == 1 and set(state.since_fired.tolist()) <= {0, 11}
    assert fired.shape == (16,)


def test_relu_sae_trains_and_a_larger_l1_gives_sparser_features():
    g = torch.Generator().manual_seed(7)
    acts = torch.randn(2048, 16, generator=g) @ torch.randn(16, 16, generator=g) / 4
    l0 = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for l1 in (0.0, 2.0):
            sae, log = train_sae_on_activations(
                acts,
                architecture="relu",
                l1_coefficient=l1,
                expansion=2,
                lr=1e-2,
                warmup_steps=10,
                epochs=4,
                batch_size=128,
            )
            l0.append(float((sae.encode(acts) > 0).float().sum(-1).mean()))
    finally:
        torch.set_num_threads(threads)
    assert l0[1] < 0.7 * l0[0]
    with pytest.raises(SAEConfigError, match="l1_coefficient"):
        train_sae_on_activations(acts, architecture="relu")


def test_an_sae_config_that_does_not_fit_its_weights_is_refused_before_anything_is_built(tmp_path):
    """cfg.json's d_sae of 2·10⁹ beside a 256-feature SAE's weights: a typed error naming both shapes,
    read from the safetensors header (building it would ask for about 6 TB); a cfg.json that is not
    JSON, or lacks d_in, is a typed error too."""
    import json

    sae = random_sae(d_in=8, d_sae=256, hook_name=POINT)
    folder = tmp_path / "sae"
    save_sae(sae, folder)
    assert load_sae(folder).config.d_sae == 256
    cfg = json.loads((folder / "cfg.json").read_text())
    (folder / "cfg.json").write_text(json.dumps({**cfg, "d_sae": 2_000_000_000}))
    with pytest.raises(SAEFolderError, match=r"W_enc in .* has shape \(8, 256\), cfg.json says \(8, 2000000000\)"):
        load_sae(folder)
    (folder / "cfg.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "d_in"}))
    with pytest.raises(SAEFolderError, match="d_in and d_sae"):
        load_sae(folder)
    (folder / "cfg.json").write_text("{not json")
    with pytest.raises(SAEFolderError, match="d_in and d_sae"):
        load_sae(folder)


def test_a_clamped_feature_that_did_not_fire_changes_the_logits_as_a_hand_written_hook(vit, pixels):
    """clamp={i: v} switches on a feature that is 0 on every token of an image (scale= cannot): the
    logits equal those of a hook written here that sets f_i = v at every chosen token and puts
    x + decode(f') − decode(f) in place of x."""
    sae = random_sae(d_in=vit.spec.embed_dim, d_sae=256, k=4, hook_name=POINT, tokens="all")
    features = feature_activations(vit, pixels[:1], sae)[0]  # (T, d_sae)
    silent = int((features.abs().sum(0) == 0).nonzero()[0])  # a feature that fires on no token of the image
    assert torch.equal(
        run_with_hooks(vit, pixels[:1], splice(vit, sae, scale={silent: 10.0}, keep_error=True)),
        run_with_hooks(vit, pixels[:1], {}),
    )  # scaling a silent feature changes nothing

    def by_hand(activation):  # (1, T, D): every token is the SAE's ("all")
        with torch.no_grad():
            f = sae.encode(activation)
            g = f.clone()
            g[..., silent] = 3.0
            return activation + sae.decode(g) - sae.decode(f)

    expected = run_with_hooks(vit, pixels[:1], {POINT: by_hand})
    clamped = run_with_hooks(vit, pixels[:1], splice(vit, sae, clamp={silent: 3.0}, keep_error=True))
    torch.testing.assert_close(clamped, expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(clamped, run_with_hooks(vit, pixels[:1], {}), atol=1e-4)
    with pytest.raises(SAEFeatureError, match="both scaled and clamped"):
        splice(vit, sae, scale={silent: 0.0}, clamp={silent: 1.0})
    with pytest.raises(SAEFeatureError, match="does not exist"):
        splice(vit, sae, clamp={256: 1.0})
