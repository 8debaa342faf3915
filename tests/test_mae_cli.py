"""``python -m analysis mae``: one process and torchrun (2 ranks, gloo, CPU) equal a direct loop
over mae_reconstruct; bad ratios and models without a decoder exit with a message."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import cli_runner

transformers = pytest.importorskip("transformers")

from analysis.base.images import load_image  # noqa: E402
from analysis.mae import load_mae, mae_reconstruct  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
ENV_KEYS = {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
RATIOS = (0.25, 0.5, 0.75, 0.9)


def run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python *args``: ``-m analysis ...`` in this process (tests/cli_runner.py), torchrun in new ones."""
    import os

    return cli_runner.run(*args, env={**os.environ, **ENV_KEYS}, timeout=timeout)


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    torch.manual_seed(3)
    config = transformers.ViTMAEConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        decoder_hidden_size=16,
        decoder_num_hidden_layers=1,
        decoder_num_attention_heads=2,
        decoder_intermediate_size=32,
        norm_pix_loss=True,
    )
    folder = tmp_path_factory.mktemp("mae")
    transformers.ViTMAEForPreTraining(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def scenes(tmp_path_factory) -> Path:
    """Seven demo scenes and one file that is not an image (it sorts first: image indices shift)."""
    from analysis.demo.data import generate_samples

    folder = tmp_path_factory.mktemp("scenes")
    images, _, _ = generate_samples(7, 77)
    for i, image in enumerate(images):
        image.save(folder / f"scene_{i:02d}.png")
    (folder / "a_corrupt.png").write_bytes(b"this is not a png")
    return folder


def direct_loop(model_folder: Path, scenes: Path, seed: int) -> np.ndarray:
    """Mean over the readable images of mae_reconstruct(image i, seed + i) at each ratio."""
    mae = load_mae(model_folder, device="cpu")
    files = sorted(scenes.glob("*.png"))  # the set's order, the corrupt file included
    losses = []
    for index, path in enumerate(files):
        if path.name.startswith("a_corrupt"):
            continue
        pixels = mae.preprocess(load_image(path))
        losses.append([float(mae_reconstruct(mae, pixels, mask_ratio=r, seed=seed + index).loss) for r in RATIOS])
    return np.array(losses).mean(0)


def test_one_process_and_torchrun_equal_a_direct_loop_over_mae_reconstruct(model_folder, scenes, tmp_path):
    one, two = tmp_path / "one.npz", tmp_path / "two.npz"
    ratios = ",".join(map(str, RATIOS))
    single = run(
        "-m",
        "analysis",
        "mae",
        "--model",
        str(model_folder),
        "--images",
        str(scenes),
        "--ratios",
        ratios,
        "--seed",
        "3",
        "--batch-size",
        "3",
        "--out",
        str(one),
    )
    assert single.returncode == 0, single.stderr
    ranks = run(
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "analysis",
        "mae",
        "--model",
        str(model_folder),
        "--images",
        str(scenes),
        "--ratios",
        ratios,
        "--seed",
        "3",
        "--batch-size",
        "2",
        "--out",
        str(two),
    )
    assert ranks.returncode == 0, ranks.stderr
    a, b = np.load(one), np.load(two)
    assert int(a["world_size"]) == 1 and int(b["world_size"]) == 2
    reference = direct_loop(model_folder, scenes, seed=3)
    np.testing.assert_allclose(a["mean_loss"], reference, atol=1e-5, rtol=0)
    np.testing.assert_allclose(b["mean_loss"], a["mean_loss"], atol=1e-5, rtol=0)
    assert tuple(a["ratios"]) == RATIOS and tuple(a["visible_patches"]) == (12, 8, 4, 1)
    assert int(a["count"]) == int(b["count"]) == 7 and bool(a["norm_pix_loss"])
    for result, process in ((a, single), (b, ranks)):
        assert int(result["skipped"]) == 1 and "a_corrupt.png" in str(result["skipped_images"][0])
        assert "a_corrupt.png" in process.stderr
    # a different seed masks other patches, so the losses differ
    assert not np.allclose(direct_loop(model_folder, scenes, seed=4), reference, atol=1e-6)


def test_bad_ratios_and_a_model_without_decoder_exit_with_a_message(model_folder, scenes, tmp_path):
    from analysis.cli import main

    out = str(tmp_path / "x.npz")
    for ratios, needle in (("0.5,1.0", "mask_ratio"), ("0.99", "hides all"), ("half", "comma-separated")):
        result = run(
            "-m",
            "analysis",
            "mae",
            "--model",
            str(model_folder),
            "--images",
            str(scenes),
            "--ratios",
            ratios,
            "--out",
            out,
        )
        assert result.returncode == 2 and needle in result.stderr, result.stderr
    encoder = tmp_path / "encoder"
    transformers.ViTMAEModel(
        transformers.ViTMAEConfig(
            image_size=32,
            patch_size=8,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=4,
            intermediate_size=64,
        )
    ).save_pretrained(encoder)
    assert main(["mae", "--model", str(encoder), "--images", str(scenes), "--out", out]) == 1
    assert not Path(out).exists()
