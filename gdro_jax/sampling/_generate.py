"""The KV-cache sampler: one jitted `lax.while_loop` that draws up to `max_new_tokens` tokens for
every slot of a batch, with temperature / top-k / top-p or greedy decoding, a set of stop ids,
per-sequence stopping and an early exit once every sequence has stopped.

Layout. Prompts are left-aligned internally: slot r's prompt occupies cache slots
`P - len_r .. P-1` of a cache of `S = P + max_new_tokens` slots, so every decode step writes the
whole batch at the same slot `P + t - 1` (one dynamic-update-slice, no scatter). RoPE positions
start at 0 at each prompt's first real token, as in transformers' left-padded `generate`.

Prefill sharing (SPEC section 6). GRPO draws several completions per prompt: `prompt_of_slot[R]`
maps each of the R sampled sequences to one of the N distinct prompts. Each distinct prompt is
prefilled once; its keys/values are then copied to all its slots.
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gdro_jax.models import Decoder, KVCache


class FinishReason(enum.IntEnum):
    """Why a sequence stopped (values of `GenerationResult.finish_reasons`)."""

    LENGTH = 0  # reached max_new_tokens without a stop id
    EOS = 1  # emitted one of the stop ids (the stop token is part of the completion)


class GenerationResult(NamedTuple):
    """Completions of R slots. Positions after a sequence's end hold `pad_id` and log-prob 0."""

    tokens: jax.Array  # [R, M] int32 sampled tokens, including the stop token
    logprobs: jax.Array  # [R, M] float32 log-prob of each token (see `generate`)
    lengths: jax.Array  # [R] int32 number of generated tokens, stop token included
    finish_reasons: jax.Array  # [R] int32 FinishReason
    prompt_tokens: jax.Array  # [R, P] int32 each slot's prompt, left-padded with pad_id
    prompt_lengths: jax.Array  # [R] int32


class _LoopState(NamedTuple):
    step: jax.Array  # [] int32 index of the next token to sample
    cache: KVCache  # L x [R, K, S, H] keys and values
    tokens: jax.Array  # [R, M] int32
    logprobs: jax.Array  # [R, M] float32
    done: jax.Array  # [R] bool
    lengths: jax.Array  # [R] int32
    finish_reasons: jax.Array  # [R] int32


