"""Per-token log-probabilities of given sequences from one forward pass: the trainer's log π_θ
(and log π_old, log π_ref), computed exactly as the sampler reports them."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from gdro_jax.models import Decoder


def sequence_logprobs(
    model: Decoder,
    tokens_BT: jax.Array,
    *,
    attention_mask_BT: jax.Array | None = None,
    positions_BT: jax.Array | None = None,
    segment_ids_BT: jax.Array | None = None,
    temperature: jax.typing.ArrayLike = 1.0,
    chunk_size: int | None = None,
) -> jax.Array:
    """log p(tokens[t] | tokens[<t]) under log_softmax(logits / temperature), at every position.

    Jittable and differentiable.

    Args:
      model: the Decoder.
      tokens_BT: token ids (left- or right-padded).
      attention_mask_BT: True for real tokens (None: all real).
      positions_BT: RoPE positions (default: 0 at each row's first real token, then counting).
      segment_ids_BT: for packed rows (`pack_completions`), the sequence of each token: a token
        attends to, and is predicted from, earlier tokens of its own segment only. None: one
        sequence a row.
      temperature: the sampler's temperature (1 for a greedy sampler).
      chunk_size: run the output projection and softmax over this many positions at a time,
        rematerialised in the backward pass, so the [B, T, V] logits never exist at once (they
        dominate memory for a 152k vocabulary). When it does not divide T, the last chunk is
        padded; a chunk larger than T is T (one chunk, no padding). None: all positions at once.

    Returns:
      logprobs_BT float32; 0 where the token is padding or has no real token before it (a row's,
      or a segment's, first real token).
    """
    B, T = tokens_BT.shape
    if attention_mask_BT is None:
        mask_BT = jnp.ones((B, T), bool)
    else:
        mask_BT = attention_mask_BT.astype(bool)
    if positions_BT is None:
        positions_BT = jnp.maximum(jnp.cumsum(mask_BT, axis=1) - 1, 0)
    h_BTD = model.hidden_states(tokens_BT, positions_BT, mask_BT, segment_ids_BT=segment_ids_BT)
    # Position t predicts token t+1; the last position predicts nothing (its target is a dummy).
    next_BT = jnp.concatenate([tokens_BT[:, 1:], jnp.zeros((B, 1), tokens_BT.dtype)], axis=1)

    def chunk(h_BCD, next_BC):
        logp_BCV = jax.nn.log_softmax(model.logits(h_BCD) / temperature, axis=-1)
        return jnp.take_along_axis(logp_BCV, next_BC[..., None], axis=-1)[..., 0]

    if chunk_size is None:
        predicted_BT = chunk(h_BTD, next_BT)
    else:
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be None or a positive int, got {chunk_size!r}")
        chunk_size = min(chunk_size, T)
        n = -(-T // chunk_size)
        pad = n * chunk_size - T
        h_nBCD = jnp.pad(h_BTD, ((0, 0), (0, pad), (0, 0)))
        h_nBCD = h_nBCD.reshape(B, n, chunk_size, -1).swapaxes(0, 1)
        next_nBC = jnp.pad(next_BT, ((0, 0), (0, pad))).reshape(B, n, chunk_size).swapaxes(0, 1)
        predicted_nBC = jax.lax.map(lambda xs: jax.checkpoint(chunk)(*xs), (h_nBCD, next_nBC))
        predicted_BT = predicted_nBC.swapaxes(0, 1).reshape(B, n * chunk_size)[:, :T]
    logprobs_BT = jnp.concatenate([jnp.zeros((B, 1), jnp.float32), predicted_BT[:, :-1]], axis=1)
    has_context_BT = jnp.concatenate([jnp.zeros((B, 1), bool), mask_BT[:, :-1]], axis=1)
    if segment_ids_BT is not None:
        same_segment_BT = segment_ids_BT[:, 1:] == segment_ids_BT[:, :-1]
        has_context_BT &= jnp.concatenate([jnp.zeros((B, 1), bool), same_segment_BT], axis=1)
    return jnp.where(mask_BT & has_context_BT, logprobs_BT, 0.0)


def completion_logprobs(
    model: Decoder,
    prompt_tokens_RP: jax.Array,
    prompt_lengths_R: jax.Array,
    completion_tokens_RM: jax.Array,
    completion_lengths_R: jax.Array,
    *,
    temperature: jax.typing.ArrayLike = 1.0,
    chunk_size: int | None = None,
) -> jax.Array:
    """Log-probs of completions given their prompts, aligned with `GenerationResult.logprobs`.

    Args:
      model: the Decoder.
      prompt_tokens_RP: left-padded prompts (`GenerationResult.prompt_tokens`).
      prompt_lengths_R: prompt lengths.
      completion_tokens_RM: completions (`GenerationResult.tokens`).
      completion_lengths_R: completion lengths (`GenerationResult.lengths`).
      temperature: the sampler's temperature (1 for a greedy sampler).
      chunk_size: see `sequence_logprobs` (positions of the P + M per chunk).

    Returns:
      logprobs_RM float32, 0 after each completion's end.
    """
    P = prompt_tokens_RP.shape[1]
    M = completion_tokens_RM.shape[1]
    prompt_mask_RP = jnp.arange(P)[None, :] >= (P - prompt_lengths_R)[:, None]
    completion_mask_RM = jnp.arange(M)[None, :] < completion_lengths_R[:, None]
    tokens_RT = jnp.concatenate([prompt_tokens_RP, completion_tokens_RM], axis=1)
    mask_RT = jnp.concatenate([prompt_mask_RP, completion_mask_RM], axis=1)
    logprobs_RT = sequence_logprobs(
        model, tokens_RT, attention_mask_BT=mask_RT, temperature=temperature, chunk_size=chunk_size
    )
    return logprobs_RT[:, P:]
