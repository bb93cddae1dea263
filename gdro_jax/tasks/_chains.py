"""Chains of single-digit operations: the project's CPU-sized reasoning task and its splits.

A problem of level `l` (1..L) is a start digit followed by `l` operations, each one of `+ - *`
with a single-digit operand, applied left to right modulo 10 (no operator precedence). The prompt
writes the chain and ends with `=`; the worked solution restates and performs one step at a time,
each step starting from the previous result:

    prompt    3+4*7-2=
    solution  3+4=7;7*7=9;9-2=7          (answer 7; every value is a digit, taken mod 10)

Why this design meets SPEC section 11:

- Levels: the level is the number of steps, 1..L with L in [6, 12] (default 8).
- Shared skills: every step of every level is one entry of the same 300-entry table
  (10 left digits x 3 operations x 10 operands), written the same way; a level-`l` problem is a
  level-`l-1` problem with one more step appended, and its solution extends the shorter solution
  by one step (`make_problem` on a truncated chain gives the prefix). What is learnt on short
  chains is exactly what long chains need, so a curriculum can transfer.
- A heavy tail: the training pool gives level `l` the share `base^-l / sum_k base^-k`
  (`tail_base`, e.g. 1.5 or 2), so most prompts are easy, as in DAPO-Math for a strong model.
- A frontier: one wrong step anywhere fails the chain, so a model with per-step accuracy `a`
  solves level `l` roughly `a^l` of the time and pass@1 falls with the level. SPEC 11's check of
  this design (a 0.79 M-parameter model, 400 warm-start steps, shares 1.5^-l) measured pass@1
  0.99 at level 1 down to 0.003 at level 8; the warm start must still be checked per seed.
- No guessing: the reward grades the whole worked solution exactly (see `_reward.py`). The
  final digit alone would be right 10 % of the time by chance; a format-perfect chain with
  random step results is right `10^-l` of the time (1e-8 at level 8).
- A finite pool with revisits, and held-out splits: `build_splits` returns a training pool of
  `pool_size` prompts (size it with `pool_size_for`: pool <= steps x prompts per step / 5, so a run
  visits each prompt >= 5 times), a validation split and a test split with a fixed number of
  problems per level. The three are disjoint by problem content, and the warm-start data
  (`pretraining_rows`) never contains a validation or test problem.

Problem identity. Level `l` has `10 * 30^l` distinct problems (300 at level 1, 9 000 at level 2),
numbered by a mixed-radix code: `start + 10 * sum_j (10 * op_j + operand_j) * 30^j`. Splits are
drawn as codes: test first, then validation excluding test, then the pool excluding both, each
from its own seeded stream, so the test split does not change with the pool size. Where a level
has fewer unused problems than its share of the pool (level 1 in a large pool), the pool takes
every unused problem of that level once and then repeats them as evenly as possible (counts
differ by at most one); the splits stay disjoint. Rows are dicts in the shape of SPEC section 9:
`{"id", "prompt", "answer", "solution", "level"}`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from gdro_jax.tasks._config import (
    NUM_DIGITS,
    OPERATIONS,
    STEP_CHOICES,
    ChainTaskConfig,
    level_counts,
    problem_space_size,
)

# Levels with at most this many problems (levels 1 and 2), or of which a draw takes over a
# quarter, are enumerated; otherwise codes are drawn by rejection, which then ends quickly.
_ENUMERATE_LIMIT = 1 << 15
# Seed-stream tags, so that every split and the pretraining stream draw independent numbers.
_TEST, _VALIDATION, _TRAIN, _PRETRAIN = 1, 2, 3, 4


class ChainSplits(NamedTuple):
    """The three disjoint splits of a `ChainTaskConfig`, as lists of row dicts.

    Attributes:
      train: the training prompt pool, `pool_size` rows in a seeded random order (levels mixed);
        the prompt index used by the controllers is the row's position.
      validation: `validation_per_level` rows per level, grouped by level (1 first).
      test: `test_count(level)` rows per level, grouped by level (1 first).
    """

    train: list[dict]
    validation: list[dict]
    test: list[dict]


def _rng(*entropy: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(e) for e in entropy]))


def _decode_codes(level: int, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Problem codes -> (start[N], operation[N, l], operand[N, l]) as int64 arrays."""
    codes = np.asarray(codes, np.int64)
    start = codes % NUM_DIGITS
    rest = codes // NUM_DIGITS
    operation = np.zeros((len(codes), level), np.int64)
    operand = np.zeros((len(codes), level), np.int64)
    for step in range(level):
        pair = rest % STEP_CHOICES
        operation[:, step] = pair // NUM_DIGITS
        operand[:, step] = pair % NUM_DIGITS
        rest = rest // STEP_CHOICES
    return start, operation, operand


