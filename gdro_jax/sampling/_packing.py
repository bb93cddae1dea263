"""Sequences packed into fixed-length rows: the trainer's forward passes at a cost in proportion
to the real tokens, with static shapes.

Each slot's sequence (its prompt's real tokens, then its completion's) goes whole into one row of
`row_length` tokens, beside others (first-fit decreasing by length, a `lax.scan`). A packed row
carries segment ids (`i + 1` for slot `i`, 0 for the padding after the last sequence) and
per-segment positions (0 at each sequence's first token), so attention stays causal within a
segment and never crosses one (`Decoder.hidden_states(..., segment_ids_BT=...)`) and RoPE sees the
positions the padded layout gives.

The buffer keeps the worst case, one row per slot (token ids are cheap); `num_rows_used` says how
many rows hold a sequence, and `packed_completion_logprobs` runs passes of `rows_per_pass` rows
only over those (a `lax.fori_loop` with a traced trip count), so a step of short completions costs
fewer passes and nothing recompiles when the lengths change.

References:
  Krell et al., 2021, "Efficient Sequence Packing without Cross-contamination", arXiv 2107.02027;
  the segment-id packing of t5x and MaxText.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from gdro_jax.models import Decoder
from gdro_jax.sampling._logprobs import sequence_logprobs


class PackedRows(NamedTuple):
    """Sequences packed into rows; every array is static-shaped (the worst case)."""

    tokens_BL: jax.Array  # [B, L] int32 token ids, 0 in padding
    positions_BL: jax.Array  # [B, L] int32 position within the token's sequence
    segments_BL: jax.Array  # [B, L] int32 i + 1 for slot i's tokens, 0 for padding
    row_S: jax.Array  # [S] int32 the row of each slot's sequence
    start_S: jax.Array  # [S] int32 the column of its first token
    num_rows_used: jax.Array  # [] int32 rows holding a sequence (they come first)


def pack_layout(lengths_S: jax.Array, *, row_length: int, num_rows: int):
    """Where each sequence goes: first-fit decreasing over `num_rows` rows of `row_length`.

    Sequences are placed longest first (ties by index), each in the first row with room. A
    sequence never spans rows; every length must be at most `row_length`, and `num_rows >= S`
    guarantees a row with room (the worst case, one sequence per row).

    Args:
      lengths_S: [S] int sequence lengths, `0 <= length <= row_length`.
      row_length: L, tokens per row.
      num_rows: rows available.

    Returns:
      `(row_S, start_S, num_rows_used)`: each sequence's row and first column, and how many rows
      hold a sequence (the rows in use are the first ones).
    """
    chex.assert_rank(lengths_S, 1)
    num_sequences = lengths_S.shape[0]
    if num_rows < num_sequences:
        raise ValueError(f"num_rows must be at least the {num_sequences} sequences, got {num_rows}")
    lengths_S = jnp.asarray(lengths_S, jnp.int32)
    order_S = jnp.argsort(-lengths_S, stable=True)

    def place(free_B, length):
        row = jnp.argmax(free_B >= length)  # the first row with room
        start = row_length - free_B[row]
        return free_B.at[row].add(-length), (row, start)

    free_B = jnp.full((num_rows,), row_length, jnp.int32)
    free_B, (row_sorted, start_sorted) = jax.lax.scan(place, free_B, lengths_S[order_S])
    row_S = jnp.zeros_like(row_sorted).at[order_S].set(row_sorted)
    start_S = jnp.zeros_like(start_sorted).at[order_S].set(start_sorted)
    num_rows_used = jnp.sum(free_B < row_length, dtype=jnp.int32)
    return row_S.astype(jnp.int32), start_S.astype(jnp.int32), num_rows_used


def pack_completions(
    prompt_tokens_SP: jax.Array,
    prompt_lengths_S: jax.Array,
    completion_tokens_SM: jax.Array,
    completion_lengths_S: jax.Array,
    *,
    num_rows: int | None = None,
) -> PackedRows:
    """Packs each slot's prompt (left-padded, as the sampler returns it) and completion
    (right-padded) into rows of `P + M` tokens.

    Args:
      prompt_tokens_SP: [S, P] left-padded prompts.
      prompt_lengths_S: [S] their lengths.
      completion_tokens_SM: [S, M] completions.
      completion_lengths_S: [S] their lengths.
      num_rows: rows in the buffer (default S, the worst case); at least S.

    Returns:
      `PackedRows` of `num_rows` rows of `P + M` tokens.
    """
    chex.assert_rank([prompt_tokens_SP, completion_tokens_SM], 2)
    num_slots, width = prompt_tokens_SP.shape
    max_new_tokens = completion_tokens_SM.shape[1]
    row_length = width + max_new_tokens
    num_rows = num_slots if num_rows is None else num_rows
    prompt_lengths_S = jnp.asarray(prompt_lengths_S, jnp.int32)
    lengths_S = prompt_lengths_S + jnp.asarray(completion_lengths_S, jnp.int32)
    row_S, start_S, num_rows_used = pack_layout(lengths_S, row_length=row_length, num_rows=num_rows)
    # Each slot's sequence from its first real token: the padded row shifted left by its padding.
    padded_ST = jnp.concatenate([prompt_tokens_SP, completion_tokens_SM], axis=1)
    column_T = jnp.arange(row_length, dtype=jnp.int32)
    source_ST = jnp.minimum((width - prompt_lengths_S)[:, None] + column_T[None], row_length - 1)
    sequence_ST = jnp.take_along_axis(padded_ST, source_ST, axis=1)
    # Scattered to row * L + start + t; a column past the sequence's end is dropped.
    target_ST = (row_S * row_length + start_S)[:, None] + column_T[None]
    target_ST = jnp.where(column_T[None] < lengths_S[:, None], target_ST, num_rows * row_length)

    def scatter(values_ST):
        flat = jnp.zeros((num_rows * row_length,), jnp.int32)
        flat = flat.at[target_ST.reshape(-1)].set(values_ST.reshape(-1), mode="drop")
        return flat.reshape(num_rows, row_length)

    segment_ST = jnp.broadcast_to(
        jnp.arange(1, num_slots + 1, dtype=jnp.int32)[:, None], source_ST.shape
    )
    return PackedRows(
        tokens_BL=scatter(sequence_ST.astype(jnp.int32)),
        positions_BL=scatter(jnp.broadcast_to(column_T[None], source_ST.shape)),
        segments_BL=scatter(segment_ST),
        row_S=row_S,
        start_S=start_S,
        num_rows_used=num_rows_used,
    )


def packed_rows_logprobs(
    model: Decoder,
    packed: PackedRows,
    first_row: jax.Array | int,
    num_rows: int,
    *,
    temperature: jax.typing.ArrayLike = 1.0,
    chunk_size: int | None = None,
) -> jax.Array:
    """`sequence_logprobs` of the packed rows `first_row .. first_row + num_rows - 1`:
    [num_rows, L] float32, each token's log-prob given the earlier tokens of its own segment
    (0 at a segment's first token and in padding)."""

    def rows(x_BL):
        return jax.lax.dynamic_slice_in_dim(x_BL, first_row, num_rows, axis=0)

    segments_BL = rows(packed.segments_BL)
    return sequence_logprobs(
        model,
        rows(packed.tokens_BL),
        attention_mask_BT=segments_BL > 0,
        positions_BT=rows(packed.positions_BL),
        segment_ids_BT=segments_BL,
        temperature=temperature,
        chunk_size=chunk_size,
    )


def unpack_completion_logprobs(
    logprobs_BL: jax.Array,
    packed: PackedRows,
    first_row: jax.Array | int,
    prompt_lengths_S: jax.Array,
    completion_lengths_S: jax.Array,
    max_new_tokens: int,
) -> tuple[jax.Array, jax.Array]:
    """The completion tokens' log-probs of the slots whose rows `logprobs_BL` holds (rows
    `first_row ..`), in the padded `[S, M]` layout.

    Returns:
      `(logprobs_SM, in_rows_S)`: float32, 0 for tokens past a completion's end and for slots in
      other rows; and which slots these rows hold.
    """
    num_rows, row_length = logprobs_BL.shape
    local_row_S = packed.row_S - first_row
    in_rows_S = (local_row_S >= 0) & (local_row_S < num_rows)
    column_SM = (packed.start_S + jnp.asarray(prompt_lengths_S, jnp.int32))[:, None] + jnp.arange(
        max_new_tokens, dtype=jnp.int32
    )[None]
    flat_SM = jnp.clip(local_row_S, 0, num_rows - 1)[:, None] * row_length + jnp.minimum(
        column_SM, row_length - 1
    )
    values_SM = jnp.take(logprobs_BL.reshape(-1), flat_SM.reshape(-1)).reshape(flat_SM.shape)
    live_SM = in_rows_S[:, None] & (
        jnp.arange(max_new_tokens)[None] < jnp.asarray(completion_lengths_S)[:, None]
    )
    return jnp.where(live_SM, values_SM, 0.0), in_rows_S


def packed_passes(packed: PackedRows, rows_per_pass: int) -> jax.Array:
    """[] int32: passes of `rows_per_pass` rows that cover the rows in use."""
    return (packed.num_rows_used + rows_per_pass - 1) // rows_per_pass


def packed_buffer_rows(num_slots: int, rows_per_pass: int) -> int:
    """Rows of a packed buffer for `num_slots` sequences: the worst case (one a row), rounded up
    to whole passes so that no pass reads past the buffer."""
    return -(-num_slots // rows_per_pass) * rows_per_pass


def packed_completion_logprobs(
    model: Decoder,
    prompt_tokens_SP: jax.Array,
    prompt_lengths_S: jax.Array,
    completion_tokens_SM: jax.Array,
    completion_lengths_S: jax.Array,
    *,
    rows_per_pass: int,
    temperature: jax.typing.ArrayLike = 1.0,
    chunk_size: int | None = None,
) -> jax.Array:
    """`completion_logprobs` computed on packed rows: the same `[S, M]` values (up to float
    rounding), at a cost of `ceil(rows in use / rows_per_pass)` passes of `rows_per_pass` rows.

    Not differentiated (a loop with a traced trip count): for log-probs under fixed parameters,
    e.g. the trainer's rescoring of another engine's samples.
    """
    num_slots, max_new_tokens = completion_tokens_SM.shape
    packed = pack_completions(
        prompt_tokens_SP,
        prompt_lengths_S,
        completion_tokens_SM,
        completion_lengths_S,
        num_rows=packed_buffer_rows(num_slots, rows_per_pass),
    )

    def one_pass(index, logprobs_SM):
        first_row = index * rows_per_pass
        logprobs_BL = packed_rows_logprobs(
            model, packed, first_row, rows_per_pass, temperature=temperature, chunk_size=chunk_size
        )
        values_SM, _ = unpack_completion_logprobs(
            logprobs_BL, packed, first_row, prompt_lengths_S, completion_lengths_S, max_new_tokens
        )
        return logprobs_SM + values_SM

    zeros_SM = jnp.zeros((num_slots, max_new_tokens), jnp.float32)
    return jax.lax.fori_loop(0, packed_passes(packed, rows_per_pass), one_pass, zeros_SM)
