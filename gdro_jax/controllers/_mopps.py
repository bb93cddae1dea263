"""MoPPS: a Beta posterior over each prompt's success rate, and Thompson sampling of the batch.

Every prompt `d` of the dataset keeps a Beta(`alpha_d`, `beta_d`) posterior over its success
rate, starting at the prior (`prior_alpha`, `prior_beta`). After a prompt's group of `n`
rollouts with `c` correct, its posterior is decayed toward the prior and updated:

    alpha_d <- decay * alpha_d + (1 - decay) * prior_alpha + c
    beta_d  <- decay * beta_d  + (1 - decay) * prior_beta  + (n - c)

(`decay = 1` is the plain conjugate update; smaller values forget faster, tracking a policy that
changes.) To make a batch of N prompts, `C = candidates * N` candidates are drawn uniformly
without replacement from the pool (all of it when the pool is smaller), a success rate
`theta_d ~ Beta(alpha_d, beta_d)` is sampled for each, and the N whose `theta_d` lie nearest
`target` are the batch (Thompson sampling, top-N). Prompts whose rate is likely near the target
are drawn most, at no extra rollouts: every prompt still gets `n_mean` rollouts.

Where we differ from the released code (`thu-rllab/MoPPS`, `recipe/ours/mopps.py`): its
candidates are the next `ts_ratio * N` prompts of a shuffled data loader (every prompt a
candidate once an epoch), ours are a fresh uniform draw from the pool each step (fixed shapes,
no loader state); its update writes each prompt's new posterior once per batch, ours applies a
batch's visits one after the other (in closed form), so a prompt twice in a batch is decayed
and updated twice.
The update of a prompt uses its success rate times its rollouts, which is `c` (the released
code's `s * n`).

References:
  Qu et al., "Can Prompt Difficulty be Online Predicted for Accelerating RL Finetuning of
  Reasoning Models?", 2025 (arXiv 2507.04632); released code `thu-rllab/MoPPS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from gdro_jax.controllers._segments import prompt_visits


class MoPPSState(NamedTuple):
    """The posterior of every prompt of the dataset (fixed shapes: a `lax.scan` carry)."""

    alpha: jax.Array  # [D] float32 Beta alpha of each prompt's success rate
    beta: jax.Array  # [D] float32 Beta beta
    visits: jax.Array  # [D] int32 groups recorded for each prompt
    step: jax.Array  # [] int32 updates applied


class MoPPSDraw(NamedTuple):
    """What `draw` decided, for logging and tests."""

    prompt_ids: jax.Array  # [N] int32 the batch: the candidates whose sample is nearest target
    sampled_rate: jax.Array  # [N] float32 their Thompson samples theta
    candidates: jax.Array  # [C] int32 the candidates the batch was chosen from


class MoPPS(NamedTuple):
    """MoPPS as pure functions; build it with `mopps`."""

    init: Callable[[], MoPPSState]
    draw: Callable[..., MoPPSDraw]
    update: Callable[..., MoPPSState]
    posterior_mean: Callable[[MoPPSState, ArrayLike], jax.Array]
    # (MoPPSDraw) -> {"sampler/sampled_rate"}: the batch's mean Thompson sample, for the step
    metrics: Callable[[MoPPSDraw], dict[str, jax.Array]]
    num_prompts: int
    candidates: int


def mopps(
    num_prompts: int,
    *,
    candidates: int = 8,
    target: float = 0.5,
    decay: float = 0.5,
    prior_alpha: float = 1.0,
    prior_beta: float = 1.0,
) -> MoPPS:
    """Builds MoPPS's posterior prompt sampler over a dataset of `num_prompts` prompts.

    Args:
      num_prompts: dataset size `D`; prompts are keyed by their index `0..D-1`.
      candidates: candidates per batch prompt, the released code's `ts_ratio` (its scripts: 8);
        a draw considers `min(candidates * N, D)` prompts.
      target: the success rate the batch's sampled rates should lie nearest (released: 0.5).
      decay: how much of a posterior survives each update; the rest returns to the prior
        (released scripts: 0.5; 1 keeps all of it).
      prior_alpha: the Beta prior's alpha (released: 1; with `prior_beta` 1, uniform).
      prior_beta: the Beta prior's beta (released: 1).

    Returns:
      A `MoPPS` with `init()`, `draw(state, num_prompts_in_batch, key) -> MoPPSDraw`,
      `update(state, *, prompt_ids, num_correct, num_rollouts, valid=None, **unused)` and
      `posterior_mean(state, prompt_ids) -> [N] alpha / (alpha + beta)`.

    References:
      Qu et al., 2025 (arXiv 2507.04632); `thu-rllab/MoPPS`, `recipe/ours/mopps.py`.
    """
    if isinstance(num_prompts, bool) or not isinstance(num_prompts, int) or num_prompts < 1:
        raise ValueError(f"num_prompts must be an int >= 1, got num_prompts={num_prompts!r}")
    if isinstance(candidates, bool) or not isinstance(candidates, int) or candidates < 1:
        raise ValueError(f"candidates must be an int >= 1, got candidates={candidates!r}")
    if not 0.0 <= target <= 1.0:
        raise ValueError(f"target must be in [0, 1], got target={target!r}")
    if not 0.0 <= decay <= 1.0:
        raise ValueError(f"decay must be in [0, 1], got decay={decay!r}")
    for name, value in (("prior_alpha", prior_alpha), ("prior_beta", prior_beta)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {name}={value!r}")

    def init() -> MoPPSState:
        return MoPPSState(
            alpha=jnp.full((num_prompts,), prior_alpha, jnp.float32),
            beta=jnp.full((num_prompts,), prior_beta, jnp.float32),
            visits=jnp.zeros((num_prompts,), jnp.int32),
            step=jnp.zeros((), jnp.int32),
        )

    def posterior_mean(state: MoPPSState, prompt_ids: ArrayLike) -> jax.Array:
        prompt_ids = jnp.asarray(prompt_ids, jnp.int32)
        alpha, beta = state.alpha[prompt_ids], state.beta[prompt_ids]
        return alpha / (alpha + beta)

    def draw(state: MoPPSState, batch_size: int, key: jax.Array) -> MoPPSDraw:
        """N prompts: of `min(candidates * N, D)` uniform candidates, the N whose Thompson
        samples lie nearest `target` (ties to the earlier candidate)."""
        if batch_size > num_prompts:
            raise ValueError(f"a batch of {batch_size} prompts needs a pool of at least as many")
        num_candidates = min(candidates * batch_size, num_prompts)
        pick_key, sample_key = jax.random.split(key)
        pool = jax.random.permutation(pick_key, num_prompts)[:num_candidates].astype(jnp.int32)
        theta = jax.random.beta(sample_key, state.alpha[pool], state.beta[pool])
        distance = jnp.abs(theta - target)
        order = jnp.argsort(distance, stable=True)[:batch_size]
        return MoPPSDraw(prompt_ids=pool[order], sampled_rate=theta[order], candidates=pool)

    def update(
        state: MoPPSState,
        bins=None,
        *,
        prompt_ids: ArrayLike,
        num_correct: ArrayLike,
        num_rollouts: ArrayLike,
        valid: ArrayLike | None = None,
        **unused,
    ) -> MoPPSState:
        """Decays each visited prompt's posterior toward the prior and adds its group's
        correct and failed rollouts, one visit after the other in batch order."""
        del bins, unused
        prompt_ids, correct, rollouts, keep = prompt_visits(
            prompt_ids, num_correct, num_rollouts, valid
        )
        # k visits of a prompt in order: each visit's addition decays by the visits after it,
        # and the old posterior by all k (decay ** 0 = 1, also for decay = 0).
        same = (prompt_ids[:, None] == prompt_ids[None, :]) & keep[None, :] & keep[:, None]
        later = jnp.sum(jnp.triu(same, k=1), axis=1).astype(jnp.float32)  # [N] later visits
        visits_D = (
            jnp.zeros((num_prompts,), jnp.float32).at[prompt_ids].add(keep.astype(jnp.float32))
        )
        survive_N = jnp.where(keep, decay**later, 0.0)
        prior_share = 1.0 - decay
        add_alpha = (
            jnp.zeros((num_prompts,), jnp.float32)
            .at[prompt_ids]
            .add(survive_N * (prior_share * prior_alpha + correct))
        )
        add_beta = (
            jnp.zeros((num_prompts,), jnp.float32)
            .at[prompt_ids]
            .add(survive_N * (prior_share * prior_beta + rollouts - correct))
        )
        alpha = decay**visits_D * state.alpha + add_alpha
        beta = decay**visits_D * state.beta + add_beta
        visits = state.visits + visits_D.astype(jnp.int32)
        return MoPPSState(alpha=alpha, beta=beta, visits=visits, step=state.step + 1)

    def metrics(drawn: MoPPSDraw) -> dict[str, jax.Array]:
        return {"sampler/sampled_rate": jnp.mean(drawn.sampled_rate)}

    return MoPPS(
        init=init,
        draw=draw,
        update=update,
        posterior_mean=posterior_mean,
        metrics=metrics,
        num_prompts=num_prompts,
        candidates=candidates,
    )
