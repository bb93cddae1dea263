"""The exact GRPO group-advantage policy gradient of the skill-chain learner, on ragged groups.

Rollout-GDRO gives prompts different numbers of rollouts, so a step has a fixed number of slots
`R = N * n_mean` (SPEC 6) and `prompt_of_slot_R` says which prompt each slot samples. Every group
statistic is a segment reduction over slots, never a reshape to `[N, n]`.

For prompt i with rollouts j, rewards r_ij and success y_ij in {0, 1}, the GRPO advantage is

    A_ij = clip((r_ij - mean_i r) / (std_i r + eps), -clip, clip)      (SPEC 2)

(`std` is the group's sample standard deviation as in the released code, the trainer's
`losses.group_advantages`; Dr.GRPO drops the division). With
per-prompt multipliers w_i (Prompt-GDRO's reweighting), the policy gradient of one step is

    g = (1/R) sum_i sum_j w_i A_ij grad log P(y_ij; theta),
    grad log P(1) = grad log p_i,   grad log P(0) = grad log(1 - p_i) = -p_i/(1 - p_i) grad log p_i,

which is exactly `jax.grad` of the sample surrogate `(1/R) sum_ij sg(w_i A_ij) log P(y_ij; theta)`
(one optimizer step at ratio 1, where the clipped PPO surrogate has that gradient). Because both
terms are multiples of `grad log p_i`, the gradient needs only two segment sums per prompt:
`a+_i = sum_{y=1} A_ij` and `a-_i = sum_{y=0} A_ij`, so g = (1/R) sum_i w_i (a+_i - a-_i odds_i)
grad log p_i with odds_i = p_i/(1 - p_i). Cost O(R + N L).

References:
  Shao et al., 2024, "DeepSeekMath" (GRPO), arXiv 2402.03300, eq. 3.
  Liu et al., 2025, "Understanding R1-Zero-Like Training" (Dr.GRPO), arXiv 2503.20783.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from gdro_jax import losses
from gdro_jax.sim._learner import success_log_prob_grad


class RolloutStats(NamedTuple):
    """Per-prompt and per-slot statistics of one simulated step's rollout groups."""

    num_correct_N: jax.Array  # [N] int32
    num_rollouts_N: jax.Array  # [N] int32
    mean_reward_N: jax.Array  # [N] float32
    advantage_R: jax.Array  # [R] float32
    informative_N: jax.Array  # [N] bool, the group has a non-zero advantage (rewards not all equal)


def grpo_policy_gradient(
    theta_L: ArrayLike,
    level_N: ArrayLike,
    offset_N: ArrayLike,
    prompt_of_slot_R: ArrayLike,
    success_R: ArrayLike,
    weight_N: ArrayLike,
    *,
    reward_correct: float = 1.0,
    reward_wrong: float = -1.0,
    scale_by_std: bool = True,
    eps: float = 1e-6,
    clip: float | None = 5.0,
    estimator: str = "sample",
) -> tuple[jax.Array, RolloutStats]:
    """The exact GRPO policy gradient (ascent direction) of one step of the skill-chain learner.

    Args:
      theta_L: float[L] skill logits.
      level_N: int[N] levels of the step's prompts.
      offset_N: float[N] offsets of the step's prompts.
      prompt_of_slot_R: int[R] prompt of each rollout slot.
      success_R: bool[R] whether each rollout is correct.
      weight_N: float[N] advantage multipliers (1 for plain GRPO).
      reward_correct: reward of a correct rollout.
      reward_wrong: reward of a wrong rollout.
      scale_by_std: GRPO (True) or Dr.GRPO (False) advantages.
      eps: see `gdro_jax.losses.group_advantages`.
      clip: see `gdro_jax.losses.group_advantages`.
      estimator: `"sample"` (the released code's) or `"population"`, see
        `gdro_jax.losses.group_advantages`.

    Returns:
      `(grad_L, stats)`: float32[L] gradient of `(1/R) sum_ij sg(w_i A_ij) log P(y_ij; theta)`,
      and the step's `RolloutStats`.

    References:
      Williams, 1992 (REINFORCE); Shao et al., 2024, arXiv 2402.03300, eq. 3 at ratio 1.
    """
    theta_L = jnp.asarray(theta_L, jnp.float32)
    slot_R = jnp.asarray(prompt_of_slot_R)
    success_R = jnp.asarray(success_R, bool)
    num_prompts = jnp.shape(level_N)[0]
    num_slots = slot_R.shape[0]

    reward_R = jnp.where(success_R, reward_correct, reward_wrong).astype(jnp.float32)
    # The trainer's advantages (gdro_jax.losses), so the simulator and the trainer agree on GRPO.
    advantage_R = losses.group_advantages(
        reward_R,
        slot_R,
        num_prompts,
        normalize_std=scale_by_std,
        eps=eps,
        clip=clip,
        estimator=estimator,
    )
    group = losses.group_statistics(reward_R, slot_R, num_prompts)
    adv_success_N = jax.ops.segment_sum(
        jnp.where(success_R, advantage_R, 0.0), slot_R, num_segments=num_prompts
    )
    adv_failure_N = jax.ops.segment_sum(
        jnp.where(success_R, 0.0, advantage_R), slot_R, num_segments=num_prompts
    )
    log_p_N, grad_log_p_NL = success_log_prob_grad(theta_L, level_N, offset_N)
    # odds = p / (1 - p) with 1 - p = -expm1(log p): exact near p = 1. The floor only guards
    # 0 * inf when p rounds to 1 (then no rollout can fail and adv_failure is 0).
    one_minus_p_N = jnp.maximum(-jnp.expm1(log_p_N), jnp.finfo(jnp.float32).tiny)
    odds_N = jnp.exp(log_p_N) / one_minus_p_N
    coef_N = jnp.asarray(weight_N, jnp.float32) * (
        adv_success_N - jnp.where(adv_failure_N == 0.0, 0.0, adv_failure_N * odds_N)
    )
    grad_L = coef_N @ grad_log_p_NL / num_slots

    num_correct_N = jax.ops.segment_sum(success_R.astype(jnp.int32), slot_R, num_prompts)
    stats = RolloutStats(
        num_correct_N=num_correct_N,
        num_rollouts_N=group.count_N,
        mean_reward_N=group.mean_N,
        advantage_R=advantage_R,
        informative_N=group.informative_N,
    )
    return grad_L, stats
