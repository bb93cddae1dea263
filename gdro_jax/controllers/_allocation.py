"""The allocation problems Rollout-GDRO solves: rollouts per prompt under an exact total.

Minimise the gradient-variance proxy ``sum_i v_i / n_i`` over integers ``n_min <= n_i <= n_max``
with ``sum_i n_i = total``:

* :func:`integer_allocation`: the exact integer optimum (the discrete square-root rule) by one
  ``top_k`` over marginal gains, with the shadow price ``mu`` at the cut;
* :func:`continuous_allocation`: the continuous relaxation ``n_i = clip(sqrt(v_i / mu))``;
* :func:`arms_allocation`: the released code's arms design, the joint configuration of maximal
  log-probability with the exact budget, by dynamic programming.

References:
  Neyman, "On the two different aspects of the representative method", 1934 (square-root rule).
  Fox, "Discrete optimization via marginal analysis", Management Science, 1966 (greedy optimum).
  Panaganti et al., 2026, arXiv 2601.19280 (Rollout-GDRO's arms).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

# Variances below _TINY count as zero and above _HUGE are capped, so every gain, square root and
# log stays a finite float32.
_TINY = 1e-30
_HUGE = 1e30
# Log-probabilities below this (or NaN) are treated as this: exp(-1e6) is 0 in any float anyway,
# and a sum of N of them stays finite, so the DP never has to compare infinities.
_LOG_PROB_FLOOR = -1e6


def _sanitize_variance(variance_N: jax.typing.ArrayLike) -> jax.Array:
    """float32 [N] variances with NaN and tiny or negative values as 0, huge values capped."""
    variance_N = jnp.asarray(variance_N, jnp.float32)
    if variance_N.ndim != 1:
        raise ValueError(f"variance_N must have rank 1, got shape {variance_N.shape}")
    variance_N = jnp.minimum(jnp.nan_to_num(variance_N, nan=0.0), _HUGE)
    return jnp.where(variance_N >= _TINY, variance_N, 0.0)


def _check_budget(num_prompts: int, n_min: int, n_max: int, total: int) -> None:
    if n_min < 1:
        raise ValueError(f"n_min must be >= 1, got {n_min}")
    if n_max < n_min:
        raise ValueError(f"n_max must be >= n_min={n_min}, got {n_max}")
    if not num_prompts * n_min <= total <= num_prompts * n_max:
        raise ValueError(
            f"total={total} is infeasible for {num_prompts} prompts with n in "
            f"[{n_min}, {n_max}]: it must lie in [{num_prompts * n_min}, {num_prompts * n_max}]"
        )


def _permuted(fn: Callable[..., Any], key: jax.Array | None, x: jax.Array) -> Any:
    """Applies ``fn`` to ``x`` with its leading axis shuffled by ``key``; returns it unshuffled.

    Index-based tie-breaking inside ``fn`` then favours random prompts rather than the first ones.
    """
    if key is None:
        return fn(x)
    perm = jax.random.permutation(key, x.shape[0])
    n_perm, *rest = fn(x[perm])
    return (jnp.zeros_like(n_perm).at[perm].set(n_perm), *rest)


def integer_allocation(
    variance_N: jax.typing.ArrayLike,
    *,
    n_min: int,
    n_max: int,
    total: int,
    key: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Integer minimiser of ``sum_i v_i / n_i`` over ``n_i in [n_min, n_max]``, ``sum n = total``.

    Starting from ``n_min`` everywhere, the ``R = total - N * n_min`` remaining units go to the
    largest marginal gains ``v_i / (n (n + 1))`` (the drop in ``v_i / n`` from ``n`` to ``n + 1``).
    The objective is separable and convex, so this greedy is optimal (Fox 1966), and since each
    prompt's gains fall with ``n`` it equals taking the top ``R`` of all ``N * (n_max - n_min)``
    candidate gains: one stable sort, static shapes.

    Ties: candidates are ordered unit-major (every prompt's k-th unit before anyone's (k+1)-th)
    and then by prompt index, or by a random permutation of the prompts when ``key`` is given.
    Hence equal ``v`` (including all ``v = 0``) gives an even split, differing by at most one.

    Args:
      variance_N: [N] per-prompt variances ``v_i``; NaN, negative and values below 1e-30 count
        as 0, values above 1e30 are capped.
      n_min: smallest rollout count per prompt (>= 1).
      n_max: largest rollout count per prompt.
      total: exact total of rollouts, static; in ``[N * n_min, N * n_max]``.
      key: optional PRNG key that breaks the remaining ties at random instead of by index.

    Returns:
      ``(n_N, mu)``: int32 [N] rollout counts and the float32 [] shadow price ``mu``, the marginal
      gain of the last unit handed out (``min_i v_i / ((n_i - 1) n_i)`` over ``n_i > n_min``).
      When no unit is handed out (``total == N * n_min``) it is the largest gain declined, and 0
      when there are no candidates at all (``n_min == n_max``).

    References:
      Fox, "Discrete optimization via marginal analysis", Management Science 13(3), 1966.
    """
    variance_N = _sanitize_variance(variance_N)
    num_prompts = variance_N.shape[0]
    _check_budget(num_prompts, n_min, n_max, total)
    num_levels = n_max - n_min
    remaining = total - num_prompts * n_min
    if num_levels == 0 or num_prompts == 0:
        return jnp.full((num_prompts,), n_min, jnp.int32), jnp.zeros((), jnp.float32)

    def allocate(v_N):
        level_K = jnp.arange(n_min, n_max, dtype=jnp.float32)
        gain_KN = v_N[None, :] / (level_K * (level_K + 1.0))[:, None]
        gain_flat = gain_KN.reshape(-1)  # unit-major: index k * N + i
        if remaining == 0:  # nothing to hand out: report the largest gain declined
            return jnp.full((num_prompts,), n_min, jnp.int32), jnp.max(gain_flat)
        # top_k returns equal values lower index first, so ties follow the unit-major order.
        # It is several times faster than a full sort on CPU (benchmarks/controllers.py).
        top_values, top_index = jax.lax.top_k(gain_flat, remaining)
        taken = jnp.zeros(gain_flat.shape, jnp.int32).at[top_index].set(1)
        n_N = n_min + jnp.sum(taken.reshape(num_levels, num_prompts), axis=0, dtype=jnp.int32)
        return n_N, top_values[-1]

    return _permuted(allocate, key, variance_N)


