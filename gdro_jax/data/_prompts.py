"""Prompt formatting: the authors' instruction suffix and an optional chat template.

`format_prompt` turns a problem into the text the policy sees: the problem, a space and the
suffix the DAPO/GDRO authors used (SPEC 9), optionally wrapped by a transformers tokenizer's chat
template as one user message (with an optional system message) and the generation prompt.
`with_prompts` applies it to dataset rows, keeping the original text under `"problem"`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

PROMPT_SUFFIX = "Let's think step by step and output the final answer within \\boxed{}."


def format_prompt(
    problem: str,
    *,
    suffix: str | None = PROMPT_SUFFIX,
    tokenizer: Any = None,
    system: str | None = None,
) -> str:
    """The prompt text for one problem.

    Args:
      problem: the problem text.
      suffix: appended after a space; None or "" appends nothing.
      tokenizer: optional transformers tokenizer whose `apply_chat_template` wraps the text as a
        user message and appends the generation prompt; None returns plain text.
      system: optional system message (only with `tokenizer`).

    Returns:
      The prompt as a string (not tokenized).

    Raises:
      ValueError: when `system` is given without a tokenizer.
    """
    text = f"{problem} {suffix}" if suffix else problem
    if tokenizer is None:
        if system is not None:
            raise ValueError("system=... needs a tokenizer with a chat template")
        return text
    messages = [{"role": "user", "content": text}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    # tokenize=False returns the rendered string; with tokenize=True, transformers 5 returns a
    # dict (BatchEncoding) unless return_dict=False, which is why we never tokenize here.
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if not isinstance(rendered, str):
        raise TypeError(
            f"tokenizer.apply_chat_template(tokenize=False) returned {type(rendered).__name__}, "
            "expected a string"
        )
    return rendered


def with_prompts(
    rows: Sequence[dict],
    *,
    suffix: str | None = PROMPT_SUFFIX,
    tokenizer: Any = None,
    system: str | None = None,
) -> list[dict]:
    """Copies of `rows` whose `"prompt"` is formatted by `format_prompt`.

    Args:
      rows: dataset rows `{"id", "prompt", "answer", ...}` with the raw problem in `"prompt"`.
      suffix: see `format_prompt`.
      tokenizer: see `format_prompt`.
      system: see `format_prompt`.

    Returns:
      New rows; each keeps the raw problem under `"problem"` (unless the row already has one).
    """
    formatted = []
    for row in rows:
        new_row = dict(row)
        new_row.setdefault("problem", row["prompt"])
        new_row["prompt"] = format_prompt(
            row["prompt"], suffix=suffix, tokenizer=tokenizer, system=system
        )
        formatted.append(new_row)
    return formatted
