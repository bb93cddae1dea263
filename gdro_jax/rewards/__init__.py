"""Math rewards (SPEC 9): final-answer extraction and math-verify grading in worker processes.

Typical use:

    rewards.extract_answer("... so the answer is $\\boxed{\\frac{1}{2}}$.")   # "\\frac{1}{2}"
    with rewards.MathGrader(num_workers=2, timeout_s=5.0) as grader:
        scores = grader.grade(completions, golds)        # list[float]: 1.0 correct, else 0.0
        grader.stats                                     # timeouts, crashes, restarts, ...

`grade_completion` is the same verdict computed in the calling process without a timeout (for
trusted inputs, tests and benchmarks).
"""

from gdro_jax.rewards._extract import ANSWER_LINE_PATTERNS, extract_answer
from gdro_jax.rewards._grader import GraderStats, MathGrader
from gdro_jax.rewards._verify import (
    CORRECT,
    CRASH,
    NO_ANSWER,
    STATUSES,
    TIMEOUT,
    WRONG,
    Grade,
    answers_match,
    grade_completion,
    normalize_answer,
)

__all__ = [
    "ANSWER_LINE_PATTERNS",
    "CORRECT",
    "CRASH",
    "NO_ANSWER",
    "STATUSES",
    "TIMEOUT",
    "WRONG",
    "Grade",
    "GraderStats",
    "MathGrader",
    "answers_match",
    "extract_answer",
    "grade_completion",
    "normalize_answer",
]
