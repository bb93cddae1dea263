"""Studies that compare the methods.

- `run_demo`: the miniature study of `make demo` (warm start, equal-compute RL per method, a
  held-out table with the frontier levels and intervals, plots; `plan_line` says first what will
  run). Each policy's evaluation (`demo_evaluation`: the chain task's default settings, those of
  `experiments.evaluate`) is kept and reused while the policy and settings are unchanged
  (`cached_evaluation`, `evaluation_key`, `policy_fingerprint`); `format_comparison`.
- The comparison study of `make study` (`experiments/compare.py`, `run_study`): arms x seeds
  from one warm start (`run_specs`, `run_config`, `run_one`), each finished run kept as one small
  file in the results' store (`sync_store`, `compact_log`, `log_rows`, `weights_fingerprint`),
  collected into the pre-declared
  primary metric and secondary tables (`collect`, `write_results`, `format_tables`) and figures
  (`draw_figures`; one `plot_*` function each, returning the figure, for notebooks).
- The adversaries' premise on a task profile (`premise_criteria`: graded bins, groups with signal,
  graded warm-start levels, the hardest level, the heavy tail, pooled over the steps and, with
  `batches_failing`, batch by batch; `format_criteria`, `plot_premise`).
- What a run's method decided, read back from its metrics (`decision_summary`: the rivals'
  rollouts per prompt, drawn prompts and kept groups).
- The statistics of a comparison over seeds (`paired_relative_gain`: a method's gain over GRPO,
  paired by seed and problem, with a paired bootstrap interval; `detectable_gain`;
  `paired_gain_change`: how that gain changes between two points of the same runs).
- A horizon study (`config.along_primary`, `experiments/configs/horizon_study.py`): the primary
  gain at every point along the runs, its change from the first point to the last and its
  reading (`reading_of`), beside the points of the study it continues (`config.warm_start_store`,
  whose warm start it starts from, `restore_other_warm_start`); `plot_horizon`.
"""

from gdro_jax.study._collect import (
    RESULTS_BEGIN,
    RESULTS_END,
    collect,
    level_weights,
    reading_of,
    results_markers,
    run_figures,
    write_results,
)
from gdro_jax.study._compare import (
    RunSpec,
    apply_overrides,
    arms_of,
    compact_log,
    log_rows,
    parse_overrides,
    pending,
    prepare_warm_start,
    restore_other_warm_start,
    restore_warm_start,
    run_config,
    run_one,
    run_specs,
    seeds_of,
    sync_store,
    weights_fingerprint,
)
from gdro_jax.study._decisions import decision_summary
from gdro_jax.study._demo import format_counts, plan_line, run_demo, warm_start_frontier
from gdro_jax.study._heldout import (
    cached_evaluation,
    demo_evaluation,
    evaluation_key,
    format_comparison,
    frontier_pass_at,
    policy_fingerprint,
)
from gdro_jax.study._premise import (
    Criterion,
    all_equal_share,
    batches_failing,
    bin_shares,
    format_criteria,
    level_pass_at_1,
    plot_premise,
    pool_level_shares,
    premise_criteria,
    problem_success,
)
from gdro_jax.study._report import (
    ALONG_FIGURE,
    FIGURES,
    HORIZON_FIGURE,
    draw_figures,
    load_logs,
    plot_allocation,
    plot_along,
    plot_heldout,
    plot_horizon,
    plot_lead_lag,
    plot_prompt_adversary,
    plot_standard_error,
    plot_tokens,
    plot_zero_advantage,
)
from gdro_jax.study._runner import run_study
from gdro_jax.study._stats import (
    PairedGain,
    bootstrap_gains,
    detectable_gain,
    paired_gain_change,
    paired_relative_gain,
)
from gdro_jax.study._tables import format_tables

__all__ = [
    "ALONG_FIGURE",
    "FIGURES",
    "HORIZON_FIGURE",
    "RESULTS_BEGIN",
    "RESULTS_END",
    "Criterion",
    "PairedGain",
    "RunSpec",
    "all_equal_share",
    "apply_overrides",
    "arms_of",
    "batches_failing",
    "bin_shares",
    "bootstrap_gains",
    "cached_evaluation",
    "collect",
    "compact_log",
    "decision_summary",
    "demo_evaluation",
    "detectable_gain",
    "draw_figures",
    "evaluation_key",
    "format_comparison",
    "format_counts",
    "format_criteria",
    "format_tables",
    "frontier_pass_at",
    "level_pass_at_1",
    "level_weights",
    "load_logs",
    "log_rows",
    "paired_gain_change",
    "paired_relative_gain",
    "parse_overrides",
    "pending",
    "plan_line",
    "plot_allocation",
    "plot_along",
    "plot_heldout",
    "plot_horizon",
    "plot_lead_lag",
    "plot_premise",
    "plot_prompt_adversary",
    "plot_standard_error",
    "plot_tokens",
    "plot_zero_advantage",
    "policy_fingerprint",
    "pool_level_shares",
    "premise_criteria",
    "prepare_warm_start",
    "reading_of",
    "problem_success",
    "restore_other_warm_start",
    "restore_warm_start",
    "results_markers",
    "run_config",
    "run_demo",
    "run_figures",
    "run_one",
    "run_specs",
    "run_study",
    "seeds_of",
    "sync_store",
    "warm_start_frontier",
    "weights_fingerprint",
    "write_results",
]
