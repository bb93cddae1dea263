"""Group-relative advantages over ragged groups, and Prompt-GDRO's per-prompt multipliers.

A step has a fixed number of rollout slots `R = N * n_mean` (SPEC 6); `prompt_of_slot_R` says
which of the `N` prompts each slot belongs to, and prompts may own different numbers of slots
(Rollout-GDRO). Every group statistic is therefore a segment reduction over slots with
`num_segments = N`, never a reshape to `[N, n]`. For prompt `i` with valid slots `j`:

    A_ij = clip((r_ij - mean_i r) / (std_i r + eps), -clip, clip)      (GRPO, SPEC 2)
    A_ij = clip( r_ij - mean_i r,                     -clip, clip)      (Dr.GRPO)

where, with `estimator="population"`, `std_i` is the population standard deviation of the group
(divide by `n_i`, not `n_i - 1`). A group whose rewards are all equal (including a group
of one) gets advantage exactly 0: it is enforced with a `where`, since `r - mean` can be a rounding
error away from 0 in float32.

`estimator="sample"` (the default, here, in the trainer's `GRPOConfig` and in the simulator)
computes the group statistics as the authors' released code does, through
verl's `compute_grpo_outcome_advantage`: the *sample* standard deviation (`torch.std`, divide by
`n_i - 1`; with 4 rollouts it is 15 % larger, from 1.41x at `n = 2` to 1.04x at `n = 12`), and a
group of one has mean 0 and std 1, so it keeps its raw reward `r / (1 + eps)` (`r` for Dr.GRPO)
where the population estimator gives 0. The released code applies no clip: pass `clip=None`.

References:
  Shao et al., 2024, "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language
  Models" (GRPO), arXiv 2402.03300, section 4.1.2 (outcome supervision).
  Liu et al., 2025, "Understanding R1-Zero-Like Training: A Critical Perspective" (Dr.GRPO),
  arXiv 2503.20783, section 3.1.
  verl, `verl/trainer/ppo/core_algos.py`, `compute_grpo_outcome_advantage` (the released code's
  GRPO advantages: `estimator="sample"`, `clip=None`).
  Panaganti et al., 2026, arXiv 2601.19280, Prompt-GDRO `reweight` realisation.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from gdro_jax.losses._segments import segment_mean
from gdro_jax.losses._validation import check_at_least, check_choice, check_positive

# How `group_advantages` estimates each group's mean and standard deviation (see the module doc).
ADVANTAGE_ESTIMATORS = ("population", "sample")


class GroupStats(NamedTuple):
    """Per-prompt statistics of one step's rollout groups, over valid slots only."""

    mean_N: jax.Array  # [N] float32 mean reward of the group (0 for an empty group)
    std_N: jax.Array  # [N] float32 population standard deviation of the rewards (0 when empty)
    count_N: jax.Array  # [N] int32 number of valid slots of the group
    informative_N: jax.Array  # [N] bool rewards not all equal, so some advantage is non-zero


