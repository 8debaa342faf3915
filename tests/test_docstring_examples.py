"""Every ``>>>`` example in the library's docstrings runs, offline, on the bundled demo models, and prints
what it says (doctest, with ``...`` and whitespace forgiven). An example inside a function or class may
use ``vit`` (the demo ViT) and ``pixels`` (its preprocessed star scene), as the module docstrings define
them; anything else it imports itself."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from pathlib import Path

import pytest

import analysis

PACKAGE = Path(analysis.__file__).resolve().parent


def _examples() -> list[doctest.DocTest]:
    """Each docstring with examples, in the module that defines it (a re-exported name is found once)."""
    found: dict[str, doctest.DocTest] = {}
    finder = doctest.DocTestFinder(exclude_empty=True)
    names = ["analysis"] + [m.name for m in pkgutil.walk_packages([str(PACKAGE)], "analysis.")]
    for name in names:
        if name.rsplit(".", 1)[-1] == "__main__":  # running it is the command line
            continue
        module = importlib.import_module(name)
        source = Path(module.__file__).resolve()
        for test in finder.find(module, name):
            if test.examples and test.filename and Path(test.filename).resolve() == source:
                found.setdefault(f"{source.relative_to(PACKAGE.parent)}:{test.lineno}", test)
    return [found[key] for key in sorted(found)]


EXAMPLES = _examples()


def test_the_library_has_docstring_examples():
    assert sum(len(test.examples) for test in EXAMPLES) >= 40, [test.name for test in EXAMPLES]


@pytest.mark.parametrize("test", EXAMPLES, ids=[test.name for test in EXAMPLES])
def test_the_docstring_example_runs(test, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    vit = analysis.load_vit("demo")
    pixels = vit.preprocess(analysis.load_image(analysis.asset_path("samples", "scene_1_star.png")))
    test.globs.update(vit=vit, pixels=pixels)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report: list[str] = []
    result = runner.run(test, out=report.append)
    assert result.failed == 0, "".join(report)