def make_problem(start: int, operations: Sequence[str], operands: Sequence[int]) -> dict:
    """Builds one problem row from its chain; rows of the splits are built the same way.

    Args:
      start: the start digit, 0..9.
      operations: l >= 1 operation symbols from `OPERATIONS`.
      operands: l operand digits, 0..9.

    Returns:
      A row `{"id": "", "prompt", "answer", "solution", "level"}`: the prompt string (chain and
      `=`), the final value as a one-digit string, the worked solution (steps joined by `;`), and
      the level `l`.
    """
    if not (isinstance(start, (int, np.integer)) and 0 <= start < NUM_DIGITS):
        raise ValueError(f"start must be a digit 0..9, got start={start!r}")
    if len(operations) != len(operands) or not operations:
        raise ValueError(
            "operations and operands must be non-empty and of equal length, got "
            f"{len(operations)} operations and {len(operands)} operands"
        )
    for operation, operand in zip(operations, operands, strict=True):
        if operation not in OPERATIONS:
            raise ValueError(f"operations must be in {OPERATIONS}, got {operation!r}")
        if not (isinstance(operand, (int, np.integer)) and 0 <= operand < NUM_DIGITS):
            raise ValueError(f"operands must be digits 0..9, got {operand!r}")
    value = int(start)
    prompt = [str(value)]
    steps = []
    for operation, operand in zip(operations, operands, strict=True):
        operand = int(operand)
        if operation == "+":
            result = (value + operand) % NUM_DIGITS
        elif operation == "-":
            result = (value - operand) % NUM_DIGITS
        else:
            result = (value * operand) % NUM_DIGITS
        prompt.append(f"{operation}{operand}")
        steps.append(f"{value}{operation}{operand}={result}")
        value = result
    return {
        "id": "",
        "prompt": "".join(prompt) + "=",
        "answer": str(value),
        "solution": ";".join(steps),
        "level": len(steps),
    }


def _rows_from_codes(level: int, codes: np.ndarray) -> list[dict]:
    start, operation, operand = _decode_codes(level, codes)
    return [
        make_problem(int(s), [OPERATIONS[o] for o in ops], ds.tolist())
        for s, ops, ds in zip(start, operation, operand, strict=True)
    ]


