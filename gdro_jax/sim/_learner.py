"""The simulator's learner: a chain of shared skills, and its heavy-tailed prompt sets.

A prompt of level `l` (1..L) is a chain of `l` steps; step `j` uses skill `j`, the same skill in
every prompt, so harder prompts compose the skills of easier ones (SPEC 11, "shared skills"). Each
step succeeds independently with probability `sigmoid(theta_j + c_x)`, where `theta_L` are the
learner's skill logits and `c_x` is a fixed per-prompt offset (some prompts of a level are easier
than others). A rollout is correct when every step is:

    p(x; theta) = prod_{j < l(x)} sigmoid(theta_j + c_x).

Why this model: it is the smallest one with the three properties the study needs. Transfer: any
gradient on a level-l prompt moves theta_0..theta_{l-1}, which every prompt of level > l also uses,
so learning level l strictly raises the success of level l+1. A frontier: with skill logits falling
in j, success decays geometrically in the level, so the easiest level is solved and the hardest
nearly never. Scarce signal at the frontier: skill j is trained only by prompts of level > j, and
with a heavy tail of difficulty (level share proportional to `tail_base^-l`) the late skills see
few prompts under uniform sampling, which is what the GDRO adversaries exist to fix.

Everything here is a pure function of arrays; the per-prompt offsets are the only randomness.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike


class PromptSet(NamedTuple):
    """A fixed set of prompts, sorted by level.

    Attributes:
      level_P: the level of each prompt, 1..L (number of chained skills).
      offset_P: the prompt's logit offset `c_x`, added to every skill logit.
    """

    level_P: jax.Array  # [P] int32, values in 1..L
    offset_P: jax.Array  # [P] float32


def prompt_levels(counts_L: np.ndarray) -> np.ndarray:
    """Returns int32[sum(counts)] levels 1..L, sorted, from per-level counts."""
    counts_L = np.asarray(counts_L)
    return np.repeat(np.arange(1, len(counts_L) + 1, dtype=np.int32), counts_L)


def sample_prompt_set(key: jax.Array, counts_L: np.ndarray, offset_std: float) -> PromptSet:
    """Draws a prompt set with `counts_L[l-1]` prompts of level l and N(0, offset_std^2) offsets.

    The levels are static (numpy) so that array shapes depend only on the counts.

    Args:
      key: PRNG key for the offsets.
      counts_L: int[L] prompts per level.
      offset_std: standard deviation of the per-prompt logit offset (>= 0).

    Returns:
      A `PromptSet` sorted by level.
    """
    level_P = prompt_levels(counts_L)
    offset_P = offset_std * jax.random.normal(key, level_P.shape, jnp.float32)
    return PromptSet(level_P=jnp.asarray(level_P), offset_P=offset_P)


def initial_skill_logits(num_levels: int, first: float, slope: float) -> jax.Array:
    """Returns the warm-start skill logits `theta_j = first - slope * j`, float32[L]."""
    return jnp.asarray(first - slope * np.arange(num_levels), jnp.float32)


def _step_logits(theta_L: jax.Array, offset_P: jax.Array) -> jax.Array:
    return theta_L[None, :] + offset_P[:, None]  # [P, L]


def _skill_mask(level_P: jax.Array, num_levels: int) -> jax.Array:
    return jnp.arange(num_levels)[None, :] < level_P[:, None]  # [P, L]


def success_log_prob(theta_L: ArrayLike, level_P: ArrayLike, offset_P: ArrayLike) -> jax.Array:
    """Returns `log p(x; theta) = sum_{j < l(x)} log sigmoid(theta_j + c_x)`, float32[P].

    Args:
      theta_L: float[L] skill logits.
      level_P: int[P] prompt levels in 1..L.
      offset_P: float[P] prompt offsets.
    """
    theta_L = jnp.asarray(theta_L)
    logits_PL = _step_logits(theta_L, jnp.asarray(offset_P))
    mask_PL = _skill_mask(jnp.asarray(level_P), theta_L.shape[0])
    return jnp.sum(jnp.where(mask_PL, jax.nn.log_sigmoid(logits_PL), 0.0), axis=-1)


def success_prob(theta_L: ArrayLike, level_P: ArrayLike, offset_P: ArrayLike) -> jax.Array:
    """Returns the probability `p(x; theta)` that one rollout of each prompt is correct, [P]."""
    return jnp.exp(success_log_prob(theta_L, level_P, offset_P))


def success_log_prob_grad(
    theta_L: ArrayLike, level_P: ArrayLike, offset_P: ArrayLike
) -> tuple[jax.Array, jax.Array]:
    """Returns `log p` and its gradient in theta, in closed form.

    `d log p / d theta_j = (1 - sigmoid(theta_j + c_x)) * 1[j < l(x)]`.

    Args:
      theta_L: float[L] skill logits.
      level_P: int[P] prompt levels in 1..L.
      offset_P: float[P] prompt offsets.

    Returns:
      `(log_p_P, grad_log_p_PL)`: float32[P] and float32[P, L].
    """
    theta_L = jnp.asarray(theta_L)
    logits_PL = _step_logits(theta_L, jnp.asarray(offset_P))
    mask_PL = _skill_mask(jnp.asarray(level_P), theta_L.shape[0])
    log_p_P = jnp.sum(jnp.where(mask_PL, jax.nn.log_sigmoid(logits_PL), 0.0), axis=-1)
    grad_PL = jnp.where(mask_PL, jax.nn.sigmoid(-logits_PL), 0.0)
    return log_p_P, grad_PL


def exact_pass_at_k(p: ArrayLike, k: int) -> jax.Array:
    """Returns `1 - (1 - p)^k`, the exact chance that at least one of k rollouts is correct."""
    p = jnp.asarray(p)
    return -jnp.expm1(k * jnp.log1p(-jnp.minimum(p, 1.0)))


def per_level_mean(values_P: ArrayLike, level_P: ArrayLike, num_levels: int) -> jax.Array:
    """Returns the mean of `values_P` over the prompts of each level, float32[L] (0 if none)."""
    # A one-hot contraction rather than a segment sum: L is small, and a dot compiles and runs
    # faster than a scatter on CPU.
    onehot_PL = jax.nn.one_hot(jnp.asarray(level_P) - 1, num_levels, dtype=jnp.float32)
    total_L = jnp.asarray(values_P, jnp.float32) @ onehot_PL
    return total_L / jnp.maximum(onehot_PL.sum(axis=0), 1.0)