def continuous_allocation(
    variance_N: jax.typing.ArrayLike,
    *,
    n_min: int,
    n_max: int,
    total: int,
    num_iterations: int = 64,
) -> tuple[jax.Array, jax.Array]:
    """Continuous relaxation, the bounded square-root rule ``n_i = clip(sqrt(v_i / mu), lo, hi)``.

    The shadow price ``mu`` is found by bisection on ``log mu`` (the budget is decreasing in
    ``mu``), then refined in closed form on the unclipped prompts, ``mu = (sum_F sqrt(v) /
    (total - sum_clipped n))^2``, so the budget holds to float32 rounding. Prompts with ``v = 0``
    sit at ``n_min``; if the others all reach ``n_max`` and budget is left over, ``mu = 0`` and the
    zero-variance prompts share the rest evenly (they are indifferent), which makes all ``v = 0``
    an even split ``total / N``. With ``n_min == n_max`` there is nothing to choose and ``mu = 0``.

    Args:
      variance_N: [N] per-prompt variances (sanitised as in :func:`integer_allocation`).
      n_min: lower bound on each ``n_i`` (>= 1).
      n_max: upper bound on each ``n_i``.
      total: the budget ``sum_i n_i``, static; in ``[N * n_min, N * n_max]``.
      num_iterations: bisection steps on ``log mu``.

    Returns:
      ``(n_N, mu)``: float32 [N] real rollout counts and the float32 [] shadow price.

    References:
      Neyman (1934), optimum allocation: ``n_i`` proportional to the standard deviation.
    """
    variance_N = _sanitize_variance(variance_N)
    num_prompts = variance_N.shape[0]
    _check_budget(num_prompts, n_min, n_max, total)
    if n_min == n_max:  # nothing to choose; report mu = 0 as integer_allocation does
        return jnp.full((num_prompts,), float(n_min), jnp.float32), jnp.zeros((), jnp.float32)
    lo_n, hi_n, total_f = float(n_min), float(n_max), float(total)
    positive_N = variance_N > 0.0
    num_zero = num_prompts - jnp.sum(positive_N)
    any_positive = jnp.any(positive_N)
    safe_v_N = jnp.where(positive_N, variance_N, 1.0)
    sqrt_v_N = jnp.sqrt(safe_v_N)

    def counts(log_mu):
        n_N = jnp.clip(sqrt_v_N * jnp.exp(-0.5 * log_mu), lo_n, hi_n)
        return jnp.where(positive_N, n_N, lo_n)

    # At mu_hi every positive prompt is at n_min (budget N*n_min <= total); at mu_lo at n_max.
    log_hi = jnp.log(jnp.max(safe_v_N)) - 2.0 * jnp.log(lo_n)
    log_lo = jnp.log(jnp.min(safe_v_N)) - 2.0 * jnp.log(hi_n)

    def bisect(_, bounds):
        lo, hi = bounds
        mid = 0.5 * (lo + hi)
        over = jnp.sum(counts(mid)) > total_f  # mu too small: too many rollouts
        return jnp.where(over, mid, lo), jnp.where(over, hi, mid)

    lo, hi = jax.lax.fori_loop(0, num_iterations, bisect, (log_lo, log_hi))
    n_N = counts(0.5 * (lo + hi))
    # Closed-form refinement on the free (unclipped, positive) prompts.
    free_N = positive_N & (n_N > lo_n) & (n_N < hi_n)
    left = total_f - jnp.sum(jnp.where(free_N, 0.0, n_N))
    sqrt_free = jnp.sum(jnp.where(free_N, sqrt_v_N, 0.0))
    has_free = jnp.any(free_N) & (left > 0.0)
    scale = jnp.where(has_free, left / jnp.where(has_free, sqrt_free, 1.0), 0.0)
    n_N = jnp.where(free_N, jnp.clip(sqrt_v_N * scale, lo_n, hi_n), n_N)
    mu = jnp.where(has_free, 1.0 / jnp.where(has_free, scale, 1.0) ** 2, jnp.exp(0.5 * (lo + hi)))
    # Budget the positive prompts cannot absorb goes evenly to the zero-variance ones, at mu = 0.
    capacity = jnp.sum(jnp.where(positive_N, hi_n, lo_n))
    shortfall = jnp.maximum(total_f - capacity, 0.0)
    n_zero = lo_n + shortfall / jnp.maximum(num_zero, 1).astype(jnp.float32)
    saturated = shortfall > 0.0
    n_N = jnp.where(positive_N, jnp.where(saturated, hi_n, n_N), n_zero)
    mu = jnp.where(saturated | ~any_positive, 0.0, mu)
    return n_N.astype(jnp.float32), mu.astype(jnp.float32)


