"""Final metrics of a simulation: pass@1 and pass@k per level and pooled, with seed intervals.

Every number comes from the learner's exact success probabilities on the held-out prompts, so the
only spread is across seeds (pools, batches and rollouts). Intervals are percentile-bootstrap 95%
intervals of the mean over seeds; the gain of a method over plain GRPO is a paired difference
(seeds are common random numbers across methods).
"""

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from gdro_jax.sim._simulate import SimOutput


class Interval(NamedTuple):
    """Mean over seeds and its bootstrap interval, per column (levels, then pooled, natural)."""

    mean: np.ndarray  # [C] float64
    lower: np.ndarray  # [C] float64
    upper: np.ndarray  # [C] float64


def bootstrap_interval(
    values_SC: np.ndarray, *, confidence: float = 0.95, num_resamples: int = 2000, seed: int = 0
) -> Interval:
    """Percentile-bootstrap interval of the mean over the first axis (seeds).

    Args:
      values_SC: float[S, C] one row per seed.
      confidence: the interval's coverage in (0, 1).
      num_resamples: bootstrap resamples of the seeds.
      seed: numpy seed, so tables are reproducible.

    Returns:
      An `Interval` of float64[C] arrays. With one seed the interval is the point itself.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got confidence={confidence!r}")
    values_SC = np.asarray(values_SC, np.float64)
    if values_SC.ndim == 1:
        values_SC = values_SC[:, None]
    num_seeds = values_SC.shape[0]
    mean_C = values_SC.mean(axis=0)
    rng = np.random.default_rng(seed)
    draws_KS = rng.integers(0, num_seeds, size=(num_resamples, num_seeds))
    means_KC = values_SC[draws_KS].mean(axis=1)
    tail = 100.0 * (1.0 - confidence) / 2.0
    lower_C, upper_C = np.percentile(means_KC, [tail, 100.0 - tail], axis=0)
    return Interval(mean=mean_C, lower=lower_C, upper=upper_C)


def pooled_columns(per_level_SL: np.ndarray, shares_L: np.ndarray) -> np.ndarray:
    """Appends two pooled columns to per-level values: `pooled` and `natural`.

    `pooled` is the mean over the held-out set (equal prompts per level, so the mean over levels);
    `natural` weighs levels by the training pool's heavy-tailed shares.

    Args:
      per_level_SL: float[S, L].
      shares_L: float[L] level shares summing to 1.

    Returns:
      float64[S, L + 2].
    """
    per_level_SL = np.asarray(per_level_SL, np.float64)
    pooled_S = per_level_SL.mean(axis=1)
    natural_S = per_level_SL @ np.asarray(shares_L, np.float64)
    return np.concatenate([per_level_SL, pooled_S[:, None], natural_S[:, None]], axis=1)


def summarize(
    outputs: Mapping[str, SimOutput],
    shares_L: np.ndarray,
    *,
    eval_k: int = 8,
    confidence: float = 0.95,
) -> dict[str, dict[str, Interval]]:
    """Final pass@1 and pass@k per level and pooled, for every method.

    Args:
      outputs: `{method: SimOutput}` with a leading seed axis (from `simulate`).
      shares_L: the pool's level shares, for the `natural` column.
      eval_k: the k of the outputs' `final_pass_k`, used in the metric name.
      confidence: interval coverage.

    Returns:
      `{"pass@1": {method: Interval}, f"pass@{k}": {...}}`, columns L1..LL, pooled, natural.
    """
    summary = {"pass@1": {}, f"pass@{eval_k}": {}}
    for method, output in outputs.items():
        for name, values in (
            ("pass@1", output.final_pass1),
            (f"pass@{eval_k}", output.final_pass_k),
        ):
            columns = pooled_columns(np.asarray(values), shares_L)
            summary[name][method] = bootstrap_interval(columns, confidence=confidence)
    return summary


def paired_gain(
    outputs: Mapping[str, SimOutput],
    shares_L: np.ndarray,
    *,
    baseline: str = "grpo",
    confidence: float = 0.95,
) -> dict[str, Interval]:
    """Relative gain of each method's pooled pass@k over `baseline`, paired by seed.

    The gain is `mean_s(m_s) / mean_s(b_s) - 1` with a bootstrap over seeds resampled jointly for
    both methods (the paper reports relative pass@8 gains).

    Args:
      outputs: `{method: SimOutput}` over the same seeds.
      shares_L: level shares, for the `natural` column.
      baseline: the method the others are compared with.
      confidence: interval coverage.

    Returns:
      `{method: Interval}` over the columns (pooled, natural) for every method but the baseline.
    """
    if baseline not in outputs:
        return {}
    base_S2 = pooled_columns(np.asarray(outputs[baseline].final_pass_k), shares_L)[:, -2:]
    rng = np.random.default_rng(0)
    num_seeds = base_S2.shape[0]
    draws_KS = rng.integers(0, num_seeds, size=(2000, num_seeds))
    tail = 100.0 * (1.0 - confidence) / 2.0
    gains = {}
    for method, output in outputs.items():
        if method == baseline:
            continue
        ours_S2 = pooled_columns(np.asarray(output.final_pass_k), shares_L)[:, -2:]
        ratio_K2 = ours_S2[draws_KS].mean(axis=1) / base_S2[draws_KS].mean(axis=1) - 1.0
        lower, upper = np.percentile(ratio_K2, [tail, 100.0 - tail], axis=0)
        gains[method] = Interval(ours_S2.mean(0) / base_S2.mean(0) - 1.0, lower, upper)
    return gains


def format_table(
    summary: Mapping[str, Mapping[str, Interval]],
    *,
    num_seeds: int,
    gains: Mapping[str, Interval] | None = None,
    gains_metric: str = "pass@8",
    baseline: str = "grpo",
) -> str:
    """Renders `summarize`'s output as text: one block per metric, levels as rows.

    Args:
      summary: from `summarize`.
      num_seeds: seeds behind the intervals (printed in the header).
      gains: optional `paired_gain` output, printed under the tables.
      gains_metric: the metric the gains are of (for the caption).
      baseline: the method the gains are relative to (for the caption).

    Returns:
      The table, ending with a newline.
    """
    lines = []
    for metric, per_method in summary.items():
        methods = list(per_method)
        num_columns = next(iter(per_method.values())).mean.shape[0]
        labels = [f"L{level}" for level in range(1, num_columns - 1)] + ["pooled", "natural"]
        lines.append(f"final {metric}: mean [95% interval] over {num_seeds} seeds")
        lines.append(f"{'':8s}" + "".join(f"{m:>22s}" for m in methods))
        for column, label in enumerate(labels):
            cells = []
            for method in methods:
                interval = per_method[method]
                cells.append(
                    f"{interval.mean[column]:.3f} "
                    f"[{interval.lower[column]:.3f},{interval.upper[column]:.3f}]"
                )
            lines.append(f"{label:8s}" + "".join(f"{c:>22s}" for c in cells))
        lines.append("")
    if gains:
        lines.append(
            f"relative gain in pooled | natural {gains_metric} over {baseline}, paired by seed"
        )
        width = max(14, *(len(method) + 1 for method in gains))
        for method, gain in gains.items():
            cells = [
                f"{100 * gain.mean[c]:+.1f}% [{100 * gain.lower[c]:+.1f}, "
                f"{100 * gain.upper[c]:+.1f}]"
                for c in range(2)
            ]
            lines.append(f"  {method:{width}s}" + " | ".join(cells))
        lines.append("")
    return "\n".join(lines)
