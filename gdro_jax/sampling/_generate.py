"""The KV-cache sampler's static loop, and the parts both loops share (the token draw, the prompt
layout, the weights' and caches' placement): one jitted `lax.while_loop` per chunk of slots that
draws up to `max_new_tokens` tokens for every slot, with temperature / top-k / top-p or greedy
decoding, a set of stop ids, per-sequence stopping and an early exit once every sequence has
stopped. `_continuous` is the other loop: decode slots that take the next request as they free up.

Layout. Prompts are left-aligned internally: slot r's prompt occupies cache slots
`P - len_r .. P-1` of a cache of `S = P + max_new_tokens` slots, so every decode step writes the
whole batch at the same slot `P + t - 1` (one dynamic-update-slice, no scatter). RoPE positions
start at 0 at each prompt's first real token, as in transformers' left-padded `generate`.

Decode windows. A decode step reads every slot of the cache it is given, so the static loop keeps
its cache in blocks (`window_ends`): the prompt and the first window of completion slots, then one
block per later window, added as its window opens; window i's steps (a `lax.while_loop` each)
read and write blocks 0..i only, its live positions rounded up to a window, not P + M.

Stop checks. A `lax.while_loop` checks its condition before every iteration; on a GPU XLA copies
it to the host and waits there, unless the trip count is static, and the loop is not captured in
a command buffer. With `stop_check_every=k` both loops decode k steps per iteration (a fixed-trip
`fori_loop`, `while_in_chunks`), so the condition is checked once per k steps: a loop that could
stop inside a chunk runs at most k - 1 steps more, steps that change no output (every slot has
stopped, or the lanes have not yet halved). A chunk never crosses a window's end: the steps that
remain of a window when a whole chunk no longer fits run one per iteration, as before.

Prefill sharing (SPEC section 6). GRPO draws several completions per prompt: `prompt_of_slot[R]`
maps each of the R sampled sequences to one of the N distinct prompts. Each distinct prompt is
prefilled once; its keys/values are then copied to all its slots.

Micro-batches. With `micro_batch_slots=C` the R slots are decoded C at a time by a `lax.map`
over chunks inside the one compiled function: the N prompts are still prefilled once, each chunk
gathers its slots' prefix keys/values into a cache of C x (P + M) slots (instead of R x (P + M))
and runs its own while loop, which stops as soon as that chunk's slots have stopped. When C does
not divide R the last chunk is padded with slots that are stopped from the start (their tokens
are dropped).

Weights. The rollout reads one copy of the parameters, cast once to the compute dtype and gathered
over the batch mesh axes (`data`, `fsdp`; still split over `tensor`) before the prefill: the
prefill and every decode step then read the same copy, instead of all-gathering float32 shards
layer by layer (which XLA hoists out of the loops, holding every layer's gathered float32 weights
at once, twice). Per device the copy costs parameters x compute-dtype bytes / tensor: 15 GiB for
Qwen3-8B in bfloat16; a model whose copy does not fit needs `mesh.tensor > 1`.

Randomness. Slot r's token at step t is drawn with `fold_in(fold_in(key, r), t)`, one uniform
per slot: a slot's completion depends on the key, its slot index and its prompt only, never on
which other slots share its batch, so chunked and unchunked sampling give the same tokens, up to
the rounding of matmuls whose kernel depends on the batch size (none for chunks of 5 or 8 on
CPU in the tests; a batch of one there moves log-probs by ~1e-6).

Over 400 lines on purpose: the prefill, the shared prefix, the chunked decode loop and the
placement of the weights and caches on the mesh are one compiled function, read top to bottom.
"""

from __future__ import annotations

