"""The RL core: `TrainState`, the step (plan / rollout / reward / update), the loop, checkpoints,
guards and metrics.

- `build_run(config)` (`_assemble.py`): task, policy, controllers, optimizer, jitted phases.
- `run_step` and `train` (`_loop.py`): one timed step; the loop with resume and checkpoints.
- `make_update` (`_step.py`): advantages, multipliers, mini-batch steps, controller updates.
- `sample_rollouts` and the `RolloutEngine` seam with its built-in `KVCacheEngine`
  (`_rollouts.py`), `step_metrics` and `MetricsWriter` (`_metrics.py`).
- checkpoints (`_checkpoint.py`), resume rules (`_resume.py`), SIGTERM handling
  (`_preemption.py`), guards (`_guards.py`), the parts read off a config (`_components.py`).
- `memory_plan` and `check_memory_plan` (`_plan.py`): bytes per device before allocating.
- `initialize_distributed` and `is_primary` (`_distributed.py`): one run over several processes.
"""

from gdro_jax.controllers import METHODS
from gdro_jax.models import CheckpointError
from gdro_jax.train._assemble import Run, build_run
from gdro_jax.train._checkpoint import (
    Checkpoint,
    abstract_state,
    checkpoint_manager,
    restore_checkpoint,
    save_checkpoint,
)
from gdro_jax.train._components import (
    build_controllers,
    make_optimizer,
    mesh_from_config,
)
from gdro_jax.train._distributed import initialize as initialize_distributed
from gdro_jax.train._distributed import is_primary
from gdro_jax.train._export import policy_from_checkpoint
from gdro_jax.train._guards import NonFiniteStepsError, RewardError, validate_config
from gdro_jax.train._loop import describe_outputs, run_step, train
from gdro_jax.train._metrics import MetricsWriter, read_metrics, step_metrics
from gdro_jax.train._plan import MemoryPlan, check_memory_plan, memory_plan, planning_mesh
from gdro_jax.train._preemption import TrainingInterrupted
from gdro_jax.train._rollouts import KVCacheEngine, RolloutEngine, Rollouts, sample_rollouts
from gdro_jax.train._state import TrainState, init_train_state
from gdro_jax.train._step import GRPOConfig, make_update

__all__ = [
    "METHODS",
    "Checkpoint",
    "CheckpointError",
    "GRPOConfig",
    "KVCacheEngine",
    "MemoryPlan",
    "MetricsWriter",
    "NonFiniteStepsError",
    "RewardError",
    "RolloutEngine",
    "Rollouts",
    "Run",
    "TrainState",
    "TrainingInterrupted",
    "abstract_state",
    "build_controllers",
    "build_run",
    "check_memory_plan",
    "checkpoint_manager",
    "describe_outputs",
    "init_train_state",
    "initialize_distributed",
    "is_primary",
    "make_optimizer",
    "make_update",
    "memory_plan",
    "mesh_from_config",
    "planning_mesh",
    "policy_from_checkpoint",
    "read_metrics",
    "restore_checkpoint",
    "run_step",
    "sample_rollouts",
    "save_checkpoint",
    "step_metrics",
    "train",
    "validate_config",
]
