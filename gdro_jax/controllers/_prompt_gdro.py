"""Prompt-GDRO: an exponential-weights adversary over difficulty bins.

The adversary keeps one score per bin, built from the bin's per-step mean loss signal, and plays
the distribution

    q(b) = (1 - gamma) * softmax(eta * clip(S, -C, C))(b) + gamma / |P|     for b in P,

over the bins `P` present in the current batch (zero elsewhere). With `ema=None` the score is the
running sum of bin losses and the adversary is the classic Hedge learner; with an EMA it tracks a
moving target. Exponential weights on bin losses is gradient descent on the soft worst-group
objective `(1/eta) log sum_b exp(eta L_b)`.

References:
  Panaganti et al., "Multi-Adversary Group DRO for RL post-training of LLM reasoning", 2026
  (arXiv 2601.19280), Prompt-GDRO. Freund & Schapire, "A decision-theoretic generalization of
  on-line learning", 1997 (Hedge and its regret bound).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from gdro_jax.controllers._segments import segment_mean

# Per-prompt losses are clipped to this magnitude before averaging, so that segment sums over a
# batch cannot overflow float32 (a batch of 1e5 prompts at 1e30 sums to 1e35 < 3.4e38).
LOSS_BOUND = 1e30
# Scores are kept inside this range so that running sums over any number of steps stay finite.
_SCORE_BOUND = float(jnp.finfo(jnp.float32).max) / 4


class PromptGDROState(NamedTuple):
    """State of the Prompt-GDRO adversary."""

    scores: jax.Array  # [B] float32 per-bin score S(b): EMA (or running sum) of the bin's loss
    seen: jax.Array  # [B] bool whether the bin has been observed at least once
    step: jax.Array  # [] int32 number of updates applied


class PromptGDRO(NamedTuple):
    """Pure functions of the Prompt-GDRO adversary (see `prompt_gdro`)."""

    init: Callable[[], PromptGDROState]
    distribution: Callable[[PromptGDROState, ArrayLike], jax.Array]  # (state, present_B) -> q_B
    # (state, bins, *, num_rollouts=None, valid=None) -> [N] float32 advantage multipliers
    weights: Callable[..., jax.Array]
    # (state, bins, *, losses, importance=None, valid=None) -> PromptGDROState
    update: Callable[..., PromptGDROState]
    bin_losses: Callable[..., tuple[jax.Array, jax.Array]]
    # (state, present_B) -> {"bin/q": q_B, "bin/score": S_B}: what the step logs of it
    metrics: Callable[[PromptGDROState, ArrayLike], dict[str, jax.Array]]
    num_bins: int
    realisation: str = "reweight"  # how q reaches the update: "reweight" or "resample" (SPEC 4)


REALISATIONS = ("reweight", "resample")


def prompt_gdro(
    num_bins: int = 10,
    eta: float = 0.65,
    gamma: float = 0.01,
    ema: float | None = 0.12,
    share_normalize: bool = True,
    share_floor: float = 0.02,
    clip: float | None = 10.0,
    max_weight: float = 15.0,
    realisation: str = "reweight",
) -> PromptGDRO:
    """Builds the Prompt-GDRO adversary over `num_bins` difficulty bins.

    Args:
      num_bins: number of bins `B` (bin 0 is the hardest).
      eta: exponential-weights learning rate `eta >= 0` (paper: 0.65). `eta = 0` is uniform.
      gamma: uniform mixing `gamma` in [0, 1] over the present bins (paper: 0.01).
      ema: EMA rate `beta` in (0, 1] for the bin scores (paper: 0.12); the first observation of a
        bin initialises its score. `None` keeps running sums `S <- S + lbar` (Hedge).
      share_normalize: divide each bin's mean loss by `max(share(b), share_floor)`, where
        `share(b)` is the bin's fraction of the batch (on in the paper's runs). This boosts rare
        bins; the per-step *mean* alone already removes the frequency bias of a running sum.
      share_floor: floor on the share in (0, 1]; bounds the boost of a rare bin by `1/share_floor`.
      clip: scores are clipped to `[-clip, clip]` inside the softmax (`None`: no clipping, as in
        the textbook Hedge learner). Must be > 0.
      max_weight: cap `omega_max > 0` on the per-prompt advantage multipliers (paper: 15).
      realisation: how `q` acts (SPEC 4), read by `multi_adversary`: `"reweight"` (paper)
        multiplies advantages by `weights`; `"resample"` draws the batch's prompts (bins from
        `q`, prompts uniformly within a bin) and passes `importance=q` to `update`.

    Returns:
      A `PromptGDRO` of pure functions:
        `init() -> PromptGDROState`;
        `distribution(state, present) -> q` float32[B], zero outside `present` (bool[B]);
        `weights(state, bins, *, num_rollouts=None, valid=None) -> w` float32[N];
        `update(state, bins, losses, *, importance=None, valid=None) -> state`;
        `bin_losses(bins, losses, *, valid=None) -> (mean_loss[B], count[B])`.

    Raises:
      ValueError: naming the parameter and value when a hyperparameter is out of range.
    """
    if not isinstance(num_bins, int) or num_bins < 1:
        raise ValueError(f"num_bins must be a positive int, got num_bins={num_bins!r}")
    if not math.isfinite(eta) or eta < 0:
        raise ValueError(f"eta must be finite and >= 0, got eta={eta!r}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got gamma={gamma!r}")
    if ema is not None and not 0.0 < ema <= 1.0:
        raise ValueError(f"ema must be in (0, 1] or None, got ema={ema!r}")
    if not 0.0 < share_floor <= 1.0:
        raise ValueError(f"share_floor must be in (0, 1], got share_floor={share_floor!r}")
    if clip is not None and not clip > 0:
        raise ValueError(f"clip must be > 0 or None, got clip={clip!r}")
    if not max_weight > 0:
        raise ValueError(f"max_weight must be > 0, got max_weight={max_weight!r}")
    if realisation not in REALISATIONS:
        raise ValueError(
            f"realisation must be one of {REALISATIONS}, got realisation={realisation!r}"
        )
    score_bound = _SCORE_BOUND if clip is None else clip

    def init() -> PromptGDROState:
        return PromptGDROState(
            scores=jnp.zeros((num_bins,), jnp.float32),
            seen=jnp.zeros((num_bins,), bool),
            step=jnp.zeros((), jnp.int32),
        )

    def distribution(state: PromptGDROState, present: ArrayLike) -> jax.Array:
        """Adversary distribution over the present bins, computed in log space."""
        present = jnp.asarray(present, bool)
        if present.shape != (num_bins,):
            raise ValueError(f"present must have shape ({num_bins},), got {present.shape}")
        # No bin present (an empty batch): play over all bins rather than divide by zero.
        present = jnp.where(present.any(), present, True)
        logits = eta * jnp.clip(state.scores, -score_bound, score_bound)
        # Keep eta * S inside float32 even without a clip, so the softmax never sees inf - inf.
        logits = jnp.clip(logits, -_SCORE_BOUND, _SCORE_BOUND)
        log_p = jax.nn.log_softmax(jnp.where(present, logits, -jnp.inf))
        p = jnp.where(present, jnp.exp(log_p), 0.0)
        num_present = present.sum().astype(jnp.float32)
        return (1.0 - gamma) * p + gamma * present / num_present

    def bin_losses(
        bins: ArrayLike, losses: ArrayLike, *, valid: ArrayLike | None = None
    ) -> tuple[jax.Array, jax.Array]:
        """Per-bin mean of the finite, valid per-prompt losses, and the per-bin counts."""
        bins = jnp.asarray(bins, jnp.int32)
        losses = jnp.asarray(losses, jnp.float32)
        if bins.ndim != 1 or losses.shape != bins.shape:
            raise ValueError(
                f"bins and losses must be matching [N] arrays, got {bins.shape} and {losses.shape}"
            )
        keep = jnp.isfinite(losses)
        if valid is not None:
            keep &= jnp.asarray(valid, bool)
        # Documented rule: a NaN or infinite loss is ignored (its prompt leaves the bin's mean).
        losses = jnp.where(keep, jnp.clip(losses, -LOSS_BOUND, LOSS_BOUND), 0.0)
        return segment_mean(losses, bins, keep.astype(jnp.float32), num_bins)

    def present_bins(bins: jax.Array, valid: ArrayLike | None) -> jax.Array:
        keep = jnp.ones(bins.shape, bool) if valid is None else jnp.asarray(valid, bool)
        return jax.ops.segment_max(keep.astype(jnp.int32), bins, num_segments=num_bins) > 0

    def weights(
        state: PromptGDROState,
        bins: ArrayLike,
        *,
        num_rollouts: ArrayLike | None = None,
        valid: ArrayLike | None = None,
    ) -> jax.Array:
        """Per-prompt advantage multipliers `w_i = q(b_i)`, mean 1 over responses, capped.

        Args:
          state: the adversary state.
          bins: int[N] bin of each prompt in the batch.
          num_rollouts: optional int[N] responses per prompt; the mean-1 rescaling is over
            responses, so a prompt with more rollouts counts more. Default: one each.
          valid: optional bool[N]; invalid prompts (padding) get weight 0 and do not count.

        Returns:
          float32[N] multipliers, capped at `max_weight` after the rescaling (so the mean can
          fall below 1 when the cap binds, as in the paper).
        """
        bins = jnp.asarray(bins, jnp.int32)
        keep = jnp.ones(bins.shape, bool) if valid is None else jnp.asarray(valid, bool)
        q = distribution(state, present_bins(bins, keep))
        w = jnp.where(keep, q[bins], 0.0)
        n = jnp.ones(bins.shape, jnp.float32) if num_rollouts is None else num_rollouts
        n = jnp.where(keep, jnp.asarray(n, jnp.float32), 0.0)
        mean_w = jnp.sum(n * w) / jnp.maximum(jnp.sum(n), 1.0)
        return jnp.minimum(w / jnp.maximum(mean_w, jnp.finfo(jnp.float32).tiny), max_weight)

    def update(
        state: PromptGDROState,
        bins: ArrayLike,
        *,
        losses: ArrayLike,
        importance: ArrayLike | None = None,
        valid: ArrayLike | None = None,
    ) -> PromptGDROState:
        """Folds one batch's per-prompt loss signals into the bin scores.

        Args:
          state: the adversary state.
          bins: int[N] bin of each prompt.
          losses: float[N] per-prompt loss signal (higher means the adversary wants more of it).
            NaN or infinite entries are ignored; finite ones are clipped to +-1e30.
          importance: optional float[B], the probability with which each bin was drawn when the
            data pipeline samples bins from `q` (`resample` realisation). The bin loss is then
            divided by it (EXP3-style importance weighting).
          valid: optional bool[N]; invalid prompts are ignored.

        Returns:
          The new state; bins absent from the batch keep their score.
        """
        bins = jnp.asarray(bins, jnp.int32)
        mean_loss, count = bin_losses(bins, losses, valid=valid)
        present = count > 0
        signal = mean_loss
        if share_normalize:
            share = count / jnp.maximum(count.sum(), 1.0)
            signal = signal / jnp.maximum(share, share_floor)
        if importance is not None:
            importance = jnp.asarray(importance, jnp.float32)
            if importance.shape != (num_bins,):
                raise ValueError(
                    f"importance must have shape ({num_bins},), got {importance.shape}"
                )
            signal = signal / jnp.maximum(importance, 1e-6)
        if ema is None:
            scores = state.scores + jnp.where(present, signal, 0.0)
        else:
            smoothed = jnp.where(state.seen, (1.0 - ema) * state.scores + ema * signal, signal)
            scores = jnp.where(present, smoothed, state.scores)
        return PromptGDROState(
            scores=jnp.clip(scores, -_SCORE_BOUND, _SCORE_BOUND),
            seen=state.seen | present,
            step=state.step + 1,
        )

    def metrics(state: PromptGDROState, present: ArrayLike) -> dict[str, jax.Array]:
        return {"bin/q": distribution(state, present), "bin/score": state.scores}

    return PromptGDRO(
        init=init,
        distribution=distribution,
        weights=weights,
        update=update,
        bin_losses=bin_losses,
        metrics=metrics,
        num_bins=num_bins,
        realisation=realisation,
    )