def arms_allocation(log_probs_NA: jax.typing.ArrayLike, *, n_min: int, total: int) -> jax.Array:
    """Exact DP: maximise ``sum_i log_probs[i, n_i - n_min]`` s.t. ``sum_i n_i == total``.

    ``dp[s]`` is the best joint log-probability of the prompts so far using ``s`` units above
    ``n_min``; a ``lax.scan`` over prompts updates it for every arm and records the argmax, and a
    reverse scan backtracks from ``s = total - N * n_min``. Cost ``O(N * total * A)``.

    Ties: among configurations with exactly equal log-probability the DP prefers the smallest
    ``sum_i (n_i - n_min)^2`` (the most even one; e.g. uniform arms give an even split), then the
    smallest arm for the later prompts. This lexicographic tie rule is our addition: the joint
    log-probability is still maximised exactly.

    Args:
      log_probs_NA: [N, A] per-prompt log-probabilities of the arms ``n_min..n_min + A - 1``;
        NaN and values below -1e6 are treated as -1e6.
      n_min: rollout count of arm 0 (>= 1).
      total: exact total of rollouts, static; in ``[N * n_min, N * (n_min + A - 1)]``.

    Returns:
      int32 [N] rollout counts.
    """
    log_probs_NA = jnp.asarray(log_probs_NA, jnp.float32)
    if log_probs_NA.ndim != 2:
        raise ValueError(f"log_probs_NA must have rank 2, got shape {log_probs_NA.shape}")
    num_prompts, num_arms = log_probs_NA.shape
    _check_budget(num_prompts, n_min, n_min + num_arms - 1, total)
    log_probs_NA = jnp.maximum(jnp.nan_to_num(log_probs_NA, nan=_LOG_PROB_FLOOR), _LOG_PROB_FLOOR)
    budget = total - num_prompts * n_min
    arm_A = jnp.arange(num_arms, dtype=jnp.int32)
    source_AS = jnp.arange(budget + 1, dtype=jnp.int32)[None, :] - arm_A[:, None]
    reachable_AS = source_AS >= 0
    source_AS = jnp.maximum(source_AS, 0)
    big = jnp.iinfo(jnp.int32).max

    def forward(carry, log_probs_A):
        value_S, spread_S = carry
        value_AS = jnp.where(reachable_AS, value_S[source_AS] + log_probs_A[:, None], -jnp.inf)
        spread_AS = jnp.where(reachable_AS, spread_S[source_AS] + (arm_A * arm_A)[:, None], big)
        best_S = jnp.max(value_AS, axis=0)
        choice_S = jnp.argmin(jnp.where(value_AS == best_S, spread_AS, big), axis=0)
        spread_S = jnp.take_along_axis(spread_AS, choice_S[None], axis=0)[0]
        return (best_S, spread_S), choice_S.astype(jnp.int32)

    init = (
        jnp.where(jnp.arange(budget + 1) == 0, 0.0, -jnp.inf).astype(jnp.float32),
        jnp.zeros((budget + 1,), jnp.int32),
    )
    _, choice_NS = jax.lax.scan(forward, init, log_probs_NA)

    def backward(units_left, choice_S):
        arm = choice_S[units_left]
        return units_left - arm, arm

    _, arm_N = jax.lax.scan(backward, jnp.int32(budget), choice_NS, reverse=True)
    return (n_min + arm_N).astype(jnp.int32)
