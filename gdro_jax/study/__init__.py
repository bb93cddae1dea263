"""Studies that compare the methods: the miniature study of `make demo` (warm start, equal-compute
RL per method, a held-out table with the frontier levels, plots) and the statistics of a
comparison over seeds (`paired_relative_gain`: a method's gain over GRPO, paired by seed and
problem, with a paired bootstrap interval)."""

from gdro_jax.study._demo import (
    format_comparison,
    frontier_pass_at,
    run_demo,
    warm_start_frontier,
)
from gdro_jax.study._stats import (
    PairedGain,
    bootstrap_gains,
    detectable_gain,
    paired_relative_gain,
)

__all__ = [
    "PairedGain",
    "bootstrap_gains",
    "detectable_gain",
    "format_comparison",
    "frontier_pass_at",
    "paired_relative_gain",
    "run_demo",
    "warm_start_frontier",
]
