"""VIP: rollouts where they cut the policy gradient's variance most, from predicted success rates.

Two pieces (VIP, arXiv 2602.01601, ICLR 2026; `HieuNT91/VIP`):

1. **Prediction.** A Gaussian process in logit space predicts each prompt's success rate `p_i`
   from its neighbours in a feature space. Its posterior mean is carried across steps: after a
   batch, the observed rates `r_j` (logits `g_j = logit(clip(r_j, eps))`) correct every prompt's
   mean through the kernel,

       m <- m + K(., obs) (K(obs, obs) + noise I)^-1 (g - m[obs]),   then m[obs] <- g,

   and the next batch is predicted as `p_i = sigmoid(m_i)`. A prompt with nothing near anything
   observed keeps the prior `prior_logit`. The kernel is an RBF of length `lengthscale` over the
   features the task supplies for each prompt (`prompt_features`, [D, F]); without features
   prompts share nothing (each only learns from its own visits).
2. **Allocation.** With `a_i = p_i (1 - p_i)`, the rollouts minimise

       sum_i  a_i (n_i - 1) / n_i^2  +  gamma log(p_i) n_i      s.t.  sum_i n_i = N n_mean,
                                                                       n_min <= n_i <= n_max,

   in integers: the first term is GRPO's gradient variance of a group of `n_i` Bernoulli
   rollouts, the second a pull towards the prompts unlikely to be solved. The objective is
   separable, so the exact integer optimum comes from a dynamic programme over the prompts and
   the budget (`vip_allocation`): for every prefix of prompts and every budget used, the best
   value and the count that reached it. It is exact also where a term is not convex (`n < 3`,
   which our `n_min = 2` reaches), where rounding a continuous solution by marginal gains is not.

Where we differ from the released code: it solves the continuous relaxation with SLSQP over
`4 <= n_i <= 32`, floors it, sets counts below 4 to 0 and hands the rest out by marginal gains of
a different value function; we solve the stated integer problem exactly over our `n_min`/`n_max`
(no prompt gets 0 rollouts, as in our other allocations). Its features are sentence embeddings
of the prompt; ours are what the task supplies (`gdro_jax.tasks.prompt_features`). Its GP runs in
float64 numpy; ours in float32, jitted.

References:
  VIP, arXiv 2602.01601 (ICLR 2026); `HieuNT91/VIP`, `src/vip/allocation/bernoulli_allocation.py`
  and `src/vip/success_rate_prediction/gaussian_process.py`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike


class VIPState(NamedTuple):
    """The Gaussian process's posterior mean over the pool, carried from step to step."""

    mean: jax.Array  # [D] float32 posterior mean of each prompt's success logit
    seen: jax.Array  # [D] bool the prompt has been observed
    step: jax.Array  # [] int32 updates applied


class VIPInfo(NamedTuple):
    """What `allocate` decided beside the counts (`controllers.Allocation`)."""

    mu: jax.Array  # [] float32 the smallest gain of a rollout given beyond n_min (0: none)
    success_rate: jax.Array  # [N] float32 the predicted success rate p_i of each prompt
    objective: jax.Array  # [] float32 the allocation's objective sum_i f_i(n_i)


class VIP(NamedTuple):
    """VIP as pure functions; build it with `vip`."""

    init: Callable[[], VIPState]
    allocate: Callable[..., tuple[jax.Array, VIPInfo]]
    update: Callable[..., VIPState]
    # (state, prompt_ids) -> [N] float32 predicted success rates
    predict: Callable[[VIPState, ArrayLike], jax.Array]
    # (VIPInfo) -> {"mu", "allocation/objective"}
    metrics: Callable[[VIPInfo], dict[str, jax.Array]]
    n_mean: int
    num_prompts: int
    n_min: int
    n_max: int
    num_bins: None = None  # by prompt: the classifier's bins are not used (`RolloutAllocator`)


def vip_objective(p: ArrayLike, counts: ArrayLike, gamma: ArrayLike) -> jax.Array:
    """`[..., N]` per-prompt terms `a (n - 1) / n^2 + gamma log(p) n`, `a = p (1 - p)`."""
    p = jnp.asarray(p, jnp.float32)
    n = jnp.asarray(counts, jnp.float32)
    return p * (1.0 - p) * (n - 1.0) / n**2 + gamma * jnp.log(p) * n


