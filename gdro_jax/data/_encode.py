"""Math prompts as token arrays: the training pool's right-padded prompts and the stop tokens.

Used by the trainer's math task (`gdro_jax.tasks.math_task`); prompts are already formatted
(suffix, chat template) by `load_preset`.
"""

from __future__ import annotations

import numpy as np


def encode_prompts(
    tokenizer, rows: list[dict], max_prompt_tokens: int, *, on_long_prompt: str = "skip"
) -> tuple[np.ndarray, np.ndarray, list[dict], int]:
    """Tokenises `rows[i]["prompt"]` into right-padded arrays.

    Prompts longer than `max_prompt_tokens` are dropped and counted (`on_long_prompt="skip"`),
    or raise naming the row (`"raise"`): truncating a math problem would change the problem.

    Returns:
      `(tokens [D, P] int32, lengths [D] int32, kept_rows, num_skipped)` with `P` the longest
      kept prompt.
    """
    if on_long_prompt not in ("skip", "raise"):
        raise ValueError(
            f"on_long_prompt must be 'skip' or 'raise', got on_long_prompt={on_long_prompt!r}"
        )
    encoded = tokenizer([row["prompt"] for row in rows], add_special_tokens=False)["input_ids"]
    kept_rows, kept_ids = [], []
    for index, (row, ids) in enumerate(zip(rows, encoded, strict=True)):
        if len(ids) > max_prompt_tokens:
            if on_long_prompt == "raise":
                raise ValueError(
                    f"row {index} (id={row['id']!r}) has a prompt of {len(ids)} tokens, more "
                    f"than max_prompt_tokens={max_prompt_tokens}"
                )
            continue
        kept_rows.append(row)
        kept_ids.append(ids)
    if not kept_rows:
        raise ValueError(
            f"every prompt is longer than max_prompt_tokens={max_prompt_tokens}: nothing to "
            "train on"
        )
    width = max(len(ids) for ids in kept_ids)
    tokens = np.zeros((len(kept_ids), width), np.int32)
    lengths = np.zeros((len(kept_ids),), np.int32)
    for i, ids in enumerate(kept_ids):
        tokens[i, : len(ids)] = ids
        lengths[i] = len(ids)
    return tokens, lengths, kept_rows, len(rows) - len(kept_rows)


def stop_token_ids(tokenizer, names: tuple[str, ...]) -> tuple[int, ...]:
    """The ids that end a completion: the tokenizer's eos token and the tokens `names`.

    Raises:
      ValueError: a name the tokenizer does not know (named as in `math.eos_tokens`), or no id
        at all.
    """
    ids = []
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    for name in names:
        token_id = tokenizer.convert_tokens_to_ids(name)
        if token_id is None or token_id == tokenizer.unk_token_id:
            raise ValueError(f"math.eos_tokens names {name!r}, which the tokenizer does not know")
        ids.append(int(token_id))
    if not ids:
        raise ValueError("the tokenizer has no eos token and math.eos_tokens is empty")
    return tuple(dict.fromkeys(ids))
