"""The adversaries' premise, measured: does a task profile give the classifier graded bins and
GRPO groups that carry signal?

Five criteria (issue 16), each computed from what a profile's runs leave behind:

1. `bins`: after the first pass over the pool no bin holds more than 60 % of the batch's prompts,
   and the middle bins (1 to B-2) hold at least 25 % (a GRPO pilot's `bin/prompts`).
2. `all_equal`: at most 60 % of groups have all-equal rewards (`1 - nonzero_advantage_fraction`).
3. `graded_levels`: at least 3 levels have warm-start pass@1 in [0.05, 0.8] (validation split).
4. `hardest_level`: the hardest level's warm-start pass@1 lies in (0, 0.05).
5. `heavy_tail`: the pool's level shares fall with the level (SPEC 11).

Criteria 1 and 2 are declared on counts pooled over the steps; each is also reported batch by
batch (`batches_failing`: how many of the counted steps' batches, on their own, break the rule),
since a pooled share within the limit can hide many batches beyond it.

Pilot rows are `metrics.jsonl` rows, whose `step` is 1-based (row `s` is the `s`-th update). With a
pool of `D` prompts and `N` per step, the first pass fills rows 1..D/N, whose prompts are all
unseen; `after_step=30` counts rows 31 onwards (0-based step index >= 30), the first whose bins
come from history. `premise_criteria` returns one `Criterion` per check, `format_criteria` a
markdown table and `plot_premise` a figure of one or more profiles side by side.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from jax.typing import ArrayLike

from gdro_jax import tasks
from gdro_jax.plots import figure

if TYPE_CHECKING:  # matplotlib is imported where a figure is drawn: commands start faster
    from matplotlib.figure import Figure

MAX_BIN_SHARE = 0.6
MIN_MIDDLE_SHARE = 0.25
MAX_ALL_EQUAL = 0.6
GRADED_RANGE = (0.05, 0.8)
MIN_GRADED_LEVELS = 3
HARDEST_MAX_PASS1 = 0.05


class Criterion(NamedTuple):
    """One premise check: what was measured, against what, and whether it holds."""

    name: str  # e.g. "all_equal"
    value: float  # the measured value
    threshold: str  # the rule, e.g. "<= 0.6"
    holds: bool
    # For the per-step criteria: (batches that break the rule on their own, batches counted).
    batches_failing: tuple[int, int] | None = None


def problem_success(evaluation: Any) -> tuple[np.ndarray, np.ndarray]:
    """Each problem's level and success rate from a warm start's evaluation.

    Args:
      evaluation: an `eval.ChainEvaluation` or its `to_dict()` (as stored in `frontier.json`'s
        `"evaluation"`).

    Returns:
      `(levels_P, success_P)`: int64[P] levels and float64[P] correct samples / samples.
    """
    if hasattr(evaluation, "to_dict"):
        evaluation = evaluation.to_dict()
    levels_P = np.asarray(evaluation["problem_levels"], np.int64)
    correct_P = np.asarray(evaluation["correct"], np.float64)
    return levels_P, correct_P / float(evaluation["num_samples"])


def level_pass_at_1(evaluation: Any) -> dict[int, float]:
    """Level -> pass@1 (the mean success rate of its problems: the unbiased pass@1), ascending."""
    levels_P, success_P = problem_success(evaluation)
    return {int(level): float(success_P[levels_P == level].mean()) for level in np.unique(levels_P)}


def _rows_after(rows: Sequence[Mapping[str, Any]], after_step: int) -> list[Mapping[str, Any]]:
    kept = [row for row in rows if int(row["step"]) > after_step]
    if not kept:
        raise ValueError(f"no metrics row has a step after after_step={after_step}")
    return kept


def bin_shares(rows: Sequence[Mapping[str, Any]], *, after_step: int = 30) -> np.ndarray:
    """float64[B] each bin's share of the batch's prompts, pooled over rows with step > after_step
    (every step holds the same N prompts, so this is also the mean of the per-step shares)."""
    prompts_SB = np.asarray([row["bin/prompts"] for row in _rows_after(rows, after_step)], float)
    return prompts_SB.sum(axis=0) / prompts_SB.sum()


def all_equal_share(rows: Sequence[Mapping[str, Any]], *, after_step: int = 30) -> float:
    """The mean share of groups whose rewards are all equal (zero advantage) over rows with
    step > after_step: `1 - nonzero_advantage_fraction`."""
    kept = _rows_after(rows, after_step)
    return float(np.mean([1.0 - float(row["nonzero_advantage_fraction"]) for row in kept]))


def batches_failing(rows: Sequence[Mapping[str, Any]], *, after_step: int = 30) -> dict[str, int]:
    """Criteria 1 and 2 batch by batch over rows with step > after_step: how many batches have
    one bin above `MAX_BIN_SHARE` of their prompts (`bins_max`), their middle bins below
    `MIN_MIDDLE_SHARE` (`bins_middle`), more than `MAX_ALL_EQUAL` of their groups all-equal
    (`all_equal`), and how many were counted (`batches`)."""
    kept = _rows_after(rows, after_step)
    prompts_SB = np.asarray([row["bin/prompts"] for row in kept], np.float64)
    shares_SB = prompts_SB / np.maximum(prompts_SB.sum(axis=1, keepdims=True), 1.0)
    all_equal_S = 1.0 - np.asarray([float(row["nonzero_advantage_fraction"]) for row in kept])
    return {
        "bins_max": int((shares_SB.max(axis=1) > MAX_BIN_SHARE).sum()),
        "bins_middle": int((shares_SB[:, 1:-1].sum(axis=1) < MIN_MIDDLE_SHARE).sum()),
        "all_equal": int((all_equal_S > MAX_ALL_EQUAL).sum()),
        "batches": len(kept),
    }


def pool_level_shares(task: tasks.ChainTaskConfig) -> np.ndarray:
    """float64[L] the pool's realised share of each level (its exact counts over the pool size)."""
    return task.pool_level_counts() / task.pool_size