def vip_allocation(
    p: ArrayLike, total: int, *, n_min: int, n_max: int, gamma: ArrayLike
) -> tuple[jax.Array, jax.Array]:
    """The exact integer minimiser of VIP's objective under the total and the bounds.

    A dynamic programme over prompts: `best[b]`, the least objective of the prompts so far using
    `b` rollouts, is carried through a `lax.scan`; each prompt tries every count in
    `[n_min, n_max]` and keeps the best (the smallest count on a tie); a reverse scan reads the
    counts back. O(N * total * (n_max - n_min + 1)).

    Args:
      p: float[N] success rates in (0, 1).
      total: the rollouts to hand out, in `[N n_min, N n_max]`.
      n_min, n_max: the bounds of every count.
      gamma: the weight of the `log(p) n` term (VIP's 4e-4 for GRPO).

    Returns:
      `(counts int32[N] summing to total, objective float32[])`.
    """
    p = jnp.asarray(p, jnp.float32)
    num = p.shape[0]
    if not num * n_min <= total <= num * n_max:
        raise ValueError(
            f"total={total} must lie in [N n_min, N n_max] = [{num * n_min}, {num * n_max}]"
        )
    return _dynamic_programme(p, jnp.asarray(gamma, jnp.float32), total, n_min, n_max)


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def _dynamic_programme(p, gamma, total: int, n_min: int, n_max: int):
    choices = jnp.arange(n_min, n_max + 1, dtype=jnp.int32)  # [K]
    cost_NK = vip_objective(p[:, None], choices[None, :], gamma)
    budget = jnp.arange(total + 1)
    inf = jnp.asarray(jnp.inf, jnp.float32)
    start = jnp.where(budget == 0, 0.0, inf).astype(jnp.float32)

    def add_prompt(best_B, cost_K):
        # candidate[k, b] = best[b - n_k] + cost[k]: the prompt takes n_k of the b rollouts.
        source = budget[None, :] - choices[:, None]
        before = jnp.where(source >= 0, best_B[jnp.maximum(source, 0)], inf)
        candidate_KB = before + cost_K[:, None]
        pick_B = jnp.argmin(candidate_KB, axis=0).astype(jnp.int32)
        return jnp.min(candidate_KB, axis=0), pick_B

    best_B, pick_NB = jax.lax.scan(add_prompt, start, cost_NK)

    def read_back(remaining, pick_B):
        count = choices[pick_B[remaining]]
        return remaining - count, count

    _, reversed_counts = jax.lax.scan(read_back, jnp.asarray(total), pick_NB[::-1])
    return reversed_counts[::-1], best_B[total]


