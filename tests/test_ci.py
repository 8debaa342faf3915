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
    "test_rules.py": (
        "import pytest\n\n@pytest.mark.lxt\ndef test_lxt():\n    pytest.importorskip('zennit_not_here')\n\n"
        "@pytest.mark.attack_library\ndef test_attacks():\n    pytest.skip('no torchattacks here')\n"
    ),
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
        "test_rules.py::test_attacks",
        "test_rules.py::test_lxt",
    ], out
    assert "no chromium here" in out and "no_such_module_here" in out and "old AppTest" in out
    assert "no registry here" in out and "zennit_not_here" in out and "no torchattacks here" in out
    assert "6 required test(s) skipped, so this run fails" in out


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


# A tool of the fake machine: it records its name, its arguments and CI, and fails (status 3) when
# "name arguments" contains $FAIL. python3 -m venv DIR makes DIR/bin of such tools.
_RECORDING_TOOL = """#!/bin/sh
echo "$(basename "$0") $* [CI=$CI PYTHONPATH=$PYTHONPATH]" >> {calls}
case "$(basename "$0") $*" in *"$FAIL"*) [ -n "$FAIL" ] && {{ echo "$(basename "$0") failed here"; exit 3; }};; esac
if [ "$(basename "$0") $1 $2" = "python3 -m venv" ]; then
  mkdir -p "$3/bin"
  for tool in python pip pytest lint-imports mypy ruff mkdocs; do cp "$0" "$3/bin/$tool"; done
fi
case "$*" in *"import sysconfig"*) echo /fake/site-packages;; esac
exit 0
"""


