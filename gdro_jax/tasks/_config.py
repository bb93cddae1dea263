"""The chain task's config: levels, the heavy-tailed level shares, split sizes, pool sizing.

`ChainTaskConfig` is a frozen dataclass validated on construction (a `ValueError` names the
parameter). The training pool gives level `l` the share `tail_base^-l / sum_k tail_base^-k`
(SPEC 11's heavy tail, as in DAPO-Math where most prompts are easy for a strong base model);
`level_counts` turns shares into exact integer counts. `pool_size_for` sizes the pool from the
run (pool <= steps x prompts per step / 5), so each training prompt is revisited often enough for
the online difficulty classifier to learn from its own history.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from gdro_jax.levels import level_counts, level_shares

OPERATIONS = ("+", "-", "*")
MIN_LEVELS = 6  # SPEC 11: at least 6 difficulty levels.
MAX_LEVELS = 12  # The largest level whose problem codes fit in int64 (10 * 30^12 < 2^63).
MAX_POOL_SIZE = 1_000_000
NUM_DIGITS = 10
STEP_CHOICES = len(OPERATIONS) * NUM_DIGITS  # (operation, operand) pairs per step: 30


def problem_space_size(level: int) -> int:
    """Returns the number of distinct problems of a level: `10 * 30^level`."""
    return NUM_DIGITS * STEP_CHOICES**level


def pool_size_for(steps: int, prompts_per_step: int, min_visits: int = 5) -> int:
    """Returns the largest training pool a run revisits `min_visits` times on average.

    SPEC 11: the classifier learns from each prompt's own history, so size the pool from the run
    length, `pool <= steps * prompts_per_step / min_visits`.

    Args:
      steps: optimizer steps of the run (>= 1).
      prompts_per_step: N, prompts drawn per step (>= 1).
      min_visits: average visits per prompt to guarantee (>= 1; SPEC: 5).

    Returns:
      `steps * prompts_per_step // min_visits`.
    """
    for name, value in (
        ("steps", steps),
        ("prompts_per_step", prompts_per_step),
        ("min_visits", min_visits),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {name}={value!r}")
    return steps * prompts_per_step // min_visits


@dataclasses.dataclass(frozen=True)
class ChainTaskConfig:
    """The chain task's levels, heavy tail, split sizes and seed (see the module docstring).

    Attributes:
      num_levels: L, levels 1..L; a level-l problem has l steps. In [6, 12] (SPEC 11: >= 6).
      tail_base: the training pool's level-l share is proportional to `tail_base^-l`; > 1
        (1.5 keeps a usable frontier after a short warm start, 2 gives a steeper tail).
      pool_size: D, prompts in the training pool; in [num_levels, 1e6]. Size it from the run
        with `pool_size_for` (pool <= steps x prompts per step / 5).
      validation_per_level: problems per level in the validation split. It is for choosing
        hyperparameters.
      test_per_level: problems per level in the held-out test split, one int or one per level.
        A sequence holds `num_levels` ints (levels 1..L), e.g. more problems on the frontier
        levels, where pass@8 intervals are widest (stored as a tuple; `test_count(level)` reads
        it). Validation plus test may hold at most half of a level's problems, so
        `validation_per_level + test_per_level <= 150` on level 1 (300 problems) and far more
        on longer chains (`problem_space_size`).
      seed: the seed of every split (non-negative int).
    """

    num_levels: int = 8
    tail_base: float = 1.5
    pool_size: int = 1024
    validation_per_level: int = 32
    test_per_level: int | tuple[int, ...] = 100
    seed: int = 0

    def __post_init__(self):
        def _is_int(value):
            return isinstance(value, (int, np.integer)) and not isinstance(value, bool)

        if not _is_int(self.num_levels) or not MIN_LEVELS <= self.num_levels <= MAX_LEVELS:
            raise ValueError(
                f"num_levels must be an int in [{MIN_LEVELS}, {MAX_LEVELS}], "
                f"got num_levels={self.num_levels!r}"
            )
        if not (
            isinstance(self.tail_base, (int, float))
            and math.isfinite(self.tail_base)
            and self.tail_base > 1.0
        ):
            raise ValueError(f"tail_base must be finite and > 1, got tail_base={self.tail_base!r}")
        if not _is_int(self.pool_size) or not self.num_levels <= self.pool_size <= MAX_POOL_SIZE:
            raise ValueError(
                f"pool_size must be an int in [num_levels={self.num_levels}, {MAX_POOL_SIZE}] "
                f"(at least one prompt per level), got pool_size={self.pool_size!r}"
            )
        if not _is_int(self.validation_per_level) or self.validation_per_level < 1:
            raise ValueError(
                "validation_per_level must be an int >= 1, "
                f"got validation_per_level={self.validation_per_level!r}"
            )
        test = self.test_per_level
        if isinstance(test, (list, tuple)):
            if len(test) != self.num_levels or not all(_is_int(n) and n >= 1 for n in test):
                raise ValueError(
                    f"test_per_level must be an int >= 1 or {self.num_levels} such ints (one per "
                    f"level), got test_per_level={test!r}"
                )
            object.__setattr__(self, "test_per_level", tuple(int(n) for n in test))
        elif not _is_int(test) or test < 1:
            raise ValueError(
                f"test_per_level must be an int >= 1 or {self.num_levels} such ints (one per "
                f"level), got test_per_level={test!r}"
            )
        for level in range(1, self.num_levels + 1):
            limit = problem_space_size(level) // 2
            if self.validation_per_level + self.test_count(level) > limit:
                raise ValueError(
                    f"validation_per_level + test_per_level must be <= {limit} on level {level} "
                    f"(half of its {problem_space_size(level)} problems), got "
                    f"validation_per_level={self.validation_per_level}, "
                    f"test_per_level={self.test_per_level!r}"
                )
        if not _is_int(self.seed) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative int, got seed={self.seed!r}")

    def test_count(self, level: int) -> int:
        """Problems of `level` (1..L) in the test split."""
        if isinstance(self.test_per_level, tuple):
            return self.test_per_level[level - 1]
        return self.test_per_level

    @property
    def max_prompt_length(self) -> int:
        """P: tokens of the longest prompt: `<bos>`, the start digit, L (op, digit) pairs, `=`."""
        return 2 * self.num_levels + 3

    @property
    def max_solution_length(self) -> int:
        """S: tokens of the longest solution: L steps of 5 symbols, L-1 `;`, and `<eos>`."""
        return 6 * self.num_levels

    @property
    def sequence_length(self) -> int:
        """P + S: the static length of a supervised (prompt + solution) sequence."""
        return self.max_prompt_length + self.max_solution_length

    def level_shares(self) -> np.ndarray:
        """float64[L] the training pool's target share of each level (see `level_shares`)."""
        return level_shares(self.num_levels, self.tail_base)

    def pool_level_counts(self) -> np.ndarray:
        """int64[L] prompts of each level in the training pool (see `level_counts`)."""
        return level_counts(self.pool_size, self.num_levels, self.tail_base)
