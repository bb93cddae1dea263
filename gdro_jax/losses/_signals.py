"""Per-prompt loss signals that Prompt-GDRO scores bins with (SPEC 4, step 1).

Each kind returns one float per prompt, `losses_N`, where higher means the adversary should want
more of that prompt. For prompt `i` with valid slots `j` and valid tokens `t`:

    surrogate      l_i = -(sum_jt J_ijt) / (sum_jt m_ijt)             (released code)
    surrogate_kl   l_i = (sum_jt (-J_ijt + beta k3_ijt)) / (sum_jt m_ijt)   (paper's objective)
    failure_rate   l_i = 1 - mean_j correct_ij

with `J` the clipped surrogate (`clipped_surrogate`) on *unweighted* advantages and `k3` the
per-token KL estimate. The token mean pools all tokens of all of the prompt's slots (a per-prompt
`token_mean`), by segment sums over slots, so ragged groups need no reshape.

Note (SPEC 4): at `rho = 1` (the first optimizer mini-batch of a step) `J_ijt = A_ij`, and GRPO
advantages sum to zero within a prompt, so "surrogate" is near zero there; only the unequal
response lengths (the token pooling) and the advantage clip keep it from being exactly zero. Log
it and measure whether the adversary's weights move; "failure_rate" has no such blind spot.

A prompt with no valid slot (or no valid token) gets 0; give the adversary `valid = count > 0`.

References:
  Panaganti et al., 2026, "Multi-Adversary Group DRO for RL post-training of LLM reasoning",
  arXiv 2601.19280, Prompt-GDRO (per-prompt loss signal).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from gdro_jax.losses._policy_loss import check_kl
from gdro_jax.losses._segments import segment_mean
from gdro_jax.losses._surrogate import clipped_surrogate, k3_kl
from gdro_jax.losses._validation import check_choice

SIGNALS = ("surrogate", "surrogate_kl", "failure_rate")


def _require(kind: str, **arrays: ArrayLike | None) -> None:
    for name, array in arrays.items():
        if array is None:
            raise ValueError(f"{name} is required for kind={kind!r}, got {name}=None")


def prompt_loss_signal(
    kind: str,
    *,
    prompt_of_slot_R: ArrayLike,
    num_prompts: int,
    logp_RT: ArrayLike | None = None,
    old_logp_RT: ArrayLike | None = None,
    adv_R: ArrayLike | None = None,
    mask_RT: ArrayLike | None = None,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    kl_coef: float = 0.0,
    ref_logp_RT: ArrayLike | None = None,
    correct_R: ArrayLike | None = None,
    valid_R: ArrayLike | None = None,
) -> jax.Array:
    """Per-prompt loss signal for Prompt-GDRO (see the module docstring for the equations).

    Args:
      kind: one of `SIGNALS`: "surrogate", "surrogate_kl" or "failure_rate".
      prompt_of_slot_R: int[R] prompt of each rollout slot, in `0..num_prompts-1`.
      num_prompts: `N`, the static number of prompts.
      logp_RT: float[R, T] current log-probabilities (surrogate kinds).
      old_logp_RT: float[R, T] sampling-policy log-probabilities (surrogate kinds).
      adv_R: float[R] *unweighted* group advantages (surrogate kinds), as in the released code:
        the signal should not feed the adversary's own weights back into its scores.
      mask_RT: [R, T] valid-token mask (surrogate kinds).
      eps_low: lower clip range of the surrogate.
      eps_high: upper clip range of the surrogate.
      kl_coef: `beta >= 0` of "surrogate_kl" (ignored by the other kinds). With 0 the signal
        equals "surrogate" and `ref_logp_RT` is not needed.
      ref_logp_RT: float[R, T] reference log-probabilities ("surrogate_kl" with `kl_coef > 0`).
      correct_R: [R] bool or 0/1 correctness of each rollout ("failure_rate").
      valid_R: optional bool[R]; invalid slots are left out.

    Returns:
      float32[N] per-prompt losses (a signal: no gradient flows through it); 0 for a prompt
      without valid slots or tokens.

    Raises:
      ValueError: naming `kind` when it is unknown, or the missing array the kind needs, or a bad
        hyperparameter.

    References:
      Panaganti et al., 2026, arXiv 2601.19280, Prompt-GDRO; SPEC 4.
    """
    check_choice("kind", kind, SIGNALS)
    prompt_of_slot_R = jnp.asarray(prompt_of_slot_R, jnp.int32)
    valid_R = (
        jnp.ones(prompt_of_slot_R.shape, bool) if valid_R is None else jnp.asarray(valid_R, bool)
    )
    if valid_R.shape != prompt_of_slot_R.shape or prompt_of_slot_R.ndim != 1:
        raise ValueError(
            "prompt_of_slot_R and valid_R must be matching [R] arrays, got "
            f"{prompt_of_slot_R.shape} and {valid_R.shape}"
        )

    if kind == "failure_rate":
        _require(kind, correct_R=correct_R)
        correct_R = jnp.asarray(correct_R, jnp.float32)
        if correct_R.shape != prompt_of_slot_R.shape:
            raise ValueError(
                f"correct_R must have shape {prompt_of_slot_R.shape}, got {correct_R.shape}"
            )
        accuracy_N, count_N = segment_mean(
            correct_R, prompt_of_slot_R, valid_R.astype(jnp.float32), num_prompts
        )
        return jnp.where(count_N > 0, 1.0 - accuracy_N, 0.0)

    _require(kind, logp_RT=logp_RT, old_logp_RT=old_logp_RT, adv_R=adv_R, mask_RT=mask_RT)
    kl_coef = check_kl(kl_coef, ref_logp_RT) if kind == "surrogate_kl" else 0.0
    mask_RT = jnp.asarray(mask_RT).astype(bool)
    if mask_RT.ndim != 2 or mask_RT.shape[0] != prompt_of_slot_R.shape[0]:
        raise ValueError(
            f"mask_RT must have shape ({prompt_of_slot_R.shape[0]}, T), got {mask_RT.shape}"
        )
    mask_RT = mask_RT & valid_R[:, None]
    surrogate_RT, _ = clipped_surrogate(
        logp_RT, old_logp_RT, adv_R, mask_RT, eps_low=eps_low, eps_high=eps_high
    )
    loss_RT = -surrogate_RT
    if kl_coef > 0:
        loss_RT = loss_RT + kl_coef * k3_kl(logp_RT, ref_logp_RT, mask_RT)
    # Per-prompt token mean: token sums and token counts per slot, then segment sums over slots.
    token_sum_N = jax.ops.segment_sum(
        jnp.sum(loss_RT, axis=-1), prompt_of_slot_R, num_segments=num_prompts
    )
    tokens_N = jax.ops.segment_sum(
        jnp.sum(mask_RT, axis=-1, dtype=jnp.float32), prompt_of_slot_R, num_segments=num_prompts
    )
    return jax.lax.stop_gradient(token_sum_N / jnp.maximum(tokens_N, 1.0))
