"""The light install: `pip install gdro-jax` (jax, chex, numpy, ml-dtypes and msgpack) runs the
controllers and the host API, which import nothing of the trainer; the trainer's packages come
with the `train` extra, which every extra that runs the trainer includes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LIGHT = {"jax", "chex", "numpy", "ml-dtypes", "msgpack"}
# The trainer's packages (import names), none of which the light dependencies import.
TRAINER = (
    "flax", "optax", "orbax", "grain", "transformers", "tokenizers", "safetensors", "matplotlib",
    "tqdm", "ml_collections", "tensorboardX", "math_verify", "sympy", "torch",
)  # fmt: skip
# What the host API's user runs: a method by name, a step of its calls, bytes out and back in.
HOST_STEP = """
import json, sys
import numpy as np
from gdro_jax.integrations import HostControllers
host = HostControllers.for_method("gdro_both", num_prompts=8, trainer_can={"per_prompt_rollouts"})
ids = host.select_prompts(np.arange(4, dtype=np.int32))
counts = host.allocate(ids)
rollout_ids = np.repeat(ids, counts)
host.observe(rollout_ids, (np.arange(rollout_ids.size) % 2).astype(np.float32))
again = HostControllers.for_method("gdro_both", num_prompts=8, trainer_can={"per_prompt_rollouts"})
again.load_bytes(host.to_bytes())
assert again.to_bytes() == host.to_bytes() and again.step == 1
print(json.dumps(sorted(sys.modules)))
"""


def _name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", requirement)[0].lower()


def imported_by_host_step(python: str | Path) -> list[str]:
    """The modules a process holds after `HOST_STEP`, run with `python`."""
    completed = subprocess.run(
        [str(python), "-c", HOST_STEP],
        cwd=REPO,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.splitlines()[-1])


def assert_nothing_of_the_trainer(modules: list[str]) -> None:
    tops = {module.split(".")[0] for module in modules}
    assert not tops & set(TRAINER), sorted(tops & set(TRAINER))
    ours = {m for m in modules if m.startswith("gdro_jax.")}
    outside = {
        m for m in ours if not m.startswith(("gdro_jax.controllers", "gdro_jax.integrations"))
    }
    assert not outside, sorted(outside)


def test_the_light_dependencies_and_the_train_extra():
    tomllib = pytest.importorskip(
        "tomllib", reason="reads pyproject.toml with Python 3.11's tomllib"
    )
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert {_name(r) for r in project["dependencies"]} == LIGHT
    extras = project["optional-dependencies"]
    train = {_name(r) for r in extras["train"]}
    for package in ("flax", "optax", "orbax-checkpoint", "grain", "transformers", "math-verify"):
        assert package in train, package
    # Every extra that runs the trainer, the tests or the notebooks brings the trainer along.
    for extra in ("test", "notebooks", "tensorboard"):
        assert "gdro-jax[train]" in extras[extra], extra


def test_the_host_api_imports_nothing_of_the_trainer():
    """In this (full) environment, a step of the host API loads no trainer package and no
    gdro_jax module beyond the controllers and the integrations. Fails when `_host.py` imports
    flax again (its bytes were flax's `serialization` before the light install)."""
    assert_nothing_of_the_trainer(imported_by_host_step(sys.executable))


@pytest.mark.slow
def test_a_light_environment_runs_the_host_api(tmp_path):
    """`pip install <this repo>` into a new environment, without extras: the host API's step
    runs there, and none of the trainer's packages was installed."""
    venv = tmp_path / "light"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", str(REPO)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    installed = {entry["name"].lower().replace("_", "-") for entry in json.loads(listed.stdout)}
    assert not installed & {"flax", "optax", "orbax-checkpoint", "grain", "transformers", "torch"}
    assert_nothing_of_the_trainer(imported_by_host_step(python))
