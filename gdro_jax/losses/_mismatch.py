"""The training-inference mismatch: how far an inference engine's log-probs of its own samples are
from the trainer's, and the truncated importance-sampling (TIS) weights that correct for it.

An engine such as vLLM samples with its own kernels (and often in bfloat16), so the policy it
samples from, pi_engine, is not exactly the trainer's pi_trainer with the same weights: "on-policy"
GRPO is then silently off-policy. With the trainer's log-probs of the sampled tokens recomputed in
one forward pass, each token can be weighted by the truncated ratio

    w_it = min(pi_trainer(y_it) / pi_engine(y_it), C),

which makes the gradient that of samples drawn from pi_trainer, up to the truncation at C that
bounds its variance.

References:
  Yao et al., 2025, "Your efficient RL framework secretly brings you off-policy RL training"
  (truncated importance sampling, C = 2); Ionides, 2008, "Truncated importance sampling".
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from gdro_jax.losses._validation import check_at_least


def truncated_is_weights(
    trainer_logp_RT: ArrayLike, engine_logp_RT: ArrayLike, mask_RT: ArrayLike, *, cap: float
) -> jax.Array:
    """Per-token weights `min(exp(trainer_logp - engine_logp), cap)`; 0 outside the mask.

    Args:
      trainer_logp_RT: float[R, T] log-probs of the sampled tokens under the trainer's policy.
      engine_logp_RT: float[R, T] the same under the engine that sampled them.
      mask_RT: [R, T] valid-token mask (bool or 0/1).
      cap: C >= 1, the truncation.

    Returns:
      float32[R, T] weights, constants for the gradient (`stop_gradient` applied).
    """
    cap = check_at_least("cap", cap, 1.0)
    log_ratio_RT = jnp.asarray(trainer_logp_RT, jnp.float32) - jnp.asarray(
        engine_logp_RT, jnp.float32
    )
    # The log-ratio is capped before exp: a token the engine found far less likely than the
    # trainer does cannot overflow.
    weights_RT = jnp.exp(jnp.minimum(log_ratio_RT, jnp.log(cap)))
    return jax.lax.stop_gradient(jnp.where(jnp.asarray(mask_RT, bool), weights_RT, 0.0))


def logprob_mismatch(
    trainer_logp_RT: ArrayLike, engine_logp_RT: ArrayLike, mask_RT: ArrayLike, *, cap: float
) -> dict[str, jax.Array]:
    """The mismatch over the valid tokens, for the step's metrics.

    Args:
      trainer_logp_RT: float[R, T] log-probs of the sampled tokens under the trainer's policy.
      engine_logp_RT: float[R, T] the same under the engine that sampled them.
      mask_RT: [R, T] valid-token mask (bool or 0/1).
      cap: C, the truncation of the importance weights.

    Returns:
      float32[] scalars: "logprob_mismatch_mean" and "logprob_mismatch_max", the mean and largest
      `|trainer_logp - engine_logp|`, and "is_weight_capped_fraction", the share of tokens whose
      ratio `pi_trainer / pi_engine` exceeds C (0 for a batch without a valid token).
    """
    mask_RT = jnp.asarray(mask_RT, bool)
    gap_RT = jnp.abs(
        jnp.asarray(trainer_logp_RT, jnp.float32) - jnp.asarray(engine_logp_RT, jnp.float32)
    )
    gap_RT = jnp.where(mask_RT, gap_RT, 0.0)
    tokens = jnp.maximum(jnp.sum(mask_RT), 1)
    above = (jnp.asarray(trainer_logp_RT) - jnp.asarray(engine_logp_RT)) > jnp.log(cap)
    return {
        "logprob_mismatch_mean": jnp.sum(gap_RT) / tokens,
        "logprob_mismatch_max": jnp.max(gap_RT),
        "is_weight_capped_fraction": jnp.sum(above & mask_RT) / tokens,
    }
