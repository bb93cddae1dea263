"""Evaluation, chain task and math alike: k samples per problem, the unbiased pass@k and mean@k
with bootstrap intervals, per level (chain task) or per benchmark and difficulty bin (math).

- `evaluate_policy(path, out_dir)`: the one entry point for a saved policy (`experiments/
  evaluate.py`): it opens the policy (`open_policy`), finds the task it was trained for and
  writes that task's report.
- `evaluate_chain(model, rows, task_config, settings)`: a policy in memory on chain-task problems
  (the warm start, the demo, the study at a run's end and at its snapshots along the way).
- `evaluate_math(model, tokenizer, benchmarks, grader=..., out_dir=...)`: a policy in memory on
  math benchmarks, resumable.
- `EvalSettings`: the sampling settings of both, with each task's defaults.
- `pass_at_k`, `mean_at_k`, `summarize_counts`: the statistics, on counts alone.
"""

from gdro_jax.eval._chain import (
    FRONTIER_K,
    FRONTIER_PASS,
    ChainEvaluation,
    ChainReport,
    evaluate_chain,
)
from gdro_jax.eval._harness import SAMPLING_FLAGS, EvalSettings
from gdro_jax.eval._math import evaluate_math, load_bins
from gdro_jax.eval._math_report import MathEvaluation
from gdro_jax.eval._passk import PassSummary, mean_at_k, pass_at_k, summarize_counts
from gdro_jax.eval._policy import DTYPES, Policy, evaluate_policy, open_policy, resolve_dtype

__all__ = [
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
