"""Knapsack-RL: rollouts per prompt by a knapsack over each prompt's value of more rollouts.

Each prompt keeps its own recent success rate `p` (the rollouts of its last visits). Giving a
prompt `n` rollouts is worth

    v(n) = (1 - p^n - (1 - p)^n) * p * (1 - p)^2,

the chance that its group is not all-equal (so its gradient is not zero) times a gradient-size
term. Under the same total `R = N * n_mean` as every method:

- a prompt without enough history (fewer than `min_history` rollouts) gets `n_mean`;
- a prompt with `p = 0` gets `negative_n` and one with `p = 1` gets `positive_n`;
- a prompt with `0 < p < 1` starts at `n_min`, and the budget left goes to them by a knapsack: a
  prompt given `k >= 1` extra units is worth `v(n_min + k)` (nothing with `k = 0`), at most
  `n_max - n_min` extra each;
- when those prompts would need fewer rollouts than are left (their estimated cost
  `log(1 - confidence) / log(max(p, 1 - p))` each, capped at `n_max`, summed), the rest goes
  evenly to the `p = 0` prompts (else to the prompts outside the knapsack): the fallback;
- with no prompt inside `(0, 1)`, the budget left goes evenly to the `p = 0` prompts (else every
  prompt gets `n_mean`).

The total is exact. The knapsack's item values are concave in `k` (the first unit is worth
`v(n_min + 1)`, the next ones `v`'s falling increments), so handing units one at a time to the
largest gain is optimal: one sort of every candidate unit's gain, static shapes, as Rollout-GDRO's
integer allocation. The released code solves the same problem by dynamic programming (equal
optimum; ties may be split differently).

Where we differ from the released code (`liziniu/KnapsackRL`, `exploration_utils.py` and
`rl_dataset.py`): the success rate is kept as per-visit counts (the last `window` visits), so
its "most recent `history` rewards" take a visit's mean for the part of the oldest visit that
fits, rather than that visit's individual last rewards; a knapsack that cannot place its whole
budget within `n_max` spreads the rest evenly over its prompts, as the released code does.

References:
  Li et al., "Knapsack RL: Unlocking Exploration of LLMs via Optimizing Budget Allocation", 2025
  (arXiv 2509.25849); released code `liziniu/KnapsackRL`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from gdro_jax.controllers._segments import prompt_visits


class KnapsackState(NamedTuple):
    """Per-prompt success history of Knapsack-RL (fixed shapes: a `lax.scan` carry)."""

    correct: jax.Array  # [D, W] float32 correct rollouts of each prompt's last W visits (a ring)
    rollouts: jax.Array  # [D, W] float32 rollouts of those visits (0: no visit yet)
    visits: jax.Array  # [D] int32 visits recorded
    step: jax.Array  # [] int32 updates applied


class KnapsackInfo(NamedTuple):
    """What `allocate` decided, for logging."""

    success_rate: jax.Array  # [N] float32 each prompt's recent success rate p
    effective: jax.Array  # [N] bool the prompts inside the knapsack (enough history, 0 < p < 1)
    fallback: jax.Array  # [] bool part of the budget went to the p = 0 prompts unasked
    mu: jax.Array  # [] float32 the gain of the last unit the knapsack handed out (0: none)


class Knapsack(NamedTuple):
    """Knapsack-RL as pure functions; build it with `knapsack`."""

    init: Callable[[], KnapsackState]
    allocate: Callable[..., tuple[jax.Array, KnapsackInfo]]
    update: Callable[..., KnapsackState]
    success_rate: Callable[[KnapsackState, ArrayLike], tuple[jax.Array, jax.Array]]
    # (KnapsackInfo) -> {"mu", "allocation/effective_fraction", "allocation/fallback"}
    metrics: Callable[[KnapsackInfo], dict[str, jax.Array]]
    n_mean: int
    num_prompts: int
    num_bins: None = None  # by prompt: the classifier's bins are not used (`RolloutAllocator`)


def knapsack_value(p: ArrayLike, n: ArrayLike) -> jax.Array:
    """`(1 - p^n - (1 - p)^n) * p * (1 - p)^2`: the value of giving a prompt of success rate `p`
    `n` rollouts (Knapsack-RL's item value)."""
    p = jnp.asarray(p, jnp.float32)
    n = jnp.asarray(n, jnp.float32)
    return (1.0 - p**n - (1.0 - p) ** n) * p * (1.0 - p) ** 2


def _check(name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {name}={value!r}")
    return value


def knapsack(
    num_prompts: int,
    *,
    n_mean: int = 4,
    n_min: int = 2,
    n_max: int = 12,
    negative_n: int | None = None,
    positive_n: int | None = None,
    history: int = 16,
    min_history: int = 8,
    window: int = 8,
    confidence: float = 0.9,
    fallback: bool = True,
) -> Knapsack:
    """Builds Knapsack-RL's allocation of rollouts over the prompts of a dataset.

    Args:
      num_prompts: dataset size `D`; prompts are keyed by their index `0..D-1`.
      n_mean: rollouts per prompt on average (the total is `N * n_mean`).
      n_min: rollouts of a prompt inside the knapsack before it gets extra units (released: 2).
      n_max: most rollouts of a knapsack prompt (released: 128; the paper's runs use 4 to 128).
      negative_n: rollouts of a prompt whose recent rollouts all failed (default `n_min`).
      positive_n: rollouts of a prompt whose recent rollouts all succeeded (default `n_min`).
      history: the success rate is over a prompt's most recent `history` rollouts, or its last
        visit when that visit alone has at least as many (released: 16).
      min_history: a prompt with fewer rollouts recorded gets `n_mean` (released: 8).
      window: visits kept per prompt (enough to hold `history` rollouts of the smallest visits).
      confidence: `alpha` of the cost estimate `log(1 - alpha) / log(max(p, 1 - p))`, the
        rollouts after which a group is mixed with probability `alpha` (released: 0.9).
      fallback: give the budget the knapsack prompts would not need to the `p = 0` prompts.

    Returns:
      A `Knapsack` with `init()`, `allocate(state, bins, p_hat=None, key=None, *, prompt_ids)
      -> (num_rollouts [N], KnapsackInfo)` (`bins` and `p_hat`, the classifier's, are not
      used: the allocation reads its own history), `update(state, bins, *, prompt_ids,
      num_correct, num_rollouts, valid=None, **unused)` and `success_rate(state, prompt_ids) ->
      (p [N], rollouts recorded [N])`.

    References:
      Li et al., 2025 (arXiv 2509.25849), the knapsack allocation; `liziniu/KnapsackRL`.
    """
    _check("num_prompts", num_prompts, 1)
    _check("n_mean", n_mean, 1)
    if not _check("n_min", n_min, 1) <= n_mean <= _check("n_max", n_max, 1):
        raise ValueError(
            f"n_min and n_max must bracket n_mean={n_mean}, got n_min={n_min}, n_max={n_max}"
        )
    negative_n = n_min if negative_n is None else negative_n
    positive_n = n_min if positive_n is None else positive_n
    for name, value in (("negative_n", negative_n), ("positive_n", positive_n)):
        _check(name, value, 1)
        if value > n_mean:
            raise ValueError(f"{name} must be <= n_mean={n_mean}, got {name}={value}")
    _check("history", history, 1)
    _check("min_history", min_history, 0)
    _check("window", window, 1)
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got confidence={confidence!r}")
    num_extra = n_max - n_min
    log_miss = math.log(1.0 - confidence)

    def init() -> KnapsackState:
        return KnapsackState(
            correct=jnp.zeros((num_prompts, window), jnp.float32),
            rollouts=jnp.zeros((num_prompts, window), jnp.float32),
            visits=jnp.zeros((num_prompts,), jnp.int32),
            step=jnp.zeros((), jnp.int32),
        )

    def success_rate(state: KnapsackState, prompt_ids: ArrayLike) -> tuple[jax.Array, jax.Array]:
        """Each prompt's success rate over its most recent `history` rollouts (the last visit
        whole when it holds that many), and the rollouts recorded over its whole window."""
        prompt_ids = jnp.asarray(prompt_ids, jnp.int32)
        visits = state.visits[prompt_ids]
        # Newest first: slot (visits - 1 - j) mod W holds the visit j steps back.
        back = jnp.arange(window, dtype=jnp.int32)
        slots = (visits[:, None] - 1 - back[None, :]) % window
        correct = jnp.take_along_axis(state.correct[prompt_ids], slots, axis=1)
        rollouts = jnp.take_along_axis(state.rollouts[prompt_ids], slots, axis=1)
        before = jnp.cumsum(rollouts, axis=1) - rollouts  # rollouts of the newer visits
        room = jnp.clip(history - before, 0.0, None)
        taken = jnp.minimum(rollouts, room)
        taken = taken.at[:, 0].set(rollouts[:, 0])  # the last visit counts whole
        rate = correct / jnp.where(rollouts > 0, rollouts, 1.0)
        total = jnp.sum(taken, axis=1)
        p = jnp.sum(taken * rate, axis=1) / jnp.where(total > 0, total, 1.0)
        return jnp.clip(p, 0.0, 1.0), jnp.sum(rollouts, axis=1)

    def _spread(amount, members, num):
        """`amount` units spread evenly over `members` ([N] bool), the first ones one more."""
        count = jnp.sum(members)
        rank = jnp.cumsum(members) - 1
        share = amount // jnp.maximum(count, 1)
        extra = (rank < amount % jnp.maximum(count, 1)) & members
        return jnp.where(members, share + extra.astype(jnp.int32), 0).astype(jnp.int32)

    def allocate(state, bins=None, p_hat=None, key=None, *, prompt_ids):
        del bins, p_hat, key  # the classifier's bins and estimate: this allocation uses its own
        prompt_ids = jnp.asarray(prompt_ids, jnp.int32)
        num = prompt_ids.shape[0]
        total = num * n_mean
        p, recorded = success_rate(state, prompt_ids)
        known = recorded >= min_history
        effective = known & (p > 0.0) & (p < 1.0)
        zero = known & (p <= 0.0)
        one = known & (p >= 1.0)
        base = jnp.where(
            effective, n_min, jnp.where(zero, negative_n, jnp.where(one, positive_n, n_mean))
        ).astype(jnp.int32)
        left = total - jnp.sum(base)
        safe_p = jnp.where(effective, p, 0.5)
        cost = log_miss / jnp.log(jnp.maximum(safe_p, 1.0 - safe_p))
        estimated = jnp.sum(jnp.where(effective, jnp.floor(jnp.minimum(cost, n_max)), 0.0))
        estimated = estimated.astype(jnp.int32)
        any_effective = jnp.any(effective)
        any_zero = jnp.any(zero)
        # No knapsack prompt: the p = 0 prompts take the rest evenly (else n_mean for all).
        no_knapsack = jnp.where(any_zero, base + _spread(left, zero, num), n_mean)
        # The fallback: what the knapsack prompts would not need goes to the p = 0 prompts,
        # else to every prompt outside the knapsack.
        use_fallback = fallback & (estimated < left)
        spare = jnp.where(use_fallback, left - estimated, 0)
        receivers = jnp.where(any_zero, zero, ~effective)
        budget = left - spare
        # The knapsack: the `budget` largest unit gains over the effective prompts.
        extra = jnp.arange(1, num_extra + 1, dtype=jnp.float32)  # units k = 1..n_max - n_min
        value = knapsack_value(safe_p[None, :], n_min + extra[:, None])  # [K, N] v(n_min + k)
        previous = jnp.concatenate([jnp.zeros((1, num)), value[:-1]], axis=0)
        gain = jnp.where(effective[None, :], value - previous, -jnp.inf).reshape(-1)
        order = jnp.argsort(-gain, stable=True)  # unit-major: ties go to lower units first
        rank = jnp.zeros(gain.shape, jnp.int32).at[order].set(jnp.arange(gain.size))
        taken = (rank < budget) & jnp.isfinite(gain)
        units = jnp.sum(taken.reshape(num_extra, num), axis=0, dtype=jnp.int32)
        placed = jnp.sum(units)
        last_gain = jnp.where(placed > 0, jnp.min(jnp.where(taken, gain, jnp.inf)), 0.0)
        # A budget beyond n_max per prompt is spread evenly over the knapsack's prompts.
        units = units + _spread(budget - placed, effective, num)
        with_knapsack = base + units + _spread(spare, receivers, num)
        counts = jnp.where(any_effective, with_knapsack, no_knapsack).astype(jnp.int32)
        info = KnapsackInfo(
            success_rate=p,
            effective=effective,
            fallback=any_effective & use_fallback,
            mu=jnp.where(any_effective, last_gain, 0.0).astype(jnp.float32),
        )
        return counts, info

    def update(
        state,
        bins=None,
        *,
        prompt_ids,
        num_correct,
        num_rollouts,
        valid: ArrayLike | None = None,
        **unused,
    ) -> KnapsackState:
        """Records each prompt's visit: its correct rollouts out of its rollouts."""
        del bins, unused
        prompt_ids, correct, rollouts, keep = prompt_visits(
            prompt_ids, num_correct, num_rollouts, valid
        )
        # A prompt twice in a batch: its visits are recorded one after the other, in batch order.
        same = prompt_ids[:, None] == prompt_ids[None, :]
        earlier = jnp.tril(jnp.ones(same.shape, bool), k=-1)
        prior = jnp.sum(same & earlier & keep[None, :], axis=1, dtype=jnp.int32)
        slot = (state.visits[prompt_ids] + prior) % window
        target = jnp.where(keep, prompt_ids, num_prompts)  # out of range: dropped
        new_correct = state.correct.at[target, slot].set(correct, mode="drop")
        new_rollouts = state.rollouts.at[target, slot].set(rollouts, mode="drop")
        visits = state.visits.at[target].add(1, mode="drop")
        return state._replace(
            correct=new_correct, rollouts=new_rollouts, visits=visits, step=state.step + 1
        )

    def metrics(info: KnapsackInfo) -> dict[str, jax.Array]:
        return {
            "mu": info.mu,
            "allocation/effective_fraction": jnp.mean(info.effective.astype(jnp.float32)),
            "allocation/fallback": info.fallback.astype(jnp.int32),
        }

    return Knapsack(
        init=init,
        allocate=allocate,
        update=update,
        success_rate=success_rate,
        metrics=metrics,
        n_mean=n_mean,
        num_prompts=num_prompts,
    )
