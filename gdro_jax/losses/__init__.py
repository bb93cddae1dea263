"""Losses as pure functions of arrays: GRPO advantages, clipped surrogate, KL, aggregation.

Everything here is a pure, jittable function of `jnp` arrays with static hyperparameters, built
for static-shape rollouts (SPEC 6): a step has `R` rollout slots, `prompt_of_slot_R` maps each to
one of `N` prompts (groups may be ragged), token arrays are `[R, T]` with a valid-token mask, and
group statistics are segment reductions.

- `group_advantages`, `group_statistics`, `informative_fraction`: GRPO / Dr.GRPO advantages over
  ragged groups and the per-group statistics behind them.
- `weighted_advantages`: Prompt-GDRO's per-prompt advantage multipliers applied to the slots.
- `clipped_surrogate`, `k3_kl`: per-token clipped surrogate (clip-higher) and k3 KL estimate.
- `aggregate`: the three loss aggregations (`AGGREGATIONS`); `aggregation_normalizer`: their
  denominators over a whole mini-batch, shared by its micro-batches (gradient accumulation).
- `policy_loss`: the mini-batch loss with its metrics.
- `truncated_is_weights`, `logprob_mismatch`: an inference engine's log-probs against the
  trainer's: the truncated importance weights that correct for the gap, and its metrics.
- `masked_cross_entropy`: the warm start's token-mean cross-entropy on the weighted targets.
- `segment_mean`: the weighted mean per segment (group or bin), shared with the controllers.
- `prompt_loss_signal`: Prompt-GDRO's per-prompt loss signals (`SIGNALS`).
"""

from gdro_jax.losses._advantages import (
    ADVANTAGE_ESTIMATORS,
    GroupStats,
    group_advantages,
    group_statistics,
    informative_fraction,
    weighted_advantages,
)
from gdro_jax.losses._aggregation import (
    AGGREGATIONS,
    AggregationNormalizer,
    aggregate,
    aggregation_normalizer,
)
from gdro_jax.losses._mismatch import logprob_mismatch, truncated_is_weights
from gdro_jax.losses._policy_loss import policy_loss
from gdro_jax.losses._segments import segment_mean
from gdro_jax.losses._signals import SIGNALS, prompt_loss_signal
from gdro_jax.losses._supervised import masked_cross_entropy
from gdro_jax.losses._surrogate import SurrogateStats, clipped_surrogate, k3_kl

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATIONS",
    "SIGNALS",
    "AggregationNormalizer",
    "GroupStats",
    "SurrogateStats",
    "aggregate",
    "aggregation_normalizer",
    "clipped_surrogate",
    "group_advantages",
    "group_statistics",
    "informative_fraction",
    "k3_kl",
    "logprob_mismatch",
    "masked_cross_entropy",
    "policy_loss",
    "segment_mean",
    "truncated_is_weights",
    "prompt_loss_signal",
    "weighted_advantages",
]
