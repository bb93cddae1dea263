"""The layers hold: imports between gdro_jax's packages only point down, read with `ast`.

The rules (docs/architecture.md):

1. Each package has a layer (`LAYERS`); it imports only packages of lower layers, so
   `controllers` and `losses` import no other gdro_jax package, and nothing below `train`
   (`step`, `planner`, `checkpoint`, `configs`, `eval`, `warmstart`, `sim`, `tasks`, `models`,
   ...) imports it.
2. Nobody imports `gdro_jax.X._module` from outside `X`: gdro_jax's other packages, `benchmarks/`,
   `experiments/` and `notebooks/` use what `X/__init__.py` exports.
3. No gdro_jax import hides inside a function or class (where it would dodge a cycle).

Each rule is checked on the repository, and on a copy with a violation planted: the checker must
report it.
"""

from __future__ import annotations

import ast
import pathlib
import shutil

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# A package imports only packages of lower layers (the same layer is not lower).
LAYERS = {
    "controllers": 0,
    "integrations": 1,
    "levels": 0,
    "losses": 0,
    "models": 1,
    "plots": 1,
    "data": 1,
    "rewards": 1,
    "sampling": 2,
    "tasks": 2,
    "runtime": 2,
    "step": 3,
    "configs": 4,
    "checkpoint": 5,
    "planner": 5,
    "train": 6,
    "eval": 6,
    "sim": 6,
    "warmstart": 7,
    "study": 8,
}
USERS = ("benchmarks", "experiments", "notebooks")  # code outside the library that uses it


def _imported(node: ast.AST, package: str | None) -> list[tuple[str, str | None]]:
    """`(package, module or None)` of each gdro_jax import of an `import` / `from` node: the
    module is the part after the package (`_checkpoint` in `gdro_jax.train._checkpoint`)."""
    found = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            parts = alias.name.split(".")
            if parts[0] == "gdro_jax" and len(parts) > 1:
                found.append((parts[1], parts[2] if len(parts) > 2 else None))
    elif isinstance(node, ast.ImportFrom):
        if node.level:  # relative: from the file's own package
            parts = ["gdro_jax", package or "", *(node.module or "").split(".")]
        else:
            parts = (node.module or "").split(".")
        if parts[0] != "gdro_jax":
            return found
        if len(parts) == 1:  # from gdro_jax import train, eval as evaluation
            found.extend((alias.name, None) for alias in node.names)
        elif len(parts) == 2:  # from gdro_jax.train import build_run, _loop
            found.extend(
                (parts[1], alias.name if alias.name.startswith("_") else None)
                for alias in node.names
            )
        else:
            found.append((parts[1], parts[2]))
    return found


def _nested_imports(tree: ast.AST) -> list[ast.AST]:
    """The import nodes inside a function or class body."""
    nested = []
    for scope in ast.walk(tree):
        if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            for node in ast.walk(scope):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    nested.append(node)
    return nested


def violations(root: pathlib.Path) -> list[str]:
    """Every broken rule in the tree at `root`, one line each (`file:line: what`)."""
    found = []
    files = sorted((root / "gdro_jax").rglob("*.py"))
    for folder in USERS:
        files += sorted((root / folder).rglob("*.py"))
    for path in files:
        relative = path.relative_to(root)
        in_library = relative.parts[0] == "gdro_jax"
        package = relative.parts[1] if in_library and len(relative.parts) > 2 else None
        tree = ast.parse(path.read_text(encoding="utf-8"), str(relative))
        nested = {id(node) for node in _nested_imports(tree)}
        for node in ast.walk(tree):
            for target, module in _imported(node, package):
                where = f"{relative}:{node.lineno}"
                if id(node) in nested:
                    found.append(f"{where}: gdro_jax.{target} imported inside a function")
                if target not in LAYERS:
                    continue
                if module is not None and target != package:
                    found.append(f"{where}: imports gdro_jax.{target}.{module} from outside it")
                if package is not None and package != target:
                    if package not in LAYERS:
                        found.append(f"{where}: gdro_jax.{package} has no layer in LAYERS")
                    elif LAYERS[target] >= LAYERS[package]:
                        found.append(
                            f"{where}: {package} (layer {LAYERS[package]}) imports {target} "
                            f"(layer {LAYERS[target]})"
                        )
        if relative.name == "__init__.py" and relative.parent == pathlib.Path("gdro_jax"):
            if any(_imported(node, None) for node in ast.walk(tree)):
                found.append(f"{relative}: the top-level package imports a subpackage")
    return found


def test_every_package_has_a_layer():
    packages = {p.name for p in (ROOT / "gdro_jax").iterdir() if (p / "__init__.py").exists()}
    assert packages == set(LAYERS)


def test_the_repository_keeps_every_rule():
    assert violations(ROOT) == []


@pytest.fixture
def copy(tmp_path):
    """The library and its users, copied: each test plants one violation into it."""
    for folder in ("gdro_jax", *USERS):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    return tmp_path


def _plant(copy: pathlib.Path, file: str, line: str) -> None:
    path = copy / file
    path.write_text(path.read_text(encoding="utf-8") + "\n" + line + "\n", encoding="utf-8")


@pytest.mark.parametrize(
    ("file", "line", "reported"),
    [
        # Rule 1: the controllers import another package; a layer below train imports it.
        (
            "gdro_jax/controllers/_compose.py",
            "from gdro_jax.losses import segment_mean",
            "controllers (layer 0) imports losses (layer 0)",
        ),
        ("gdro_jax/step/_update.py", "from gdro_jax import train", "step (layer 3) imports train"),
        ("gdro_jax/eval/_policy.py", "import gdro_jax.train", "eval (layer 6) imports train"),
        (
            "gdro_jax/checkpoint/_policy.py",
            "from gdro_jax.train import build_run",
            "checkpoint (layer 5) imports train",
        ),
        # Rule 2: a private module reached from outside its package.
        (
            "benchmarks/accelerator.py",
            "from gdro_jax.configs._parts import build_controllers",
            "imports gdro_jax.configs._parts from outside it",
        ),
        (
            "gdro_jax/sim/_config.py",
            "from gdro_jax.tasks import _config",
            "imports gdro_jax.tasks._config from outside it",
        ),
        # Rule 3: an import inside a function.
        (
            "gdro_jax/planner/_planner.py",
            "def later():\n    from gdro_jax import step\n    return step",
            "gdro_jax.step imported inside a function",
        ),
    ],
)
def test_a_planted_violation_is_reported(copy, file, line, reported):
    assert violations(copy) == []
    _plant(copy, file, line)
    found = violations(copy)
    assert len(found) == 1 and reported in found[0] and found[0].startswith(file), found
