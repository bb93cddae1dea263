"""The step's metrics, computed inside the jitted update: the curriculum made visible (SPEC 10).

Per-bin arrays (names starting `bin/`: `q`, scores, prompts, rollouts, tokens, reward, the share
of groups with all-equal rewards), the step's decisions per prompt (`prompt/rollouts`, the
classifier's `prompt/p_hat` and a method's own `prompt/estimate`; the update adds `prompt/ids`,
the prompts the batch held, and `prompt/correct`) and scalars (reward, accuracy, lengths, the shadow
price `mu`, the lead-lag gap, `q`'s entropy and mean bin, the weighted standard error against a
uniform allocation, the fraction of groups with a non-zero advantage). `train`'s writers put them
in `metrics.jsonl` and TensorBoard.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from gdro_jax import losses
from gdro_jax.controllers import Plan
from gdro_jax.step._engines import Rollouts


def _per_bin(values_N: jax.Array, bins_N: jax.Array, num_bins: int) -> jax.Array:
    return jax.ops.segment_sum(values_N, bins_N, num_segments=num_bins)


def step_metrics(
    plan: Plan,
    rollouts: Rollouts,
    adv_R: jax.Array,
    mask_RM: jax.Array,
    signal_N: jax.Array,
    *,
    num_bins: int,
) -> dict[str, jax.Array]:
    """The curriculum made visible (SPEC section 10): per-bin arrays and scalars of one step.

    What the method's parts report at planning (`plan.reports`: a prompt adversary's `bin/q`
    and `bin/score`, an allocation's `mu`, ...) is logged under its own names; without a prompt
    adversary, `bin/q` is uniform over the batch's bins and `bin/score` zero.
    """
    reported = {}
    for report in (plan.reports or {}).values():
        reported.update(report)
    num_prompts = plan.bins.shape[0]
    bins, n_N = plan.bins, plan.num_rollouts.astype(jnp.float32)
    slot_bins = bins[plan.prompt_of_slot]
    prompts_B = _per_bin(jnp.ones((num_prompts,)), bins, num_bins)
    rollouts_B = _per_bin(n_N, bins, num_bins)
    tokens_R = rollouts.lengths.astype(jnp.float32)
    tokens_B = jax.ops.segment_sum(tokens_R, slot_bins, num_segments=num_bins)
    ones_R = jnp.ones_like(rollouts.rewards)
    reward_mean_B, _ = losses.segment_mean(rollouts.rewards, slot_bins, ones_R, num_bins)
    reward_sq_B, _ = losses.segment_mean(rollouts.rewards**2, slot_bins, ones_R, num_bins)
    reward_std_B = jnp.sqrt(jnp.maximum(reward_sq_B - reward_mean_B**2, 0.0))
    present_B = prompts_B > 0
    share_B = prompts_B / num_prompts
    q_B = reported.get("bin/q")
    if q_B is None:
        q_B = jnp.where(present_B, 1.0 / jnp.maximum(present_B.sum(), 1), 0.0)
    scores_B = reported.get("bin/score", jnp.zeros((num_bins,)))
    # Advantage-weight mass of each bin over the batch's responses, against the bin's share.
    mass_B = _per_bin(n_N * plan.advantage_weights, bins, num_bins)
    weight_share_B = mass_B / jnp.maximum(mass_B.sum(), 1e-12)
    bin_index = jnp.arange(num_bins, dtype=jnp.float32)
    stats = losses.group_statistics(rollouts.rewards, plan.prompt_of_slot, num_prompts)
    # GRPO's wasted groups: rewards all equal, so every advantage is zero (per bin, of its groups).
    groups_B = _per_bin((stats.count_N > 0).astype(jnp.float32), bins, num_bins)
    wasted_N = (stats.count_N > 0) & ~stats.informative_N
    zero_advantage_B = _per_bin(wasted_N.astype(jnp.float32), bins, num_bins)
    zero_advantage_B = zero_advantage_B / jnp.maximum(groups_B, 1.0)
    # The same per-bin spread over a uniform allocation of the same R slots (n-bar per prompt).
    uniform_rollouts_B = prompts_B * (plan.prompt_of_slot.shape[0] / num_prompts)
    q_log_q = jnp.where(q_B > 0, q_B * jnp.log(jnp.where(q_B > 0, q_B, 1.0)), 0.0)
    logp_tokens = jnp.where(mask_RM, rollouts.logprobs, 0.0)
    metrics = {
        "reward": jnp.mean(rollouts.rewards),
        "accuracy": jnp.mean(rollouts.correct.astype(jnp.float32)),
        "response_length": jnp.mean(tokens_R),
        "tokens": jnp.sum(tokens_R),
        "entropy_estimate": -jnp.sum(logp_tokens) / jnp.maximum(mask_RM.sum(), 1),
        "advantage_abs_mean": jnp.mean(jnp.abs(adv_R)),
        "nonzero_advantage_fraction": losses.informative_fraction(stats),
        "loss_signal_mean": jnp.mean(signal_N),
        "mu": plan.mu,
        "lead_lag_gap": jnp.sum(bin_index * weight_share_B) - jnp.sum(bin_index * share_B),
        "weighted_standard_error": jnp.sum(
            jnp.where(present_B, q_B * reward_std_B / jnp.sqrt(jnp.maximum(rollouts_B, 1.0)), 0.0)
        ),
        "uniform_standard_error": jnp.sum(
            jnp.where(
                present_B, q_B * reward_std_B / jnp.sqrt(jnp.maximum(uniform_rollouts_B, 1.0)), 0.0
            )
        ),
        "q_entropy": -jnp.sum(q_log_q),
        "q_mean_bin": jnp.sum(bin_index * q_B),
        "bin/q": q_B,
        "bin/score": scores_B,
        "bin/prompts": prompts_B,
        "bin/rollouts": rollouts_B,
        "bin/rollouts_per_prompt": rollouts_B / jnp.maximum(prompts_B, 1.0),
        "bin/tokens": tokens_B,
        "bin/reward": reward_mean_B,
        "bin/zero_advantage_fraction": zero_advantage_B,
        "prompt/rollouts": plan.num_rollouts,
        "prompt/p_hat": plan.p_hat,
    }
    metrics.update({name: value for name, value in reported.items() if name not in metrics})
    if plan.estimate is not None:  # the method's own success-rate estimate, beside p_hat
        metrics["prompt/estimate"] = plan.estimate
    return metrics
