"""Every notebook executes without error, and its jupytext .py and .ipynb hold the same cells.

`curriculum` reads a finished study: `tests/study/test_compare.py` executes it on its tiny one.
"""

from pathlib import Path

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.py"))
NEEDS_A_STUDY = {"curriculum"}  # executed by tests/study/test_compare.py


def execute_notebook(path: Path) -> None:
    """Runs every cell of a jupytext notebook from the repository root (as a user would) and
    checks that no cell failed and that a figure was shown."""
    notebook = jupytext.read(path)
    client = NotebookClient(
        notebook,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(ROOT)}},
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs]
    assert not [out for out in outputs if out.output_type == "error"]
    assert any("image/png" in out.get("data", {}) for out in outputs), "no figure was shown"


def _cells(notebook) -> list[tuple[str, str]]:
    return [(cell.cell_type, cell.source.strip()) for cell in notebook.cells]


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ holds no jupytext .py notebooks"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_py_and_ipynb_are_in_sync(path):
    paired = path.with_suffix(".ipynb")
    assert paired.exists(), f"{paired.name} is missing: run `jupytext --sync {path.name}`"
    from_py = jupytext.read(path)
    from_ipynb = nbformat.read(paired, as_version=4)
    assert _cells(from_py) == _cells(from_ipynb), f"run `jupytext --sync {path.name}`"


@pytest.mark.slow
@pytest.mark.parametrize(
    "path", [p for p in NOTEBOOKS if p.stem not in NEEDS_A_STUDY], ids=lambda p: p.stem
)
def test_notebook_executes_without_error(path):
    execute_notebook(path)
