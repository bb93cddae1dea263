"""The controllers' own weighted segment mean, so that `gdro_jax.controllers` imports nothing of
gdro_jax beyond itself (jax, chex and numpy only) and can be copied into another codebase.

`gdro_jax.losses.segment_mean` is the same function for the losses; a test holds the two equal.
"""

import jax
import jax.numpy as jnp


def segment_mean(
    values_N: jax.Array, segments_N: jax.Array, weight_N: jax.Array, num_segments: int
) -> tuple[jax.Array, jax.Array]:
    """The weighted mean of `values_N` in each segment (bin), and each segment's total weight.

    Args:
      values_N: float[N] values (entries of weight 0 must be finite; they contribute nothing).
      segments_N: int32[N] segment of each entry, in [0, num_segments).
      weight_N: float[N] non-negative weights (0/1 masks included).
      num_segments: S, a static int.

    Returns:
      `(mean_S, weight_S)`: float32[S] weighted means (0 where a segment's weight is 0) and the
      float32[S] total weight per segment.
    """
    weight_S = jax.ops.segment_sum(weight_N, segments_N, num_segments=num_segments)
    total_S = jax.ops.segment_sum(weight_N * values_N, segments_N, num_segments=num_segments)
    return total_S / jnp.where(weight_S > 0, weight_S, 1.0), weight_S


def prompt_visits(prompt_ids, num_correct, num_rollouts, valid=None):
    """A batch's per-prompt observations as arrays: `(ids int32[N], correct float32[N],
    rollouts float32[N], kept bool[N])`, where a visit is kept when it has rollouts and is
    `valid` (the per-prompt allocators' `update` input)."""
    prompt_ids = jnp.asarray(prompt_ids, jnp.int32)
    correct = jnp.asarray(num_correct, jnp.float32)
    rollouts = jnp.asarray(num_rollouts, jnp.float32)
    kept = rollouts > 0
    if valid is not None:
        kept &= jnp.asarray(valid, bool)
    return prompt_ids, correct, rollouts, kept