import enum
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from gdro_jax.models import BATCH_AXES, Decoder, KVCache, constrain, fit_spec


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
    """The decode loop's carry for one chunk of C slots (C = R without micro-batches)."""

    step: jax.Array  # [] int32 index of the next token to sample
    cache: KVCache  # L x blocks (one a decode window) of [C, K, H, s] keys and [C, K, s, H] values
    tokens: jax.Array  # [C, M] int32
    logprobs: jax.Array  # [C, M] float32
    done: jax.Array  # [C] bool
    lengths: jax.Array  # [C] int32
    finish_reasons: jax.Array  # [C] int32


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
      key: a PRNG key (R uniforms drawn from it), or [R] keys, one per row (row r's draw then
        depends on its own key only, whatever the other rows).
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
    peak_R = jnp.max(scaled_RV, axis=-1)
    # Both filters keep the tokens whose scaled logit reaches a floor: the k-th largest value
    # (ties kept) and the nucleus's last value.
    floor_R = None
    if top_k > 0:
        top_RK = jax.lax.top_k(scaled_RV, top_k)[0]
        floor_R = top_RK[:, -1]
    if use_top_p:
        # Candidates in descending order: the top-k values if top-k ran, else a full sort.
        sorted_RC = top_RK if top_k > 0 else -jnp.sort(-scaled_RV, axis=-1)
        probs_RC = jax.nn.softmax(sorted_RC, axis=-1)
        mass_before_RC = jnp.cumsum(probs_RC, axis=-1) - probs_RC
        keep_count_R = jnp.sum(mass_before_RC < top_p, axis=-1)
        nucleus_R = _gather(sorted_RC, keep_count_R - 1)
        floor_R = nucleus_R if floor_R is None else jnp.maximum(floor_R, nucleus_R)
    token_R, scaled_R, kept_R = _inverse_cdf_draw(
        _uniforms(key, logits_RV.shape[0]), scaled_RV, peak_R, floor_R
    )
    # The normaliser: without a filter the draw's kept mass is all of it (no second pass).
    if floor_R is None:
        total_R = kept_R
    else:
        total_R = jnp.sum(jnp.exp(scaled_RV - peak_R[:, None]), axis=-1)
    return token_R, scaled_R - (peak_R + jnp.log(total_R))


def _first_argmax(x_RV: jax.Array) -> jax.Array:
    # Two plain reductions; XLA:CPU runs them several times faster than jnp.argmax's
    # variadic (value, index) reduction.
    max_R1 = jnp.max(x_RV, axis=-1, keepdims=True)
    index_RV = jax.lax.broadcasted_iota(jnp.int32, x_RV.shape, 1)
    return jnp.min(jnp.where(x_RV == max_R1, index_RV, x_RV.shape[-1]), axis=-1)


def _uniforms(key: jax.Array, rows: int) -> jax.Array:
    """[rows, 1] uniforms in [0, 1): from one key, or one from each of [rows] keys."""
    typed = jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
    if key.ndim == (0 if typed else 1):  # one key for the batch
        return jax.random.uniform(key, (rows, 1), jnp.float32)
    return jax.vmap(lambda row_key: jax.random.uniform(row_key, (1,), jnp.float32))(key)


