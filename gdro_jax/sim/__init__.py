"""A controller-dynamics simulator for the GDRO controllers and their rivals, entirely in JAX.

The learner is a chain of shared skills (a level-l prompt succeeds when each of its l steps does,
step j with probability sigmoid(theta_j + c_x)), trained by GRPO on a heavy-tailed finite prompt
pool with Bernoulli rollouts and its exact group-advantage policy gradient. Every method of
`controllers.METHODS` runs in one compiled `lax.scan` (seeds `vmap`-ed) holding its parts, built
from `controllers.PARTS` (`MethodFlags` name the part behind each decision): plain GRPO,
Prompt-GDRO (advantage reweighting), Rollout-GDRO (rollout allocation under the fixed total
R = N * n_mean), both, and the rivals at equal compute: Knapsack-RL (rollouts per prompt), MoPPS
(Thompson-sampled batches) and DAPO's dynamic sampling (rounds of R rollouts, an update once a
buffer of groups with a signal is ready). The rivals' parts are compiled in only when a method
needs them (`make_simulator(config, parts=...)`, `method_parts`).

Typical use:

    config = sim.SimConfig(steps=300)
    outputs = sim.simulate(config, num_seeds=16)            # {method: SimOutput}, GDRO_METHODS
    summary = sim.summarize(outputs, config.pool_shares)
    print(sim.format_table(summary, num_seeds=16))
"""

from gdro_jax.levels import level_counts, level_shares  # shared with the chain task
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
from gdro_jax.sim._parts import (
    ALL_PARTS,
    GDRO_METHODS,
    GDRO_PARTS,
    METHODS,
    SIMULATED_METHODS,
    SIMULATED_PARTS,
    MethodFlags,
    method_flags,
    method_parts,
    part_index,
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
    BufferedGroups,
    SimOutput,
    SimState,
    Simulator,
    StepRecord,
    make_simulator,
    seed_keys,
    simulate,
)
from gdro_jax.sim._study import simulate_study

__all__ = [
    "predicted_gains",
    "pass1_gain",
    "non_increasing",
    "fit_skill_logits",
    "expected_pass_at_1",
    "calibrate_learning_rate",
    "ALL_PARTS",
    "EXPERIMENT_KEYS",
    "FAST_COMPILE_OPTIONS",
    "GDRO_METHODS",
    "GDRO_PARTS",
    "METHODS",
    "SIMULATED_METHODS",
    "SIMULATED_PARTS",
    "BufferedGroups",
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
    "method_parts",
    "paired_gain",
    "part_index",
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
