"""The simulator needs the controllers and the losses, not the trainer: with flax, grain, orbax,
transformers and the trainer's packages blocked from importing, a fresh process imports
`gdro_jax.sim` and builds a simulator of every part.
"""

import subprocess
import sys
from pathlib import Path

from gdro_jax import sim

ROOT = Path(__file__).resolve().parents[2]

# The trainer's packages and the libraries only they need: any import of these raises ImportError.
BLOCKED_LIBRARIES = ("flax", "grain", "orbax", "transformers", "tokenizers", "safetensors")
BLOCKED_PACKAGES = ("train", "step", "models", "sampling", "configs", "tasks", "data", "rewards")

_CHILD = f"""
import importlib.abc, sys

class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        parts = name.split(".")
        if parts[0] in {BLOCKED_LIBRARIES!r} or (
            parts[0] == "gdro_jax" and len(parts) > 1 and parts[1] in {BLOCKED_PACKAGES!r}
        ):
            raise ImportError(f"{{name}} is blocked: the simulator must not need it")
        return None

sys.meta_path.insert(0, Blocker())
from gdro_jax import sim
simulator = sim.make_simulator(sim.SimConfig(), parts=sim.ALL_PARTS)
print(sorted(simulator.parts))
"""


def test_the_simulator_imports_and_builds_with_the_trainer_blocked():
    process = subprocess.run(
        [sys.executable, "-c", _CHILD], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert process.returncode == 0, process.stderr[-3000:]
    assert process.stdout.strip() == str(sorted(sim.ALL_PARTS))
