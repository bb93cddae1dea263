"""The project's own CPU-sized reasoning task: chains of single-digit operations (SPEC 11).

A level-`l` problem is a start digit and `l` operations (`+ - *` with a digit, mod 10, left to
right) with a worked solution written one step at a time. Levels 1..L (6 to 12) share one table
of steps, the training pool is heavy-tailed in the level, and validation/test splits are held out
by content.
"""

from gdro_jax.tasks._chains import (
    MAX_LEVELS,
    MIN_LEVELS,
    OPERATIONS,
    ChainSplits,
    ChainTaskConfig,
    build_splits,
    level_counts,
    level_shares,
    make_problem,
    pool_size_for,
    pretraining_rows,
    problem_space_size,
)

__all__ = [
    "MAX_LEVELS",
    "MIN_LEVELS",
    "OPERATIONS",
    "ChainSplits",
    "ChainTaskConfig",
    "build_splits",
    "level_counts",
    "level_shares",
    "make_problem",
    "pool_size_for",
    "pretraining_rows",
    "problem_space_size",
]
