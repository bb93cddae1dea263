"""Supervised losses: the masked next-token cross-entropy of the warm start (teacher forcing)."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def masked_cross_entropy(
    logits_BTV: jax.Array, targets_BT: jax.Array, weights_BT: jax.Array
) -> jax.Array:
    """Token-mean cross-entropy over the weighted targets: `sum(w * nll) / max(sum(w), 1)`.

    Args:
      logits_BTV: next-token logits.
      targets_BT: int target ids.
      weights_BT: float weights, 1 on the tokens to learn (the solution) and 0 elsewhere.

    Returns:
      The scalar loss (float32). A target with weight 0 has no effect on the loss or its gradient.
    """
    chex.assert_rank([logits_BTV, targets_BT, weights_BT], [3, 2, 2])
    chex.assert_equal_shape([targets_BT, weights_BT])
    chex.assert_equal_shape_prefix([logits_BTV, targets_BT], 2)
    log_probs_BTV = jax.nn.log_softmax(logits_BTV.astype(jnp.float32), axis=-1)
    nll_BT = -jnp.take_along_axis(log_probs_BTV, targets_BT[..., None], axis=-1)[..., 0]
    weights_BT = weights_BT.astype(jnp.float32)
    return jnp.sum(weights_BT * nll_BT) / jnp.maximum(jnp.sum(weights_BT), 1.0)
