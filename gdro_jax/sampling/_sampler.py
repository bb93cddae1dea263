"""`generate`: checks its arguments and runs one of the two KV-cache decode loops, continuous
batching (`_continuous`, the default) or static chunks (`_generate`)."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gdro_jax.models import Decoder
from gdro_jax.sampling._continuous import LANE_HALVINGS, _generate_continuous
from gdro_jax.sampling._generate import GenerationResult, _generate

BATCHING = ("continuous", "static")


def _check_count(name: str, value, meaning: str = "", least: int = 0) -> None:
    """Raises ValueError naming `name` unless `value` is an int >= `least` (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an int >= {least}{meaning}, got {name}={value!r}")


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
    micro_batch_slots: int | None = None,
    batching: str = "continuous",
    decode_window: int = 0,
    lane_halvings: int = LANE_HALVINGS,
    stop_check_every: int = 1,
    skip_dead_blocks: bool = True,
) -> GenerationResult:
    """Samples completions of a batch of prompts with a KV cache, in one compiled loop.

    Compiles once per (number of prompts, number of slots, padded prompt length, max_new_tokens,
    top_k, greedy or not, top-p on or off, number of stop ids, decode slots, batching); the
    temperature and top_p values, the stop ids, the slot map and the key are traced, so changing
    them does not recompile.

    Args:
      model: the Decoder (sharded or not).
      prompt_tokens: N prompts, either a list of token-id lists (padded on the host to a multiple
        of `prompt_bucket`), or an int array [N, P] whose row i holds prompt i in its first
        `prompt_lengths[i]` entries (right padding; P is used as is). Every prompt needs at least
        one token.
      key: PRNG key; the same key and inputs give the same result. Slot r's token t is drawn
        with `fold_in(fold_in(key, r), t)`, so a slot's completion does not depend on the other
        slots or on `micro_batch_slots`.
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
        prefill every slot separately (False; same result, for benchmarking: it implies
        `batching="static"`, as continuous batching copies prompts from the shared prefill).
      micro_batch_slots: C, the slots decoded at once: the KV cache holds C x (P + M) slots
        instead of R x (P + M), next to the N x P prefill cache. None or 0: all R at once.
      batching: how the R slots share the C decode slots. "continuous" (the default): the R
        slots are a queue of requests, and a decode slot whose request stops takes the next one
        at once, so the decode steps follow the tokens sampled (pays with C < R and uneven
        lengths); once the queue is empty, the lanes halve whenever at most half are active.
        "static": the slots are decoded in chunks of C (a `lax.map` inside the same compiled
        function, the last chunk padded), each chunk until its longest completion stops. Same
        completions either way, up to float rounding (see the module docstrings).
      decode_window: the completion slots of the KV cache in blocks of this many tokens
        (`window_ends`; 0: at least 128 tokens and at most 8 blocks), so a decode step reads
        what is live, not all P + M. Static batching: the cache grows a block at a time and a
        step reads its live positions rounded up to a block (each window compiled into the
        loop). Continuous: the lanes' ring of completion slots is in blocks, and a step skips
        (`lax.cond`) the blocks no active lane has written into since it entered. The same
        completions up to float rounding; M: one block, every slot read at every step.
      lane_halvings: continuous batching, once the queue is empty: the most times the decode
        slots halve, whenever at most half of them are active (while C is even, and on a mesh
        while every batch shard keeps a slot). Each is one more decode loop in the program.
      stop_check_every: decode this many steps per iteration of the decode loop, so its stop
        condition is checked (on a GPU: copied to the host, and waited for) once per that many
        steps; a loop that could stop inside runs at most that many - 1 steps more, steps that
        change no output. The same completions; above 1 each loop compiles twice (the chunk's,
        then the one step at a time that ends a window).
      skip_dead_blocks: continuous batching with a queue or halved lanes: skip (`lax.cond` per
        block and layer) the ring's blocks no active lane has written into (True), or read
        every block, their dead slots masked, with no conds (False: on a GPU each cond waits
        for its predicate on the host). The same completions up to float rounding.

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
    _check_count("decode_window", decode_window, " (0: automatic)")
    _check_count("lane_halvings", lane_halvings)
    _check_count("stop_check_every", stop_check_every, least=1)
    if not isinstance(skip_dead_blocks, bool):
        raise ValueError(f"skip_dead_blocks must be True or False, got {skip_dead_blocks!r}")
    if micro_batch_slots is not None and (
        isinstance(micro_batch_slots, bool)
        or not isinstance(micro_batch_slots, int)
        or micro_batch_slots < 0
    ):
        raise ValueError(
            "micro_batch_slots must be None or an int >= 0 (0: all slots at once), got "
            f"micro_batch_slots={micro_batch_slots!r}"
        )

    if batching not in BATCHING:
        raise ValueError(f"batching must be one of {', '.join(BATCHING)}, got {batching!r}")

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
    num_slots = np.shape(prompt_of_slot)[0]
    graphdef, state = nnx.split(model)
    arrays = (
        graphdef,
        state,
        jnp.asarray(tokens, jnp.int32),
        jnp.asarray(lengths, jnp.int32),
        jnp.asarray(prompt_of_slot, jnp.int32),
        jnp.asarray(eos_ids, jnp.int32).reshape(-1),
        key,
        jnp.asarray(temperature if temperature > 0 else 1.0, jnp.float32),
        jnp.asarray(top_p, jnp.float32),
    )
    static = dict(
        max_new_tokens=max_new_tokens,
        top_k=top_k,
        greedy=temperature == 0,
        use_top_p=top_p < 1,
        pad_id=int(pad_id),
    )
    slots = min(micro_batch_slots or num_slots, num_slots)
    if batching == "continuous" and share_prefill:
        return _generate_continuous(
            *arrays, **static, decode_slots=slots, decode_window=decode_window,
            lane_halvings=lane_halvings, stop_check_every=stop_check_every,
            skip_dead_blocks=skip_dead_blocks,
        )  # fmt: skip
    return _generate(
        *arrays,
        **static,
        share_prefill=share_prefill,
        micro_batch_slots=slots,
        decode_window=decode_window,
        stop_check_every=stop_check_every,
    )