def _distinct_codes(
    rng: np.random.Generator, level: int, count: int, exclude: np.ndarray, *, repeat: bool
) -> np.ndarray:
    """Draws `count` codes of `level` outside `exclude`, distinct unless the level runs out.

    With `repeat`, a level with fewer than `count` unused problems contributes each of them
    `count // available` or one more times; without it that is an error.
    """
    space = problem_space_size(level)
    if space <= _ENUMERATE_LIMIT or 4 * (count + len(exclude)) > space:
        available = np.setdiff1d(np.arange(space, dtype=np.int64), exclude, assume_unique=True)
        if count > len(available) and not repeat:
            raise ValueError(f"level {level} has {len(available)} unused problems, {count} asked")
        rounds = -(-count // len(available))
        return np.concatenate([rng.permutation(available) for _ in range(rounds)])[:count]
    # Rejection sampling: at most a quarter of the level is taken, so a few rounds suffice.
    taken = set(np.asarray(exclude).tolist())
    chosen: list[int] = []
    while len(chosen) < count:
        for code in rng.integers(0, space, size=2 * (count - len(chosen)) + 8).tolist():
            if code not in taken:
                taken.add(code)
                chosen.append(code)
                if len(chosen) == count:
                    break
    return np.asarray(chosen, np.int64)


@functools.lru_cache(maxsize=16)
def _heldout_codes(config: ChainTaskConfig) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """Per level, the (test, validation) codes: distinct, disjoint, fixed by the config."""
    per_level = []
    for level in range(1, config.num_levels + 1):
        none = np.zeros((0,), np.int64)
        test = _distinct_codes(
            _rng(config.seed, _TEST, level), level, config.test_count(level), none, repeat=False
        )
        validation = _distinct_codes(
            _rng(config.seed, _VALIDATION, level),
            level,
            config.validation_per_level,
            np.sort(test),
            repeat=False,
        )
        test.flags.writeable = False
        validation.flags.writeable = False
        per_level.append((test, validation))
    return tuple(per_level)


def _with_ids(rows: list[dict], split: str) -> list[dict]:
    for index, row in enumerate(rows):
        row["id"] = f"{split}-{index:06d}"
    return rows


def build_splits(config: ChainTaskConfig) -> ChainSplits:
    """Builds the training pool, the validation split and the test split of a config.

    Deterministic: the same config gives the same rows. Test and validation depend only on
    `num_levels`, their sizes and `seed`, not on the pool. The three splits are disjoint by
    problem content (prompt string); test and validation hold distinct problems; the pool holds
    distinct problems except at levels it exhausts (then each is repeated evenly, see the module
    docstring).

    Args:
      config: the task config.

    Returns:
      `ChainSplits(train, validation, test)` of row dicts
      `{"id", "prompt", "answer", "solution", "level"}`; ids are `"<split>-<index>"`.
    """
    heldout = _heldout_codes(config)
    test_rows, validation_rows, train_rows = [], [], []
    for level, count in zip(
        range(1, config.num_levels + 1), config.pool_level_counts().tolist(), strict=True
    ):
        test, validation = heldout[level - 1]
        test_rows += _rows_from_codes(level, test)
        validation_rows += _rows_from_codes(level, validation)
        exclude = np.sort(np.concatenate([test, validation]))
        codes = _distinct_codes(
            _rng(config.seed, _TRAIN, level), level, count, exclude, repeat=True
        )
        train_rows += _rows_from_codes(level, codes)
    order = _rng(config.seed, _TRAIN, 0).permutation(len(train_rows))
    train_rows = [train_rows[i] for i in order]
    return ChainSplits(
        train=_with_ids(train_rows, "train"),
        validation=_with_ids(validation_rows, "validation"),
        test=_with_ids(test_rows, "test"),
    )


def pretraining_rows(
    config: ChainTaskConfig, num_rows: int, *, seed: int, tail_base: float | None = None
) -> list[dict]:
    """Draws warm-start (supervised) problems that never appear in validation or test.

    Levels follow `level_counts(num_rows, L, tail_base)` (exact heavy-tailed counts, every level
    present), problems are uniform within a level with replacement, and rows come in a seeded
    random order. The training pool's problems may appear (the warm start sees the same
    distribution the RL pool is drawn from); held-out problems never do.

    Args:
      config: the task config (its held-out problems are excluded).
      num_rows: rows to draw (>= num_levels), e.g. `steps * batch_size` of the warm start.
      seed: the stream's seed (independent of `config.seed`'s split streams).
      tail_base: level-share base of the warm-start mix (default: `config.tail_base`).

    Returns:
      A list of `num_rows` row dicts with ids `"pretrain-<index>"`.
    """
    base = config.tail_base if tail_base is None else tail_base
    if isinstance(num_rows, bool) or not isinstance(num_rows, int) or num_rows < config.num_levels:
        raise ValueError(
            f"num_rows must be an int >= num_levels={config.num_levels}, got num_rows={num_rows!r}"
        )
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got seed={seed!r}")
    counts = level_counts(num_rows, config.num_levels, base)
    heldout = _heldout_codes(config)
    rng = _rng(config.seed, _PRETRAIN, seed)
    rows: list[dict] = []
    for level, count in zip(range(1, config.num_levels + 1), counts.tolist(), strict=True):
        exclude = np.concatenate(heldout[level - 1])
        codes = rng.integers(0, problem_space_size(level), size=count)
        # Redraw the few held-out codes; at most half of any level is held out, so this ends.
        while (hit := np.isin(codes, exclude)).any():
            codes[hit] = rng.integers(0, problem_space_size(level), size=int(hit.sum()))
        rows += _rows_from_codes(level, codes)
    order = rng.permutation(len(rows))
    return _with_ids([rows[i] for i in order], "pretrain")
