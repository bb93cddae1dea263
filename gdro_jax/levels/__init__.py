"""The heavy-tailed difficulty levels of a pool, shared by the chain task and the simulator.

Level `l` of `L` gets the share `tail_base^-l / sum_k tail_base^-k` (SPEC 11's heavy tail, as in
DAPO-Math where most prompts are easy for a strong base model); `level_counts` turns the shares
into exact integer counts. numpy only, so the simulator (`gdro_jax.sim`) builds its pool as the
chain task (`gdro_jax.tasks`) does without loading the task's data stack.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["level_counts", "level_shares"]


def level_shares(num_levels: int, tail_base: float) -> np.ndarray:
    """Returns the heavy-tailed share of each level, proportional to `tail_base ** -level`.

    Args:
      num_levels: L, the number of levels (>= 1).
      tail_base: the ratio between the shares of consecutive levels (finite, >= 1; 1 is
        uniform). The chain task's pool asks for > 1 (`ChainTaskConfig`); the simulator allows 1.

    Returns:
      float64[L] shares of levels 1..L, summing to 1.
    """
    if isinstance(num_levels, bool) or not isinstance(num_levels, int) or num_levels < 1:
        raise ValueError(f"num_levels must be an int >= 1, got num_levels={num_levels!r}")
    if not (math.isfinite(tail_base) and tail_base >= 1.0):
        raise ValueError(f"tail_base must be finite and >= 1, got tail_base={tail_base!r}")
    weights = float(tail_base) ** -np.arange(1, num_levels + 1, dtype=np.float64)
    return weights / weights.sum()


def level_counts(total: int, num_levels: int, tail_base: float) -> np.ndarray:
    """Splits `total` prompts over the levels by `level_shares`, every level getting at least one.

    One prompt goes to each level first (so the rarest level is never empty), the rest by share
    with largest remainders, so the counts sum to `total` exactly and are deterministic.

    Args:
      total: number of prompts (>= num_levels).
      num_levels: L.
      tail_base: see `level_shares`.

    Returns:
      int64[L] counts of levels 1..L.
    """
    shares = level_shares(num_levels, tail_base)
    if isinstance(total, bool) or not isinstance(total, int) or total < num_levels:
        raise ValueError(f"total must be an int >= num_levels={num_levels}, got total={total!r}")
    ideal = shares * (total - num_levels)
    counts = np.floor(ideal).astype(np.int64)
    order = np.argsort(-(ideal - counts), kind="stable")
    counts[order[: total - num_levels - int(counts.sum())]] += 1
    return counts + 1
