"""What a person sees on a first run: no advisory from a library we use only in part.

transformers, imported without PyTorch (a `make demo` install has none), prints "PyTorch was not
found. Models won't be available ..."; gdro-jax uses only its tokenizers and configs, so the
entry points turn the advisory off. The test hides torch from a real training command (0 steps:
the task's tokenizer is still built, which imports transformers) and reads its console.
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_WITHOUT_TORCH = """
import runpy, sys
sys.modules["torch"] = None  # as if torch were not installed
sys.argv = ["experiments.train", *sys.argv[1:]]
runpy.run_module("experiments.train", run_name="__main__", alter_sys=True)
"""


def test_a_training_command_without_torch_prints_no_transformers_advisory(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRANSFORMERS_NO_ADVISORY_WARNINGS"}
    completed = subprocess.run(
        [
            sys.executable, "-c", _WITHOUT_TORCH,
            "--config=experiments/configs/tiny_cpu.py", f"--workdir={tmp_path / 'run'}",
            "--config.steps=0", "--config.progress=False",
        ],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "PyTorch was not found" not in completed.stdout + completed.stderr
    assert completed.stdout.startswith("grpo: 0 of 0 steps done")
