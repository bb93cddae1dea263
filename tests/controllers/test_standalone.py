"""`gdro_jax.controllers` stands alone: with flax, optax, orbax, grain, transformers and every other
gdro_jax package blocked from importing, a fresh process imports the controllers and jits an
update of each of the three, and runs the README's "in your own training loop" example.
"""

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

# Installed in the child before anything else: any import of these raises ImportError.
_BLOCKER = r"""
import importlib.abc, sys

BLOCKED = {"flax", "optax", "orbax", "grain", "transformers", "tokenizers", "safetensors",
           "tensorboardX", "torch", "math_verify", "matplotlib", "ml_collections"}


class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        own = name == "gdro_jax" or name.startswith("gdro_jax.controllers")
        if top in BLOCKED or (top == "gdro_jax" and not own):
            raise ImportError(f"{name} is blocked: the controllers must not need it")
        return None


sys.meta_path.insert(0, Blocker())
"""

_UPDATES = r"""
import json
import jax
import jax.numpy as jnp
from gdro_jax import controllers

D, N, B = 64, 8, 10
ids = jnp.arange(N, dtype=jnp.int32)
bins = ids % B
classifier = controllers.passk_classifier(num_prompts=D)
prompt = controllers.prompt_gdro(num_bins=B)
rollout = controllers.rollout_gdro(num_bins=B, n_min=2, n_max=6, n_mean=4)
counts = jnp.full((N,), 4, jnp.int32)
correct = ids % 5
classified = jax.jit(
    lambda s: classifier.update(s, ids, num_correct=correct, num_rollouts=counts)
)(classifier.init())
weighted = jax.jit(lambda s: prompt.update(s, bins, losses=ids / N))(prompt.init())
allocated = jax.jit(
    lambda s: rollout.update(s, bins, p_hat=ids / N, losses=ids / N, num_correct=correct,
                             num_rollouts=counts)
)(rollout.init())
loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED or m.startswith("gdro_jax"))
print(json.dumps({
    "visits": int(classified.visits.sum()),
    "prompt_step": int(weighted.step),
    "rollout_seen": bool(jnp.any(allocated.variance > 0)),
    "loaded": loaded,
}))
"""


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _BLOCKER + code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_controllers_jit_their_updates_with_everything_else_blocked():
    process = _run(_UPDATES)
    assert process.returncode == 0, process.stderr[-3000:]
    result = json.loads(process.stdout.strip().splitlines()[-1])
    assert result["visits"] == 8 and result["prompt_step"] == 1 and result["rollout_seen"]
    library = [m for m in result["loaded"] if m.startswith("gdro_jax")]
    assert [m for m in result["loaded"] if m not in library] == [], "a blocked package loaded"
    assert all(m == "gdro_jax" or m.startswith("gdro_jax.controllers") for m in library)


def _readme_loop_example() -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split("## The controllers in your own training loop", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL)[1]


def test_the_readmes_own_loop_example_needs_only_the_controllers():
    code = _readme_loop_example()
    assert "from gdro_jax import controllers" in code
    process = _run(textwrap.dedent(code))
    assert process.returncode == 0, process.stderr[-3000:]
