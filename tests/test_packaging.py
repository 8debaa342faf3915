"""``pip install -e .`` makes ``analysis`` and ``vizapp`` importable from anywhere, and the
``vit-explorer`` console script starts the app.

The install goes into a throw-away virtual environment that sees this environment's packages
through a ``.pth`` file (nothing is downloaded, and the test environment is left as it was).
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path

import pytest

from streamlit_server import free_port

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A venv with this repository installed in editable mode; returns its bin folder."""
    root = tmp_path_factory.mktemp("pkg")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    bin_dir = venv / ("Scripts" if os.name == "nt" else "bin")
    python = bin_dir / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}
    Path(purelib, "_outer_env.pth").write_text("\n".join(sorted(p for p in ours if Path(p).is_dir())) + "\n")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-e", str(REPO)],
        capture_output=True, text=True, cwd=root, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return bin_dir, root


def test_packages_import_from_anywhere(installed):
    bin_dir, root = installed
    code = "import analysis, vizapp, vizapp.cli; print(analysis.__file__)"
    out = subprocess.run([str(bin_dir / "python"), "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert Path(out.stdout.strip()).resolve().parent == (REPO / "analysis").resolve()


def test_console_script_starts_the_app(installed):
    bin_dir, root = installed
    script = bin_dir / "vit-explorer"
    assert script.is_file()
    port = free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    log = root / "vit-explorer.log"
    with log.open("w") as handle:
        process = subprocess.Popen(
            [str(script), "--server.headless=true", f"--server.port={port}", "--server.address=127.0.0.1",
             "--server.fileWatcherType=none"],
            cwd=root, env=env, stdout=handle, stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert process.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, "vit-explorer did not open its port: " + log.read_text()[-2000:]
            time.sleep(0.3)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as response:
            assert response.status == 200 and b"<html" in response.read(2000).lower()
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


def test_the_repository_settings_travel_with_the_script():
    from vizapp.cli import config_flags

    flags = config_flags()
    assert "--server.maxUploadSize=20" in flags and "--browser.gatherUsageStats=false" in flags


def _requirements(path: Path, operator: str) -> dict[str, str]:
    """``name -> version`` for every ``name<operator>version`` line (comments dropped)."""
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if operator in line:
            name, version = line.split(operator)
            found[name.strip().lower().replace("_", "-")] = version.strip()
    return found


def test_every_declared_floor_is_the_version_the_minimum_versions_job_installs():
    """requirements.txt, pyproject.toml and .ci/min-versions.txt name the same floors, so the
    CI job that installs the floors together tests exactly what users are promised."""
    import tomllib

    from packaging.version import Version

    floors = _requirements(REPO / "requirements.txt", ">=")
    pins = _requirements(REPO / ".ci" / "min-versions.txt", "==")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = [*project["dependencies"], *project["optional-dependencies"]["hf"]]
    pyproject_floors = dict(
        (name.strip().lower().replace("_", "-"), version.strip()) for name, version in (d.split(">=") for d in declared)
    )
    runtime = {name: version for name, version in floors.items() if name not in ("pytest", "playwright")}
    assert runtime, "no floors found in requirements.txt"
    assert set(runtime) == set(pins), (sorted(runtime), sorted(pins))
    assert set(pyproject_floors) == set(runtime), (sorted(pyproject_floors), sorted(runtime))
    for name, floor in runtime.items():
        assert Version(floor) == Version(pins[name]), f"{name}: floor {floor}, CI installs {pins[name]}"
        assert Version(pyproject_floors[name]) == Version(floor), f"{name}: pyproject {pyproject_floors[name]}"
    assert "tests/min_versions_smoke.py" in (REPO / ".ci" / "run").read_text()


def test_analysis_console_script_runs_the_command_line(installed, tmp_path):
    """``vit-analysis`` is ``python -m analysis``: the distance of the demo model on one sample."""
    bin_dir, root = installed
    script = bin_dir / "vit-analysis"
    assert script.is_file()
    out = tmp_path / "d.npz"
    result = subprocess.run(
        [str(script), "distance", "--model", "demo", "--images", str(REPO / "assets" / "samples" / "scene_0_bar.png"),
         "--out", str(out)], cwd=root, capture_output=True, text=True, timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr
    import numpy as np

    assert int(np.load(out)["count"]) == 1
