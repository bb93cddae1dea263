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
from typing import NamedTuple

import jax
import jax.numpy as jnp

from gdro_jax.controllers._allocation import _permuted, arms_allocation, integer_allocation
from gdro_jax.controllers._segments import segment_mean

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
    success_rate: None = None  # by bin: no estimate of its own per prompt (`Allocation`)


class RolloutGDRO(NamedTuple):
    """Rollout-GDRO as pure functions; build it with :func:`rollout_gdro`."""

    init: Callable[[], RolloutGDROState]
    # (state, bins, p_hat=None, key=None) -> (n_N int32, AllocationInfo)
    allocate: Callable[..., tuple[jax.Array, AllocationInfo]]
    # (state, bins, *, p_hat=None, losses=None, num_correct=None, num_rollouts=None,
    # valid=None, prompt_ids=None) -> RolloutGDROState; which observations are needed depends
    # on the proxy (the `RolloutAllocator` protocol)
    update: Callable[..., RolloutGDROState]
    # (AllocationInfo) -> {"mu", "bin/variance", "allocation/objective"}: what the step logs
    metrics: Callable[[AllocationInfo], dict[str, jax.Array]]
    num_bins: int
    n_min: int
    n_max: int
    n_mean: int


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
    if n_min > n_max:
        raise ValueError(
            f"n_min and n_max must be ints with 1 <= n_min <= n_max, got n_min={n_min!r}, "
            f"n_max={n_max!r}"
        )
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

    def allocate(state, bins, p_hat=None, key=None, *, prompt_ids=None):
        del prompt_ids  # by bin: the prompts themselves do not matter
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
        prompt_ids=None,
    ):
        del prompt_ids  # by bin: the prompts themselves do not matter
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

    def metrics(info: AllocationInfo) -> dict[str, jax.Array]:
        return {
            "mu": info.mu,
            "bin/variance": info.variance_per_bin,
            "allocation/objective": info.objective,
        }

    return RolloutGDRO(
        init=init,
        allocate=allocate,
        update=update,
        metrics=metrics,
        num_bins=num_bins,
        n_min=n_min,
        n_max=n_max,
        n_mean=n_mean,
    )
