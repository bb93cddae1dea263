"""Offline pass@k statistics: the unbiased estimator (docs/evaluation.md, "pass@k", says why
not the tempting alternatives), mean@k, bootstrap intervals by group, and the reports' cells.

References:
  Chen et al., "Evaluating Large Language Models Trained on Code", 2021 (arXiv 2107.03374),
  eq. 1 and its numerically stable product form.
  Efron and Tibshirani, "An Introduction to the Bootstrap", 1993, ch. 13 (percentile intervals).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike


def _integers(value: ArrayLike, name: str) -> np.ndarray:
    """`value` as an int64 array; ValueError naming `name` for non-integral or negative entries."""
    array = np.asarray(value)
    if array.dtype == bool or not (
        np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)
    ):
        raise ValueError(f"{name} must hold integers, got {name}={value!r}")
    if np.issubdtype(array.dtype, np.floating) and not np.all(
        np.isfinite(array) & (array == np.floor(array))
    ):
        raise ValueError(f"{name} must hold integers, got {name}={value!r}")
    array = array.astype(np.int64)
    if np.any(array < 0):
        raise ValueError(f"{name} must be >= 0, got {name}={value!r}")
    return array


def _checked(n: ArrayLike, c: ArrayLike, k: ArrayLike):
    n_, c_, k_ = _integers(n, "n"), _integers(c, "c"), _integers(k, "k")
    try:
        n_, c_, k_ = np.broadcast_arrays(n_, c_, k_)
    except ValueError as error:
        raise ValueError(
            f"n, c and k must broadcast together, got shapes {np.shape(n)}, {np.shape(c)}, "
            f"{np.shape(k)}"
        ) from error
    if np.any(c_ > n_):
        raise ValueError(f"c must be <= n (correct out of drawn), got n={n!r}, c={c!r}")
    if np.any(k_ < 1):
        raise ValueError(f"k must be >= 1, got k={k!r}")
    return n_, c_, k_


def pass_at_k(n: ArrayLike, c: ArrayLike, k: ArrayLike) -> np.ndarray:
    """The unbiased pass@k estimator `1 - C(n-c, k) / C(n, k)`, elementwise.

    Computed as `1 - prod_{j<k} (n-c-j) / (n-j)`: every factor lies in [0, 1], so nothing
    overflows for any n, and the result is exact to a few ulps (no factorials, no cancellation
    in the product). Where `n - c < k` a factor is 0 and the result is exactly 1.

    Args:
      n: samples drawn per problem (int >= 0), any shape broadcasting with `c` and `k`.
      c: correct samples per problem (int, `0 <= c <= n`).
      k: the k of pass@k (int >= 1).

    Returns:
      float64 array of the broadcast shape (a numpy scalar for scalar inputs). Entries with
      `n < k` are NaN: pass@k cannot be estimated without bias from fewer than k samples, and a
      NaN makes any mean over it NaN instead of silently biased.

    Raises:
      ValueError: naming the argument, for non-integers, negatives, `c > n`, `k < 1`, or shapes
        that do not broadcast.
    """
    n_, c_, k_ = _checked(n, c, k)
    fail = np.ones(n_.shape, np.float64)
    max_k = int(k_.max()) if k_.size else 0
    for j in range(max_k):
        # Factors with j >= k are 1; with j >= n - c one factor is 0 and the product stays 0.
        numerator = np.maximum(n_ - c_ - j, 0).astype(np.float64)
        denominator = np.maximum(n_ - j, 1).astype(np.float64)
        fail *= np.where(j < k_, numerator / denominator, 1.0)
    return np.where(n_ < k_, np.nan, 1.0 - fail)[()]


def mean_at_k(n: ArrayLike, c: ArrayLike, k: ArrayLike) -> np.ndarray:
    """The unbiased estimator of mean@k, the expected accuracy of k samples: `c / n`.

    Any `k <= n` of the n samples, taken as a uniformly random subset, have an expected share of
    correct samples of `c / n`, so the estimate does not depend on k; k only decides where it is
    defined. mean@n with n samples per problem is the paper's "mean@8" (average accuracy).

    Args:
      n, c, k: as in `pass_at_k`.

    Returns:
      float64 array of the broadcast shape (a numpy scalar for scalar inputs); NaN where `n < k`.

    Raises:
      ValueError: as `pass_at_k`.
    """
    n_, c_, k_ = _checked(n, c, k)
    return np.where(n_ < k_, np.nan, c_ / np.maximum(n_, 1))[()]


class PassSummary(NamedTuple):
    """mean@n and pass@k (k = 1..n) of one group of problems, with bootstrap intervals.

    Intervals are (low, high) percentiles of the statistic over problem resamples.
    """

    num_problems: int  # problems in the group
    mean: float  # mean@n: average accuracy over all samples of the group's problems
    mean_interval: np.ndarray  # [2] float64
    pass_at: np.ndarray  # [K] float64 pass@k for k = 1..K (K = samples per problem)
    pass_interval: np.ndarray  # [K, 2] float64


def _stratified_bootstrap(
    values_NM: np.ndarray,
    strata_N: np.ndarray,
    *,
    num_resamples: int,
    confidence: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Percentile interval [M, 2] of the column means, resampling rows within each stratum."""
    total_BM = np.zeros((num_resamples, values_NM.shape[1]), np.float64)
    for stratum in np.unique(strata_N):
        rows_SM = values_NM[strata_N == stratum]
        draws_BS = rng.integers(0, len(rows_SM), size=(num_resamples, len(rows_SM)))
        total_BM += rows_SM[draws_BS].sum(axis=1)
    means_BM = total_BM / len(values_NM)
    tail = 50.0 * (1.0 - confidence)
    return np.percentile(means_BM, [tail, 100.0 - tail], axis=0).T