def _inverse_cdf_draw(
    uniform_R1: jax.Array, scaled_RV: jax.Array, peak_R: jax.Array, floor_R: jax.Array | None
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """A draw from the categorical distribution with weights exp(scaled - peak) on the tokens
    whose scaled logit reaches the row's floor (0 elsewhere; `floor_R` None: every token), by
    inverting the CDF at the row's uniform. `peak_R`: the row's largest scaled logit, so its
    weight is 1 and some weight > 0.

    Exact in distribution, like the Gumbel-max trick of `jax.random.categorical`, but it needs
    R random numbers instead of R x V, and no length-V cumulative sum: the vocabulary is cut into
    ~sqrt(V) blocks, the block is chosen from the cumulative block masses, then the token inside
    it. After the one pass that sums the blocks' weights, only the chosen block is read again
    (its weights recomputed from its logits). Zero-weight tokens are never returned: the block
    chosen has positive mass (the last such at most), and if rounding inside it lands on a zero
    weight, the block's most likely token is returned instead.

    Returns:
      (token_R int32, the token's scaled logit, the kept weights' total).
    """
    R, V = scaled_RV.shape
    size = math.isqrt(V - 1) + 1
    count = -(-V // size)

    def weights(scaled_RnS):
        weights_RnS = jnp.exp(scaled_RnS - peak_R[:, None, None])
        if floor_R is None:
            return weights_RnS
        return jnp.where(scaled_RnS >= floor_R[:, None, None], weights_RnS, 0.0)

    pad = ((0, 0), (0, count * size - V))
    blocks_RnS = jnp.pad(scaled_RV, pad, constant_values=-jnp.inf).reshape(R, count, size)
    mass_Rn = jnp.sum(weights(blocks_RnS), axis=-1)
    cdf_Rn = jnp.cumsum(mass_Rn, axis=-1)
    target_R1 = uniform_R1 * cdf_Rn[:, -1:]
    # A block whose CDF first passes the target has positive mass; only rounding (a target at
    # the total) could run past the last such block.
    last_R = jnp.max(jnp.where(mass_Rn > 0, jnp.arange(count), 0), axis=-1)
    block_R = jnp.minimum(jnp.sum(cdf_Rn <= target_R1, axis=-1), last_R)
    scaled_RS = jnp.take_along_axis(blocks_RnS, block_R[:, None, None], axis=1)[:, 0]
    inside_RS = weights(scaled_RS[:, None])[:, 0]
    before_R1 = jnp.take_along_axis(cdf_Rn - mass_Rn, block_R[:, None], axis=1)
    inside_cdf_RS = jnp.cumsum(inside_RS, axis=-1) + before_R1
    offset_R = jnp.minimum(jnp.sum(inside_cdf_RS <= target_R1, axis=-1), size - 1)
    offset_R = jnp.where(_gather(inside_RS, offset_R) > 0, offset_R, _first_argmax(inside_RS))
    token_R = (block_R * size + offset_R).astype(jnp.int32)
    return token_R, _gather(scaled_RS, offset_R), cdf_Rn[:, -1]


def _gather(values_RV: jax.Array, index_R: jax.Array) -> jax.Array:
    return jnp.take_along_axis(values_RV, index_R[:, None], axis=-1)[:, 0]


# The decode windows (`window_ends`): the least window, and the most windows.
WINDOW_TOKENS = 128
MAX_WINDOWS = 8


def window_ends(max_new_tokens: int, window: int = 0) -> tuple[int, ...]:
    """The completion lengths at which the KV cache's blocks end, one block a decode window.

    Static loop: a decode step reads its whole cache, so the cache holds `P + end` slots while
    the steps write slots before it, and grows by one window (a copy) when a slot is still
    running: a step then reads at most a window more than its live positions, not `P + M`
    whatever the completions' lengths. Each window is a while loop of its own in the program
    (one compilation per shape still; more windows, a longer compile). Continuous loop: the
    lanes' ring of completion slots is held in these blocks from the start, and a step skips
    the blocks no active lane has written into (`_continuous`).

    Args:
      max_new_tokens: M.
      window: the window in tokens; 0: `max(WINDOW_TOKENS, ceil(M / MAX_WINDOWS))` (one window,
        the whole `P + M` cache, for M <= 128).

    Returns:
      The increasing ends, the last one M.
    """
    M = max_new_tokens
    if window <= 0:
        window = max(WINDOW_TOKENS, -(-M // MAX_WINDOWS))
    return (*range(window, M, window), M)


class _Prompts(NamedTuple):
    """The N prompts as both loops decode them: left-aligned in P columns."""

    tokens: jax.Array  # [N, P] int32, left-padded with pad_id
    valid: jax.Array  # [N, P] bool
    positions: jax.Array  # [N, P] int32 RoPE positions, 0 at each prompt's first token
    lengths: jax.Array  # [N] int32


def _set_up(graphdef, state, tokens_NP, lengths_N, *, pad_id, temperature, top_p, top_k, greedy,
            use_top_p):  # fmt: skip
    """What both decode loops start from: the sampling copy of the model, the token draw with
    the sampling settings bound, and the prompts left-aligned."""
    model = _sampling_copy(nnx.merge(graphdef, state))
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
    return model, sample, _Prompts(left_NP, valid_NP, positions_NP, lengths_N)


def _prefill(model: Decoder, tokens_BP, positions_BP, valid_BP) -> tuple[jax.Array, KVCache]:
    """The prompts' keys and values in a cache of their P slots, and each prompt's last logits."""
    empty = model.init_cache(tokens_BP.shape[0], tokens_BP.shape[1])
    h_BPD, cache = model.extend_cache(
        tokens_BP, positions_BP, cache=empty, cache_index=0, key_mask_BS=valid_BP
    )
    return model.logits(h_BPD[:, -1:])[:, 0], cache


def _result(outputs, prompts: _Prompts, prompt_of_slot_R) -> GenerationResult:
    """The R slots' (tokens, log-probs, lengths, finish reasons) with each slot's prompt."""
    tokens_RM, logprobs_RM, lengths_R, finish_reasons_R = outputs
    return GenerationResult(
        tokens=tokens_RM,
        logprobs=logprobs_RM,
        lengths=lengths_R,
        finish_reasons=finish_reasons_R,
        prompt_tokens=prompts.tokens[prompt_of_slot_R],
        prompt_lengths=prompts.lengths[prompt_of_slot_R],
    )


def _left_align(tokens_NP, lengths_N, pad_id):
    """Right-padded rows -> left-padded rows (row i's tokens end at column P-1)."""
    P = tokens_NP.shape[1]
    shift_N = P - lengths_N
    source_NP = jnp.arange(P)[None, :] - shift_N[:, None]
    valid_NP = source_NP >= 0
    moved_NP = jnp.take_along_axis(tokens_NP, jnp.maximum(source_NP, 0), axis=1)
    return jnp.where(valid_NP, moved_NP, pad_id), valid_NP


def _sampling_copy(model: Decoder) -> Decoder:
    """`model` with its weights cast to the compute dtype and gathered over the batch axes
    (kept sharded over `tensor`): the one copy the prefill and the decode loops read."""
    compute_dtype = jnp.dtype(model.config.compute_dtype)
    graphdef, state = nnx.split(model)

    def copy(value, spec):
        value = value.astype(compute_dtype)
        if model.mesh is None:
            return value
        return constrain(value, PartitionSpec(*map(_without_batch_axes, spec)), model.mesh)

    specs = nnx.get_partition_spec(state)
    state = jax.tree.map(copy, state, specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
    return nnx.merge(graphdef, state)


def _without_batch_axes(entry):
    """A PartitionSpec entry with the batch mesh axes (`data`, `fsdp`) removed."""
    axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
    kept = tuple(a for a in axes if a not in BATCH_AXES)
    return None if not kept else kept[0] if len(kept) == 1 else kept


def _positions_on_batch(model: Decoder, cache: KVCache) -> KVCache:
    """The cache split over the batch mesh axes along its positions instead of its sequences.

    The shared prefill's cache lives this way: a chunk's slots may continue any prompts, and
    with positions split every device gathers its positions of those prompts' rows locally;
    one all-to-all per layer then moves them to the slots' devices. Gathering rows of a cache
    split by prompt builds every layer's C x P rows on every device first (and XLA combines
    the layers' reductions into one buffer: 36 GiB per device for 128 slots of Qwen3-8B).
    """
    if model.mesh is None:
        return cache

    def by_position(spec: PartitionSpec, position_axis: int) -> PartitionSpec:
        entries = list(spec) + [None] * (4 - len(spec))
        entries[position_axis], entries[0] = entries[0], None
        return PartitionSpec(*entries)

    k_spec = by_position(model.sharding.cache_bkhs, 3)
    v_spec = by_position(model.sharding.cache_bksh, 2)
    return KVCache(
        k=tuple(constrain(k, k_spec, model.mesh) for k in cache.k),
        v=tuple(constrain(v, v_spec, model.mesh) for v in cache.v),
    )


def _slots_on_batch(model: Decoder, tree, slot_axis: int = 0):
    """Puts every leaf's slot axis on the model's batch mesh axes; the identity without a mesh."""
    if model.mesh is None:
        return tree
    batch_axes = model.sharding.tokens_bt[0]

    def place(x):
        spec = PartitionSpec(*(None,) * slot_axis, batch_axes)
        spec = fit_spec(spec, x.shape, dict(model.mesh.shape))
        return jax.lax.with_sharding_constraint(x, NamedSharding(model.mesh, spec))

    return jax.tree.map(place, tree)


def while_in_chunks(cond, body, state, steps: int, room=None):
    """`lax.while_loop(cond, body, state)`, checking `cond` once per `steps` steps where it can.

    First a loop whose iteration runs `steps` steps (a `fori_loop` of a static trip count) while
    `cond` holds and `room(state)` does (a whole chunk stays within the loop's bounds: every step
    of it may run, even past the step where `cond` would have failed, so such steps must change
    no output); then the plain loop, for the steps left (fewer than `steps` where `room` stopped
    the chunks; none where `cond` did). `steps=1`: the plain loop alone.
    """
    if steps > 1:
        state = jax.lax.while_loop(
            lambda s: cond(s) & (True if room is None else room(s)),
            lambda s: jax.lax.fori_loop(0, steps, lambda _, x: body(x), s),
            state,
        )
    return jax.lax.while_loop(cond, body, state)


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
        "micro_batch_slots",
        "decode_window",
        "stop_check_every",
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
    micro_batch_slots: int,
    decode_window: int = 0,
    stop_check_every: int = 1,
) -> GenerationResult:
    model, sample, prompts = _set_up(
        graphdef, state, tokens_NP, lengths_N, pad_id=pad_id, temperature=temperature,
        top_p=top_p, top_k=top_k, greedy=greedy, use_top_p=use_top_p,
    )  # fmt: skip
    left_NP, valid_NP, positions_NP, lengths_N = prompts
    P = tokens_NP.shape[1]
    R, M, C = prompt_of_slot_R.shape[0], max_new_tokens, micro_batch_slots
    num_chunks = -(-R // C)
    prefill = functools.partial(_prefill, model)

    if share_prefill:
        logits_NV, prefix_N = prefill(left_NP, positions_NP, valid_NP)
        prefix_N = _positions_on_batch(model, prefix_N)
    layers = model.layer_slices()  # weights sliced once, outside the decode loops

    def decode_chunk(slot_C):
        """Decodes the slots `slot_C` (indices >= R pad the last chunk: stopped from the start)."""
        prompt_C = prompt_of_slot_R[jnp.minimum(slot_C, R - 1)]
        lengths_C = lengths_N[prompt_C]
        if share_prefill:
            logits_CV = logits_NV[prompt_C]
            prefix = _positions_on_batch(model, jax.tree.map(lambda a: a[prompt_C], prefix_N))
        else:
            logits_CV, prefix = prefill(
                left_NP[prompt_C], positions_NP[prompt_C], valid_NP[prompt_C]
            )
        # The cache in blocks, one a window: the prompt and the first window, then a block for
        # each later window, added as its window opens. Window i's steps read blocks 0..i.
        ends = window_ends(M, decode_window)
        first = jax.tree.map(
            lambda empty, p: jax.lax.dynamic_update_slice(empty, p, (0, 0, 0, 0)),
            model.init_cache(C, P + ends[0]),
            prefix,
        )
        cache = KVCache(k=tuple((k,) for k in first.k), v=tuple((v,) for v in first.v))
        slot_keys_C = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, slot_C)

        def record(state: _LoopState, logits_CV) -> _LoopState:
            step_keys_C = jax.vmap(jax.random.fold_in, in_axes=(0, None))(slot_keys_C, state.step)
            token_C, logprob_C = sample(logits_CV, step_keys_C)
            active_C = ~state.done
            token_C = jnp.where(active_C, token_C, pad_id)
            logprob_C = jnp.where(active_C, logprob_C, 0.0)
            stopped_C = active_C & jnp.any(token_C[:, None] == eos_ids_E[None, :], axis=-1)
            return state._replace(
                step=state.step + 1,
                tokens=jax.lax.dynamic_update_index_in_dim(state.tokens, token_C, state.step, 1),
                logprobs=jax.lax.dynamic_update_index_in_dim(
                    state.logprobs, logprob_C, state.step, 1
                ),
                done=state.done | stopped_C,
                lengths=state.lengths + active_C.astype(jnp.int32),
                finish_reasons=jnp.where(stopped_C, int(FinishReason.EOS), state.finish_reasons),
            )

        def not_finished(state: _LoopState) -> jax.Array:
            return (state.step < M) & ~jnp.all(state.done)

        def outputs(state: _LoopState):
            return state.tokens, state.logprobs, state.lengths, state.finish_reasons

        def window(index: int, state: _LoopState) -> _LoopState:
            """Decodes the steps whose keys/values go into block `index`, the last of the cache:
            every step reads the blocks 0..index, the prompt and the completion up to the
            window's end."""
            end = ends[index]
            key_mask_CS = jnp.arange(P + end)[None, :] >= (P - lengths_C)[:, None]

            def decode(state: _LoopState) -> _LoopState:
                t = state.step
                last_C = jax.lax.dynamic_index_in_dim(state.tokens, t - 1, axis=1, keepdims=False)
                h_C1D, cache = model.extend_cache(
                    last_C[:, None],
                    (lengths_C + t - 1)[:, None],
                    cache=state.cache,
                    cache_index=P + t - 1,
                    key_mask_BS=key_mask_CS,
                    layers=layers,
                )
                return record(state._replace(cache=cache), model.logits(h_C1D)[:, 0])

            # Step t writes slot P + t - 1: this window runs the steps t <= end (a finished
            # chunk's loop exits at once). Steps after every slot stopped write pads.
            last = min(end, M - 1)
            return while_in_chunks(
                lambda state: not_finished(state) & (state.step <= end),
                decode,
                state,
                stop_check_every,
                room=lambda state: state.step + stop_check_every - 1 <= last,
            )

        start = _LoopState(
            step=jnp.zeros((), jnp.int32),
            cache=cache,
            tokens=jnp.full((C, M), pad_id, jnp.int32),
            logprobs=jnp.zeros((C, M), jnp.float32),
            done=slot_C >= R,
            lengths=jnp.zeros((C,), jnp.int32),
            finish_reasons=jnp.full((C,), int(FinishReason.LENGTH), jnp.int32),
        )
        state = record(start, logits_CV)
        for index in range(len(ends)):
            if index:  # the next block, zeros (a finished chunk's loop then exits at once)
                block = model.init_cache(C, ends[index] - ends[index - 1])
                state = state._replace(
                    cache=KVCache(
                        k=tuple((*ks, k) for ks, k in zip(state.cache.k, block.k, strict=True)),
                        v=tuple((*vs, v) for vs, v in zip(state.cache.v, block.v, strict=True)),
                    )
                )
            state = window(index, state)
        return _slots_on_batch(model, outputs(state))

    slot_KC = jnp.arange(num_chunks * C, dtype=jnp.int32).reshape(num_chunks, C)
    if num_chunks == 1:
        outputs = decode_chunk(slot_KC[0])
    else:
        # One traced chunk, run num_chunks times: the cache holds C slots whatever R is.
        outputs = _slots_on_batch(model, jax.lax.map(decode_chunk, slot_KC), slot_axis=1)
        outputs = jax.tree.map(lambda a: a.reshape(num_chunks * C, *a.shape[2:])[:R], outputs)
        outputs = _slots_on_batch(model, outputs)
    return _result(outputs, prompts, prompt_of_slot_R)
