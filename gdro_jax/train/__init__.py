"""Training: TrainState, the GRPO/GDRO step, the loop, checkpoints, metrics, the warm start."""

from gdro_jax.train._checkpoint import (
    Checkpoint,
    CheckpointError,
    TrainingInterrupted,
    abstract_state,
    checkpoint_manager,
    restore_checkpoint,
    save_checkpoint,
)
from gdro_jax.train._demo import run_demo
from gdro_jax.train._export import policy_from_checkpoint
from gdro_jax.train._loop import (
    METHODS,
    Run,
    build_controllers,
    build_run,
    make_optimizer,
    run_step,
    train,
)
from gdro_jax.train._metrics import MetricsWriter, read_metrics
from gdro_jax.train._pretrain import (
    PretrainResult,
    check_frontier,
    pretrain,
    pretrain_model,
    supervised_loss,
)
from gdro_jax.train._state import TrainState, init_train_state
from gdro_jax.train._step import GRPOConfig, Rollouts, make_update, sample_rollouts, step_metrics

__all__ = [
    "METHODS",
    "Checkpoint",
    "CheckpointError",
    "GRPOConfig",
    "MetricsWriter",
    "PretrainResult",
    "Rollouts",
    "Run",
    "TrainState",
    "TrainingInterrupted",
    "abstract_state",
    "build_controllers",
    "build_run",
    "checkpoint_manager",
    "check_frontier",
    "init_train_state",
    "make_optimizer",
    "make_update",
    "policy_from_checkpoint",
    "pretrain",
    "pretrain_model",
    "read_metrics",
    "restore_checkpoint",
    "run_demo",
    "run_step",
    "sample_rollouts",
    "save_checkpoint",
    "step_metrics",
    "supervised_loss",
    "train",
]
