"""`experiments.train` with the vLLM engine, from the command line (`make test-vllm`).

tests/step/test_vllm.py builds its runs in Python; this file goes through the entry point and its
console, where vLLM's logging set-up (`logging.config.dictConfig`) closes every log handler,
absl's among them, whose stream is then the wrapper that prints log records above progress bars.
The command is docs/engines.md's (tiny_cpu, 2 steps, head width 32 for vLLM's CPU attention) in
eager mode (no compile of vLLM's graphs: quicker to start), with progress bars and without.

Planted: the console's stream wrapper without `close` (issue 38: `AttributeError: '_AboveBars'
object has no attribute 'close'` from `VLLMEngine.__init__`): both cases failed with it.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[2]
# Only vLLM's rollouts carry these (the engine's log-probs against the trainer's).
VLLM_ONLY = ("rollout/logprob_mismatch_mean", "rollout/logprob_mismatch_max")


@pytest.mark.parametrize("progress", [True, False], ids=["bars", "no-bars"])
def test_two_steps_through_vllm_from_the_command_line(tmp_path, progress):
    workdir = tmp_path / "run"
    completed = subprocess.run(
        [
            sys.executable, "-m", "experiments.train", "--config=experiments/configs/tiny_cpu.py",
            f"--workdir={workdir}", "--config.rollout.engine=vllm", "--config.model.head_dim=32",
            "--config.steps=2", "--config.rollout.vllm.enforce_eager=True",
            f"--config.progress={progress}",
        ],
        cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert "Traceback" not in completed.stderr, completed.stderr[-4000:]
    assert completed.stdout.startswith("grpo: 2 of 2 steps done"), completed.stdout
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert [row["step"] for row in rows] == [1, 2]
    assert all(name in row for row in rows for name in VLLM_ONLY)  # vLLM sampled them
    assert ("| 2/2 [" in completed.stderr) == progress  # the bar, drawn only when asked for
