"""One GRPO/GDRO training step on arrays (SPEC 7), below the loop that drives it:

    plan     the controllers' `MultiAdversary.plan` (jitted by the caller)
    rollout  `StepProgram.rollout_function`: R completions and log pi_old through a `RolloutEngine`
             (`KVCacheEngine`, the built-in sampler, fused into one jit; `VLLMEngine`, vLLM
             in the trainer's process, with the optional vllm extra)
    reward   `device_reward_phase` (jittable rewards) or `host_reward_phase` (a grader, under
             `HostRewardCaller`'s time limit)
    update   `make_update`: advantages, Prompt-GDRO multipliers, mini-batch steps (or, under a
             group filter, a round into its buffer and the steps when it is full), the
             controller transitions, the non-finite guard and the SPEC 10 metrics

`TrainState` is the whole state of a run as one pytree. Nothing here reads a config: the config
layer (`gdro_jax.configs`) builds `GRPOConfig` and the controllers, and `gdro_jax.train` runs the
loop.
"""

from gdro_jax.step._engines import (
    ENGINES,
    LOGPROBS_FROM,
    KVCacheEngine,
    RolloutConfig,
    RolloutEngine,
    Rollouts,
    WeightSync,
    sample_rollouts,
)
from gdro_jax.step._grpo import GRPOConfig
from gdro_jax.step._guard import (
    DEFAULT_MAX_CONSECUTIVE_SKIPS,
    NonFiniteStepsError,
    check_skips,
    keep_if_finite,
)
from gdro_jax.step._metrics import step_metrics
from gdro_jax.step._program import StepProgram, rollout_groups
from gdro_jax.step._rewards import (
    HostRewardCaller,
    RewardError,
    check_rewards,
    device_reward_phase,
    host_reward_phase,
)
from gdro_jax.step._state import TrainState, init_train_state
from gdro_jax.step._update import make_update, minibatch_step
from gdro_jax.step._vllm import (
    MissingExtraError,
    VLLMConfig,
    VLLMEngine,
    check_vllm_installed,
    check_vllm_model,
)

__all__ = [
    "DEFAULT_MAX_CONSECUTIVE_SKIPS",
    "ENGINES",
    "LOGPROBS_FROM",
    "GRPOConfig",
    "HostRewardCaller",
    "KVCacheEngine",
    "MissingExtraError",
    "NonFiniteStepsError",
    "RewardError",
    "RolloutConfig",
    "RolloutEngine",
    "StepProgram",
    "Rollouts",
    "TrainState",
    "VLLMConfig",
    "VLLMEngine",
    "WeightSync",
    "check_rewards",
    "check_skips",
    "check_vllm_installed",
    "check_vllm_model",
    "device_reward_phase",
    "host_reward_phase",
    "init_train_state",
    "keep_if_finite",
    "make_update",
    "minibatch_step",
    "rollout_groups",
    "sample_rollouts",
    "step_metrics",
]
