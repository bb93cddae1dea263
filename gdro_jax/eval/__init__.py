"""Evaluation: the unbiased pass@k estimator, mean@k, bootstrap summaries, and the chain-task
harness (k samples per problem, per-level and pooled tables)."""

from gdro_jax.eval._math_eval import MathEvalSettings, MathEvaluation, evaluate_math, load_bins
from gdro_jax.eval._passk import PassSummary, mean_at_k, pass_at_k, summarize_counts
from gdro_jax.eval._policy import evaluate_math_policy, load_policy
from gdro_jax.eval._task_eval import (
    TaskEvaluation,
    evaluate_task,
    evaluate_with,
    format_level_table,
    sample_correct_counts,
)

__all__ = [
    "MathEvalSettings",
    "MathEvaluation",
    "PassSummary",
    "TaskEvaluation",
    "evaluate_math",
    "evaluate_math_policy",
    "evaluate_task",
    "evaluate_with",
    "format_level_table",
    "load_bins",
    "load_policy",
    "mean_at_k",
    "pass_at_k",
    "sample_correct_counts",
    "summarize_counts",
]
