"""Training: the TrainState pytree, the GRPO/GDRO step, the loop, metrics, and the warm start."""

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
from gdro_jax.train._state import TrainState, init_train_state
from gdro_jax.train._step import GRPOConfig, Rollouts, make_update, sample_rollouts, step_metrics

__all__ = [
    "METHODS",
    "GRPOConfig",
    "MetricsWriter",
    "Rollouts",
    "Run",
    "TrainState",
    "build_controllers",
    "build_run",
    "init_train_state",
    "make_optimizer",
    "make_update",
    "read_metrics",
    "run_step",
    "sample_rollouts",
    "step_metrics",
    "train",
]