def premise_criteria(
    evaluation: Any,
    rows: Sequence[Mapping[str, Any]],
    level_shares: ArrayLike,
    *,
    after_step: int = 30,
) -> list[Criterion]:
    """The five premise criteria of a profile (module docstring), in order.

    Args:
      evaluation: the warm start's validation evaluation (`ChainEvaluation` or its dict).
      rows: a GRPO pilot's `metrics.jsonl` rows (`train.read_metrics`).
      level_shares: float[L] the pool's share of levels 1..L (`pool_level_shares`).
      after_step: rows with `step > after_step` count (the first pass over the pool excluded).

    Returns:
      `[bins_max, bins_middle, all_equal, graded_levels, hardest_level, heavy_tail]`: criterion 1
      is two records (the largest bin's share and the middle bins' share). The first three are
      measured on counts pooled over the steps, as declared, and carry `batches_failing`.
    """
    shares_B = bin_shares(rows, after_step=after_step)
    failing = batches_failing(rows, after_step=after_step)
    per_batch = {name: (failing[name], failing["batches"]) for name in failing}
    middle = float(shares_B[1:-1].sum())
    all_equal = all_equal_share(rows, after_step=after_step)
    pass1 = level_pass_at_1(evaluation)
    low, high = GRADED_RANGE
    graded = sum(low <= value <= high for value in pass1.values())
    hardest = pass1[max(pass1)]
    level_shares = np.asarray(level_shares, np.float64)
    falling = np.diff(level_shares) < 0
    return [
        Criterion(
            "bins_max",
            float(shares_B.max()),
            f"<= {MAX_BIN_SHARE}",
            bool(shares_B.max() <= MAX_BIN_SHARE),
            per_batch["bins_max"],
        ),
        Criterion(
            "bins_middle",
            middle,
            f">= {MIN_MIDDLE_SHARE}",
            middle >= MIN_MIDDLE_SHARE,
            per_batch["bins_middle"],
        ),
        Criterion(
            "all_equal",
            all_equal,
            f"<= {MAX_ALL_EQUAL}",
            all_equal <= MAX_ALL_EQUAL,
            per_batch["all_equal"],
        ),
        Criterion(
            "graded_levels",
            float(graded),
            f">= {MIN_GRADED_LEVELS} levels with pass@1 in [{low}, {high}]",
            graded >= MIN_GRADED_LEVELS,
        ),
        Criterion(
            "hardest_level",
            hardest,
            f"pass@1 in (0, {HARDEST_MAX_PASS1})",
            0.0 < hardest < HARDEST_MAX_PASS1,
        ),
        Criterion(
            "heavy_tail",
            float(falling.mean()) if falling.size else 0.0,
            "share falls at every level (fraction of steps = 1)",
            bool(falling.size and falling.all()),
        ),
    ]


