"""Continuous batching: a fixed number of decode lanes and a queue of requests, in one jitted loop.

The static sampler (`_generate`) decodes each chunk of slots until its longest completion stops:
the slots that stopped early ride along. Here the R requests (the plan's slots, in order) wait in
a queue; C lanes decode them, and a lane whose request stops (a stop id or the cap) takes the next
request at once, so the loop runs until the queue is empty and every lane has stopped, and the
work follows the tokens sampled rather than C x the longest completion.

Shapes stay static. Every lane owns a KV cache row of `S = P + M` slots: the request's prompt
left-aligned in slots `P - len .. P-1` (copied from the shared prefill of the N prompts when the
request enters), its completion in the ring of slots `P .. S-1`. Lanes are at different steps, so
decode step g writes every lane's new key/value at the one ring slot `P + g mod M` (in place),
and each lane attends to its own prefix and to the ring slots its request wrote; slots a previous
request left behind are masked. A refill (`lax.cond`, only on steps where a lane is free and the
queue is not empty) gathers the entering requests' prefixes, and their first tokens come from the
prefill's logits; a request's tokens, log-probs, length and finish reason land in its own row of
the [R, M] outputs.

Decode windows. The cache is kept in the static loop's blocks (`window_ends`): the prompts' P slots
with the ring's first window, then one block per later window of ring slots. A step reads the
first block and only the later blocks that some active lane has written into since its request
entered: the others are skipped (`lax.cond` per block and layer; the blocks read are joined by
their scores' maxima, `models._decoder._attention_over_live_blocks`), so a step's reads follow
the span of ring slots its live requests cover, not all M. Nothing moves: the ring wraps as
before, and the step's key/value goes into the block that holds its ring slot. With
`skip_dead_blocks=False` a step reads every block, the dead ones' slots masked, with no conds: on
a GPU a cond's predicate is copied to the host and waited for (unless XLA's command buffers take
the cond), one per block and layer a step, which may cost more than reading the dead blocks.
The same completions up to float rounding.

No queue. With a lane for every request (`decode_slots >= R`, the trainer's default), every
request enters at step 0 and ring slot g is written at step g, so the loop starts as the static
loop's windows: window i's steps read blocks 0..i whole and write into block i, with no cond.
On a CPU that is what keeps it level with the static loop where every request runs to the cap:
the per-block conds do the same work, but XLA:CPU runs them one at a time, where the static
loop's blocks run side by side on two cores (BENCHMARKS.md, "No queue: the static loop's windows
first"). The halved lanes (below) go on with the ring's conds. Each window is one more loop to
compile (at a cap of 1,024, 8 windows: 22 s against 18 on that CPU).

Halving after the queue. Once the queue is empty, the lanes whose requests stopped would ride
along until the longest request ends, and a step's cost follows the lanes (on a CPU almost in
proportion). So whenever at most half the lanes are still active, the loop moves them to the front
and goes on with half as many (`_lanes_after_queue`: while the count is even, at most
`lane_halvings` times, each size one more loop compiled into this program: on the engines
benchmark's CPU a step costs about 0.5 ms at 1 lane, 1.0 at 8 and 5.4 at 64). On a mesh each batch
shard halves its own lanes, so no cache row changes device.

Randomness is the static sampler's: request r's token t is drawn with `fold_in(fold_in(key, r), t)`,
whatever lane it ran in and whenever it entered, so both samplers give the same completions, equal
up to the rounding of matmuls whose kernel depends on the batch's composition (bit for bit on CPU
in the tests).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from gdro_jax.models import KVCache, constrain, mesh_shape
from gdro_jax.sampling._generate import (
    FinishReason,
    GenerationResult,
    _positions_on_batch,
    _prefill,
    _result,
    _set_up,
    _slots_on_batch,
    while_in_chunks,
    window_ends,
)

# The default most times the lanes halve once the queue is empty (`generate`'s lane_halvings).
# Six measured 1.11-1.17x four on the engines benchmark's long tail with a lane per request (a
# CPU, where a step's cost keeps falling with fewer lanes), but each halving is one more loop to
# compile: about 6 s more at 256 lanes, and `make test` 6:50 against 6:26 (BENCHMARKS.md).
LANE_HALVINGS = 4


class _Lanes(NamedTuple):
    """The continuous loop's carry: C lanes, the queue's head and the requests' outputs."""

    cache: KVCache  # L x blocks (windows) of [C, K, H, s] keys and [C, K, s, H] values
    request: jax.Array  # [C] int32 the lane's request (R: none yet)
    prompt_length: jax.Array  # [C] int32 its prompt's length
    step: jax.Array  # [C] int32 tokens its request has sampled
    last: jax.Array  # [C] int32 the last token sampled, fed at the next decode step
    done: jax.Array  # [C] bool the lane is free: its request stopped, or it has none
    next_request: jax.Array  # [] int32 the queue's head
    iterations: jax.Array  # [] int32 decode steps run
    tokens: jax.Array  # [R, M] int32
    logprobs: jax.Array  # [R, M] float32
    lengths: jax.Array  # [R] int32
    finish_reasons: jax.Array  # [R] int32


