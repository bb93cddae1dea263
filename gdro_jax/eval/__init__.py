"""Evaluation, chain task and math alike (docs/evaluation.md): k samples per problem, the
unbiased pass@k and mean@k with bootstrap intervals, per level or per benchmark and bin.

`evaluate_policy` evaluates a saved policy on its task (`experiments/evaluate.py`);
`evaluate_chain` and `evaluate_math` a policy in memory, with `EvalSettings`; `pass_at_k`,
`mean_at_k` and `summarize_counts` are the statistics, on counts alone.
"""

from gdro_jax.eval._chain import (
    FRONTIER_K,
    FRONTIER_PASS,
    ChainEvaluation,
    ChainReport,
    evaluate_chain,
)
from gdro_jax.eval._harness import CHAIN_FIELDS, SAMPLING_FLAGS, EvalSettings
from gdro_jax.eval._math import evaluate_math, load_bins
from gdro_jax.eval._math_report import MathEvaluation
from gdro_jax.eval._passk import PassSummary, mean_at_k, pass_at_k, summarize_counts
from gdro_jax.eval._policy import DTYPES, Policy, evaluate_policy, open_policy, resolve_dtype

__all__ = [
    "CHAIN_FIELDS",
    "DTYPES",
    "FRONTIER_K",
    "FRONTIER_PASS",
    "SAMPLING_FLAGS",
    "ChainEvaluation",
    "ChainReport",
    "EvalSettings",
    "MathEvaluation",
    "PassSummary",
    "Policy",
    "evaluate_chain",
    "evaluate_math",
    "evaluate_policy",
    "load_bins",
    "mean_at_k",
    "open_policy",
    "pass_at_k",
    "resolve_dtype",
    "summarize_counts",
]