def _fake_machine(tmp_path: Path, fail: str = "") -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run .ci/run in an empty checkout on a machine whose python3, venvs and tools only record
    their calls; returns the run and the calls, one line each."""
    checkout = tmp_path / "checkout"
    (checkout / ".ci").mkdir(parents=True)
    run = checkout / ".ci" / "run"
    run.write_text((REPO / ".ci" / "run").read_text())
    calls = tmp_path / "calls"
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("python3", "chromium"):
        (tools / name).write_text(_RECORDING_TOOL.format(calls=calls))
        (tools / name).chmod(0o755)
    packaging = checkout / ".ci" / "packaging_check.sh"
    packaging.write_text(_RECORDING_TOOL.format(calls=calls))
    packaging.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTHONPATH")}
    env.update(PATH=f"{tools}:/usr/bin:/bin", CI_CHROMIUM=str(tools / "chromium"), FAIL=fail)
    result = subprocess.run(["bash", str(run)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    return result, calls.read_text().splitlines() if calls.exists() else []


def _readme_test_command() -> str:
    readme = (REPO / "README.md").read_text()
    return re.search(r"```bash\n(.+?)\n```", readme.split("Run the tests", 1)[1], re.S).group(1).strip()


def test_ci_runs_the_readme_command_and_every_tier_with_ci_set(tmp_path):
    """Every step of .ci/run, seen from the commands it runs: the README's tests, the static
    checks, the docs build (strict, without -q, which hides the warnings that --strict counts), the
    packaging check, each tier deselected by pytest.ini, the minimum-versions job (deselecting, never
    skipping, the upload tests) and SAELens's interop test; all under CI=true."""
    result, calls = _fake_machine(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert all("[CI=true " in call for call in calls), calls
    commands = [call.split(" [CI=")[0].strip() for call in calls]
    expected = [
        "python3 -m venv .venv",
        "pip install -q --no-compile -e .[dev]",
        "pip install -q -e .[dev]",
        "python -m pytest -q tests",  # the README's
        "lint-imports",
        "mypy",
        "ruff check .",
        "ruff format --check .",
        "packaging_check.sh",
        "python -m pytest -q -m real_weights or layout or attack_library or lxt tests",
        "python3 -m pip install -q --no-deps --target .ci-attacks torchattacks==3.5.1",
        "python3 -m pip install -q --no-deps --target .ci-lxt lxt==2.1 zennit==0.5.1",
        "python tests/min_versions_smoke.py",
        "python -m pytest -q tests/test_app.py tests/test_app_families.py -m not upload",
        "python -m pytest -q -n 0 -m sae_lens tests/test_sae.py",
    ]
    for command in expected:
        assert command in commands, (command, commands)
    # the click storm (eight sessions, 90 s), alone: after every other step's commands
    storm = next(
        i for i, c in enumerate(commands) if c.startswith("python tests/bench_click_storm.py --sessions 8 --seconds 90")
    )
    assert storm == len(commands) - 1, commands
    # SAELens's venv borrows .venv's torch; both side venvs install after .venv, never beside it
    # (three CUDA builds of torch unpacking at once filled a CI machine's disk)
    assert "python .ci/lend_torch.py .venv-sae" in commands, commands
    venv_installed = commands.index("pip install -q --no-compile -e .[dev]")
    for side in (
        "pip install -q --no-compile sae-lens",
        "pip install -q --no-compile -r .ci/min-versions.txt pytest>=8.0 pytest-xdist>=3.6",
    ):
        assert commands.index(side) > venv_installed, (side, commands)
    mkdocs = [c for c in commands if c.startswith("mkdocs ")]
    assert len(mkdocs) == 1 and mkdocs[0].startswith("mkdocs build --strict") and " -q" not in mkdocs[0], mkdocs
    tiers = next(call for call in calls if "-m real_weights or layout" in call)
    assert "PYTHONPATH=.ci-attacks:.ci-lxt]" in tiers  # the cross-check libraries, on the tier's path only
    # the marker expression pytest.ini deselects is exactly the tiers run here (and SAELens's)
    deselected = re.search(r'-m "not (.+?)"', (REPO / "pytest.ini").read_text()).group(1).split(" and not ")
    assert sorted(deselected) == ["attack_library", "layout", "lxt", "real_weights", "sae_lens"]
    assert "(steps" not in result.stderr and re.search(r"^readme-tests\s+0\s", result.stdout, re.M)
    # each step's line: exit status, wall seconds and the CPU seconds of what it ran
    assert re.search(r"^readme-tests\s+0\s+\d+s\s+\d+s CPU$", result.stdout, re.M), result.stdout


def test_ci_runs_the_readme_test_command_verbatim():
    script = (REPO / ".ci" / "run").read_text()
    assert f"  ({_readme_test_command()})" in script.splitlines(), _readme_test_command()
    assert "export CI=true" in script.split(_readme_test_command())[0]


def test_a_failing_step_fails_the_run_with_its_log_while_the_others_still_run(tmp_path):
    result, calls = _fake_machine(tmp_path, fail="mypy")
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(r"^static\s+3\s", result.stdout, re.M), result.stdout  # the step, with mypy's status
    assert "mypy failed here" in result.stdout  # its log, printed
    assert "CI failed" in result.stderr
    commands = [call.split(" [CI=")[0].strip() for call in calls]
    assert "python -m pytest -q tests" in commands and "packaging_check.sh" in commands
    assert "ruff check ." not in commands  # the rest of the failed step stopped


def test_ci_run_stops_when_the_venv_cannot_be_made(tmp_path):
    """A venv that cannot be made stops the run: no test and no check runs without it."""
    result, calls = _fake_machine(tmp_path, fail="-m venv .venv")
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(r"^venv\s+3\s", result.stdout, re.M), result.stdout
    commands = [call.split(" [CI=")[0].strip() for call in calls]
    assert not [c for c in commands if "pytest" in c or c in ("mypy", "lint-imports", "packaging_check.sh")], commands


def test_a_side_venv_that_fails_stops_its_job_and_fails_the_run(tmp_path):
    """A side venv that cannot be made leaves its job unrun, named, and fails the run; the other jobs
    still run."""
    result, calls = _fake_machine(tmp_path, fail="-r .ci/min-versions.txt")
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(r"^min-venv\s+3\s", result.stdout, re.M) and re.search(r"^min-versions\s+1\s", result.stdout, re.M)
    assert "not run: the step min-venv failed" in result.stdout
    commands = [call.split(" [CI=")[0].strip() for call in calls]
    assert "python tests/min_versions_smoke.py" not in commands
    assert "python -m pytest -q -n 0 -m sae_lens tests/test_sae.py" in commands  # SAELens's job still ran


def test_a_failing_tier_fails_the_run(tmp_path):
    result, _ = _fake_machine(tmp_path, fail="-m real_weights")
    assert result.returncode == 1 and re.search(r"^tiers\s+3\s", result.stdout, re.M), result.stdout


def test_under_xdist_a_skipped_required_test_still_fails_the_run(tmp_path):
    """The skip check runs in the controller of a parallel run (the workers' reports reach it)."""
    result = _pytest(_synthetic(tmp_path), "-n", "2", ci="true")
    assert result.returncode == 1, result.stdout
    assert "6 required test(s) skipped, so this run fails" in result.stdout, result.stdout


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


def test_the_type_check_and_the_lint_are_configured_in_pyproject():
    """.ci/run calls mypy and ruff bare (test_ci_runs_the_readme_command_and_every_tier_with_ci_set),
    so pyproject.toml's configuration, with its stated exceptions, is the one used."""
    import tomllib

    tool = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]
    assert sorted(tool["mypy"]["files"]) == ["analysis", "vizapp"]
    assert tool["mypy"]["python_version"] == "3.10" and tool["ruff"]["target-version"] == "py310"
    assert {"E", "F", "W", "I", "UP", "B"} <= set(tool["ruff"]["lint"]["select"])
