"""A controller-dynamics simulator for the GDRO controllers, written entirely in JAX.

The learner is a chain of shared skills (a level-l prompt succeeds when each of its l steps does,
step j with probability sigmoid(theta_j + c_x)), trained by GRPO on a heavy-tailed finite prompt
pool with Bernoulli rollouts and its exact group-advantage policy gradient. Four methods share one
compiled `lax.scan` (seeds `vmap`-ed): plain GRPO, Prompt-GDRO (advantage reweighting),
Rollout-GDRO (rollout allocation under the fixed total R = N * n_mean) and both.

Typical use:

    config = sim.SimConfig(steps=300)
    outputs = sim.simulate(config, num_seeds=16)            # {method: SimOutput}
    summary = sim.summarize(outputs, config.pool_shares)
    print(sim.format_table(summary, num_seeds=16))
"""

from gdro_jax.sim._calibrate import (
    calibrate_learning_rate,
    expected_pass_at_1,
    fit_skill_logits,
    non_increasing,
    pass1_gain,
    predicted_gains,
)
from gdro_jax.sim._config import SimConfig
from gdro_jax.sim._experiment import EXPERIMENT_KEYS, ExperimentResult, run_experiment
from gdro_jax.sim._grpo import RolloutStats, grpo_policy_gradient
from gdro_jax.sim._learner import (
    PromptSet,
    exact_pass_at_k,
    initial_skill_logits,
    per_level_mean,
    prompt_levels,
    sample_prompt_set,
    success_log_prob,
    success_log_prob_grad,
    success_prob,
)
from gdro_jax.sim._plots import (
    plot_controller_signals,
    plot_final_by_level,
    plot_pass_rate_per_level,
    plot_q_heatmap,
    plot_rollouts_per_bin,
)
from gdro_jax.sim._report import (
    Interval,
    bootstrap_interval,
    format_table,
    paired_gain,
    pooled_columns,
    summarize,
)
from gdro_jax.sim._simulate import (
    FAST_COMPILE_OPTIONS,
    METHODS,
    SIMULATED_METHODS,
    MethodFlags,
    SimOutput,
    SimState,
    Simulator,
    StepRecord,
    make_simulator,
    method_flags,
    seed_keys,
    simulate,
)
from gdro_jax.sim._study import simulate_study
from gdro_jax.tasks import level_counts, level_shares  # shared with the chain task

__all__ = [
    "predicted_gains",
    "pass1_gain",
    "non_increasing",
    "fit_skill_logits",
    "expected_pass_at_1",
    "calibrate_learning_rate",
    "EXPERIMENT_KEYS",
    "FAST_COMPILE_OPTIONS",
    "METHODS",
    "SIMULATED_METHODS",
    "ExperimentResult",
    "Interval",
    "MethodFlags",
    "PromptSet",
    "RolloutStats",
    "SimConfig",
    "SimOutput",
    "SimState",
    "Simulator",
    "StepRecord",
    "bootstrap_interval",
    "exact_pass_at_k",
    "format_table",
    "grpo_policy_gradient",
    "initial_skill_logits",
    "level_counts",
    "level_shares",
    "make_simulator",
    "method_flags",
    "paired_gain",
    "per_level_mean",
    "plot_controller_signals",
    "plot_final_by_level",
    "plot_pass_rate_per_level",
    "plot_q_heatmap",
    "plot_rollouts_per_bin",
    "pooled_columns",
    "prompt_levels",
    "run_experiment",
    "sample_prompt_set",
    "seed_keys",
    "simulate",
    "simulate_study",
    "success_log_prob",
    "success_log_prob_grad",
    "success_prob",
    "summarize",
]