def summarize_counts(
    correct: ArrayLike,
    num_samples: int,
    groups: ArrayLike,
    *,
    num_resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[dict[int, PassSummary], PassSummary]:
    """Per-group and pooled mean@n and pass@k for every k <= n, with bootstrap intervals.

    Point estimates average the per-problem unbiased estimates. A group's interval resamples its
    problems with replacement; the pooled interval resamples within each group (a stratified
    bootstrap: the number of problems per group is fixed by the evaluation set's design).

    Args:
      correct: int[N] correct samples of each problem.
      num_samples: n, samples drawn per problem (>= 1); pass@k is reported for k = 1..n.
      groups: int[N] each problem's group (e.g. its level).
      num_resamples: bootstrap resamples (>= 1).
      confidence: interval coverage, in (0, 1).
      seed: seed of the bootstrap draws.

    Returns:
      `(by_group, pooled)`: a dict from group id (ascending) to its `PassSummary`, and the
      `PassSummary` of all N problems.
    """
    if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)):
        raise ValueError(f"num_samples must be an int >= 1, got num_samples={num_samples!r}")
    if num_samples < 1:
        raise ValueError(f"num_samples must be an int >= 1, got num_samples={num_samples!r}")
    if isinstance(num_resamples, bool) or not isinstance(num_resamples, int) or num_resamples < 1:
        raise ValueError(f"num_resamples must be an int >= 1, got num_resamples={num_resamples!r}")
    if not (isinstance(confidence, float) and 0.0 < confidence < 1.0 and math.isfinite(confidence)):
        raise ValueError(f"confidence must be a float in (0, 1), got confidence={confidence!r}")
    correct_N = _integers(correct, "correct").reshape(-1)
    groups_N = np.asarray(groups).reshape(-1)
    if groups_N.shape != correct_N.shape or correct_N.size == 0:
        raise ValueError(
            f"correct and groups must be non-empty and of one length, got {correct_N.size} "
            f"and {groups_N.size}"
        )
    ks_K = np.arange(1, num_samples + 1)
    # Columns: mean@n, then pass@1 .. pass@n of every problem.
    values_NM = np.concatenate(
        [
            mean_at_k(num_samples, correct_N, num_samples)[:, None],
            pass_at_k(num_samples, correct_N[:, None], ks_K[None, :]),
        ],
        axis=1,
    )
    rng = np.random.default_rng(seed)

    def summary(rows: np.ndarray, strata: np.ndarray) -> PassSummary:
        values = values_NM[rows]
        interval_M2 = _stratified_bootstrap(
            values, strata, num_resamples=num_resamples, confidence=confidence, rng=rng
        )
        means_M = values.mean(axis=0)
        return PassSummary(
            num_problems=int(rows.sum()),
            mean=float(means_M[0]),
            mean_interval=interval_M2[0],
            pass_at=means_M[1:],
            pass_interval=interval_M2[1:],
        )

    by_group = {}
    for group in np.unique(groups_N):
        rows = groups_N == group
        by_group[int(group)] = summary(rows, np.zeros(int(rows.sum()), np.int64))
    pooled = summary(np.ones_like(groups_N, bool), groups_N)
    return by_group, pooled


def summary_dict(summary: PassSummary | None, n: int) -> dict[str, Any] | None:
    """A summary as the reports store it: `num_problems`, mean@n and pass@k with intervals (keys
    "1".."n"); None stays None."""
    if summary is None:
        return None
    return {
        "num_problems": summary.num_problems,
        f"mean@{n}": summary.mean,
        f"mean@{n}_interval": summary.mean_interval.tolist(),
        "pass@k": {str(k + 1): float(v) for k, v in enumerate(summary.pass_at)},
        "pass@k_interval": {str(k + 1): v.tolist() for k, v in enumerate(summary.pass_interval)},
    }


def summary_cells(summary: PassSummary | None, ks: Sequence[int]) -> list[str]:
    """A table row's cells: problems and pass@k for each k in `ks`, each as `estimate [low,
    high]`; "0" and dashes for no summary.

    No mean@n cell: the unbiased pass@1 of a problem is `c / n`, its mean@n, and the bootstrap
    draws the same problems for every column, so the two columns would be equal to the last
    digit, intervals included (`PassSummary` keeps both; the reports' JSON holds both).
    """
    if summary is None:
        return ["0"] + ["-"] * len(ks)
    values = [(summary.pass_at[k - 1], summary.pass_interval[k - 1]) for k in ks]
    return [str(summary.num_problems)] + [f"{v:.3f} [{i[0]:.3f}, {i[1]:.3f}]" for v, i in values]


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """The lines of a Markdown table: the first column left-aligned, the others right."""
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]
