"""Rollout-GDRO: the compute adversary that moves rollouts between prompts under a fixed total.

Each step the batch's ``N`` prompts fall in difficulty bins ``b_i``. Rollout-GDRO chooses per-prompt
rollout counts ``n_i`` in ``[n_min, n_max]`` with ``sum_i n_i == N * n_mean`` exactly (the sampler
always draws ``R = N * n_mean`` sequences, so nothing recompiles; SPEC section 6) to minimise the
gradient-variance proxy ``sum_i v(b_i) / n_i``, ``v(b)`` an EMA of a per-bin variance proxy.

Two modes:

* ``"sqrt"`` (default): the exact integer optimum of that problem (:func:`integer_allocation`),
  the discrete square-root rule, with its shadow price ``mu`` (the marginal gain at the cut).
  :func:`continuous_allocation` is the continuous relaxation ``n_i = clip(sqrt(v_i / mu))``.
* ``"arms"``: the authors' released design, per-bin exponential weights over the integer arms
  ``n_min..n_max`` with the joint configuration chosen by dynamic programming
  (:func:`arms_allocation`) and a running price ``mu`` on rollouts above ``n_mean``.

References:
  Panaganti et al., "Multi-Adversary Group DRO for RL post-training", 2026, arXiv 2601.19280.
  Neyman, "On the two different aspects of the representative method", 1934 (square-root rule).
  Fox, "Discrete optimization via marginal analysis", Management Science, 1966 (greedy optimum).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp

from gdro_jax.losses import segment_mean

# Variances below _TINY count as zero and above _HUGE are capped, so every gain, square root and
# log stays a finite float32.
_TINY = 1e-30
_HUGE = 1e30
# Log-probabilities below this (or NaN) are treated as this: exp(-1e6) is 0 in any float anyway,
# and a sum of N of them stays finite, so the DP never has to compare infinities.
_LOG_PROB_FLOOR = -1e6
_PROXIES = ("bernoulli", "empirical", "signal")
_MODES = ("sqrt", "arms")


class RolloutGDROState(NamedTuple):
    """State of Rollout-GDRO; fixed shapes and dtypes, so it can be a ``lax.scan`` carry."""

    variance: jax.Array  # [B] float32 EMA of the per-bin variance proxy v(b)
    seen: jax.Array  # [B] bool whether v(b) has been observed
    arm_scores: jax.Array  # [B, A] float32, A = n_max - n_min + 1 (arms mode; zeros in sqrt mode)
    mu: jax.Array  # [] float32 arms mode's running price (sqrt mode: 0; see AllocationInfo.mu)
    step: jax.Array  # [] int32 number of updates applied


class AllocationInfo(NamedTuple):
    """What :func:`rollout_gdro`'s ``allocate`` decided, for logging (SPEC section 10)."""

    mu: jax.Array  # [] float32 shadow price: the marginal gain v/(n(n+1)) at the cut (arms: price)
    variance_per_prompt: jax.Array  # [N] float32 the v used for each prompt
    variance_per_bin: jax.Array  # [B] float32 the v used for each bin (unseen bins: batch proxy)
    prompts_per_bin: jax.Array  # [B] int32 the batch's prompts in each bin
    rollouts_per_bin: jax.Array  # [B] int32 total rollouts given to each bin's prompts
    objective: jax.Array  # [] float32 the variance proxy sum_i v_i / n_i of this allocation


class RolloutGDROUpdate(Protocol):
    """``update(state, bins, *, p_hat=None, losses=None, num_correct=None, num_rollouts=None,
    valid=None) -> RolloutGDROState``; which observations are needed depends on the proxy."""

    def __call__(
        self,
        state: RolloutGDROState,
        bins: jax.typing.ArrayLike,
        *,
        p_hat: jax.typing.ArrayLike | None = None,
        losses: jax.typing.ArrayLike | None = None,
        num_correct: jax.typing.ArrayLike | None = None,
        num_rollouts: jax.typing.ArrayLike | None = None,
        valid: jax.typing.ArrayLike | None = None,
    ) -> RolloutGDROState: ...


class RolloutGDRO(NamedTuple):
    """Rollout-GDRO as pure functions; build it with :func:`rollout_gdro`."""

    init: Callable[[], RolloutGDROState]
    # (state, bins, p_hat=None, key=None) -> (n_N int32, AllocationInfo)
    allocate: Callable[..., tuple[jax.Array, AllocationInfo]]
    update: RolloutGDROUpdate
    num_bins: int
    n_min: int
    n_max: int
    n_mean: int


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


