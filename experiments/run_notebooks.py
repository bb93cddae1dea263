"""Runs the notebooks in place, so their committed .ipynb files show their outputs and figures.

    python -m experiments.run_notebooks --notebooks=notebooks/curriculum.py

What `make notebooks` runs (every notebook when --notebooks is left out). Each jupytext notebook
(`notebooks/<name>.py`, the source) is run by a Jupyter kernel started in notebooks/, as Jupyter
starts one, and written with its outputs into `<name>.ipynb` (cell ids kept). The figures, 70 dpi
PNGs (the notebooks' `%config`), are cut to --colors colours, so each .ipynb stays small.
Needs the notebooks extra: pip install -e '.[notebooks]'.
"""

import base64
import io
import pathlib

from absl import flags

from experiments import _cli
from gdro_jax import step

try:
    import jupytext
    import nbformat
    from jupytext.combine import combine_inputs_with_outputs
    from nbclient import NotebookClient
    from PIL import Image
except ImportError as missing:  # named in one line by main, not at import
    jupytext = missing

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[1] / "notebooks"
_NOTEBOOKS = flags.DEFINE_list("notebooks", None, "The notebooks' .py files (default: all).")
_COLORS = flags.DEFINE_integer("colors", 64, "Colours of each figure (a palette PNG).")


def _fewer_colors(png: str, colors: int) -> str:
    image = Image.open(io.BytesIO(base64.b64decode(png))).convert("RGB")
    buffer = io.BytesIO()
    image.quantize(colors, dither=Image.Dither.NONE).save(buffer, format="png", optimize=True)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def main(argv):
    del argv
    if isinstance(jupytext, ImportError):
        raise step.MissingExtraError(
            f"{jupytext}: running the notebooks needs the notebooks extra: "
            "pip install -e '.[notebooks]'"
        )
    paths = [pathlib.Path(p) for p in _NOTEBOOKS.value or sorted(NOTEBOOKS.glob("*.py"))]
    for path in paths:
        notebook, paired = jupytext.read(path), path.with_suffix(".ipynb")
        if paired.exists():  # the .py's cells, with the .ipynb's cell ids and metadata
            notebook = combine_inputs_with_outputs(notebook, nbformat.read(paired, as_version=4))
        print(f"running {path.name} ...", flush=True)
        resources = {"metadata": {"path": str(path.resolve().parent)}}
        NotebookClient(notebook, timeout=1200, resources=resources, record_timing=False).execute()
        for cell in notebook.cells:
            for output in cell.get("outputs", []):
                if "image/png" in output.get("data", {}):
                    output.data["image/png"] = _fewer_colors(
                        output.data["image/png"], _COLORS.value
                    )
        nbformat.write(notebook, paired)
        print(f"wrote {paired.name} ({paired.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    _cli.run(main)