@functools.partial(
    jax.jit,
    static_argnames=(
        "graphdef",
        "max_new_tokens",
        "top_k",
        "greedy",
        "use_top_p",
        "pad_id",
        "decode_slots",
        "decode_window",
        "lane_halvings",
        "stop_check_every",
        "skip_dead_blocks",
    ),
)
def _generate_continuous(
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
    pad_id: int,
    decode_slots: int,
    decode_window: int = 0,
    lane_halvings: int = LANE_HALVINGS,
    stop_check_every: int = 1,
    skip_dead_blocks: bool = True,
) -> GenerationResult:
    model, sample, prompts = _set_up(
        graphdef, state, tokens_NP, lengths_N, pad_id=pad_id, temperature=temperature,
        top_p=top_p, top_k=top_k, greedy=greedy, use_top_p=use_top_p,
    )  # fmt: skip
    lengths_N = prompts.lengths
    P = tokens_NP.shape[1]
    R, M, C = prompt_of_slot_R.shape[0], max_new_tokens, decode_slots
    S = P + M
    # The cache in the static loop's blocks, one a decode window (the prompt and the ring's first
    # window, then one block per later window): a step reads the first block and the later ones
    # some active lane has written into since it entered, not all M ring slots.
    ends = window_ends(M, decode_window)
    logits_NV, prefix_N = _prefill(model, prompts.tokens, prompts.positions, prompts.valid)
    prefix_N = _positions_on_batch(model, prefix_N)
    layers = model.layer_slices()  # weights sliced once, outside the loop

    def draw(logits_CV, request_C, step_C):
        """Request r's token t from its own key, `fold_in(fold_in(key, r), t)`."""
        keys_C = jax.vmap(lambda r, t: jax.random.fold_in(jax.random.fold_in(key, r), t))(
            request_C, step_C
        )
        return sample(logits_CV, keys_C)

    def emit(lanes: _Lanes, active_C, token_C, logprob_C) -> _Lanes:
        """Writes the active lanes' tokens into their requests' rows and advances them."""
        row_C = jnp.where(active_C, lanes.request, R)  # row R is out of bounds: dropped
        step_C = lanes.step + active_C.astype(jnp.int32)
        stopped_C = active_C & jnp.any(token_C[:, None] == eos_ids_E[None, :], axis=-1)
        return lanes._replace(
            step=step_C,
            last=jnp.where(active_C, token_C, lanes.last),
            done=lanes.done | stopped_C | (active_C & (step_C >= M)),
            tokens=lanes.tokens.at[row_C, lanes.step].set(token_C, mode="drop"),
            logprobs=lanes.logprobs.at[row_C, lanes.step].set(logprob_C, mode="drop"),
            lengths=lanes.lengths.at[row_C].set(step_C, mode="drop"),
            finish_reasons=lanes.finish_reasons.at[jnp.where(stopped_C, row_C, R)].set(
                int(FinishReason.EOS), mode="drop"
            ),
        )

    def enter_requests(lanes: _Lanes) -> _Lanes:
        """Free lanes take the next requests in queue order (lane order among them)."""
        free_C = lanes.done
        entering_C = lanes.next_request + jnp.cumsum(free_C.astype(jnp.int32)) - 1
        take_C = free_C & (entering_C < R)
        request_C = jnp.where(take_C, entering_C, lanes.request)
        prompt_C = prompt_of_slot_R[jnp.minimum(request_C, R - 1)]
        # Gathered from the prefill's cache split by position, as the static loop's chunks: a
        # lane's prompt rows then reach its device by one all-to-all per layer.
        gathered = _positions_on_batch(model, jax.tree.map(lambda a: a[prompt_C], prefix_N))
        take_C111 = take_C[:, None, None, None]

        def enter(blocks, prefix, specs, position_axis):
            first = blocks[0]  # the prompt's P slots, then the ring's first block
            kept = jax.lax.slice_in_dim(first, 0, P, axis=position_axis)
            # The rows moved to their lanes' devices first (one all-to-all of the C x P rows):
            # left split by position, XLA moves the lanes' whole cache rows to that split
            # instead, and back, holding copies of every layer's cache (Qwen3-8B on fsdp=8, 128
            # lanes: 75.0 GiB of rollout buffers; 48.0 with the rows moved first).
            prefix = jnp.where(take_C111, constrain(prefix, specs, model.mesh), kept)
            first = jax.lax.dynamic_update_slice_in_dim(first, prefix, 0, position_axis)
            return (constrain(first, specs, model.mesh), *blocks[1:])

        cache = KVCache(
            k=tuple(
                enter(c, p, model.sharding.cache_bkhs, 3)
                for c, p in zip(lanes.cache.k, gathered.k, strict=True)
            ),
            v=tuple(
                enter(c, p, model.sharding.cache_bksh, 2)
                for c, p in zip(lanes.cache.v, gathered.v, strict=True)
            ),
        )
        lanes = lanes._replace(
            cache=cache,
            request=request_C,
            prompt_length=jnp.where(take_C, lengths_N[prompt_C], lanes.prompt_length),
            step=jnp.where(take_C, 0, lanes.step),
            done=lanes.done & ~take_C,
            next_request=lanes.next_request + jnp.sum(take_C, dtype=jnp.int32),
        )
        # The first token comes from the prefill's last logits.
        token_C, logprob_C = draw(logits_NV[prompt_C], request_C, lanes.step)
        return emit(lanes, take_C, token_C, logprob_C)

    def decode(lanes: _Lanes, refill: bool = True, window: int | None = None) -> _Lanes:
        # The completion slots P .. S-1 are a ring shared by the lanes: decode step g writes every
        # lane's key/value at slot P + g mod M (one in-place write for the batch), and a lane
        # reads the `step` ring slots its request wrote since it entered (at most M - 1 < M).
        # `window` i (no queue): the step reads blocks 0..i whole and writes into block i, as the
        # static loop's window i, with no cond.
        ring = lanes.iterations % M
        width = S if window is None else P + ends[window]
        column_S = jnp.arange(width) - P
        written_CS = (column_S >= 0) & (jnp.remainder(ring - column_S, M) < lanes.step[:, None])
        prompt_CS = (column_S < 0) & (column_S >= -lanes.prompt_length[:, None])
        active_C = ~lanes.done
        # A later ring block is read when an active lane has written into it since it entered
        # (the other lanes' outputs are dropped); the first block, with the prompts, always.
        # One block: no choice to make, and no cond.
        live_n, read = None, lanes.cache
        if window is not None:
            read = KVCache(
                k=tuple(blocks[: window + 1] for blocks in lanes.cache.k),
                v=tuple(blocks[: window + 1] for blocks in lanes.cache.v),
            )
        elif len(ends) > 1 and not skip_dead_blocks:
            live_n = True  # every block read, masked: no conds
        elif len(ends) > 1:
            read_CM = written_CS[:, P:] & active_C[:, None]
            live_n = jnp.stack(
                [jnp.bool_(True)]
                + [jnp.any(read_CM[:, a:e]) for a, e in zip(ends[:-1], ends[1:], strict=True)]
            )
        h_C1D, cache = model.extend_cache(
            lanes.last[:, None],
            (lanes.prompt_length + lanes.step - 1)[:, None],
            cache=read,
            cache_index=P + ring,
            key_mask_BS=prompt_CS | written_CS,
            layers=layers,
            causal_by_slot=False,
            live_blocks=live_n,
        )
        if window is not None:  # the blocks after the window, untouched
            cache = KVCache(
                k=tuple(
                    (*new, *old[window + 1 :])
                    for new, old in zip(cache.k, lanes.cache.k, strict=True)
                ),
                v=tuple(
                    (*new, *old[window + 1 :])
                    for new, old in zip(cache.v, lanes.cache.v, strict=True)
                ),
            )
        token_C, logprob_C = draw(model.logits(h_C1D)[:, 0], lanes.request, lanes.step)
        lanes = lanes._replace(cache=cache, iterations=lanes.iterations + 1)
        lanes = emit(lanes, active_C, token_C, logprob_C)
        if not refill:
            return lanes
        can_refill = jnp.any(lanes.done) & (lanes.next_request < R)
        return jax.lax.cond(can_refill, enter_requests, lambda x: x, lanes)

    # Halving after the queue (module docstring): shard d of the mesh's batch axes holds lanes
    # d * C/n .. (d + 1) * C/n - 1, and the shard with the most active lanes decides.
    data, fsdp, _ = mesh_shape(model.mesh)
    shards = data * fsdp
    sizes = _lanes_after_queue(C, shards, lane_halvings)

    def busy(lanes: _Lanes, halve_at: int | None = None) -> jax.Array:
        # Every step samples a token of some request, so R x M steps bound the loop: a broken
        # queue then shows in the outputs instead of hanging.
        waiting = jnp.any(~lanes.done) | (lanes.next_request < R)
        if halve_at is not None:  # the queue is empty, and each shard has few enough active
            active_n = jnp.sum(~lanes.done.reshape(shards, -1), axis=1)
            few = (lanes.next_request >= R) & (jnp.max(active_n) <= halve_at // shards)
            waiting = waiting & ~few
        return waiting & (lanes.iterations < R * M)

    def halve(lanes: _Lanes, size: int) -> _Lanes:
        """`size` lanes, size/n from each shard: its active ones (at most size/n), then stopped
        ones, each lane with its cache rows, state and request."""
        keep_nc = jnp.argsort(lanes.done.reshape(shards, -1), axis=1, stable=True)
        keep_nc = keep_nc[:, : size // shards]

        def take(a, spec=None):
            a_n = a.reshape(shards, -1, *a.shape[1:])
            if spec is not None:  # the shard axis on the batch axes, the rest as the lanes'
                a_n = constrain(a_n, jax.sharding.PartitionSpec(*spec[:1], None, *spec[1:]),
                                model.mesh)  # fmt: skip
            kept = jax.vmap(lambda rows, keep: rows[keep])(a_n, keep_nc)
            kept = kept.reshape(size, *a.shape[1:])
            return kept if spec is None else constrain(kept, spec, model.mesh)

        specs = model.sharding
        cache = KVCache(
            k=tuple(tuple(take(b, specs.cache_bkhs) for b in bs) for bs in lanes.cache.k),
            v=tuple(tuple(take(b, specs.cache_bksh) for b in bs) for bs in lanes.cache.v),
        )
        per_lane = ("request", "prompt_length", "step", "last", "done")
        return lanes._replace(cache=cache, **{f: take(getattr(lanes, f)) for f in per_lane})

    blocks = [model.init_cache(C, P + ends[0])] + [
        model.init_cache(C, e - a) for a, e in zip(ends[:-1], ends[1:], strict=True)
    ]
    lanes = _Lanes(
        cache=KVCache(
            k=tuple(zip(*(b.k for b in blocks), strict=True)),
            v=tuple(zip(*(b.v for b in blocks), strict=True)),
        ),
        request=jnp.full((C,), R, jnp.int32),
        prompt_length=jnp.ones((C,), jnp.int32),
        step=jnp.ones((C,), jnp.int32),
        last=jnp.full((C,), pad_id, jnp.int32),
        done=jnp.ones((C,), bool),
        next_request=jnp.zeros((), jnp.int32),
        iterations=jnp.zeros((), jnp.int32),
        tokens=jnp.full((R, M), pad_id, jnp.int32),
        logprobs=jnp.zeros((R, M), jnp.float32),
        lengths=jnp.zeros((R,), jnp.int32),
        finish_reasons=jnp.full((R,), int(FinishReason.LENGTH), jnp.int32),
    )
    halve_at = sizes[0] if sizes else None
    lanes = enter_requests(lanes)
    if C >= R:
        # No queue, every request in its lane from the start: no refill, and ring slot g is
        # written at step g by every lane still active, so window i's steps read blocks 0..i and
        # write into block i (the static loop's windows).
        # Steps in chunks (`stop_check_every`) stay within the window's block.
        for i, end in enumerate(ends):
            lanes = while_in_chunks(
                lambda x, e=end: busy(x, halve_at) & (x.iterations < e),
                functools.partial(decode, refill=False, window=i),
                lanes,
                stop_check_every,
                room=lambda x, e=end: x.iterations + stop_check_every <= e,
            )
    else:
        lanes = while_in_chunks(lambda x: busy(x, halve_at), decode, lanes, stop_check_every)
    for i, size in enumerate(sizes):
        # The queue is empty: no refill, and no more than `size` lanes still active. A chunk's
        # steps after the last lane stopped emit nothing.
        halve_at = sizes[i + 1] if i + 1 < len(sizes) else None
        lanes = while_in_chunks(
            lambda x, h=halve_at: busy(x, h), functools.partial(decode, refill=False),
            halve(lanes, size), stop_check_every,
        )  # fmt: skip
    outputs = _slots_on_batch(
        model, (lanes.tokens, lanes.logprobs, lanes.lengths, lanes.finish_reasons)
    )
    return _result(outputs, prompts, prompt_of_slot_R)


def _lanes_after_queue(lanes: int, shards: int, halvings: int) -> list[int]:
    """The lane counts the loop halves to once the queue is empty: while even, at most `halvings`
    times, and never below one lane per batch shard (so the lanes stay split)."""
    sizes = []
    while len(sizes) < halvings and lanes % 2 == 0 and (lanes // 2) % shards == 0:
        lanes //= 2
        sizes.append(lanes)
    return sizes
