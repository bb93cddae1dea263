"""Array forms of the chain task's rows, at static shapes fixed by the config.

`encode_rows` gives what RL needs (prompts for the sampler, gold solutions for the reward, levels
for per-level metrics); `supervised_arrays` gives what the warm start needs (prompt + solution
sequences with a loss mask on the solution). Shapes depend only on the config and the number of
rows, never on the levels drawn, so nothing recompiles from batch to batch. Arrays are host numpy
int32/float32; hand them to `jnp.asarray` or `jax.device_put` with a sharding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from gdro_jax.tasks._chains import ChainTaskConfig
from gdro_jax.tasks._tokenizer import PAD_ID, encode_prompts, encode_solutions


class ChainArrays(NamedTuple):
    """Token arrays of N rows (see `encode_rows`); P and S are the config's maximum lengths."""

    prompt_tokens: np.ndarray  # [N, P] int32 <bos> + prompt, right-padded with PAD_ID
    prompt_lengths: np.ndarray  # [N] int32 real prompt tokens, <bos> included
    solution_tokens: np.ndarray  # [N, S] int32 solution + <eos>, right-padded with PAD_ID
    solution_lengths: np.ndarray  # [N] int32 real solution tokens, <eos> included
    levels: np.ndarray  # [N] int32 level 1..L of each row


class SupervisedArrays(NamedTuple):
    """Teacher-forcing sequences of N rows (see `supervised_arrays`); Q = P + S."""

    tokens: np.ndarray  # [N, Q] int32 <bos> + prompt + solution + <eos>, right-padded with PAD_ID
    loss_mask: np.ndarray  # [N, Q] float32 1.0 on the solution's tokens (<eos> included), else 0
    lengths: np.ndarray  # [N] int32 real tokens of each sequence


def _rows_field(rows: Sequence[dict], key: str) -> list:
    try:
        return [row[key] for row in rows]
    except KeyError as error:
        raise ValueError(f"rows must be dicts with a {key!r} key (a task row)") from error


def encode_rows(rows: Sequence[dict], config: ChainTaskConfig) -> ChainArrays:
    """Encodes task rows into fixed-shape prompt and gold-solution token arrays.

    The prompt arrays feed `gdro_jax.sampling.generate` (right padding with lengths); the
    solution arrays are the gold tokens the reward compares against: for a slot map
    `prompt_of_slot[R]`, pass `solution_tokens[prompt_of_slot]`.

    Args:
      rows: N rows from `build_splits` or `pretraining_rows` (levels at most `config.num_levels`).
      config: fixes the padded lengths `P = config.max_prompt_length` and
        `S = config.max_solution_length`.

    Returns:
      `ChainArrays` of int32 numpy arrays.
    """
    prompt_tokens, prompt_lengths = encode_prompts(
        _rows_field(rows, "prompt"), config.max_prompt_length
    )
    solution_tokens, solution_lengths = encode_solutions(
        _rows_field(rows, "solution"), config.max_solution_length
    )
    return ChainArrays(
        prompt_tokens=prompt_tokens,
        prompt_lengths=prompt_lengths,
        solution_tokens=solution_tokens,
        solution_lengths=solution_lengths,
        levels=np.asarray(_rows_field(rows, "level"), np.int32).reshape(len(rows)),
    )


def supervised_arrays(rows: Sequence[dict], config: ChainTaskConfig) -> SupervisedArrays:
    """Packs rows into prompt + solution sequences with a loss mask on the solution.

    Row i is `<bos> prompt solution <eos>` followed by `PAD_ID` up to `Q = config.sequence_length`.
    `loss_mask[i, t] = 1` when token t belongs to the solution (its `<eos>` included), i.e. the
    tokens the model must learn to produce. For next-token prediction with inputs
    `tokens[:, :-1]`, weight the loss of target `tokens[:, 1:]` by `loss_mask[:, 1:]`.

    Args:
      rows: N task rows.
      config: fixes `Q = config.max_prompt_length + config.max_solution_length`.

    Returns:
      `SupervisedArrays` of numpy arrays (int32 tokens and lengths, float32 mask).
    """
    arrays = encode_rows(rows, config)
    num_rows = len(rows)
    length = config.sequence_length
    position_NQ = np.arange(length)[None, :]
    prompt_end_N1 = arrays.prompt_lengths[:, None]
    lengths_N = arrays.prompt_lengths + arrays.solution_lengths
    solution_part_NQ = (position_NQ >= prompt_end_N1) & (position_NQ < lengths_N[:, None])
    tokens_NQ = np.full((num_rows, length), PAD_ID, np.int32)
    tokens_NQ[:, : config.max_prompt_length] = arrays.prompt_tokens
    # Each row's solution starts right after its own prompt: gather from the solution array.
    solution_index_NQ = np.clip(position_NQ - prompt_end_N1, 0, config.max_solution_length - 1)
    shifted_NQ = np.take_along_axis(arrays.solution_tokens, solution_index_NQ, axis=1)
    tokens_NQ = np.where(solution_part_NQ, shifted_NQ, tokens_NQ)
    tokens_NQ = np.where(position_NQ < lengths_N[:, None], tokens_NQ, PAD_ID).astype(np.int32)
    return SupervisedArrays(
        tokens=tokens_NQ,
        loss_mask=solution_part_NQ.astype(np.float32),
        lengths=lengths_N.astype(np.int32),
    )
