"""The package installs and runs outside the repository.

* ``pip install -e .``: ``analysis`` and ``vizapp`` import from anywhere, and the console
  scripts start the app and the command line.
* ``pip install <wheel>``: a wheel built from the sources carries the demo models, the samples,
  the favicon and the app's Streamlit settings; from another directory, with the repository
  nowhere on ``sys.path``, the demo ViT and CNN load and classify the bundled scenes,
  ``python -m analysis report`` writes its report, the app's script runs, and ``vit-explorer``
  answers over HTTP with the repository's settings.

Each install goes into a throw-away virtual environment that sees this environment's packages
through a ``.pth`` file (nothing is downloaded, and the test environment is left as it was). A
``.pth`` line only appends a folder to ``sys.path``; the ``.pth`` files inside that folder (an
editable install of this repository, say) are not run, so the repository cannot leak in.
"""

from __future__ import annotations

import os
import shutil
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


def _venv_seeing_this_environment(root: Path) -> Path:
    """A venv (no pip of its own) whose ``sys.path`` ends with this environment's
    site-packages; returns its bin folder."""
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    bin_dir = venv / ("Scripts" if os.name == "nt" else "bin")
    purelib = subprocess.run(
        [str(bin_dir / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}
    Path(purelib, "_outer_env.pth").write_text("\n".join(sorted(p for p in ours if Path(p).is_dir())) + "\n")
    return bin_dir


def _pip_install(bin_dir: Path, cwd: Path, *args: str) -> None:
    """This environment's pip, installing into the venv of ``bin_dir`` offline, without deps."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(bin_dir / "python"),
            "install",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _clean_env() -> dict[str, str]:
    """The environment of a subprocess that must not see the repository."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    return dict(env, HF_HUB_OFFLINE="1")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A venv with this repository installed in editable mode; returns its bin folder."""
    root = tmp_path_factory.mktemp("pkg")
    bin_dir = _venv_seeing_this_environment(root)
    _pip_install(bin_dir, root, "-e", str(REPO))
    return bin_dir, root


def _copy_sources(target: Path) -> None:
    """The files a clean clone has (tracked and new, not ignored): the wheel is built from a
    copy, so the build leaves nothing in the checkout and sees nothing a clone would not."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            text=True,
        )
    except FileNotFoundError:  # no git on this machine
        listed = None
    if listed is None or listed.returncode != 0:  # not a git checkout (an unpacked source archive)
        shutil.copytree(
            REPO,
            target,
            ignore=shutil.ignore_patterns(
                ".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", "artifacts"
            ),
        )
        return
    for name in filter(None, listed.stdout.split("\0")):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


@pytest.fixture(scope="module")
def wheel_installed(tmp_path_factory):
    """A venv with a wheel of this repository installed (not editable), and an empty working
    folder outside the repository; returns (bin folder, working folder, the wheel)."""
    root = tmp_path_factory.mktemp("wheel")
    sources, dist, work = root / "src", root / "dist", root / "work"
    sources.mkdir(), work.mkdir()
    _copy_sources(sources)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(dist),
            str(sources),
        ],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = dist.glob("vit_explorer-*.whl")
    bin_dir = _venv_seeing_this_environment(root)
    _pip_install(bin_dir, root, str(wheel))
    shutil.rmtree(sources)  # the installed package must not need the sources it was built from
    return bin_dir, work, wheel


def _run_in(bin_dir: Path, cwd: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [str(bin_dir / "python"), *args], cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _serve_until_the_page_answers(command: list[str], cwd: Path, log: Path) -> None:
    """Start ``command`` (a headless Streamlit server on ``port``), wait for its health check and
    its page, stop it."""
    port = free_port()
    with log.open("w") as handle:
        process = subprocess.Popen(
            [
                *command,
                "--server.headless=true",
                f"--server.port={port}",
                "--server.address=127.0.0.1",
                "--server.fileWatcherType=none",
            ],
            cwd=cwd,
            env=_clean_env(),
            stdout=handle,
            stderr=subprocess.STDOUT,
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


def test_packages_import_from_anywhere(installed):
    bin_dir, root = installed
    code = "import analysis, vizapp, vizapp.cli; print(analysis.__file__)"
    out = subprocess.run([str(bin_dir / "python"), "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert Path(out.stdout.strip()).resolve().parent == (REPO / "analysis").resolve()


def test_console_script_starts_the_app(installed):
    bin_dir, root = installed
    script = bin_dir / "vit-explorer"
    assert script.is_file()
    _serve_until_the_page_answers([str(script)], root, root / "vit-explorer.log")


def test_the_repository_settings_travel_with_the_script():
    from vizapp.cli import config_flags

    flags = config_flags()
    assert "--server.maxUploadSize=20" in flags and "--browser.gatherUsageStats=false" in flags


def test_without_a_toml_parser_the_script_says_so_and_still_never_phones_home(monkeypatch, capsys):
    """Python 3.10 has no tomllib: without tomli the settings cannot be read; say so, and keep
    usage statistics off whatever else is missing."""
    import vizapp.cli as cli

    monkeypatch.setattr(cli, "tomllib", None)
    assert cli.config_flags() == ["--browser.gatherUsageStats=false"]
    assert "pip install tomli" in capsys.readouterr().err


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
    """pyproject.toml, the one list of dependencies, and .ci/min-versions.txt name the same floors
    for the library and the extras a user installs (app, hf, notebook), so the CI job that installs
    the floors together tests exactly what users are promised; every requirement is a floor, never a pin."""
    import tomllib
    from packaging.version import Version

    pins = _requirements(REPO / ".ci" / "min-versions.txt", "==")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    declared = [*project["dependencies"], *extras["hf"], *extras["app"], *extras["notebook"]]
    floors = dict(
        (name.strip().lower().replace("_", "-"), version.strip()) for name, version in (d.split(">=") for d in declared)
    )
    assert set(floors) == set(pins), (sorted(floors), sorted(pins))
    for name, floor in floors.items():
        assert Version(floor) == Version(pins[name]), f"{name}: floor {floor}, CI installs {pins[name]}"
    for requirement in [*project["dependencies"], *(r for group in extras.values() for r in group)]:
        assert ">=" in requirement or requirement.startswith("vit-explorer["), requirement
    assert "tests/min_versions_smoke.py" in (REPO / ".ci" / "run").read_text()


def test_analysis_console_script_runs_the_command_line(installed, tmp_path):
    """``vit-analysis`` is ``python -m analysis``: the distance of the demo model on one sample."""
    bin_dir, root = installed
    script = bin_dir / "vit-analysis"
    assert script.is_file()
    out = tmp_path / "d.npz"
    result = subprocess.run(
        [
            str(script),
            "distance",
            "--model",
            "demo",
            "--images",
            str(REPO / "assets" / "samples" / "scene_0_bar.png"),
            "--out",
            str(out),
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr
    import numpy as np

    assert int(np.load(out)["count"]) == 1


# --------------------------------------------------------------------------- the wheel


def test_every_package_folder_is_in_the_wheel_list():
    """pyproject.toml lists its packages (two are mapped folders ``find`` cannot see): a new
    subpackage of the checkout must be added there, or the wheel would go without it. The app's
    page folders (``vizapp/views/<name>/``) travel whole as ``vizapp.views``'s files (``*/*.py``)."""
    import tomllib

    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    assert setuptools["package-data"]["vizapp.views"] == ["*/*.py"]
    found = {
        ".".join(p.parent.relative_to(REPO).parts)
        for top in ("analysis", "vizapp")
        for p in (REPO / top).rglob("__init__.py")
        if p.parent.parent != REPO / "vizapp" / "views"  # a page folder
    }
    assert found <= listed, f"missing from [tool.setuptools] packages: {sorted(found - listed)}"
    assert listed - found == {"analysis._assets", "vizapp._streamlit"}


def test_the_wheel_carries_the_demo_and_the_settings_but_not_the_screenshots(wheel_installed):
    import zipfile

    _, _, wheel = wheel_installed
    names = set(zipfile.ZipFile(wheel).namelist())
    for asset in (
        "demo_vit/model.safetensors",
        "demo_vit/config.json",
        "demo_cnn/model.safetensors",
        "demo_cnn/config.json",
        "demo_swin/model.safetensors",
        "demo_swin/config.json",
        "demo_mae/model.safetensors",
        "demo_mae/config.json",
        "demo_mae/preprocessor_config.json",
        "demo_clip/model.safetensors",
        "demo_clip/config.json",
        "demo_clip/tokenizer.json",
        "demo_clip/tokenizer_config.json",
        "demo_clip/preprocessor_config.json",
        "demo_clip/MODEL_CARD.md",
        "demo_sae/cfg.json",
        "demo_sae/sae_weights.safetensors",
        "demo_sae/README.md",
        "demo_vit_textured/model.safetensors",
        "demo_vit_textured/config.json",
        "demo_vit_textured/MODEL_CARD.md",
        "demo_cnn_textured/model.safetensors",
        "demo_cnn_textured/config.json",
        "demo_swin_textured/model.safetensors",
        "demo_swin_textured/config.json",
        "favicon.png",
        "README.md",
        "samples/scene_1_star.png",
        "samples/coffee.jpg",
    ):
        assert f"analysis/_assets/{asset}" in names, asset
    assert not [n for n in names if n.startswith("training/")]  # the demo models' training scripts stay out
    assert "vizapp/_streamlit/config.toml" in names and "vizapp/views/attention/attention.py" in names
    assert "analysis/views/attention_view_page/index.html" in names  # the instant view's page (no build step)
    assert not [n for n in names if "screenshots" in n]
    # 8 MiB until the demo CLIP (2.5 MB of float32 weights that do not compress) joined the demo models,
    # 10 MiB until the three textured demo variants (2.5 MB of float16 weights) joined them, 12 MiB
    # until the demo SAE (1 MB) did (11.9 MiB with all of them)
    assert wheel.stat().st_size < 14 * 2**20, f"the wheel weighs {wheel.stat().st_size / 2**20:.1f} MiB"


def test_the_installed_demo_models_load_from_another_directory(wheel_installed):
    """The demo ViT, Swin and CNN and their textured variants come from the installed package, not from
    any checkout, and each names the class of every bundled synthetic scene (its class is in the file name)."""
    bin_dir, work, _ = wheel_installed
    code = """
import os, sys, torch
import analysis, vizapp
from analysis import load_image, load_vit
from analysis.base.assets import asset_path, assets_dir
from analysis.robustness import load_cnn
print("FILES", analysis.__file__, vizapp.__file__, assets_dir())
holders = [os.path.abspath(p or ".") for p in sys.path
           if any(os.path.isfile(os.path.join(p or ".", name, "__init__.py")) for name in ("analysis", "vizapp"))]
print("HOLDERS", *holders)  # every sys.path entry an `analysis` or `vizapp` could be imported from
from analysis.sae import demo, load_demo_sae
print("SAE", demo.demo_sae_path() / "cfg.json")  # the demo SAE comes from the installed package too
assert load_demo_sae().config.d_in == load_vit("demo").spec.embed_dim
for model in (load_vit("demo"), load_vit("demo_swin"), load_cnn("demo"),
              load_vit("demo_textured"), load_vit("demo_swin_textured"), load_cnn("demo_textured")):
    for path in sorted(asset_path("samples").glob("scene_*.png")):
        with torch.no_grad():
            logits = model.model(model.preprocess(load_image(path)))
        print("PRED", path.stem.split("_")[-1], model.class_names[int(logits.argmax())])
"""
    out = _run_in(bin_dir, work, "-c", code).stdout
    venv = bin_dir.parent.resolve()
    files = next(line for line in out.splitlines() if line.startswith("FILES")).split()[1:]
    for file in files:
        assert Path(file).resolve().is_relative_to(venv), f"{file} is not the installed copy"
    assert Path(files[2]).name == "_assets"
    (sae,) = [line.split()[1] for line in out.splitlines() if line.startswith("SAE")]
    assert Path(sae).resolve().is_relative_to(venv) and Path(sae).is_file(), sae
    # the venv's site-packages only: not the checkout (this environment's site-packages may lie
    # inside it, as CI's .venv does, and is on the path, but holds no copy of the packages)
    holders = next(line for line in out.splitlines() if line.startswith("HOLDERS")).split()[1:]
    assert len(holders) == 1 and Path(holders[0]).resolve().is_relative_to(venv), holders
    predictions = [line.split()[1:] for line in out.splitlines() if line.startswith("PRED")]
    assert len(predictions) == 18 and all(truth == predicted for truth, predicted in predictions), predictions


def test_the_installed_report_runs_on_the_bundled_samples(wheel_installed):
    """``python -m analysis report`` from another directory, its images the packaged samples
    (the default), its model the packaged demo."""
    bin_dir, work, _ = wheel_installed
    out = work / "report"
    result = _run_in(
        bin_dir,
        work,
        "-m",
        "analysis",
        "report",
        "--model",
        "demo",
        "--out",
        str(out),
        "--examples",
        "1",
        "--device",
        "cpu",
    )
    page = (out / "report.html").read_text()
    for heading in ("Position-embedding similarity", "Mean attention distance against depth", "Attention rollout"):
        assert heading in page, heading
    assert "7 images from" in page, result.stderr[-2000:]  # the seven bundled samples, all read


def test_the_installed_app_runs_and_vit_explorer_answers_with_the_settings(wheel_installed):
    """The installed app script runs (its page, favicon, samples and demo model from the
    package), ``vit-explorer`` passes the packaged settings to Streamlit and serves the page."""
    bin_dir, work, _ = wheel_installed
    code = """
import sys
from pathlib import Path
import streamlit.web.cli
import vizapp.cli
from streamlit.testing.v1 import AppTest

print("CONFIG", vizapp.cli.CONFIG)
streamlit.web.cli.main = lambda: print("ARGV", *sys.argv[1:])
vizapp.cli.main(["--server.port=1"])
at = AppTest.from_file(str(vizapp.cli.APP), default_timeout=240).run()
assert not at.exception, [e.value for e in at.exception]
print("SAMPLES", *at.selectbox(key="image_sample").options)
print("CHARTS", len(at.get("plotly_chart")))
import vizapp.attention_view as view
print("VIEW", len(at.get("component_instance")), (view.COMPONENT_DIR / "index.html").is_file(), view.COMPONENT_DIR)
"""
    out = _run_in(bin_dir, work, "-c", code).stdout
    config = Path(next(line for line in out.splitlines() if line.startswith("CONFIG")).split()[1])
    assert config.resolve().is_relative_to(bin_dir.parent.resolve()) and config.parent.name == "_streamlit"
    argv = next(line for line in out.splitlines() if line.startswith("ARGV")).split()[1:]
    assert argv[0] == "run" and Path(argv[1]).resolve().is_relative_to(bin_dir.parent.resolve())
    for flag in (
        "--server.maxUploadSize=20",
        "--browser.gatherUsageStats=false",
        "--client.toolbarMode=viewer",
        "--theme.base=light",
        "--server.port=1",
    ):
        assert flag in argv, flag
    samples = next(line for line in out.splitlines() if line.startswith("SAMPLES")).split()[1:]
    assert "scene_1_star.png" in samples and "coffee.jpg" in samples and len(samples) == 7
    assert int(next(line for line in out.splitlines() if line.startswith("CHARTS")).split()[1]) > 0
    views, page_found, folder = next(line for line in out.splitlines() if line.startswith("VIEW")).split()[1:]
    # the instant attention view is drawn, and its page comes from the installed package
    assert int(views) == 1 and page_found == "True" and Path(folder).resolve().is_relative_to(bin_dir.parent.resolve())
    _serve_until_the_page_answers([str(bin_dir / "vit-explorer")], work, work / "vit-explorer.log")


# --------------------------------------------------------------------------- the app extra


def test_the_library_does_not_depend_on_the_app():
    """``pip install .`` gives the library without Streamlit: the app's dependencies are the
    ``app`` extra (vizapp.APP_DEPENDENCIES), and no module of analysis/ imports them. Plotly
    stays a core dependency: analysis.plots draws with it. (.ci/packaging_check.sh installs the
    wheel both ways.)"""
    import ast

    import tomllib

    import vizapp

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = {d.split(">=")[0].strip().lower() for d in project["dependencies"]}
    app = {d.split(">=")[0].strip().lower() for d in project["optional-dependencies"]["app"]}
    assert set(vizapp.APP_DEPENDENCIES) == app and not (app & core), (core, app)
    assert "plotly" in core
    imported = set()
    for path in (REPO / "analysis").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
    assert not (imported & app), imported & app
    assert "plotly" in imported


def test_vizapp_without_the_app_extra_says_what_to_install():
    code = (
        "import sys\nsys.modules['streamlit'] = None\n"
        "try:\n    import vizapp\nexcept ImportError as exc:\n"
        "    print(type(exc).__name__, exc)\nelse:\n    print('imported')"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("AppDependencyError "), result.stdout
    assert 'pip install "vit-explorer[app]"' in result.stdout and "streamlit" in result.stdout