def format_criteria(criteria: Mapping[str, Sequence[Criterion]]) -> str:
    """A markdown table: one row per criterion, one `value (holds)` column per profile; the
    per-step criteria add `; F of N batches fail` (each batch on its own).

    Args:
      criteria: profile name -> its `premise_criteria` (same criteria, same order, for all).

    Returns:
      The table as a string (no trailing newline).
    """
    names = list(criteria)
    first = criteria[names[0]]
    lines = [
        "| criterion | threshold | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for i, record in enumerate(first):
        cells = []
        for measured in (criteria[n][i] for n in names):
            verdict = "holds" if measured.holds else "fails"
            if measured.batches_failing is not None:
                failing, counted = measured.batches_failing
                verdict += f"; {failing} of {counted} batches fail"
            cells.append(f"{measured.value:.3f} ({verdict})")
        lines.append(f"| {record.name} | {record.threshold} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_premise(
    profiles: Mapping[str, tuple[Any, Sequence[Mapping[str, Any]]]], *, after_step: int = 30
) -> Figure:
    """Each profile's warm-start success by level and its bins in training, side by side.

    Top row: every validation problem's success rate (correct samples / samples) by level, as a
    box per level with the problems jittered over it, and the level's pass@1 (their mean) as a
    line, with the graded range shaded. Bottom row: each bin's share of the batch's prompts over
    the pilot's steps after `after_step` (middle bins in another colour), with the 60 % ceiling.

    Args:
      profiles: name -> (warm-start evaluation, GRPO pilot metrics rows).
      after_step: rows with `step > after_step` count.

    Returns:
      The matplotlib Figure (Agg; save it with `savefig`).
    """
    fig = figure(figsize=(5.0 * len(profiles), 7.0), layout="constrained")
    axes = fig.subplots(2, len(profiles), squeeze=False)
    rng = np.random.default_rng(0)  # jitter only
    for column, (name, (evaluation, rows)) in enumerate(profiles.items()):
        levels_P, success_P = problem_success(evaluation)
        levels = np.unique(levels_P)
        top = axes[0, column]
        top.axhspan(*GRADED_RANGE, color="tab:green", alpha=0.1, label="graded range")
        top.boxplot([success_P[levels_P == lv] for lv in levels], positions=levels, widths=0.6)
        jitter = rng.uniform(-0.25, 0.25, size=levels_P.shape)
        top.scatter(levels_P + jitter, success_P, s=4, alpha=0.35, color="tab:blue")
        pass1 = level_pass_at_1(evaluation)
        top.plot(list(pass1), list(pass1.values()), "o-", color="tab:red", label="pass@1")
        top.set(title=f"{name}: warm start, validation", xlabel="level", ylim=(-0.03, 1.03))
        top.set_ylabel("success rate per problem")
        top.legend(loc="upper right", fontsize=8)
        shares_B = bin_shares(rows, after_step=after_step)
        bins = np.arange(len(shares_B))
        colors = ["tab:gray"] + ["tab:orange"] * (len(bins) - 2) + ["tab:gray"]
        bottom = axes[1, column]
        bottom.bar(bins, shares_B, color=colors[: len(bins)])
        bottom.axhline(MAX_BIN_SHARE, color="black", linestyle="--", linewidth=1)
        bottom.set(
            title=f"{name}: GRPO pilot, steps > {after_step}",
            xlabel="bin (0 hardest)",
            ylabel="share of prompts (mean over steps)",
            ylim=(0, 1),
            xticks=bins,
        )
        bottom.text(
            0.02,
            0.95,
            f"middle bins {shares_B[1:-1].sum():.2f}\nall-equal groups "
            f"{all_equal_share(rows, after_step=after_step):.2f}",
            transform=bottom.transAxes,
            va="top",
            fontsize=9,
        )
    return fig
