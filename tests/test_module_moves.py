"""The flat layout's module paths, kept for one release after ``analysis/`` was laid out in layer
folders: each old path gives the moved module itself, with a DeprecationWarning naming the new path."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import analysis
from analysis.base.module_moves import MOVED_MODULES, new_module_name

REPO = Path(__file__).resolve().parent.parent
ANALYSIS = REPO / "analysis"


def _import_fresh(old: str):
    """Import ``old`` as a user's first import of it would (the alias entry dropped first)."""
    for name in [n for n in sys.modules if n == old or n.startswith(old + ".")]:
        if sys.modules[name].__name__ != name:  # an alias entry, not a real module
            del sys.modules[name]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    return module, [w for w in caught if issubclass(w.category, DeprecationWarning)]


@pytest.mark.parametrize("old", sorted(MOVED_MODULES))
def test_an_old_path_is_the_moved_module_with_a_warning_naming_the_new_path(old):
    new = MOVED_MODULES[old]
    if new == "analysis.views.widgets":
        pytest.importorskip("anywidget")  # the notebook extra; the widget module refuses without it
    module, warned = _import_fresh(old)
    assert module is importlib.import_module(new)
    assert module.__name__ == new and module.__spec__.name == new  # its own spec, not the alias's
    assert [str(w.message).split(":")[0] for w in warned] == [f"{old} moved to {new}"]


def test_every_moved_module_is_at_its_new_path_and_gone_from_the_old_one():
    for old, new in MOVED_MODULES.items():
        new_path = ANALYSIS.joinpath(*new.split(".")[1:])
        assert new_path.with_suffix(".py").is_file() or (new_path / "__init__.py").is_file(), new
        old_path = ANALYSIS.joinpath(*old.split(".")[1:])
        assert not old_path.with_suffix(".py").exists() and not old_path.exists(), old


def test_a_submodule_of_a_moved_package_is_one_module_not_a_second_copy():
    """``analysis.adapters.registry`` must not be found again in the old parent's folder: a second
    copy would hold a second adapter registry (and its relative imports would fail)."""
    registry, warned = _import_fresh("analysis.adapters.registry")
    assert registry is importlib.import_module("analysis.model.adapters.registry")
    assert "analysis.adapters.registry moved to analysis.model.adapters.registry" in str(warned[-1].message)
    assert new_module_name("analysis.loading.hf_swin") == "analysis.model.loading.hf_swin"
    assert new_module_name("analysis.rollouts") is None and new_module_name("analysis.plots") is None


def test_an_old_module_name_as_an_attribute_of_the_package_warns_and_gives_the_module():
    # (an import of the old path binds the attribute, warned once there: start from a package without it)
    vars(analysis).pop("rollout", None)
    with pytest.warns(DeprecationWarning, match=r"analysis\.rollout moved to analysis\.attention\.rollout"):
        module = analysis.rollout
    assert module is importlib.import_module("analysis.attention.rollout")
    with pytest.raises(AttributeError, match="no attribute 'not_a_module'"):
        analysis.not_a_module  # noqa: B018


def test_the_records_package_keeps_the_old_modules_names_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from analysis.records import AttentionRecord, AttentionRecordProtocol
    from analysis.records.attention import AttentionRecord as moved

    assert AttentionRecord is moved and AttentionRecordProtocol.__module__ == "analysis.records.attention"


def test_the_old_paths_work_in_a_fresh_interpreter():
    """A user's script of the flat layout, run as its own process: the names resolve, one warning each."""
    script = (
        "import warnings; warnings.simplefilter('always')\n"
        "from analysis.capture import capture_attention\n"
        "from analysis.spec import ViTSpec\n"
        "import analysis.adapters.registry as r\n"
        "import analysis.engine.capture as c, analysis.model.adapters.registry as r2\n"
        "assert c.capture_attention is capture_attention and r is r2\n"
        "import analysis, analysis.windowed_rollout, analysis.label_space\n"
        "from types import FunctionType\n"
        "assert isinstance(analysis.windowed_rollout, FunctionType), analysis.windowed_rollout\n"
        "assert isinstance(analysis.label_space, FunctionType), analysis.label_space\n"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True)
    moved = sorted(line.split(" moved to ")[0].split()[-1] for line in out.stderr.splitlines() if " moved to " in line)
    assert moved == [
        "analysis.adapters",
        "analysis.adapters.registry",
        "analysis.capture",
        "analysis.label_space",
        "analysis.spec",
        "analysis.windowed_rollout",
    ]