def sample_logits(
    logits_RV: jax.Array,
    key: jax.Array,
    *,
    temperature: jax.typing.ArrayLike,
    top_p: jax.typing.ArrayLike = 1.0,
    top_k: int = 0,
    greedy: bool = False,
    use_top_p: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """Draws one token per row; filters in transformers' order: temperature, top-k, top-p.

    Args:
      logits_RV: next-token logits.
      key: PRNG key.
      temperature: divides the logits (ignored when greedy).
      top_p: keep the smallest set of most likely tokens whose probability reaches top_p (after
        top-k); the most likely token is always kept.
      top_k: keep the k most likely tokens (0: all). Static.
      greedy: argmax instead of sampling. Static.
      use_top_p: apply the top-p filter. Static.

    Returns:
      (token_R int32, logprob_R float32): the log-prob is that of log_softmax(logits / temperature)
      (temperature 1 when greedy), before any top-k/top-p truncation.
    """
    logits_RV = logits_RV.astype(jnp.float32)
    if greedy:
        token_R = _first_argmax(logits_RV)
        return token_R, _gather(logits_RV, token_R) - jax.nn.logsumexp(logits_RV, axis=-1)
    scaled_RV = logits_RV / temperature
    log_normaliser_R = jax.nn.logsumexp(scaled_RV, axis=-1)
    filtered_RV = scaled_RV
    if top_k > 0:
        top_RK = jax.lax.top_k(scaled_RV, top_k)[0]
        filtered_RV = jnp.where(scaled_RV >= top_RK[:, -1:], scaled_RV, -jnp.inf)
    if use_top_p:
        # Candidates in descending order: the top-k values if top-k ran, else a full sort.
        sorted_RC = top_RK if top_k > 0 else -jnp.sort(-scaled_RV, axis=-1)
        probs_RC = jax.nn.softmax(sorted_RC, axis=-1)
        mass_before_RC = jnp.cumsum(probs_RC, axis=-1) - probs_RC
        keep_count_R = jnp.sum(mass_before_RC < top_p, axis=-1)
        threshold_R = jnp.take_along_axis(sorted_RC, keep_count_R[:, None] - 1, axis=-1)
        filtered_RV = jnp.where(scaled_RV >= threshold_R, filtered_RV, -jnp.inf)
    weights_RV = jnp.exp(filtered_RV - log_normaliser_R[:, None])  # unnormalised after filtering
    token_R = _inverse_cdf_draw(key, weights_RV, fallback_R=_first_argmax(scaled_RV))
    return token_R, _gather(scaled_RV, token_R) - log_normaliser_R


def _first_argmax(x_RV: jax.Array) -> jax.Array:
    # Two plain reductions; XLA:CPU runs them several times faster than jnp.argmax's
    # variadic (value, index) reduction.
    max_R1 = jnp.max(x_RV, axis=-1, keepdims=True)
    index_RV = jax.lax.broadcasted_iota(jnp.int32, x_RV.shape, 1)
    return jnp.min(jnp.where(x_RV == max_R1, index_RV, x_RV.shape[-1]), axis=-1)


def _inverse_cdf_draw(key: jax.Array, weights_RV: jax.Array, fallback_R: jax.Array) -> jax.Array:
    """A draw from the categorical distribution ∝ weights_RV (>= 0) per row, by inverting the CDF
    at one uniform per row.

    Exact in distribution, like the Gumbel-max trick of `jax.random.categorical`, but it needs
    R random numbers instead of R x V, and no length-V cumulative sum: the vocabulary is cut into
    ~sqrt(V) blocks, the block is chosen from the cumulative block masses, then the token inside
    it. Zero-weight tokens are never returned (if rounding lands on one, the row's `fallback_R`,
    its most likely token, is returned instead).
    """
    R, V = weights_RV.shape
    size = math.isqrt(V - 1) + 1
    count = -(-V // size)
    blocks_RnS = jnp.pad(weights_RV, ((0, 0), (0, count * size - V))).reshape(R, count, size)
    mass_Rn = jnp.sum(blocks_RnS, axis=-1)
    cdf_Rn = jnp.cumsum(mass_Rn, axis=-1)
    target_R1 = jax.random.uniform(key, (R, 1), jnp.float32) * cdf_Rn[:, -1:]
    block_R = jnp.minimum(jnp.sum(cdf_Rn <= target_R1, axis=-1), count - 1)
    inside_RS = jnp.take_along_axis(blocks_RnS, block_R[:, None, None], axis=1)[:, 0]
    before_R1 = jnp.take_along_axis(cdf_Rn - mass_Rn, block_R[:, None], axis=1)
    inside_cdf_RS = jnp.cumsum(inside_RS, axis=-1) + before_R1
    offset_R = jnp.minimum(jnp.sum(inside_cdf_RS <= target_R1, axis=-1), size - 1)
    token_R = (block_R * size + offset_R).astype(jnp.int32)
    valid_R = (token_R < V) & (_gather(weights_RV, jnp.minimum(token_R, V - 1)) > 0)
    return jnp.where(valid_R, token_R, fallback_R)


def _gather(values_RV: jax.Array, index_R: jax.Array) -> jax.Array:
    return jnp.take_along_axis(values_RV, index_R[:, None], axis=-1)[:, 0]


def _left_align(tokens_NP, lengths_N, pad_id):
    """Right-padded rows -> left-padded rows (row i's tokens end at column P-1)."""
    P = tokens_NP.shape[1]
    shift_N = P - lengths_N
    source_NP = jnp.arange(P)[None, :] - shift_N[:, None]
    valid_NP = source_NP >= 0
    moved_NP = jnp.take_along_axis(tokens_NP, jnp.maximum(source_NP, 0), axis=1)
    return jnp.where(valid_NP, moved_NP, pad_id), valid_NP


@functools.partial(
    jax.jit,
    static_argnames=(
        "graphdef",
        "max_new_tokens",
        "top_k",
        "greedy",
        "use_top_p",
        "share_prefill",
        "pad_id",
    ),
)
def _generate(
    graphdef,
    state,
    tokens_NP,
    lengths_N,
    prompt_of_slot_R,
    eos_ids_E,
    key,
    temperature,
    top_p,
    *,
    max_new_tokens: int,
    top_k: int,
    greedy: bool,
    use_top_p: bool,
    share_prefill: bool,
    pad_id: int,
) -> GenerationResult:
    model: Decoder = nnx.merge(graphdef, state)
    N, P = tokens_NP.shape
    R, M = prompt_of_slot_R.shape[0], max_new_tokens
    S = P + M
    sample = functools.partial(
        sample_logits,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        greedy=greedy,
        use_top_p=use_top_p,
    )

    lengths_N = lengths_N.astype(jnp.int32)
    left_NP, valid_NP = _left_align(tokens_NP.astype(jnp.int32), lengths_N, pad_id)
    positions_NP = jnp.maximum(jnp.cumsum(valid_NP, axis=1) - 1, 0)
    lengths_R = lengths_N[prompt_of_slot_R]

    def prefill(tokens_BP, positions_BP, valid_BP):
        empty = model.init_cache(tokens_BP.shape[0], P)
        h_BPD, cache = model.extend_cache(
            tokens_BP, positions_BP, cache=empty, cache_index=0, key_mask_BS=valid_BP
        )
        return model.logits(h_BPD[:, -1:])[:, 0], cache

    if share_prefill:
        logits_NV, prefix = prefill(left_NP, positions_NP, valid_NP)
        logits_RV = logits_NV[prompt_of_slot_R]
        prefix = jax.tree.map(lambda a: a[prompt_of_slot_R], prefix)
    else:
        logits_RV, prefix = prefill(
            left_NP[prompt_of_slot_R], positions_NP[prompt_of_slot_R], valid_NP[prompt_of_slot_R]
        )
    cache = jax.tree.map(
        lambda empty, p: jax.lax.dynamic_update_slice(empty, p, (0, 0, 0, 0)),
        model.init_cache(R, S),
        prefix,
    )
    key_mask_RS = jnp.arange(S)[None, :] >= (P - lengths_R)[:, None]
    layers = model.layer_slices()  # weights sliced once, outside the decode loop

    def record(state: _LoopState, logits_RV) -> _LoopState:
        token_R, logprob_R = sample(logits_RV, jax.random.fold_in(key, state.step))
        active_R = ~state.done
        token_R = jnp.where(active_R, token_R, pad_id)
        logprob_R = jnp.where(active_R, logprob_R, 0.0)
        stopped_R = active_R & jnp.any(token_R[:, None] == eos_ids_E[None, :], axis=-1)
        return state._replace(
            step=state.step + 1,
            tokens=jax.lax.dynamic_update_index_in_dim(state.tokens, token_R, state.step, 1),
            logprobs=jax.lax.dynamic_update_index_in_dim(state.logprobs, logprob_R, state.step, 1),
            done=state.done | stopped_R,
            lengths=state.lengths + active_R.astype(jnp.int32),
            finish_reasons=jnp.where(stopped_R, int(FinishReason.EOS), state.finish_reasons),
        )

    def decode(state: _LoopState) -> _LoopState:
        t = state.step
        last_R = jax.lax.dynamic_index_in_dim(state.tokens, t - 1, axis=1, keepdims=False)
        h_R1D, cache = model.extend_cache(
            last_R[:, None],
            (lengths_R + t - 1)[:, None],
            cache=state.cache,
            cache_index=P + t - 1,
            key_mask_BS=key_mask_RS,
            layers=layers,
        )
        return record(state._replace(cache=cache), model.logits(h_R1D)[:, 0])

    def not_finished(state: _LoopState) -> jax.Array:
        return (state.step < M) & ~jnp.all(state.done)

    start = _LoopState(
        step=jnp.zeros((), jnp.int32),
        cache=cache,
        tokens=jnp.full((R, M), pad_id, jnp.int32),
        logprobs=jnp.zeros((R, M), jnp.float32),
        done=jnp.zeros((R,), bool),
        lengths=jnp.zeros((R,), jnp.int32),
        finish_reasons=jnp.full((R,), int(FinishReason.LENGTH), jnp.int32),
    )
    final = jax.lax.while_loop(not_finished, decode, record(start, logits_RV))
    return GenerationResult(
        tokens=final.tokens,
        logprobs=final.logprobs,
        lengths=final.lengths,
        finish_reasons=final.finish_reasons,
        prompt_tokens=left_NP[prompt_of_slot_R],
        prompt_lengths=lengths_R,
    )


def _bucket(length: int, multiple: int) -> int:
    return max(multiple, -(-length // multiple) * multiple)


def generate(
    model: Decoder,
    prompt_tokens: Sequence[Sequence[int]] | jax.typing.ArrayLike,
    *,
    key: jax.Array,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    eos_ids: Sequence[int] | jax.typing.ArrayLike = (),
    prompt_lengths: jax.typing.ArrayLike | None = None,
    prompt_of_slot: jax.typing.ArrayLike | None = None,
    pad_id: int = 0,
    prompt_bucket: int = 64,
    share_prefill: bool = True,
) -> GenerationResult:
    """Samples completions of a batch of prompts with a KV cache, in one compiled loop.

    Compiles once per (number of prompts, number of slots, padded prompt length, max_new_tokens,
    top_k, greedy or not, top-p on or off, number of stop ids); the temperature and top_p values,
    the stop ids, the slot map and the key are traced, so changing them does not recompile.

    Args:
      model: the Decoder (sharded or not).
      prompt_tokens: N prompts, either a list of token-id lists (padded on the host to a multiple
        of `prompt_bucket`), or an int array [N, P] whose row i holds prompt i in its first
        `prompt_lengths[i]` entries (right padding; P is used as is). Every prompt needs at least
        one token.
      key: PRNG key; the same key and inputs give the same result.
      max_new_tokens: M, the most tokens generated per slot.
      temperature: softmax temperature; 0 means greedy (argmax).
      top_p: nucleus filter, in (0, 1]; 1 disables it.
      top_k: keep the k most likely tokens; 0 disables it.
      eos_ids: stop ids: a slot stops after emitting any of them.
      prompt_lengths: [N] prompt lengths, required with an array `prompt_tokens`.
      prompt_of_slot: [R] which prompt each sampled sequence continues (SPEC section 6); default
        one slot per prompt (R = N).
      pad_id: fills prompts' padding and completions after their end.
      prompt_bucket: list prompts are padded to a multiple of this length (fewer compilations).
      share_prefill: prefill each distinct prompt once and copy its cache to its slots (True), or
        prefill every slot separately (False; same result, for benchmarking).

    Returns:
      GenerationResult with tokens/logprobs [R, M], lengths and finish reasons [R], and each
      slot's left-padded prompt. `logprobs` are log-probs of the sampled tokens under the
      temperature-scaled model, log_softmax(logits / temperature), before top-k/top-p truncation
      (under temperature 1 when greedy): the same quantity as `completion_logprobs`, which the
      GRPO ratio needs.
    """
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature!r}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    vocab = model.config.vocab_size
    if not isinstance(top_k, int) or not 0 <= top_k <= vocab:
        raise ValueError(f"top_k must be an int in [0, vocab_size={vocab}], got {top_k!r}")
    if not isinstance(prompt_bucket, int) or prompt_bucket < 1:
        raise ValueError(f"prompt_bucket must be a positive int, got {prompt_bucket!r}")

    if isinstance(prompt_tokens, list | tuple):
        if prompt_lengths is not None:
            raise ValueError("prompt_lengths is only for array prompt_tokens; got a list too")
        lengths = np.asarray([len(p) for p in prompt_tokens], np.int32)
        if lengths.size == 0 or lengths.min() < 1:
            raise ValueError(f"every prompt needs at least one token, got lengths {lengths}")
        tokens = np.full((len(prompt_tokens), _bucket(int(lengths.max()), prompt_bucket)), pad_id)
        for i, prompt in enumerate(prompt_tokens):
            tokens[i, : len(prompt)] = prompt
        tokens = tokens.astype(np.int32)
    else:
        if prompt_lengths is None:
            raise ValueError("prompt_lengths [N] is required when prompt_tokens is an array")
        tokens, lengths = prompt_tokens, prompt_lengths
        if not isinstance(lengths, jax.core.Tracer):
            concrete = np.asarray(lengths)
            if concrete.min() < 1 or concrete.max() > np.shape(tokens)[1]:
                raise ValueError(
                    f"prompt_lengths must be in [1, {np.shape(tokens)[1]}], got {concrete}"
                )
    num_prompts = np.shape(tokens)[0]
    if prompt_of_slot is None:
        prompt_of_slot = np.arange(num_prompts, dtype=np.int32)
    elif not isinstance(prompt_of_slot, jax.core.Tracer):
        concrete = np.asarray(prompt_of_slot)
        if concrete.ndim != 1 or concrete.min() < 0 or concrete.max() >= num_prompts:
            raise ValueError(
                f"prompt_of_slot must be a [R] vector of prompt indices in [0, {num_prompts}), "
                f"got {concrete}"
            )
    graphdef, state = nnx.split(model)
    return _generate(
        graphdef,
        state,
        jnp.asarray(tokens, jnp.int32),
        jnp.asarray(lengths, jnp.int32),
        jnp.asarray(prompt_of_slot, jnp.int32),
        jnp.asarray(eos_ids, jnp.int32).reshape(-1),
        key,
        jnp.asarray(temperature if temperature > 0 else 1.0, jnp.float32),
        jnp.asarray(top_p, jnp.float32),
        max_new_tokens=max_new_tokens,
        top_k=top_k,
        greedy=temperature == 0,
        use_top_p=top_p < 1,
        share_prefill=share_prefill,
        pad_id=int(pad_id),
    )
