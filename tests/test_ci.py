"""CI itself: ``.ci/run`` runs the README's test command, stops when Chromium is missing, and
under ``CI=true`` a skipped browser, load, upload or Hugging Face test fails the run
(``tests/ci_skip_check.py``, checked here on synthetic test files in a pytest subprocess)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"

SYNTHETIC = {
    "test_browser.py": "import pytest\n\n@pytest.mark.skip(reason='no chromium here')\ndef test_page():\n    pass\n",
    "test_foreign_models.py": "import pytest\n\npytest.importorskip('no_such_module_here')\n\ndef test_hf():\n    pass\n",
    "test_app.py": (
        "import pytest\n\n@pytest.mark.upload\ndef test_upload():\n    pytest.skip('old AppTest')\n\n"
        "def test_page():\n    pass\n"
    ),
    "test_other.py": "import pytest\n\n@pytest.mark.skip(reason='optional')\ndef test_optional():\n    pass\n",
    "test_real_pictures.py": "import pytest\n\ndef test_real():\n    pytest.skip('no registry here')\n",
}


def _pytest(folder: Path, *args: str, ci: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = str(TESTS)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "ci_skip_check", "-p", "no:cacheprovider", "-q", *args, str(folder)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _synthetic(tmp_path: Path, names=tuple(SYNTHETIC)) -> Path:
    for name in names:
        (tmp_path / name).write_text(SYNTHETIC[name])
    return tmp_path


def test_in_ci_a_skipped_required_test_fails_the_run_and_is_named(tmp_path):
    result = _pytest(_synthetic(tmp_path), ci="true")
    out = result.stdout
    assert result.returncode == 1, out
    named = re.findall(r"SKIPPED IN CI (\S+):", out)
    assert sorted(named) == [
        "test_app.py::test_upload",
        "test_browser.py::test_page",
        "test_foreign_models.py",
        "test_real_pictures.py::test_real",
    ], out
    assert "no chromium here" in out and "no_such_module_here" in out and "old AppTest" in out
    assert "no registry here" in out
    assert "4 required test(s) skipped, so this run fails" in out


def test_outside_ci_the_same_skips_pass(tmp_path):
    result = _pytest(_synthetic(tmp_path), ci=None)
    assert result.returncode == 0 and "SKIPPED IN CI" not in result.stdout, result.stdout


def test_in_ci_a_deselected_upload_test_and_an_optional_skip_pass(tmp_path):
    """The minimum-versions job deselects the upload tests (``-m "not upload"``): not a skip."""
    result = _pytest(_synthetic(tmp_path, ("test_app.py", "test_other.py")), "-m", "not upload", ci="true")
    assert result.returncode == 0 and "SKIPPED IN CI" not in result.stdout, result.stdout
    assert "1 passed, 1 skipped, 1 deselected" in result.stdout


def test_in_ci_a_failure_stays_a_failure(tmp_path):
    (tmp_path / "test_browser.py").write_text("def test_page():\n    assert False\n")
    result = _pytest(tmp_path, ci="true")
    assert result.returncode == 1 and "1 failed" in result.stdout


def _fake_tools(folder: Path, calls: Path) -> Path:
    """apt-get that fails (no network, no package), sudo that runs its command, python3 that
    records being called (it must not be: the run stops before creating any venv)."""
    folder.mkdir()
    scripts = {"apt-get": "exit 100", "sudo": 'exec "$@"', "python3": f'echo "$@" >> {calls}; exit 99'}
    for name, body in scripts.items():
        (folder / name).write_text(f"#!/bin/sh\n{body}\n")
        (folder / name).chmod(0o755)
    return folder


def test_ci_run_stops_with_a_message_when_chromium_cannot_be_installed(tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / ".ci").mkdir(parents=True)
    run = checkout / ".ci" / "run"
    run.write_text((REPO / ".ci" / "run").read_text())
    run.chmod(0o755)
    calls = tmp_path / "python3-calls"
    tools = _fake_tools(tmp_path / "bin", calls)
    env = dict(
        os.environ,
        PATH=f"{tools}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        CI_CHROMIUM=str(tmp_path / "no" / "chromium"),
    )
    result = subprocess.run(["bash", str(run)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Chromium is not installed" in result.stderr and "could not be installed" in result.stderr
    assert not calls.exists(), f"the run went on without Chromium: {calls.read_text()}"


def test_ci_run_stops_when_the_readme_command_cannot_make_its_venv(tmp_path):
    """Under ``set -e`` a failure inside an ``&&`` list does not stop a script: a venv that cannot be
    made would skip the tests and let the later steps run. The README's command runs in a subshell,
    so the run stops there with that failure's status and no later step is reached."""
    checkout = tmp_path / "checkout"
    (checkout / ".ci").mkdir(parents=True)
    run = checkout / ".ci" / "run"
    run.write_text((REPO / ".ci" / "run").read_text())
    run.chmod(0o755)
    calls = tmp_path / "python3-calls"
    tools = _fake_tools(tmp_path / "bin", calls)
    chromium = tmp_path / "chromium"
    chromium.write_text("#!/bin/sh\nexit 0\n")
    chromium.chmod(0o755)
    later = tmp_path / "later-steps"
    (checkout / ".venv" / "bin").mkdir(parents=True)
    step = checkout / ".venv" / "bin" / "lint-imports"  # the step after the README's command
    step.write_text(f"#!/bin/sh\necho lint-imports >> {later}\n")
    step.chmod(0o755)
    env = dict(os.environ, PATH=f"{tools}:{os.environ.get('PATH', '/usr/bin:/bin')}", CI_CHROMIUM=str(chromium))
    result = subprocess.run(["bash", str(run)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert calls.read_text().split("\n")[0] == "-m venv .venv"  # the README's command began
    assert result.returncode == 99, result.stdout + result.stderr  # python3's failure, not a later one
    assert not later.exists(), "the run went on past the README's failed command"


def test_ci_runs_the_readme_test_command_verbatim_with_ci_set():
    readme = (REPO / "README.md").read_text()
    section = readme.split("Run the tests", 1)[1]
    command = re.search(r"```bash\n(.+?)\n```", section, re.S).group(1).strip()
    script = (REPO / ".ci" / "run").read_text()
    assert f"({command})" in script.splitlines(), command  # in a subshell: its failure stops the run
    assert "export CI=true" in script.split(command)[0]
    assert '-m "not upload"' in script  # the minimum-versions job deselects (never skips) the upload tests
    # the real-weights tier, deselected by pytest.ini from the README's command, is a step of its own
    after = script.split(command, 1)[1]
    assert "-m real_weights tests" in after and "-m layout tests" in after and "-m attack_library tests" in after
    assert "-m sae_lens tests/test_sae.py" in after and "-m lxt tests/test_attnlrp.py" in after
    assert (
        '-m "not real_weights and not layout and not attack_library and not sae_lens and not lxt"'
        in (REPO / "pytest.ini").read_text()
    )


def test_every_app_test_that_uploads_is_marked_upload():
    """The minimum-versions job deselects by the marker: an unmarked upload test would skip
    there instead (and the CI check would not know it as an upload test)."""
    import ast

    unmarked = []
    for path in sorted(TESTS.glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                calls = {n.func.id for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
                marks = {ast.unparse(d) for d in node.decorator_list}
                if "uploader" in calls and "pytest.mark.upload" not in marks:
                    unmarked.append(f"{path.name}::{node.name}")
    assert not unmarked, f"call uploader() but are not marked @pytest.mark.upload: {unmarked}"


def test_ci_builds_the_docs_strictly_and_checks_the_packaging_after_the_tests():
    """The documentation build (--strict: a broken link or docstring reference fails it) and the
    wheel-without-the-app-extra check are steps of .ci/run, after the README's command."""
    readme = (REPO / "README.md").read_text()
    command = re.search(r"```bash\n(.+?)\n```", readme.split("Run the tests", 1)[1], re.S).group(1).strip()
    after = (REPO / ".ci" / "run").read_text().split(command, 1)[1]
    build = re.search(r"^[^#\n]*\.venv/bin/mkdocs build --strict.*$", after, re.M)
    assert build, "no strict docs build in .ci/run"
    assert " -q" not in build.group(0), "mkdocs -q drops the warnings that --strict counts: the build always passes"
    assert re.search(r"^\.ci/packaging_check\.sh$", after, re.M), "no packaging check in .ci/run"
    assert os.access(REPO / ".ci" / "packaging_check.sh", os.X_OK)


def test_ci_type_checks_and_lints_with_the_configuration_in_pyproject():
    """mypy (over analysis/ and vizapp/) and ruff's linter are steps of .ci/run after the README's
    command, each run bare so that pyproject.toml's configuration, with its stated exceptions, is the one used."""
    import tomllib

    readme = (REPO / "README.md").read_text()
    command = re.search(r"```bash\n(.+?)\n```", readme.split("Run the tests", 1)[1], re.S).group(1).strip()
    after = (REPO / ".ci" / "run").read_text().split(command, 1)[1]
    assert re.search(r"^\.venv/bin/mypy$", after, re.M), "no type check in .ci/run"
    assert re.search(r"^\.venv/bin/ruff check \.$", after, re.M), "no lint in .ci/run"
    assert re.search(r"^\.venv/bin/ruff format --check \.$", after, re.M), "no format check in .ci/run"
    tool = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]
    assert sorted(tool["mypy"]["files"]) == ["analysis", "vizapp"]
    assert tool["mypy"]["python_version"] == "3.10" and tool["ruff"]["target-version"] == "py310"
    assert {"E", "F", "W", "I", "UP", "B"} <= set(tool["ruff"]["lint"]["select"])
