"""``python -m analysis sae train|metrics``: one process and two torchrun ranks train the same
weights as the library's ``train_sae`` (data parallel: gradients summed over the ranks), the
metrics command prints what ``sae_metrics`` returns, and bad arguments exit with a message."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

import cli_runner
from analysis import load_vit
from analysis.demo.data import render_sample
from analysis.sae import SAEConfig, SparseAutoencoder, load_sae, sae_metrics, save_sae, train_sae

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
POINT = "blocks.2.resid_post"
SEED = 7070
# 7 scenes in batches of 3: the last batch has one image, so rank 1 of 2 has none in it
TRAIN = ["--point", POINT, "--demo-scenes", "7", "--batch-size", "3", "--expansion", "2", "--k", "4"]
TRAIN += ["--warmup", "2", "--epochs", "2", "--lr", "3e-3", "--dead-after", "2"]


def run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python *args``: ``-m analysis ...`` in this process (tests/cli_runner.py), torchrun in new ones."""

    return cli_runner.run(*args, env=ENV, timeout=timeout)


def scenes(count: int, seed: int = SEED) -> list[Image.Image]:
    return [Image.fromarray(render_sample(seed, i)[0]) for i in range(count)]


@pytest.fixture(scope="module")
def vit():
    return load_vit("demo")


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "sae_weights.safetensors"))


def test_two_torchrun_ranks_train_the_weights_of_one_process_and_of_the_api(vit, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    single = run("-m", "analysis", "sae", "train", "--model", "demo", "--out", str(one), *TRAIN)
    assert single.returncode == 0, single.stderr
    ranks = run(
        "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        "-m", "analysis", "sae", "train", "--model", "demo", "--out", str(two), *TRAIN,
    )  # fmt: skip
    assert ranks.returncode == 0, ranks.stderr
    reference, log = train_sae(
        vit, scenes(7), POINT, expansion=2, k=4, warmup_steps=2, epochs=2, lr=3e-3, batch_size=3, dead_after=2
    )
    a, b = weights(one), weights(two)
    for name in ("W_enc", "W_dec", "b_enc", "b_dec"):
        expected = getattr(reference, name).detach()
        torch.testing.assert_close(a[name], expected, atol=1e-6, rtol=0)
        torch.testing.assert_close(b[name], expected, atol=1e-5, rtol=0)
        assert not torch.equal(expected, SparseAutoencoder(reference.config).state_dict()[name]), name
    record = json.loads((two / "training_log.json").read_text())
    assert record["world_size"] == 2 and len(record["mse"]) == 6
    assert record["mse"] == pytest.approx(log.mse, rel=1e-5)  # the loss over both ranks' tokens
    assert record["inactive_fraction"] == pytest.approx(log.inactive_fraction)
    assert load_sae(two).config == reference.config
    assert (two / "last" / "state.json").is_file()  # rank 0's checkpoint


def test_resume_continues_to_the_uninterrupted_weights(tmp_path):
    base = ["-m", "analysis", "sae", "train", "--model", "demo", "--out"]
    whole = run(*base, str(tmp_path / "whole"), *TRAIN)
    assert whole.returncode == 0, whole.stderr
    halves = [a if a != "2" or i == 0 or TRAIN[i - 1] != "--epochs" else "1" for i, a in enumerate(TRAIN)]
    first = run(*base, str(tmp_path / "resumed"), *halves)
    assert first.returncode == 0, first.stderr
    second = run(*base, str(tmp_path / "resumed"), *TRAIN, "--resume")
    assert second.returncode == 0, second.stderr
    a, b = weights(tmp_path / "whole"), weights(tmp_path / "resumed")
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_a_folder_of_images_skips_the_unreadable_one_and_metrics_match_the_api(vit, tmp_path):
    folder = tmp_path / "scenes"
    folder.mkdir()
    images = scenes(5, seed=4242)
    for i, image in enumerate(images):
        image.save(folder / f"scene_{i}.png")
    (folder / "corrupt.png").write_bytes(b"not an image")
    out = tmp_path / "sae"
    trained = run(
        "-m", "analysis", "sae", "train", "--model", "demo", "--point", POINT, "--images", str(folder),
        "--out", str(out), "--batch-size", "2", "--expansion", "1", "--k", "3", "--tokens", "all",
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    assert "skipped" in trained.stderr and "corrupt.png" in trained.stderr
    reference, _ = train_sae(vit, images, POINT, expansion=1, k=3, batch_size=2, tokens="all")
    for name, value in weights(out).items():
        torch.testing.assert_close(value, getattr(reference, name).detach(), atol=1e-6, rtol=0)
    held = tmp_path / "metrics.json"
    measured = run(
        "-m", "analysis", "sae", "metrics", "--sae", str(out), "--model", "demo", "--demo-scenes", "6",
        "--json", str(held),
    )  # fmt: skip
    assert measured.returncode == 0, measured.stderr
    labels = [render_sample(7071, i)[1] for i in range(6)]
    expected = sae_metrics(vit, load_sae(out), scenes(6, seed=7071), labels=labels)
    numbers = json.loads(held.read_text())
    assert numbers["fraction_variance_explained"] == pytest.approx(expected.fraction_variance_explained, abs=1e-6)
    assert numbers["l0"] == pytest.approx(expected.l0) and numbers["images"] == 6
    assert numbers["accuracy_drop"] == pytest.approx(expected.accuracy_drop)
    assert f"{expected.kl_divergence:.4f}" in measured.stdout and "fraction_variance_explained" in measured.stdout


def test_bad_points_widths_and_folders_exit_2_with_what_to_do(tmp_path):
    base = ["-m", "analysis", "sae", "train", "--model", "demo", "--demo-scenes", "2", "--out", str(tmp_path / "x")]
    unknown = run(*base, "--point", "blocks.9.resid_post")
    assert unknown.returncode == 2 and "blocks.9.resid_post" in unknown.stderr and "blocks 0..3" in unknown.stderr
    too_large_k = run(*base, "--point", POINT, "--expansion", "1", "--k", "500")
    assert too_large_k.returncode == 2 and "k" in too_large_k.stderr
    narrow = save_sae(SparseAutoencoder(SAEConfig(d_in=16, d_sae=32, k=4, hook_name=POINT)), tmp_path / "narrow")
    width = run("-m", "analysis", "sae", "metrics", "--sae", str(narrow), "--model", "demo", "--demo-scenes", "2")
    assert width.returncode == 2 and "16-wide" in width.stderr and "128 wide" in width.stderr
    missing = run("-m", "analysis", "sae", "metrics", "--sae", str(tmp_path), "--model", "demo", "--demo-scenes", "2")
    assert missing.returncode == 2 and "cfg.json" in missing.stderr
