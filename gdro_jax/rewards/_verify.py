"""Grading one completion against its gold answer with math-verify, in the calling process.

`grade_completion` extracts the completion's final answer (`_extract.py`), wraps it and the gold
answer in `\\boxed{}` so that math-verify reads each as one LaTeX expression, and asks
`math_verify.verify(gold, prediction)`, which compares them as strings, numbers (to 6 decimals),
symbolic expressions, sets, intervals, equations and matrices. math-verify already reads
`\\dfrac`, `\\text{ units}`, `^\\circ`, `\\$`, `\\%`, thousands separators (`10{,}000`) and
zero-padded integers; the one normalisation added here rewrites scientific "e" notation
(`4.5e33`, which sympy reads as `4.5*E*33`) as `4.5\\times10^{33}`.

This runs with math-verify's own timeouts switched off: they are `signal.alarm`s, which only work
on a main thread and would cancel the caller's alarm. Unbounded work is the caller's to bound;
`MathGrader` runs this in worker processes under a per-item timeout.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import NamedTuple

from gdro_jax.rewards._extract import ANSWER_LINE_PATTERNS, extract_answer

CORRECT = "correct"
WRONG = "wrong"
NO_ANSWER = "no_answer"
TIMEOUT = "timeout"
CRASH = "crash"
STATUSES = (CORRECT, WRONG, NO_ANSWER, TIMEOUT, CRASH)


class Grade(NamedTuple):
    """The verdict on one completion."""

    score: float  # 1.0 when correct, else 0.0
    status: str  # one of STATUSES


_SCIENTIFIC = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)[eE]([+-]?\d+)(?![\w.])")


def normalize_answer(answer: str) -> str:
    """Rewrites what math-verify misreads; today only scientific "e" notation (`4.5e33`)."""
    return _SCIENTIFIC.sub(r"\1\\times10^{\2}", answer)


def _parse(answer: str):
    import math_verify

    return math_verify.parse("\\boxed{" + normalize_answer(answer) + "}", parsing_timeout=None)


def answers_match(prediction: str, gold: str) -> bool:
    """Whether math-verify judges the extracted `prediction` equal to `gold` (no timeout)."""
    import math_verify

    return bool(math_verify.verify(_parse(gold), _parse(prediction), timeout_seconds=None))


def grade_completion(
    completion: str, gold: str, *, fallback_patterns: Sequence[re.Pattern] = ANSWER_LINE_PATTERNS
) -> Grade:
    """Grades one completion in this process, without a timeout.

    Args:
      completion: the model's response.
      gold: the gold final answer (LaTeX or plain, without `\\boxed{}`).
      fallback_patterns: see `extract_answer`.

    Returns:
      `Grade(1.0, "correct")`, `Grade(0.0, "wrong")`, or `Grade(0.0, "no_answer")` when the
      completion states no final answer.
    """
    prediction = extract_answer(completion, fallback_patterns=fallback_patterns)
    if prediction is None:
        return Grade(0.0, NO_ANSWER)
    if answers_match(prediction, gold):
        return Grade(1.0, CORRECT)
    return Grade(0.0, WRONG)


def quiet_math_verify() -> None:
    """Silences math-verify's warnings that timeouts are off (we bound the time ourselves)."""
    logging.getLogger("math_verify").setLevel(logging.ERROR)