def rollout_gdro(
    num_bins: int = 10,
    n_min: int = 2,
    n_max: int = 12,
    n_mean: int = 4,
    proxy: str = "bernoulli",
    ema: float = 0.12,
    mode: str = "sqrt",
    reward_values: tuple[float, float] = (-1.0, 1.0),
    variance_floor: float = 0.01,
    arm_eta: float = 1.0,
    mu_lr: float = 0.05,
    mu_init: float = 0.0,
) -> RolloutGDRO:
    """Builds Rollout-GDRO, the compute adversary (SPEC section 5).

    Per-bin variance proxy ``v(b)``, observed at each ``update`` for the bins present and smoothed
    by an EMA whose first observation initialises it, ``v <- (1 - ema) v + ema * obs``:

    * ``"bernoulli"``: ``(r_hi - r_lo)^2 * max(mean_i p_i (1 - p_i), variance_floor)`` over the
      bin's prompts, the variance of a reward that is ``r_hi`` with probability ``p`` (x4 for
      +-1 rewards). ``p_i`` is ``p_hat`` when given, else ``num_correct / num_rollouts``.
    * ``"empirical"``: ``max(Var_i losses_i, variance_floor)``, the within-bin (population)
      variance of the per-prompt loss signal.
    * ``"signal"``: as bernoulli with ``p (1 - p)`` weighted by ``1 - p^n - (1 - p)^n``, the chance
      that a group of ``n = n_mean`` rollouts is not all-equal (so carries a GRPO gradient), as in
      Knapsack-RL; the floor applies to the weighted mean.

    ``allocate(state, bins, p_hat, key)`` uses ``v(b_i)``; for bins never observed it uses the
    current batch's proxy from ``p_hat`` (bernoulli, or signal when that is the proxy; the
    empirical proxy needs losses, which do not exist before the rollouts), and
    ``(r_hi - r_lo)^2 / 4`` (the largest Bernoulli variance) when ``p_hat`` is None.

    Modes:

    * ``"sqrt"``: :func:`integer_allocation` of ``v(b_i)`` with total ``N * n_mean``; ties broken
      by a random permutation from ``key`` (by index when ``key`` is None). The shadow price,
      the cut gain, is returned as ``info.mu`` by ``allocate``; ``state.mu`` stays 0.
    * ``"arms"``: per bin a softmax of ``arm_eta * arm_scores[b]`` over the arms ``n_min..n_max``;
      :func:`arms_allocation` picks the configuration of maximal joint log-probability with the
      exact budget. ``update`` adds ``delta_b = lbar_b - mu (n_b - n_mean)`` to the bin's arm
      scores (``lbar_b`` the bin's mean loss, ``n_b`` its mean rollouts per prompt) and sets
      ``mu <- mu + mu_lr (mean_b n_b - n_mean)``. Deviations from the released code, which gives a
      bin one arm: a bin's prompts may get different arms from the per-prompt DP, so ``delta_b``
      is split over the arms in proportion to the prompts that used them (identical when they all
      used one arm); and the price uses the unweighted mean over present bins, since the
      prompt-weighted mean is ``n_mean`` exactly under the exact budget and would never move
      ``mu``. ``v`` is still tracked for logging when its observation is passed.

    Args:
      num_bins: number of difficulty bins ``B``.
      n_min: fewest rollouts per prompt (paper 2), ``1 <= n_min <= n_mean``.
      n_max: most rollouts per prompt (paper 12), ``>= n_mean``.
      n_mean: base rollouts per prompt ``n_bar`` (paper 4); the total is ``N * n_mean``.
      proxy: ``"bernoulli"``, ``"empirical"`` or ``"signal"``.
      ema: EMA rate in ``(0, 1]`` (1 keeps only the latest observation).
      mode: ``"sqrt"`` or ``"arms"``.
      reward_values: ``(r_lo, r_hi)`` of the binary reward; scales the Bernoulli proxies.
      variance_floor: floor (>= 0) on a bin's proxy before the reward scale, so that bins at
        ``p = 0`` or ``1`` keep some rollouts.
      arm_eta: inverse temperature (>= 0) of the arms' exponential weights.
      mu_lr: step size (>= 0) of the arms-mode price ``mu``.
      mu_init: initial arms-mode price.

    Returns:
      A :class:`RolloutGDRO` of pure functions ``init()``,
      ``allocate(state, bins, p_hat, key) -> (n_N int32, AllocationInfo)`` and
      ``update(state, bins, *, p_hat=None, losses=None, num_correct=None, num_rollouts=None,
      valid=None) -> state``. ``bins`` is int32 [N] in ``[0, B)`` (others are ignored), ``valid``
      an optional bool [N] mask of prompts that count (padding excluded); a prompt whose loss is
      NaN or infinite is ignored by ``update`` as if it were not valid.

    References:
      Panaganti et al. (2026), arXiv 2601.19280, Rollout-GDRO. Knapsack-RL (Li et al., 2025,
      arXiv 2509.25849) for the non-degenerate-group weight of the ``signal`` proxy.
    """
    for name, value in (("num_bins", num_bins), ("n_min", n_min), ("n_max", n_max)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if not isinstance(n_mean, int) or n_mean < n_min:
        raise ValueError(
            f"n_mean must be an integer >= n_min={n_min}, got {n_mean!r}: "
            f"the budget N*n_mean would be below the floor N*n_min (infeasible)"
        )
    if n_max < n_mean:
        raise ValueError(f"n_max must be >= n_mean={n_mean}, got {n_max}")
    if not 0.0 < ema <= 1.0:
        raise ValueError(f"ema must lie in (0, 1], got {ema!r}")
    if proxy not in _PROXIES:
        raise ValueError(f"proxy must be one of {_PROXIES}, got {proxy!r}")
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    if len(reward_values) != 2 or reward_values[0] == reward_values[1]:
        raise ValueError(f"reward_values must be two distinct values, got {reward_values!r}")
    for name, value in (("variance_floor", variance_floor), ("arm_eta", arm_eta), ("mu_lr", mu_lr)):
        if not value >= 0.0:
            raise ValueError(f"{name} must be >= 0, got {value!r}")
    num_arms = n_max - n_min + 1
    reward_scale = float(reward_values[1] - reward_values[0]) ** 2

    def init() -> RolloutGDROState:
        return RolloutGDROState(
            variance=jnp.zeros((num_bins,), jnp.float32),
            seen=jnp.zeros((num_bins,), bool),
            arm_scores=jnp.zeros((num_bins, num_arms), jnp.float32),
            mu=jnp.asarray(mu_init if mode == "arms" else 0.0, jnp.float32),
            step=jnp.zeros((), jnp.int32),
        )

    def check_batch(bins, name, value, dtype):
        value = jnp.asarray(value, dtype)
        if value.shape != bins.shape:
            raise ValueError(f"{name} must have shape {bins.shape} like bins, got {value.shape}")
        return value

    def bernoulli_term(p_N):
        """Per-prompt p(1-p), weighted for the signal proxy."""
        p_N = jnp.clip(jnp.nan_to_num(p_N, nan=0.5), 0.0, 1.0)
        term_N = p_N * (1.0 - p_N)
        if proxy == "signal":
            term_N = term_N * (1.0 - p_N**n_mean - (1.0 - p_N) ** n_mean)
        return term_N

    def batch_proxy(bins, p_N, weight_N):
        """[B] Bernoulli-family proxy of this batch from per-prompt success probabilities."""
        mean_B, _ = segment_mean(bernoulli_term(p_N), bins, weight_N, num_bins)
        return reward_scale * jnp.maximum(mean_B, variance_floor)

    def variance_used(state, bins, p_hat):
        if p_hat is None:
            fallback_B = jnp.full((num_bins,), 0.25 * reward_scale, jnp.float32)
        else:
            p_hat = check_batch(bins, "p_hat", p_hat, jnp.float32)
            fallback_B = batch_proxy(bins, p_hat, jnp.ones(bins.shape, jnp.float32))
        return jnp.where(state.seen, state.variance, fallback_B)

    def allocate(state, bins, p_hat=None, key=None):
        bins = jnp.asarray(bins, jnp.int32)
        if bins.ndim != 1:
            raise ValueError(f"bins must have rank 1, got shape {bins.shape}")
        total = bins.shape[0] * n_mean
        variance_B = variance_used(state, bins, p_hat)
        variance_N = variance_B[jnp.clip(bins, 0, num_bins - 1)]
        if mode == "sqrt":
            n_N, mu = integer_allocation(variance_N, n_min=n_min, n_max=n_max, total=total, key=key)
        else:
            log_probs_BA = jax.nn.log_softmax(arm_eta * state.arm_scores, axis=-1)
            log_probs_NA = log_probs_BA[jnp.clip(bins, 0, num_bins - 1)]
            n_N = _permuted(
                lambda lp: (arms_allocation(lp, n_min=n_min, total=total),), key, log_probs_NA
            )[0]
            mu = state.mu
        ones_N = jnp.ones(bins.shape, jnp.int32)
        info = AllocationInfo(
            mu=jnp.asarray(mu, jnp.float32),
            variance_per_prompt=variance_N,
            variance_per_bin=variance_B,
            prompts_per_bin=jax.ops.segment_sum(ones_N, bins, num_segments=num_bins),
            rollouts_per_bin=jax.ops.segment_sum(n_N, bins, num_segments=num_bins),
            objective=jnp.sum(variance_N / n_N.astype(jnp.float32)),
        )
        return n_N, info

    def update(
        state,
        bins,
        *,
        p_hat=None,
        losses=None,
        num_correct=None,
        num_rollouts=None,
        valid=None,
    ):
        bins = jnp.asarray(bins, jnp.int32)
        if bins.ndim != 1:
            raise ValueError(f"bins must have rank 1, got shape {bins.shape}")
        in_range_N = (bins >= 0) & (bins < num_bins)
        if valid is not None:
            in_range_N = in_range_N & check_batch(bins, "valid", valid, bool)
        if losses is not None:  # a non-finite loss drops its prompt rather than poison the state
            losses = check_batch(bins, "losses", losses, jnp.float32)
            in_range_N = in_range_N & jnp.isfinite(losses)
            losses = jnp.where(in_range_N, losses, 0.0)
        weight_N = in_range_N.astype(jnp.float32)
        present_B = jax.ops.segment_sum(weight_N, bins, num_segments=num_bins) > 0

        observation_B = None
        if proxy == "empirical":
            if losses is not None:
                mean_B, _ = segment_mean(losses, bins, weight_N, num_bins)
                # Two-pass variance: E[l^2] - E[l]^2 cancels badly in float32.
                deviation_N = losses - mean_B[jnp.clip(bins, 0, num_bins - 1)]
                var_B, _ = segment_mean(deviation_N**2, bins, weight_N, num_bins)
                observation_B = jnp.maximum(var_B, variance_floor)
        elif p_hat is not None:
            observation_B = batch_proxy(
                bins, check_batch(bins, "p_hat", p_hat, jnp.float32), weight_N
            )
        elif num_correct is not None and num_rollouts is not None:
            correct_N = check_batch(bins, "num_correct", num_correct, jnp.float32)
            rollouts_N = check_batch(bins, "num_rollouts", num_rollouts, jnp.float32)
            observation_B = batch_proxy(bins, correct_N / jnp.maximum(rollouts_N, 1.0), weight_N)
        missing = "losses" if proxy == "empirical" else "p_hat or (num_correct, num_rollouts)"
        if observation_B is None and mode == "sqrt":
            raise ValueError(f"update with proxy={proxy!r} needs {missing}, which was not given")

        new_state = state._replace(step=state.step + 1)
        if observation_B is not None:
            smoothed_B = (1.0 - ema) * state.variance + ema * observation_B
            new_state = new_state._replace(
                variance=jnp.where(
                    present_B, jnp.where(state.seen, smoothed_B, observation_B), state.variance
                ).astype(jnp.float32),
                seen=state.seen | present_B,
            )
        if mode == "sqrt":  # the shadow price of sqrt mode is reported by allocate (info.mu)
            return new_state

        if losses is None or num_rollouts is None:
            raise ValueError("update in mode='arms' needs losses and num_rollouts")
        rollouts_N = check_batch(bins, "num_rollouts", num_rollouts, jnp.int32)
        mean_loss_B, _ = segment_mean(losses, bins, weight_N, num_bins)
        mean_n_B, count_B = segment_mean(rollouts_N.astype(jnp.float32), bins, weight_N, num_bins)
        delta_B = jnp.where(present_B, mean_loss_B - state.mu * (mean_n_B - n_mean), 0.0)
        # Deviation: the released code gives a bin one arm; the per-prompt DP may give a bin's
        # prompts several, so delta_b is split over them by usage (the same when only one is used).
        arm_NA = jax.nn.one_hot(rollouts_N - n_min, num_arms, dtype=jnp.float32)
        usage_BA = jax.ops.segment_sum(weight_N[:, None] * arm_NA, bins, num_segments=num_bins)
        usage_BA = usage_BA / jnp.maximum(count_B, 1.0)[:, None]
        # The price moves with the unweighted mean over present bins: the prompt-weighted mean is
        # n_mean exactly under the exact budget, so it would leave mu where it started.
        num_present = jnp.sum(present_B)
        mean_n = jnp.sum(jnp.where(present_B, mean_n_B, 0.0)) / jnp.maximum(num_present, 1)
        mu = jnp.where(num_present > 0, state.mu + mu_lr * (mean_n - n_mean), state.mu)
        return new_state._replace(
            arm_scores=(state.arm_scores + delta_B[:, None] * usage_BA).astype(jnp.float32),
            mu=mu.astype(jnp.float32),
        )

    return RolloutGDRO(
        init=init,
        allocate=allocate,
        update=update,
        num_bins=num_bins,
        n_min=n_min,
        n_max=n_max,
        n_mean=n_mean,
    )
