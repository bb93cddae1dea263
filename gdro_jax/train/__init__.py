"""The training loop: `build_run` assembles a run from its config, `run_step` takes one step,
`train` runs them with a progress bar, metrics, checkpoints, resume and preemption.

- `build_run(config)` (`_run.py`): the task, the policy, the controllers, the optimizer and the
  step's jitted phases (`gdro_jax.step`), from a config read once (`gdro_jax.configs`).
- `run_step` and `train` (`_loop.py`): one timed step; the loop, which resumes from the newest
  usable checkpoint (`_resume.py`, `gdro_jax.checkpoint`), writes `metrics.jsonl` and
  TensorBoard (`_writers.py`), stops cleanly on SIGTERM/Ctrl-C (`_preemption.py`) and exports
  the final policy (and, after each of `checkpoint.snapshot_steps`, a snapshot of it:
  `snapshot_path`).

The errors `train` raises are here too: `RewardError` and `NonFiniteStepsError` (from the
step), `CheckpointError`, `TrainingInterrupted`.
"""

from gdro_jax.checkpoint import CheckpointError
from gdro_jax.step import NonFiniteStepsError, RewardError
from gdro_jax.train._loop import SNAPSHOT_DIR, describe_outputs, run_step, snapshot_path, train
from gdro_jax.train._preemption import TrainingInterrupted
from gdro_jax.train._run import Run, build_run, check_model_fits, load_policy
from gdro_jax.train._writers import MetricsWriter, RowsOnly, read_metrics, rewind_metrics

__all__ = [
    "SNAPSHOT_DIR",
    "CheckpointError",
    "MetricsWriter",
    "NonFiniteStepsError",
    "RewardError",
    "RowsOnly",
    "Run",
    "TrainingInterrupted",
    "build_run",
    "check_model_fits",
    "describe_outputs",
    "load_policy",
    "read_metrics",
    "rewind_metrics",
    "run_step",
    "snapshot_path",
    "train",
]
