"""Every ```python block of README.md and docs/**/*.md runs, offline, on the bundled demo models.

The blocks of one file run in order in one namespace (a page is one session: later blocks use
the names earlier ones defined), from the repository root (the pages name ``assets/samples/...``)
with a temporary folder as the working directory for what they write. A block that needs the
network or a GPU is marked on the line just before it::

    <!-- skip: needs the Hugging Face hub -->
    ```python
    ...

The test counts the marked blocks (:data:`EXPECTED_SKIPPED`: adding one is a deliberate edit
here) and fails on a marker that is not directly followed by a python block or gives no reason.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)
SKIP = re.compile(r"<!--\s*skip(?::\s*(?P<reason>[^>]*?))?\s*-->")
#: marked blocks over all pages (README and docs): two need the network (hub weights); one is the
#: toy page's script, which runs under Streamlit (tests/test_add_page.py).
EXPECTED_SKIPPED = 3


def blocks(page: Path) -> list[tuple[int, str, str | None]]:
    """``(line, code, skip reason or None)`` of every python block of ``page``, in order."""
    text = page.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = SKIP.fullmatch(before.strip())
        found.append((text.count("\n", 0, match.start()) + 1, match.group(1), marker and (marker["reason"] or "")))
    return found


def misplaced_markers(page: Path) -> list[str]:
    """Markers not on the line just before a python block, and markers without a reason."""
    text = page.read_text(encoding="utf-8")
    problems = []
    for marker in SKIP.finditer(text):
        line = text.count("\n", 0, marker.start()) + 1
        after = text[marker.end() :].lstrip(" ")
        if not after.startswith("\n```python"):
            problems.append(f"{page.relative_to(REPO)}:{line}: the skip marker is not just before a ```python block")
        if not (marker["reason"] or "").strip():
            problems.append(f"{page.relative_to(REPO)}:{line}: the skip marker gives no reason")
    return problems


PAGES_WITH_CODE = [page for page in PAGES if blocks(page)]


def test_skip_markers_are_placed_and_counted(capsys):
    problems = [problem for page in PAGES for problem in misplaced_markers(page)]
    assert not problems, "\n".join(problems)
    skipped = [
        f"{page.relative_to(REPO)}:{line} ({reason})"
        for page in PAGES
        for line, _, reason in blocks(page)
        if reason is not None
    ]
    total = sum(len(blocks(page)) for page in PAGES)
    with capsys.disabled():
        print(f"\n{total - len(skipped)} python blocks run, {len(skipped)} skipped: " + "; ".join(skipped))
    assert len(skipped) == EXPECTED_SKIPPED, skipped


@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=[str(p.relative_to(REPO)) for p in PAGES_WITH_CODE])
def test_the_python_blocks_of_a_page_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "assets").symlink_to(REPO / "assets")  # the pages' relative paths, from a scratch folder
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.syspath_prepend(str(REPO))
    namespace: dict = {"__name__": f"docs_example_{page.stem}"}
    for line, code, skip in blocks(page):
        if skip is not None:
            continue
        name = f"{page.relative_to(REPO)}:{line}"
        try:
            exec(compile(code, name, "exec"), namespace)
        except Exception as exc:  # noqa: BLE001 - say which block failed, then fail
            raise AssertionError(f"the python block at {name} failed: {type(exc).__name__}: {exc}") from exc


def test_the_pages_are_collected():
    """A renamed folder or fence would leave the test above with nothing to run."""
    assert (REPO / "README.md") in PAGES_WITH_CODE
    assert len(PAGES_WITH_CODE) >= 10, [str(p) for p in PAGES_WITH_CODE]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


ISSUE_NUMBER = re.compile(r"\b[Ii]ssues? #?\d+|(?<=[\s(])#\d{2,3}\b")  # "issue 23", "(#36)"; not colours ("#777")


def issue_numbers_in_code(packages=("analysis", "vizapp")) -> list[str]:
    """Issue numbers in the string literals (messages, docstrings) of the library and the app."""
    import ast

    found = []
    for package in packages:
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and ISSUE_NUMBER.search(node.value):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: {ISSUE_NUMBER.search(node.value).group(0)}")
    return found


def test_no_issue_numbers_in_user_facing_text():
    """An issue number means nothing to a user: none in the README, the docs, the messages and
    docstrings of analysis/ and vizapp/ (comments may keep them)."""
    found = issue_numbers_in_code()
    for page in PAGES:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if ISSUE_NUMBER.search(line):
                found.append(f"{page.relative_to(REPO)}:{number}: {ISSUE_NUMBER.search(line).group(0)}")
    assert not found, "\n".join(found)


def test_docstring_references_name_what_exists():
    """Every Sphinx role in a docstring (:func:`name`, ...) names something that exists
    (docs/references.py; the docs build turns each into a link)."""
    sys.path.insert(0, str(REPO / "docs"))
    try:
        from references import broken_references
    finally:
        sys.path.remove(str(REPO / "docs"))
    broken = broken_references()
    assert not broken, "\n".join(broken)


def test_the_package_lists_first_what_the_readme_tour_imports():
    """``analysis.__all__`` (the order of the API reference, mkdocs.yml's ``members_order``) starts with
    the names the README's tour imports, in that order, and ends with the error classes."""
    import analysis

    (line,) = [
        line for line in (REPO / "README.md").read_text().splitlines() if line.startswith("from analysis import ")
    ]
    tour = [name.strip() for name in line.removeprefix("from analysis import ").split(",")]
    assert analysis.__all__[: len(tour)] == tour, analysis.__all__[: len(tour)]
    errors = [
        name
        for name in analysis.__all__
        if isinstance(getattr(analysis, name), type) and issubclass(getattr(analysis, name), Exception)
    ]
    assert analysis.__all__[-len(errors) :] == errors
    assert len(set(analysis.__all__)) == len(analysis.__all__) and all(hasattr(analysis, n) for n in analysis.__all__)