def vip(
    num_prompts: int,
    *,
    n_mean: int = 4,
    n_min: int = 2,
    n_max: int = 12,
    gamma: float = 4e-4,
    lengthscale: float = 0.4,
    noise: float = 1e-4,
    prior_logit: float = 0.0,
    eps: float = 1e-6,
    prompt_features: ArrayLike | None = None,
) -> VIP:
    """Builds VIP's allocation over a pool of `num_prompts` prompts.

    Args:
      num_prompts: D, the pool's prompts (ids `0..D-1`), whose posterior means the state holds.
      n_mean: mean rollouts per prompt; every batch gets exactly `N * n_mean`.
      n_min: the fewest rollouts a prompt gets (VIP's 4 around its mean of 16; ours is the
        other allocations' bound).
      n_max: the most rollouts a prompt gets (VIP's 32; ours is the other allocations' bound).
      gamma: the weight of the `log(p) n` term (VIP's 4e-4 for GRPO; 0: variance only).
      lengthscale: the RBF kernel's length over the features (VIP's 0.4).
      noise: the observations' variance in logit space, added to the kernel's diagonal (VIP's
        1e-4).
      prior_logit: the prior mean of every prompt's success logit (0: a rate of 1/2).
      eps: observed rates are clipped to `[eps, 1 - eps]` before the logit (VIP's 1e-6), and
        predictions to the same range.
      prompt_features: float[D, F] the task's features of each prompt (a run-level argument:
        the trainer and the simulator pass the task's); None: prompts share nothing.

    Returns:
      A `VIP` with `init`, `allocate(state, bins, p_hat=None, key=None, *, prompt_ids)`
      (`bins`, `p_hat` and `key` unused), `update(state, bins=None, *, num_correct,
      num_rollouts, prompt_ids, valid=None, ...)`, `predict(state, prompt_ids)` and `metrics`.
    """
    for name, value, low in (("num_prompts", num_prompts, 1), ("n_mean", n_mean, 1),
                             ("n_min", n_min, 1)):  # fmt: skip
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {name}={value!r}")
    if not (isinstance(n_max, int) and n_min <= n_mean <= n_max):
        raise ValueError(
            f"n_max must be an int with n_min <= n_mean <= n_max, got n_min={n_min}, "
            f"n_mean={n_mean}, n_max={n_max!r}"
        )
    if not (np.isfinite(gamma) and gamma >= 0):
        raise ValueError(f"gamma must be >= 0, got gamma={gamma!r}")
    if not (np.isfinite(lengthscale) and lengthscale > 0):
        raise ValueError(f"lengthscale must be > 0, got lengthscale={lengthscale!r}")
    if not (np.isfinite(noise) and noise > 0):
        raise ValueError(f"noise must be > 0, got noise={noise!r}")
    if not np.isfinite(prior_logit):
        raise ValueError(f"prior_logit must be finite, got prior_logit={prior_logit!r}")
    if not 0 < eps < 0.5:
        raise ValueError(f"eps must be in (0, 0.5), got eps={eps!r}")
    features = None
    if prompt_features is not None:
        features = np.asarray(prompt_features, np.float32)
        if features.ndim != 2 or features.shape[0] != num_prompts:
            raise ValueError(
                f"prompt_features must be [num_prompts={num_prompts}, F], got shape "
                f"{features.shape}"
            )
        if not np.all(np.isfinite(features)):
            raise ValueError("prompt_features must be finite")
        features = jnp.asarray(features)

    def kernel(ids_a: jax.Array, ids_b: jax.Array) -> jax.Array:
        """RBF between the prompts' features; the identity on ids without features."""
        if features is None:
            return (ids_a[:, None] == ids_b[None, :]).astype(jnp.float32)
        diff = features[ids_a][:, None, :] - features[ids_b][None, :, :]
        return jnp.exp(-0.5 * jnp.sum(diff**2, axis=-1) / lengthscale**2)

    def init() -> VIPState:
        return VIPState(
            mean=jnp.full((num_prompts,), prior_logit, jnp.float32),
            seen=jnp.zeros((num_prompts,), bool),
            step=jnp.zeros((), jnp.int32),
        )

    def predict(state: VIPState, prompt_ids: ArrayLike) -> jax.Array:
        ids = jnp.asarray(prompt_ids, jnp.int32)
        return jnp.clip(jax.nn.sigmoid(state.mean[ids]), eps, 1.0 - eps)

    def allocate(state: VIPState, bins=None, p_hat=None, key=None, *, prompt_ids: ArrayLike):
        del bins, p_hat, key  # by prompt, deterministic
        p = predict(state, prompt_ids)
        total = p.shape[0] * n_mean
        counts, objective = vip_allocation(p, total, n_min=n_min, n_max=n_max, gamma=gamma)
        # The price at the cut: the smallest gain of any rollout given beyond the floor.
        gain = vip_objective(p, jnp.maximum(counts - 1, 1), gamma) - vip_objective(p, counts, gamma)
        above = counts > n_min
        mu = jnp.where(jnp.any(above), jnp.min(jnp.where(above, gain, jnp.inf)), 0.0)
        return counts, VIPInfo(mu=mu.astype(jnp.float32), success_rate=p, objective=objective)

    def update(
        state: VIPState,
        bins=None,
        *,
        num_correct: ArrayLike,
        num_rollouts: ArrayLike,
        prompt_ids: ArrayLike,
        valid: ArrayLike | None = None,
        p_hat=None,
        losses=None,
    ) -> VIPState:
        del bins, p_hat, losses
        ids = jnp.asarray(prompt_ids, jnp.int32)
        n = jnp.asarray(num_rollouts, jnp.float32)
        rate = jnp.asarray(num_correct, jnp.float32) / jnp.maximum(n, 1.0)
        observed = n > 0
        if valid is not None:
            observed &= jnp.asarray(valid, bool)
        rate = jnp.clip(rate, eps, 1.0 - eps)
        target = jnp.log(rate) - jnp.log1p(-rate)
        # Unobserved rows: a unit diagonal and no residual, so they change nothing.
        both = observed[:, None] & observed[None, :]
        k_oo = jnp.where(both, kernel(ids, ids), 0.0)
        k_oo = k_oo + jnp.diag(jnp.where(observed, noise, 1.0))
        residual = jnp.where(observed, target - state.mean[ids], 0.0)
        alpha = jax.scipy.linalg.cho_solve((jnp.linalg.cholesky(k_oo), True), residual)
        pool = jnp.arange(num_prompts, dtype=jnp.int32)
        mean = state.mean + kernel(pool, ids) @ alpha
        # The observed prompts take their observed logit (one of them, for a prompt drawn twice).
        mean = mean.at[jnp.where(observed, ids, num_prompts)].set(target, mode="drop")
        seen = state.seen.at[jnp.where(observed, ids, num_prompts)].set(True, mode="drop")
        return VIPState(mean=mean, seen=seen, step=state.step + 1)

    def metrics(info: VIPInfo) -> dict[str, jax.Array]:
        return {"mu": info.mu, "allocation/objective": info.objective}

    return VIP(
        init=init,
        allocate=allocate,
        update=update,
        predict=predict,
        metrics=metrics,
        n_mean=n_mean,
        num_prompts=num_prompts,
        n_min=n_min,
        n_max=n_max,
    )
