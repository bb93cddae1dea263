"""Every notebook executes without error, in Jupyter and as a plain script; its jupytext .py and
.ipynb hold the same cells, and the committed .ipynb its outputs, small and without this
machine's paths.

`curriculum` reads the committed studies (`tests/study/test_compare.py` also runs it on its tiny
one); `make notebooks` (`experiments/run_notebooks.py`) writes the outputs.
"""

import base64
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.py"))
MAX_BYTES = 300_000  # a committed notebook, outputs and figures included
# The start of an absolute path of a machine (a home, this workspace, a temporary folder).
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:home|Users|work|tmp|root|private|var)/")


def execute_notebook(path: Path) -> None:
    """Runs every cell of a jupytext notebook in a kernel started in its folder, as Jupyter
    starts one, and checks that no cell failed and that a figure was shown."""
    notebook = jupytext.read(path)
    client = NotebookClient(
        notebook,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
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


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_committed_notebook_holds_its_outputs_small_and_without_paths(path):
    paired = path.with_suffix(".ipynb")
    text = paired.read_text(encoding="utf-8")
    assert len(text.encode()) < MAX_BYTES, f"{paired.name}: {len(text.encode())} bytes"
    assert not MACHINE_PATH.search(text), MACHINE_PATH.search(text)[0]
    notebook = nbformat.read(paired, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.execution_count is not None for cell in code), "run `make notebooks`"
    outputs = [output for cell in code for output in cell.outputs]
    assert not [output for output in outputs if output.output_type == "error"]
    figures = [
        output.data["image/png"] for output in outputs if "image/png" in output.get("data", {})
    ]
    assert figures, "no figure"
    for figure in figures:
        with Image.open(io.BytesIO(base64.b64decode(figure))) as image:
            assert image.format == "PNG" and image.width <= 1300  # drawn at 70 dpi


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes_without_error(path):
    execute_notebook(path)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_as_a_script_without_ipython(path):
    """`python notebooks/<name>.py` from the repository root, where IPython cannot be imported
    (the runtime install has no Jupyter)."""
    blocked = (
        "import runpy, sys; sys.modules['IPython'] = None; "
        f"runpy.run_path({str(path)!r}, run_name='__main__')"
    )
    completed = subprocess.run(
        [sys.executable, "-c", blocked],
        cwd=ROOT,
        env=dict(os.environ, MPLBACKEND="Agg"),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]


@pytest.mark.slow
def test_make_notebooks_writes_outputs_and_small_figures_keeping_cell_ids(tmp_path):
    """`experiments.run_notebooks` on a small notebook: the .py's cells with their outputs in the
    .ipynb, figures cut to few colours, the existing .ipynb's cell ids kept."""
    source = tmp_path / "tiny.py"
    source.write_text(
        "# %% [markdown]\n# A figure\n\n"
        "# %%\n# %matplotlib inline\nimport numpy as np\nfrom matplotlib.figure import Figure\n"
        "print('hello from', 'the kernel')\n\n"
        "# %%\nfig = Figure(figsize=(3, 2))\n"
        "fig.subplots().imshow(np.linspace(0, 1, 400).reshape(20, 20))\nfig\n"
    )
    before = jupytext.read(source)
    for number, cell in enumerate(before.cells):
        cell.id = f"cell-{number}"
    nbformat.write(before, source.with_suffix(".ipynb"))
    completed = subprocess.run(
        [sys.executable, "-m", "experiments.run_notebooks", f"--notebooks={source}", "--colors=16"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    after = nbformat.read(source.with_suffix(".ipynb"), as_version=4)
    assert [cell.id for cell in after.cells] == ["cell-0", "cell-1", "cell-2"]
    assert _cells(after) == _cells(jupytext.read(source))
    assert after.cells[1].outputs[0].text == "hello from the kernel\n"
    (figure,) = [o for o in after.cells[2].outputs if "image/png" in o.get("data", {})]
    with Image.open(io.BytesIO(base64.b64decode(figure.data["image/png"]))) as image:
        assert image.mode == "P" and len(image.getcolors()) <= 16
    assert json.loads(source.with_suffix(".ipynb").read_text())["nbformat"] == 4
