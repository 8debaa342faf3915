"""The library never imports its app: no module of ``analysis`` imports ``vizapp`` or
``streamlit``, neither directly nor through another module, and the command line runs from a
copy of ``analysis`` that has no ``vizapp`` next to it."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
FORBIDDEN = ("vizapp", "streamlit")


def forbidden_imports(root: Path) -> list[str]:
    """``path:line: module`` of every ``import``/``from`` naming a forbidden package, anywhere
    in the file (functions included, where a lazy import would hide from an import walk)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                if name.split(".")[0] in FORBIDDEN:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno}: {name}")
    return found


def test_no_analysis_source_names_the_app_or_streamlit():
    assert forbidden_imports(REPO / "analysis") == []


WALK = """
import importlib, pkgutil, sys
import analysis
failed = []
for module in pkgutil.walk_packages(analysis.__path__, "analysis."):
    try:
        importlib.import_module(module.name)
    except Exception as exc:  # an optional dependency missing must not hide a forbidden import
        failed.append(f"{module.name}: {exc!r}")
names = sorted(pkgutil.walk_packages(analysis.__path__, "analysis."), key=lambda m: m.name)
print("imported", len(names), "modules")
for line in failed:
    print("could not import", line)
bad = sorted(name for name in sys.modules if name.split(".")[0] in ("vizapp", "streamlit"))
assert not bad, f"importing analysis loaded {bad}"
"""


def test_importing_every_analysis_module_loads_neither_the_app_nor_streamlit():
    """Every module of the package imported in a fresh interpreter (transitive imports
    included): nothing under ``vizapp`` or ``streamlit`` ends up in ``sys.modules``."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", WALK], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "could not import" not in result.stdout, result.stdout
    count = int(result.stdout.split("imported ")[1].split()[0])
    assert count >= 60, result.stdout  # the walk really covered the package


@pytest.fixture(scope="module")
def library_only(tmp_path_factory) -> Path:
    """A folder holding a copy of ``analysis`` (and the bundled assets) but no ``vizapp``, and
    a ``streamlit`` that cannot be imported: only the library is installed."""
    root = tmp_path_factory.mktemp("library_only")
    shutil.copytree(REPO / "analysis", root / "analysis", ignore=shutil.ignore_patterns("__pycache__"))
    if (REPO / "assets").is_dir():
        shutil.copytree(REPO / "assets", root / "assets", ignore=shutil.ignore_patterns("screenshots"))
    blocked = root / "blocked"
    for name in FORBIDDEN:
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(
            f"raise ImportError('{name} is not installed here: the library must run without it')\n"
        )
    images = root / "images"
    images.mkdir()
    from analysis.demo.data import generate_samples

    for i, image in enumerate(generate_samples(3, 777)[0]):
        image.save(images / f"scene_{i}.png")
    assert not (root / "vizapp").exists()
    return root


def run_library_only(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(PYTHONPATH=str(root / "blocked"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "analysis", *args], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )


def test_the_blocked_copy_really_lacks_the_app(library_only):
    """The check below can fail: in this folder, importing either package is an error."""
    for name in FORBIDDEN:
        env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
        env["PYTHONPATH"] = str(library_only / "blocked")
        result = subprocess.run(
            [sys.executable, "-c", f"import {name}"],
            cwd=library_only,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode != 0 and "ImportError" in result.stderr, name


def test_report_and_distance_run_with_only_the_library(library_only):
    report = run_library_only(
        library_only, "report", "--model", "demo", "--images", "images", "--out", "report", "--examples", "2"
    )
    assert report.returncode == 0, report.stderr
    page = (library_only / "report" / "report.html").read_text(encoding="utf-8")
    assert page.count('class="plotly-graph-div"') >= 6 and page.count("alt='rollout of") == 2
    assert "3 images from folder" in page

    distance = run_library_only(
        library_only, "distance", "--model", "demo", "--images", "images", "--out", "out/distance.npz"
    )
    assert distance.returncode == 0, distance.stderr
    saved = np.load(library_only / "out" / "distance.npz")
    assert int(saved["count"]) == 3 and saved["distance"].ndim == 2
    assert (library_only / "out" / "distance.html").stat().st_size > 0
    assert (library_only / "out" / "distance.png").stat().st_size > 0
