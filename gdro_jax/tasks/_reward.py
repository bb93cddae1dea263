"""The chain task's reward: exact match of the whole worked solution, jittable, plus a reference.

A completion is correct when, read up to its first `<eos>`, it equals the gold solution token for
token: every step, every intermediate value and the final answer, with nothing added or missing
before `<eos>`. Tokens after the first `<eos>` (or past the completion's length) are ignored; a
completion without `<eos>` within its length is wrong. Grading the whole chain is what keeps
guessing out (SPEC 11): the final digit alone is right 10 % of the time by chance, a chain with
random step results only `10^-l` of the time.

`solution_correct` / `solution_reward` are pure `jnp` (jit, vmap, any static R, T, S; written for
one sequence and vmapped over R). `grade_text` / `grade_tokens` are the plain-Python reference on
strings that the tests hold them to.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from gdro_jax.tasks._tokenizer import EOS_ID, EOS_TOKEN, decode


def _correct_one(
    completion_W: jax.Array, gold_W: jax.Array, length: jax.Array, eos_id: int
) -> jax.Array:
    """Exact match of one completion against one gold solution, both padded to width W.

    The completion must equal the gold through the gold's first `<eos>` (so the completion's
    first `<eos>` is at the same place) and that `<eos>` must lie within the completion's length.
    """
    position_W = jnp.arange(completion_W.shape[0])
    gold_eos_W = gold_W == eos_id
    gold_end = jnp.argmax(gold_eos_W)
    same_through_eos = jnp.all((completion_W == gold_W) | (position_W > gold_end))
    return jnp.any(gold_eos_W) & same_through_eos & (gold_end < length)


def solution_correct(
    completion_tokens: ArrayLike,
    gold_tokens: ArrayLike,
    *,
    completion_lengths: ArrayLike | None = None,
    eos_id: int = EOS_ID,
) -> jax.Array:
    """Whether each completion reproduces its gold solution exactly, up to and including `<eos>`.

    Args:
      completion_tokens: int[R, T] sampled tokens of R slots (e.g. `GenerationResult.tokens`).
      gold_tokens: int[R, S] each slot's gold solution ending in `eos_id` and padded after it
        (`ChainArrays.solution_tokens[prompt_of_slot]`). T and S may differ.
      completion_lengths: optional int[R] generated tokens per slot (`GenerationResult.lengths`);
        tokens at positions >= length do not count. Default: all T.
      eos_id: the end-of-solution id.

    Returns:
      bool[R], True where the completion's tokens up to its first `<eos>` (within its length)
      equal the gold tokens up to the gold's first `<eos>`. A gold row without `<eos>` matches
      nothing.
    """
    completion_RT = jnp.asarray(completion_tokens, jnp.int32)
    gold_RS = jnp.asarray(gold_tokens, jnp.int32)
    chex.assert_rank([completion_RT, gold_RS], 2)
    chex.assert_equal_shape_prefix([completion_RT, gold_RS], 1)
    num_slots, max_new = completion_RT.shape
    if completion_lengths is None:
        length_R = jnp.full((num_slots,), max_new, jnp.int32)
    else:
        length_R = jnp.asarray(completion_lengths, jnp.int32)
        chex.assert_shape(length_R, (num_slots,))
    # Pad both to one width with distinct negative ids, which never equal a token or each other.
    width = max(max_new, gold_RS.shape[1])
    completion_RW = jnp.pad(completion_RT, ((0, 0), (0, width - max_new)), constant_values=-1)
    gold_RW = jnp.pad(gold_RS, ((0, 0), (0, width - gold_RS.shape[1])), constant_values=-2)
    return jax.vmap(_correct_one, in_axes=(0, 0, 0, None))(completion_RW, gold_RW, length_R, eos_id)


def solution_reward(
    completion_tokens: ArrayLike,
    gold_tokens: ArrayLike,
    *,
    completion_lengths: ArrayLike | None = None,
    reward_values: tuple[float, float] = (0.0, 1.0),
    eos_id: int = EOS_ID,
) -> jax.Array:
    """The task reward: `reward_values[1]` for an exact solution, `reward_values[0]` otherwise.

    Args:
      completion_tokens, gold_tokens, completion_lengths, eos_id: as in `solution_correct`.
      reward_values: `(wrong, correct)`; `(0.0, 1.0)` (default) or SPEC 2's `(-1.0, 1.0)`. Python
        numbers (bind them with `functools.partial` before `jax.jit`), wrong < correct.

    Returns:
      float32[R] rewards.

    References:
      SPEC section 2: rewards `+1` correct, `-1` wrong, configurable to `{0, 1}`.
    """
    if (
        not isinstance(reward_values, Sequence)
        or len(reward_values) != 2
        or not all(isinstance(v, numbers.Real) for v in reward_values)
        or not np.all(np.isfinite(reward_values))
        or not reward_values[0] < reward_values[1]
    ):
        raise ValueError(
            "reward_values must be two finite numbers (wrong, correct) with wrong < correct, "
            f"got reward_values={reward_values!r}"
        )
    correct_R = solution_correct(
        completion_tokens, gold_tokens, completion_lengths=completion_lengths, eos_id=eos_id
    )
    wrong, right = (float(v) for v in reward_values)
    return jnp.where(correct_R, jnp.float32(right), jnp.float32(wrong))


def grade_text(completion_text: str, gold_solution: str) -> bool:
    """Reference grader on strings: the text before the first `<eos>` equals the gold solution.

    Args:
      completion_text: the decoded completion with special tokens written out
        (`decode(ids, skip_special_tokens=False)`), so `<pad>`/`<bos>` stay visible.
      gold_solution: the row's `"solution"` string (no `<eos>`).

    Returns:
      True for an exact whole-chain match followed by `<eos>`; False otherwise, including when
      the completion has no `<eos>`.
    """
    head, found, _ = completion_text.partition(EOS_TOKEN)
    return bool(found) and head == gold_solution


def grade_tokens(
    completion_ids: Sequence[int] | np.ndarray, gold_solution: str, *, length: int | None = None
) -> bool:
    """Reference grader on token ids: decodes the first `length` ids and calls `grade_text`.

    Args:
      completion_ids: one completion's ids.
      gold_solution: the row's `"solution"` string.
      length: generated tokens to read (default: all).

    Returns:
      `grade_text(decode(completion_ids[:length], skip_special_tokens=False), gold_solution)`.
    """
    ids = np.asarray(completion_ids).reshape(-1)
    if length is not None:
        ids = ids[: int(length)]
    return grade_text(decode(ids, skip_special_tokens=False), gold_solution)