def _slot_inputs(
    values_R: ArrayLike, prompt_of_slot_R: ArrayLike, valid_R: ArrayLike | None
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Casts and checks `[R]` slot arrays: `(values_R f32, prompt_of_slot_R i32, valid_R bool)`."""
    values_R = jnp.asarray(values_R, jnp.float32)
    prompt_of_slot_R = jnp.asarray(prompt_of_slot_R, jnp.int32)
    chex.assert_rank([values_R, prompt_of_slot_R], 1)
    chex.assert_equal_shape([values_R, prompt_of_slot_R])
    if valid_R is None:
        valid_R = jnp.ones(values_R.shape, bool)
    else:
        valid_R = jnp.asarray(valid_R, bool)
        chex.assert_equal_shape([values_R, valid_R])
    return values_R, prompt_of_slot_R, valid_R


def group_statistics(
    rewards_R: ArrayLike,
    prompt_of_slot_R: ArrayLike,
    num_prompts: int,
    *,
    valid_R: ArrayLike | None = None,
) -> GroupStats:
    """Mean, population standard deviation, size and informativeness of every prompt's group.

    `informative_N[i]` is exact (largest reward > smallest reward among the valid slots), so the
    fraction of groups with a non-zero advantage (SPEC 10) is `informative_fraction(stats)`.

    Args:
      rewards_R: float[R] reward of each rollout slot.
      prompt_of_slot_R: int[R] prompt of each slot, in `0..num_prompts-1`.
      num_prompts: `N`, the static number of segments.
      valid_R: optional bool[R]; invalid slots (padding, failed rollouts) are left out of every
        statistic. Default: all valid.

    Returns:
      A `GroupStats` of `[N]` arrays.
    """
    rewards_R, prompt_of_slot_R, valid_R = _slot_inputs(rewards_R, prompt_of_slot_R, valid_R)
    weights_R = valid_R.astype(jnp.float32)
    mean_N, count_N = segment_mean(rewards_R, prompt_of_slot_R, weights_R, num_prompts)
    # Two-pass (centred) variance: sum(r^2)/n - mean^2 cancels catastrophically in float32.
    centred_R = rewards_R - mean_N[prompt_of_slot_R]
    var_N, _ = segment_mean(centred_R**2, prompt_of_slot_R, weights_R, num_prompts)
    max_N = jax.ops.segment_max(
        jnp.where(valid_R, rewards_R, -jnp.inf), prompt_of_slot_R, num_segments=num_prompts
    )
    min_N = jax.ops.segment_min(
        jnp.where(valid_R, rewards_R, jnp.inf), prompt_of_slot_R, num_segments=num_prompts
    )
    return GroupStats(
        mean_N=mean_N,
        std_N=jnp.sqrt(var_N),
        count_N=count_N.astype(jnp.int32),
        informative_N=max_N > min_N,
    )


def informative_fraction(stats: GroupStats) -> jax.Array:
    """Fraction of non-empty groups whose advantages are not all zero, float32[] (SPEC 10)."""
    non_empty_N = stats.count_N > 0
    num_informative = jnp.sum(stats.informative_N & non_empty_N)
    return num_informative / jnp.maximum(jnp.sum(non_empty_N), 1).astype(jnp.float32)


def group_advantages(
    rewards_R: ArrayLike,
    prompt_of_slot_R: ArrayLike,
    num_prompts: int,
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
    clip: float | None = 5.0,
    valid_R: ArrayLike | None = None,
    estimator: str = "sample",
) -> jax.Array:
    """Group-relative advantages of ragged groups (GRPO, or Dr.GRPO without the std division).

        A_ij = clip((r_ij - mean_i r) / (std_i r + eps), -clip, clip)   if normalize_std
        A_ij = clip( r_ij - mean_i r,                     -clip, clip)   otherwise (Dr.GRPO)

    `estimator` chooses `mean_i` and `std_i` over the group's `n_i` valid slots:

    * `"population"`: `std_i = sqrt(sum_j (r_ij - mean_i r)^2 / n_i)`. A group whose
      valid rewards are all equal, a group of one included, gets exactly 0.
    * `"sample"` (default): the released code's (verl's `compute_grpo_outcome_advantage`):
      `std_i = sqrt(sum_j (r_ij - mean_i r)^2 / (n_i - 1))` (`torch.std`), and a group of one has
      `mean = 0`, `std = 1`, so it keeps `r / (1 + eps)` (`r` for Dr.GRPO). An all-equal group
      of two or more still gets exactly 0.

    Invalid slots get 0 under both.

    Args:
      rewards_R: float[R] reward of each rollout slot.
      prompt_of_slot_R: int[R] prompt of each slot, in `0..num_prompts-1`.
      num_prompts: `N`, the static number of segments.
      normalize_std: divide by the group's standard deviation (GRPO) or not (Dr.GRPO).
      eps: `>= 0`, added to the standard deviation.
      clip: `> 0`, advantages are clipped to `[-clip, clip]` (SPEC 2: 5); `None` applies no clip
        (the released code).
      valid_R: optional bool[R]; invalid slots are left out of the group statistics and get 0.
      estimator: `"population"` or `"sample"` (see above; one of `ADVANTAGE_ESTIMATORS`).

    Returns:
      float32[R] advantages.

    Raises:
      ValueError: naming the parameter when `eps < 0`, `clip <= 0` or `estimator` is unknown.

    References:
      Shao et al., 2024, arXiv 2402.03300, section 4.1.2; Liu et al., 2025, arXiv 2503.20783,
      section 3.1 (Dr.GRPO drops the std normalisation); SPEC 2. verl,
      `verl/trainer/ppo/core_algos.py`, `compute_grpo_outcome_advantage` (`estimator="sample"`).
    """
    eps = check_at_least("eps", eps, 0.0)
    if clip is not None:
        clip = check_positive("clip", clip)
    check_choice("estimator", estimator, ADVANTAGE_ESTIMATORS)
    rewards_R, prompt_of_slot_R, valid_R = _slot_inputs(rewards_R, prompt_of_slot_R, valid_R)
    stats = group_statistics(rewards_R, prompt_of_slot_R, num_prompts, valid_R=valid_R)
    mean_N, std_N = stats.mean_N, stats.std_N
    keep_N = stats.informative_N
    if estimator == "sample":
        count_N = stats.count_N.astype(jnp.float32)
        single_N = stats.count_N == 1
        # Bessel's correction of the population std; verl's group of one has mean 0 and std 1.
        sample_std_N = std_N * jnp.sqrt(count_N / jnp.maximum(count_N - 1.0, 1.0))
        mean_N = jnp.where(single_N, 0.0, mean_N)
        std_N = jnp.where(single_N, 1.0, sample_std_N)
        keep_N = keep_N | single_N
    adv_R = rewards_R - mean_N[prompt_of_slot_R]
    if normalize_std:
        adv_R = adv_R / (std_N[prompt_of_slot_R] + eps)
    if clip is not None:
        adv_R = jnp.clip(adv_R, -clip, clip)
    keep_R = valid_R & keep_N[prompt_of_slot_R]
    return jnp.where(keep_R, adv_R, 0.0)


def weighted_advantages(
    adv_R: ArrayLike, prompt_of_slot_R: ArrayLike, weights_N: ArrayLike
) -> jax.Array:
    """Prompt-GDRO reweighting: each slot's advantage times its prompt's multiplier.

        A'_ij = w_i * A_ij

    Args:
      adv_R: float[R] advantages (from `group_advantages`).
      prompt_of_slot_R: int[R] prompt of each slot, in `0..N-1`.
      weights_N: float[N] multipliers, e.g. `gdro_jax.controllers.prompt_gdro(...).weights(...)`
        (mean 1 over responses, capped at `omega_max`).

    Returns:
      float32[R] weighted advantages.

    References:
      Panaganti et al., 2026, arXiv 2601.19280, Prompt-GDRO `reweight`; SPEC 4.
    """
    adv_R, prompt_of_slot_R, _ = _slot_inputs(adv_R, prompt_of_slot_R, None)
    weights_N = jnp.asarray(weights_N, jnp.float32)
    chex.assert_rank(weights_N, 1)
    return adv_R * weights_N[prompt_of_slot_R]
