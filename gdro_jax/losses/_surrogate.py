"""Per-token PPO/GRPO clipped surrogate with clip-higher, and the k3 KL estimator.

Sign convention: `clipped_surrogate` returns the *objective* to maximise (higher is better for
the policy); a loss is its negative. `k3_kl` returns a non-negative penalty, added to a loss.

Masked tokens (padding after a response, or every token of a masked slot) return exactly 0 and
pass no gradient, even when their log-probabilities are garbage (NaN or infinite): the log-ratio
is replaced by 0 *before* the exponential, so no NaN reaches the backward pass.

References:
  Schulman et al., 2017, "Proximal Policy Optimization Algorithms", arXiv 1707.06347, eq. 7.
  Yu et al., 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
  arXiv 2503.14476, section 3.1 (clip-higher: separate eps_low and eps_high).
  Schulman, 2020, "Approximating KL Divergence", http://joschu.net/blog/kl-approx.html (k3).
  Shao et al., 2024, arXiv 2402.03300, eq. 4 (k3 as GRPO's KL term).
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from gdro_jax.losses._validation import check_at_least, check_token_arrays


class SurrogateStats(NamedTuple):
    """Token statistics of one clipped-surrogate evaluation, over valid tokens."""

    clip_fraction_low: jax.Array  # [] float32 share of tokens with A < 0 and rho < 1 - eps_low
    clip_fraction_high: jax.Array  # [] float32 share of tokens with A > 0 and rho > 1 + eps_high
    ratio_mean: jax.Array  # [] float32 mean importance ratio rho


def _token_mean(values_RT: jax.Array, mask_RT: jax.Array, count: jax.Array | None) -> jax.Array:
    if count is None:
        count = jnp.maximum(jnp.sum(mask_RT, dtype=jnp.float32), 1.0)
    return jnp.sum(jnp.where(mask_RT, values_RT, 0.0), dtype=jnp.float32) / count


def clipped_surrogate(
    logp_RT: ArrayLike,
    old_logp_RT: ArrayLike,
    adv_R: ArrayLike,
    mask_RT: ArrayLike,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    token_count: ArrayLike | None = None,
) -> tuple[jax.Array, SurrogateStats]:
    """Per-token clipped surrogate objective (to maximise) with asymmetric clipping.

        rho_it = exp(logp_it - old_logp_it)
        J_it   = min(rho_it * A_i, clip(rho_it, 1 - eps_low, 1 + eps_high) * A_i)

    The per-token loss is `-J_it`. The clip is active (the token passes no gradient) exactly when
    `A > 0 and rho > 1 + eps_high` (counted in `clip_fraction_high`) or `A < 0 and
    rho < 1 - eps_low` (`clip_fraction_low`); the fractions are over valid tokens. `old_logp_RT`
    and `adv_R` are treated as constants (`stop_gradient`).

    Args:
      logp_RT: float[R, T] log-probabilities of the sampled tokens under the current policy.
      old_logp_RT: float[R, T] the same under the policy that sampled them.
      adv_R: float[R] advantage of each rollout, shared by all its tokens.
      mask_RT: [R, T] bool (or 0/1) valid-token mask; non-zero means valid.
      eps_low: `0 <= eps_low < 1`, lower clip range (SPEC 2: 0.2).
      eps_high: `>= 0`, upper clip range (SPEC 2: 0.28, DAPO's clip-higher).
      token_count: float[] the statistics' denominator: the valid tokens of the whole mini-batch
        when these rows are one of its micro-batches (the statistics are then this micro-batch's
        shares, which sum to the mini-batch's). None: these rows' own, at least 1.

    Returns:
      `(surrogate_RT, stats)`: float32[R, T] objective, 0 on masked tokens; a `SurrogateStats`.

    Raises:
      ValueError: naming the parameter when `eps_low` or `eps_high` is out of range, or when the
        shapes do not match.

    References:
      Schulman et al., 2017, arXiv 1707.06347, eq. 7; Yu et al., 2025 (DAPO), arXiv 2503.14476,
      section 3.1.
    """
    eps_low = check_at_least("eps_low", eps_low, 0.0)
    if not eps_low < 1.0:
        raise ValueError(f"eps_low must be < 1, got eps_low={eps_low!r}")
    eps_high = check_at_least("eps_high", eps_high, 0.0)
    logp_RT = jnp.asarray(logp_RT, jnp.float32)
    old_logp_RT = jax.lax.stop_gradient(jnp.asarray(old_logp_RT, jnp.float32))
    mask_RT = jnp.asarray(mask_RT).astype(bool)
    adv_R = jax.lax.stop_gradient(jnp.asarray(adv_R, jnp.float32))
    check_token_arrays(mask_RT, logp_RT=logp_RT, old_logp_RT=old_logp_RT)
    chex.assert_rank(adv_R, 1)
    if adv_R.shape[0] != mask_RT.shape[0]:
        raise ValueError(f"adv_R must have shape ({mask_RT.shape[0]},), got {adv_R.shape}")

    log_ratio_RT = jnp.where(mask_RT, logp_RT - old_logp_RT, 0.0)
    ratio_RT = jnp.exp(log_ratio_RT)
    adv_RT = adv_R[:, None]
    unclipped_RT = ratio_RT * adv_RT
    clipped_RT = jnp.clip(ratio_RT, 1.0 - eps_low, 1.0 + eps_high) * adv_RT
    surrogate_RT = jnp.where(mask_RT, jnp.minimum(unclipped_RT, clipped_RT), 0.0)
    low_RT = mask_RT & (adv_RT < 0) & (ratio_RT < 1.0 - eps_low)
    high_RT = mask_RT & (adv_RT > 0) & (ratio_RT > 1.0 + eps_high)
    stats = SurrogateStats(
        clip_fraction_low=_token_mean(low_RT.astype(jnp.float32), mask_RT, token_count),
        clip_fraction_high=_token_mean(high_RT.astype(jnp.float32), mask_RT, token_count),
        ratio_mean=_token_mean(jax.lax.stop_gradient(ratio_RT), mask_RT, token_count),
    )
    return surrogate_RT, stats


def k3_kl(
    logp_RT: ArrayLike, ref_logp_RT: ArrayLike, mask_RT: ArrayLike | None = None
) -> jax.Array:
    """Per-token k3 estimator of KL(pi || pi_ref) from tokens sampled from pi.

        k3 = pi_ref/pi - log(pi_ref/pi) - 1 = expm1(x) - x,   x = ref_logp - logp,

    which is unbiased, and >= 0 for every token (it is `f(u) = u - log u - 1` at `u = pi_ref/pi`,
    whose minimum 0 is at `u = 1`). It is computed as `expm1(x) - x` to avoid the cancellation of
    `exp(x) - x - 1` for small `x`, and floored at 0 against rounding. `ref_logp_RT` is a constant
    (`stop_gradient`); the gradient w.r.t. `logp` is `1 - pi_ref/pi`.

    Args:
      logp_RT: float[R, T] log-probabilities of the sampled tokens under the current policy.
      ref_logp_RT: float[R, T] the same under the frozen reference policy.
      mask_RT: optional [R, T] valid-token mask; masked tokens return 0 with no gradient.

    Returns:
      float32[R, T] non-negative per-token KL estimates.

    References:
      Schulman, 2020, "Approximating KL Divergence" (k3); Shao et al., 2024, arXiv 2402.03300,
      eq. 4.
    """
    logp_RT = jnp.asarray(logp_RT, jnp.float32)
    ref_logp_RT = jax.lax.stop_gradient(jnp.asarray(ref_logp_RT, jnp.float32))
    chex.assert_rank([logp_RT, ref_logp_RT], 2)
    chex.assert_equal_shape([logp_RT, ref_logp_RT])
    log_ratio_RT = ref_logp_RT - logp_RT
    if mask_RT is not None:
        mask_RT = jnp.asarray(mask_RT).astype(bool)
        check_token_arrays(mask_RT, logp_RT=logp_RT)
        log_ratio_RT = jnp.where(mask_RT, log_ratio_RT, 0.0)
    return jnp.maximum(jnp.expm1(log_ratio_RT) - log_ratio_RT, 0.0)
