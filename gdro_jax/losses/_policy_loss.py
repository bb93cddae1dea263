"""The GRPO policy loss of one optimizer mini-batch: clipped surrogate, optional k3 KL, aggregation.

    loss = -aggregate(J) + kl_coef * aggregate(k3)

with `J` the per-token clipped surrogate (`clipped_surrogate`, to maximise) and `k3` the per-token
KL estimate to a frozen reference policy (`k3_kl`). Minimising the loss maximises the surrogate.
With `kl_coef = 0` the reference log-probabilities are never read (`None` is accepted), so a
trainer need not build or run a reference model at all (SPEC 2).

References:
  Shao et al., 2024 (GRPO), arXiv 2402.03300, eq. 3; Yu et al., 2025 (DAPO), arXiv 2503.14476,
  sections 3.1 and 3.3; Liu et al., 2025 (Dr.GRPO), arXiv 2503.20783, section 3.1.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from gdro_jax.losses._aggregation import (
    AggregationNormalizer,
    aggregate,
    aggregation_normalizer,
    check_aggregation,
)
from gdro_jax.losses._surrogate import clipped_surrogate, k3_kl
from gdro_jax.losses._validation import check_at_least


def check_kl(kl_coef: float, ref_logp_RT: ArrayLike | None) -> float:
    """Validates the KL coefficient and that reference log-probs come with a positive one."""
    kl_coef = check_at_least("kl_coef", kl_coef, 0.0)
    if kl_coef > 0 and ref_logp_RT is None:
        raise ValueError(f"ref_logp_RT is required when kl_coef > 0, got kl_coef={kl_coef!r}")
    return kl_coef


def policy_loss(
    logp_RT: ArrayLike,
    old_logp_RT: ArrayLike,
    adv_R: ArrayLike,
    mask_RT: ArrayLike,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    aggregation: str = "token_mean",
    kl_coef: float = 0.0,
    ref_logp_RT: ArrayLike | None = None,
    max_length: float | None = None,
    normalizer: AggregationNormalizer | None = None,
    token_weight_RT: ArrayLike | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """GRPO/DAPO policy loss with clip-higher, optional k3 KL and a selectable aggregation.

        rho_it = exp(logp_it - old_logp_it)
        J_it   = min(rho_it A_i, clip(rho_it, 1 - eps_low, 1 + eps_high) A_i)
        loss   = -agg(J) + kl_coef * agg(pi_ref/pi - log(pi_ref/pi) - 1)

    Use with `jax.value_and_grad(..., has_aux=True)`: the gradient flows through `logp_RT` only
    (`old_logp_RT`, `ref_logp_RT` and `adv_R` are constants). Pass Prompt-GDRO-weighted advantages
    (`weighted_advantages`) as `adv_R` to train on the adversary's reweighted objective.

    Args:
      logp_RT: float[R, T] log-probabilities of the sampled tokens under the current parameters.
      old_logp_RT: float[R, T] the same under the sampling policy.
      adv_R: float[R] advantage of each rollout.
      mask_RT: [R, T] valid-token mask (bool or 0/1).
      eps_low: `0 <= eps_low < 1`, lower clip range (SPEC 2: 0.2).
      eps_high: `>= 0`, upper clip range (SPEC 2: 0.28).
      aggregation: "token_mean", "seq_mean_token_mean" or "seq_mean_token_sum_norm"; see
        `aggregate`.
      kl_coef: `beta >= 0`, static (paper: 0.001). 0 skips the KL term entirely.
      ref_logp_RT: float[R, T] reference-policy log-probabilities; required iff `kl_coef > 0`.
      max_length: constant normaliser for "seq_mean_token_sum_norm".
      normalizer: for gradient accumulation, `aggregation_normalizer` of the whole mini-batch
        these rows are a micro-batch of: the loss, its gradient and every metric are then this
        micro-batch's shares, which sum over the micro-batches to the mini-batch's values. None:
        these rows are the whole mini-batch.
      token_weight_RT: optional float[R, T] constant weights of the tokens' surrogate terms,
        e.g. the truncated importance weights of an engine's samples (`truncated_is_weights`);
        None: 1. The aggregation's denominators do not change.

    Returns:
      `(loss, metrics)`: float32[] loss to minimise, and a dict of float32[] scalars:
      "loss"; "pg_loss" (`-agg(J)`); "clip_fraction_low", "clip_fraction_high" (token shares with
      an active clip, see `clipped_surrogate`); "ratio_mean" (token mean of rho); and, only when
      `kl_coef > 0`, "kl" (token mean of k3, whatever the aggregation, so that runs with different
      aggregations log comparable KLs).

    Raises:
      ValueError: naming the parameter for a bad `eps_low`, `eps_high`, `kl_coef`, `aggregation`
        or `max_length`, or a missing `ref_logp_RT`.

    References:
      Shao et al., 2024, arXiv 2402.03300, eq. 3-4; Yu et al., 2025, arXiv 2503.14476, sections
      3.1 and 3.3.
    """
    max_length = check_aggregation(aggregation, max_length, name="aggregation")
    kl_coef = check_kl(kl_coef, ref_logp_RT)
    if normalizer is None:
        normalizer = aggregation_normalizer(mask_RT)
    surrogate_RT, stats = clipped_surrogate(
        logp_RT,
        old_logp_RT,
        adv_R,
        mask_RT,
        eps_low=eps_low,
        eps_high=eps_high,
        token_count=normalizer.tokens,
    )
    if token_weight_RT is not None:
        surrogate_RT = surrogate_RT * jax.lax.stop_gradient(jnp.asarray(token_weight_RT))
    pg_loss = -aggregate(
        surrogate_RT, mask_RT, mode=aggregation, max_length=max_length, normalizer=normalizer
    )
    metrics = {
        "pg_loss": pg_loss,
        "clip_fraction_low": stats.clip_fraction_low,
        "clip_fraction_high": stats.clip_fraction_high,
        "ratio_mean": stats.ratio_mean,
    }
    loss = pg_loss
    if kl_coef > 0:
        kl_RT = k3_kl(logp_RT, ref_logp_RT, mask_RT)
        kl = aggregate(
            kl_RT, mask_RT, mode=aggregation, max_length=max_length, normalizer=normalizer
        )
        loss = loss + kl_coef * kl
        metrics["kl"] = jax.lax.stop_gradient(
            aggregate(kl_RT, mask_RT, mode="token_mean", normalizer=normalizer)
        )
    metrics["loss"] = loss
    return loss, metrics
