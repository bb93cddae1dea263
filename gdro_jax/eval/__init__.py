"""Evaluation: the unbiased pass@k estimator, mean@k, bootstrap summaries, the chain-task harness
(k samples per problem, per-level and pooled tables, the test-split report with its frontier),
the math harness, and `evaluate_policy`, which evaluates a policy on the task it was trained for.
"""

from gdro_jax.eval._evaluate import SAMPLING_FLAGS, evaluate_math_policy, evaluate_policy
from gdro_jax.eval._math_eval import MathEvalSettings, MathEvaluation, evaluate_math, load_bins
from gdro_jax.eval._passk import PassSummary, mean_at_k, pass_at_k, summarize_counts
from gdro_jax.eval._policy import (
    DTYPES,
    Policy,
    find_run_config,
    load_policy,
    open_policy,
    resolve_dtype,
)
from gdro_jax.eval._task_eval import (
    TaskEvaluation,
    evaluate_task,
    evaluate_with,
    format_level_table,
    sample_correct_counts,
)
from gdro_jax.eval._task_report import (
    FRONTIER_K,
    FRONTIER_PASS,
    TaskEvalSettings,
    TaskReport,
    evaluate_task_policy,
    frontier_levels,
)

__all__ = [
    "DTYPES",
    "FRONTIER_K",
    "FRONTIER_PASS",
    "MathEvalSettings",
    "MathEvaluation",
    "PassSummary",
    "SAMPLING_FLAGS",
    "Policy",
    "TaskEvalSettings",
    "TaskEvaluation",
    "TaskReport",
    "evaluate_math",
    "evaluate_math_policy",
    "evaluate_policy",
    "evaluate_task",
    "evaluate_task_policy",
    "evaluate_with",
    "find_run_config",
    "format_level_table",
    "frontier_levels",
    "load_bins",
    "load_policy",
    "mean_at_k",
    "open_policy",
    "pass_at_k",
    "resolve_dtype",
    "sample_correct_counts",
    "summarize_counts",
]
