"""Reducing per-token losses to a scalar: the three aggregations of SPEC 2.

With `m_it` the valid-token mask, `L_i = sum_t m_it` the length of sequence `i`, and `S` the set of
sequences with at least one valid token:

    token_mean               sum_it m_it x_it / sum_it m_it                  (DAPO)
    seq_mean_token_mean      (1/|S|) sum_{i in S} (sum_t m_it x_it / L_i)   (original GRPO)
    seq_mean_token_sum_norm  (1/|S|) sum_{i in S} (sum_t m_it x_it / L_max) (Dr.GRPO)

`token_mean` weighs every token equally, so long responses count more; `seq_mean_token_mean`
weighs every response equally, which biases towards short correct and long wrong answers;
`seq_mean_token_sum_norm` divides by a constant `L_max` (the maximum response length), which
removes that length bias. The mean over sequences skips fully masked slots (padding), as the
references do today: verl's `agg_loss` (`seq-mean-token-mean`, `seq-mean-token-sum`: "exclude
fully masked sequences", counted in its default denominator) and Tunix's `aggregate_loss`
(`sequence-mean-token-mean` and `sequence-mean-token-scale` count the non-empty rows); with no
masked slot every row counts. Two differences remain: verl divides by its `global_batch_size`
instead where one is passed (its new worker path passes the mini-batch's row count), and its
`seq-mean-token-sum-norm` divides the summed loss by the constant alone, with no mean over
sequences (|S| times ours). Checked against verl b178a3c (2026-01-29) and Tunix c7d8950. An
all-masked batch aggregates to 0.

Gradient accumulation: every aggregation is a sum over tokens or sequences divided by a count of
the whole batch (`sum_it m_it`, `|S|`). `aggregation_normalizer` computes those counts once for a
mini-batch; `aggregate(..., normalizer=...)` of one of its micro-batches is then that micro-batch's
share, and the shares of the micro-batches sum to the mini-batch's aggregate (dividing each by its
own count would weigh a micro-batch of short responses like one of long ones).

References:
  Yu et al., 2025 (DAPO), arXiv 2503.14476, section 3.3 (token-level policy-gradient loss).
  Shao et al., 2024 (GRPO), arXiv 2402.03300, eq. 3.
  Liu et al., 2025 (Dr.GRPO), arXiv 2503.20783, section 3.1 (constant normaliser).
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from gdro_jax.losses._validation import check_choice, check_positive, check_token_arrays

AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")


class AggregationNormalizer(NamedTuple):
    """The denominators of the aggregations over a whole (mini-)batch, each floored at 1."""

    tokens: jax.Array  # [] float32 valid tokens: token_mean's denominator
    sequences: jax.Array  # [] float32 sequences with a valid token: the sequence modes'


def aggregation_normalizer(mask_RT: ArrayLike) -> AggregationNormalizer:
    """The denominators of `aggregate` for the rows of `mask_RT`, to share with its micro-batches.

    Args:
      mask_RT: [R, T] bool (or 0/1) valid-token mask of the whole mini-batch.

    Returns:
      An `AggregationNormalizer`: `max(sum_it m_it, 1)` and `max(|S|, 1)`.
    """
    mask_RT = jnp.asarray(mask_RT).astype(bool)
    chex.assert_rank(mask_RT, 2)
    tokens_R = jnp.sum(mask_RT, axis=-1, dtype=jnp.float32)
    return AggregationNormalizer(
        tokens=jnp.maximum(jnp.sum(tokens_R), 1.0),
        sequences=jnp.maximum(jnp.sum(tokens_R > 0, dtype=jnp.float32), 1.0),
    )


def check_aggregation(mode: str, max_length: float | None, *, name: str = "mode") -> float | None:
    """Validates an aggregation mode (the parameter called `name`) and its `max_length`.

    Returns:
      `max_length` as a float for "seq_mean_token_sum_norm", else None.
    """
    check_choice(name, mode, AGGREGATIONS)
    if mode == "seq_mean_token_sum_norm":
        if max_length is None:
            raise ValueError(
                f"max_length is required for {name}='seq_mean_token_sum_norm', got max_length=None"
            )
        return check_positive("max_length", max_length)
    return None


def aggregate(
    per_token_RT: ArrayLike,
    mask_RT: ArrayLike,
    *,
    mode: str,
    max_length: float | None = None,
    normalizer: AggregationNormalizer | None = None,
) -> jax.Array:
    """Aggregates per-token values into a scalar (see the module docstring for the equations).

    Args:
      per_token_RT: float[R, T] per-token values (losses, KL estimates, ...).
      mask_RT: [R, T] bool (or 0/1) valid-token mask; masked tokens contribute nothing, even if
        their values are NaN.
      mode: one of `AGGREGATIONS`: "token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm".
      max_length: the constant normaliser `L_max > 0` of "seq_mean_token_sum_norm" (required
        there, ignored otherwise); usually the maximum response length `T`.
      normalizer: the denominators to divide by, from `aggregation_normalizer` of the whole
        mini-batch when these rows are one of its micro-batches: the result is then this
        micro-batch's share of the mini-batch's aggregate. None: these rows' own.

    Returns:
      float32[] the aggregate (or share).

    Raises:
      ValueError: naming `mode` for an unknown mode, or `max_length` when it is missing or <= 0
        for "seq_mean_token_sum_norm"; on mismatched shapes.

    References:
      DAPO, arXiv 2503.14476, section 3.3; GRPO, arXiv 2402.03300, eq. 3; Dr.GRPO,
      arXiv 2503.20783, section 3.1.
    """
    max_length = check_aggregation(mode, max_length)
    per_token_RT = jnp.asarray(per_token_RT, jnp.float32)
    mask_RT = jnp.asarray(mask_RT).astype(bool)
    check_token_arrays(mask_RT, per_token_RT=per_token_RT)
    if normalizer is None:
        normalizer = aggregation_normalizer(mask_RT)
    values_RT = jnp.where(mask_RT, per_token_RT, 0.0)
    if mode == "token_mean":
        return jnp.sum(values_RT) / normalizer.tokens
    if mode == "seq_mean_token_mean":
        tokens_R = jnp.sum(mask_RT, axis=-1, dtype=jnp.float32)
        per_sequence_R = jnp.sum(values_RT, axis=-1) / jnp.maximum(tokens_R, 1.0)
    else:
        per_sequence_R = jnp.sum(values_RT, axis=-1) / max_length
    return jnp.sum(per_sequence_R) / normalizer.sequences
