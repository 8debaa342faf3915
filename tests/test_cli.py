"""``python -m analysis``: distance (one process and torchrun), report, and its failures."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import analysis
import cli_runner
from analysis.robustness import load_cnn

REPO = Path(__file__).resolve().parent.parent
ENV_KEYS = {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python *args``: ``-m analysis ...`` in this process (tests/cli_runner.py), torchrun in new ones."""
    import os

    return cli_runner.run(*args, env={**os.environ, **ENV_KEYS}, timeout=timeout)


@pytest.fixture(scope="module")
def scenes(tmp_path_factory) -> Path:
    """Nine demo scenes and one file that is not an image."""
    from analysis.demo.data import generate_samples

    folder = tmp_path_factory.mktemp("scenes")
    images, _, _ = generate_samples(9, 4242)
    for i, image in enumerate(images):
        image.save(folder / f"scene_{i:02d}.png")
    (folder / "corrupt.png").write_bytes(b"this is not a png")
    return folder


def good_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("scene_*.png"))


def test_torchrun_on_two_ranks_equals_one_process_and_the_api(scenes, tmp_path):
    """distance and similarity on two ranks (one torchrun launch for both) against one process
    and the library."""
    one, two = tmp_path / "one.npz", tmp_path / "two.npz"
    single = run("-m", "analysis", "distance", "--model", "demo", "--images", str(scenes), "--out", str(one))
    assert single.returncode == 0, single.stderr
    similar_one, similar_two = tmp_path / "similar_one.npz", tmp_path / "similar_two.npz"
    similarity = [
        "similarity",
        "--model-a",
        "demo",
        "--model-b",
        "cnn:demo",
        "--images",
        "demo:40",
        "--batch-size",
        "8",
    ]
    alone = run("-m", "analysis", *similarity, "--out", str(similar_one))
    assert alone.returncode == 0, alone.stderr
    batch = cli_runner.torchrun_batch(
        {
            "distance": [
                "distance",
                "--model",
                "demo",
                "--images",
                str(scenes),
                "--out",
                str(two),
                "--batch-size",
                "2",
            ],
            "similarity": [*similarity, "--out", str(similar_two)],
        },
        tmp_path,
    )
    ranks = batch["distance"]
    assert ranks.returncode == 0, ranks.stderr
    a, b = np.load(one), np.load(two)
    assert int(a["world_size"]) == 1 and int(b["world_size"]) == 2
    reference = analysis.dataset_attention_distance(analysis.load_vit("demo"), good_files(scenes)).numpy()
    assert a["distance"].shape == reference.shape == (4, 4)
    np.testing.assert_allclose(b["distance"], a["distance"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(a["distance"], reference, atol=1e-5, rtol=0)
    assert int(a["count"]) == int(b["count"]) == 9
    # the corrupt file is skipped, counted and named, by both runs
    for result, process in ((a, single), (b, ranks)):
        assert int(result["skipped"]) == 1 and "corrupt.png" in str(result["skipped_images"][0])
        assert "skipped" in process.stderr and "corrupt.png" in process.stderr
    assert str(b["unit"]) == "px" and tuple(b["grid_size"]) == (8, 8)
    # Figure 7 (right) next to the result: a PNG and a self-contained HTML
    with Image.open(two.with_suffix(".png")) as png:
        assert png.format == "PNG" and png.size == (900, 600)
    page = two.with_suffix(".html").read_text()
    assert "plotly" in page and "mean attention distance" in page.lower()
    # similarity: the five minibatches shared by two ranks (3 and 2), their HSIC sums added up
    assert batch["similarity"].returncode == 0, batch["similarity"].stderr
    c, d = np.load(similar_one), np.load(similar_two)
    assert int(c["world_size"]) == 1 and int(d["world_size"]) == 2 and int(c["images"]) == int(d["images"]) == 40
    api = analysis.representation_similarity(analysis.load_vit("demo"), "demo:40", load_cnn("demo"), batch_size=8)
    np.testing.assert_allclose(d["matrix"], c["matrix"], atol=1e-6, rtol=0)  # float32 forwards: ~1e-8 apart
    np.testing.assert_allclose(c["matrix"], api.matrix, atol=1e-6, rtol=0)
    assert tuple(c["layers_a"]) == api.layers_a and tuple(c["layers_b"]) == api.layers_b
    with Image.open(similar_two.with_suffix(".png")) as png:
        assert png.size == (24 * len(api.layers_b), 24 * len(api.layers_a))
    assert "linear CKA" in similar_two.with_suffix(".html").read_text()


def test_bad_paths_unknown_models_and_unreadable_sets_exit_with_a_message(scenes, tmp_path):
    missing = run(
        "-m",
        "analysis",
        "distance",
        "--model",
        "demo",
        "--images",
        str(tmp_path / "nope"),
        "--out",
        str(tmp_path / "x.npz"),
    )
    assert missing.returncode == 2 and "no such folder" in missing.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (
        run(
            "-m", "analysis", "distance", "--model", "demo", "--images", str(empty), "--out", str(tmp_path / "x.npz")
        ).returncode
        == 2
    )
    pattern = run(
        "-m",
        "analysis",
        "distance",
        "--model",
        "demo",
        "--images",
        str(tmp_path / "*.jpg"),
        "--out",
        str(tmp_path / "x.npz"),
    )
    assert pattern.returncode == 2 and "matches no images" in pattern.stderr
    unknown = run(
        "-m",
        "analysis",
        "distance",
        "--model",
        "no_such_model_xyz",
        "--images",
        str(scenes),
        "--out",
        str(tmp_path / "x.npz"),
    )
    assert unknown.returncode == 1 and "could not load the model" in unknown.stderr
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "a.png").write_bytes(b"x")
    (broken / "b.jpg").write_bytes(b"y")
    nothing = run(
        "-m", "analysis", "distance", "--model", "demo", "--images", str(broken), "--out", str(tmp_path / "x.npz")
    )
    assert nothing.returncode == 1 and "None of the 2 images" in nothing.stderr
    assert not (tmp_path / "x.npz").exists()


def test_similarity_skips_an_unreadable_image_and_names_it(scenes, tmp_path):
    out = tmp_path / "similar.npz"
    result = run(
        "-m",
        "analysis",
        "similarity",
        "--model-a",
        "demo",
        "--images",
        str(scenes),
        "--batch-size",
        "5",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    assert "skipped" in result.stderr and "corrupt.png" in result.stderr
    assert int(np.load(out)["images"]) == 9  # the nine scenes: minibatches of 5 and 4 once the corrupt file is out


def test_a_glob_and_a_zip_name_the_same_images_as_the_folder(scenes, tmp_path):
    import zipfile

    from analysis.cli.sources import resolve_images

    folder = resolve_images(str(scenes))
    pattern = resolve_images(str(scenes / "scene_*.png"))
    archive_path = tmp_path / "scenes.zip"
    with zipfile.ZipFile(archive_path, "w") as archive:
        for path in good_files(scenes):
            archive.write(path, path.name)
    archive = resolve_images(str(archive_path))
    assert len(folder) == 10 and len(pattern) == len(archive) == 9
    assert [Path(n).name for n in pattern.names] == [Path(n).name for n in archive.names]
    assert archive.items[0] == good_files(scenes)[0].read_bytes()
    shards = [folder.shard(r, 3) for r in range(3)]
    assert sorted(n for s in shards for n in s.names) == sorted(folder.names)  # each image exactly once
    assert [len(s) for s in shards] == [4, 3, 3]


def test_report_writes_one_self_contained_file_with_every_panel(scenes, tmp_path):
    from analysis.cli.report import PANELS

    code = (
        "import sys; from analysis.cli import main; "
        f"code = main(['report', '--model', 'demo', '--images', {str(scenes)!r}, '--out', {str(tmp_path)!r}, "
        "'--examples', '2']); "
        "assert 'streamlit' not in sys.modules, 'the report imported streamlit'; raise SystemExit(code)"
    )
    result = run("-c", code)
    assert result.returncode == 0, result.stderr
    page = (tmp_path / "report.html").read_text()
    for panel, heading in PANELS.items():
        assert f"<section id='{panel}'>" in page and heading in page, panel
    assert len(re.findall(r"\* plotly\.js v\d", page)) == 1  # plotly.js inlined, once
    assert not re.search(r"<script[^>]+src=", page) and not re.search(r"<link[^>]+href=", page)  # nothing fetched
    assert page.count('class="plotly-graph-div"') >= 6  # filters, variance, position, distance, 2 attention maps
    assert page.count("alt='rollout of") == 2
    assert "9 images from folder" in page and "1 unreadable, skipped" in page


def test_a_model_without_a_position_table_says_why_in_the_report(tmp_path):
    """A relative-position model has no per-position embedding: its panel carries the reason,
    and the other panels are still drawn."""
    result = run(
        "-m",
        "analysis",
        "report",
        "--model",
        "random:vit_relpos_small_patch16_224",
        "--out",
        str(tmp_path),
        "--examples",
        "1",
        "--images",
        str(REPO / "assets" / "samples" / "scene_0_bar.png"),
    )
    assert result.returncode == 0, result.stderr
    page = (tmp_path / "report.html").read_text()
    position = page[page.index("<section id='position'>") :]
    position = position[: position.index("</section>")]
    assert "relative-position bias" in position and "plotly-graph-div" not in position
    assert "<section id='rollout'>" in page and "alt='rollout of" in page


def test_nice_ticks_cover_the_range():
    from analysis.cli.png_plot import nice_ticks

    assert nice_ticks(0, 116.5) == [0, 50, 100, 150]
    for hi in (1.0, 7.3, 116.5, 2345.0):
        ticks = nice_ticks(0, hi)
        steps = np.diff(ticks)
        assert ticks[0] <= 0 and ticks[-1] >= hi and np.allclose(steps, steps[0])
        mantissa = steps[0] / 10 ** np.floor(np.log10(steps[0]))
        assert any(np.isclose(mantissa, m) for m in (1, 2, 5)), ticks
