"""The example notebooks (examples/*.ipynb): each runs top to bottom in a fresh kernel (nbclient),
offline, on the bundled demo models; a cell that raises fails the test. In the repository they
are stored without outputs, and docs/notebooks.md links each one."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))
CELL_TIMEOUT_S = 120
FIGURE_TYPES = {"application/vnd.plotly.v1+json", "image/png"}


def test_there_are_example_notebooks():
    assert len(NOTEBOOKS) >= 4, NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_the_notebook_runs_top_to_bottom(path, monkeypatch):
    """Every cell in order, in a kernel started in examples/ as a newcomer's is: no PYTHONPATH, so
    ``analysis`` imports only because the README's install made the package importable from anywhere;
    the hub offline. nbclient raises CellExecutionError at the first cell that raises."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    book = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        book, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(EXAMPLES)}}
    )
    client.execute()
    code = [cell for cell in book.cells if cell.cell_type == "code"]
    assert code and all(cell.execution_count is not None for cell in code)
    outputs = [output for cell in code for output in cell.outputs]
    errors = [output for output in outputs if output.output_type == "error"]
    assert not errors, errors
    # each answers with a figure (plotly, an image, or the instant view's widget, which carries its static copy)
    data = [output.get("data", {}) for output in outputs]
    figures = [
        d for d in data if FIGURE_TYPES & set(d) or {"application/vnd.jupyter.widget-view+json", "text/html"} <= set(d)
    ]
    assert figures, f"{path.name} draws no figure"
    # and leaves no stray output: a progress bar (a tqdm widget, "…%|…"), a warning on stderr
    bars = [d["text/plain"] for d in data if "%|" in d.get("text/plain", "")]
    stderr = [output.text for output in outputs if output.output_type == "stream" and output.name == "stderr"]
    assert not bars and not stderr, (bars, stderr)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_the_notebook_is_stored_without_outputs(path):
    """Outputs stay out of the repository (they hold images and the view's data): run the notebook
    yourself, then clear its outputs before committing (Jupyter: Edit → Clear Outputs of All Cells)."""
    book = nbformat.read(path, as_version=4)
    nbformat.validate(book)
    for index, cell in enumerate(book.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: cell {index} holds outputs"


def test_every_notebook_is_linked_from_the_docs():
    page = (REPO / "docs" / "notebooks.md").read_text(encoding="utf-8")
    for path in NOTEBOOKS:
        assert f"examples/{path.name}" in page, f"docs/notebooks.md does not link {path.name}"
