"""Collecting a finished study: per-seed figures, the pre-declared primary metric with its paired
bootstrap interval, secondary gains, token costs; written as `study.json`, `tables.md`, the
figures and the marked block of RESULTS.md.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any, NamedTuple

import ml_collections
import numpy as np

from gdro_jax.eval import pass_at_k
from gdro_jax.study._compare import (
    STORE,
    RunSpec,
    _eval_file,
    arms_of,
    log_rows,
    pending,
    seeds_of,
)
from gdro_jax.study._demo import BASELINE, warm_start_frontier
from gdro_jax.study._premise import all_equal_share, batches_failing, bin_shares
from gdro_jax.study._report import draw_figures
from gdro_jax.study._stats import detectable_gain, paired_gain_change, paired_relative_gain
from gdro_jax.study._tables import _mark, format_tables

# --- Collecting a finished study ------------------------------------------------------------


class Evaluated(NamedTuple):
    """One evaluation file's per-problem data."""

    num_samples: int
    correct: np.ndarray  # int64[P] correct samples of each problem
    levels: np.ndarray  # int32[P]
    sampled_tokens: float


def _load(path: pathlib.Path) -> Evaluated:
    stored = json.loads(path.read_text())
    return _evaluated(stored, float(stored.get("sampled_tokens", 0.0)))


def _evaluated(stored: dict[str, Any], sampled_tokens: float) -> Evaluated:
    result = stored["evaluation"]
    return Evaluated(
        num_samples=int(result["num_samples"]),
        correct=np.asarray(result["correct"], np.int64),
        levels=np.asarray(result["problem_levels"], np.int32),
        sampled_tokens=sampled_tokens,
    )


def _per_problem(result: Evaluated, metric: str) -> np.ndarray:
    """Per-problem unbiased `pass@k` or `mean@n` (the fraction of samples right)."""
    name, _, k = metric.partition("@")
    if name == "pass":
        return pass_at_k(result.num_samples, result.correct, int(k))
    if name == "mean":
        return result.correct / result.num_samples
    raise ValueError(f"unknown metric {metric!r}: pass@<k> or mean@<n>")


def level_weights(levels_P: np.ndarray) -> np.ndarray:
    """float64[P] problem weights under which every level present counts equally (mean 1).

    A pooled figure is the mean over the levels of each level's mean, whatever the levels'
    problem counts (the study's test split holds 1,000 problems on level 8 and 100 on the
    others); with equal counts every weight is 1 and it is the plain mean. Frontier figures
    stay the mean over the frontier's problems, as the primary metric was declared.
    """
    _, index, counts = np.unique(np.asarray(levels_P), return_inverse=True, return_counts=True)
    return (len(levels_P) / (len(counts) * counts))[index]


def _figures_of(result: Evaluated, metrics: tuple[str, ...], frontier: list[int]) -> dict:
    out: dict[str, Any] = {}
    on_frontier = np.isin(result.levels, frontier)
    pooled_weights = level_weights(result.levels)
    for metric in metrics:
        values = _per_problem(result, metric)
        out[f"pooled {metric}"] = float(np.mean(values * pooled_weights))
        out[f"frontier {metric}"] = float(values[on_frontier].mean()) if frontier else float("nan")
        for level in sorted(set(result.levels.tolist())):
            out[f"L{level} {metric}"] = float(values[result.levels == level].mean())
    out["sampled_tokens"] = result.sampled_tokens
    return out


def collect(
    config: ml_collections.ConfigDict, workdir: str | pathlib.Path, *, check_stamps: bool = True
) -> dict[str, Any]:
    """Reads a finished study: per-seed figures, the primary paired gains with intervals, the
    power (smallest detectable gain), secondary gains and token costs; JSON-ready.

    Args:
      config: the study's config.
      workdir: its work directory.
      check_stamps: refuse evaluation files made under another config (False reads them
        anyway, e.g. files written by hand).

    Raises:
      FileNotFoundError: a run or the warm start has no evaluation file (run the study first).
      ValueError: with `check_stamps`, a run evaluated under another config.
    """
    workdir = pathlib.Path(workdir)
    split = config.eval.split
    arms, seeds = list(arms_of(config)), seeds_of(config)
    frontier, frontier_k = warm_start_frontier(workdir / BASELINE)
    k = config.eval.num_samples
    # (mean@n, the fraction of samples right, is the unbiased pass@1: reported once, as pass@1)
    metrics = tuple(dict.fromkeys((config.primary.metric, "pass@1", f"pass@{k}")))

    def path_of(arm, seed):
        return _eval_file(workdir / arm / f"seed_{seed}", split)

    missing = [str(path_of(a, s)) for a in arms for s in seeds if not path_of(a, s).exists()]
    if missing:
        raise FileNotFoundError(f"{len(missing)} runs have no evaluation yet: {missing[:4]}")
    if check_stamps:
        stale = [spec.name for spec in pending(config, workdir) if spec.arm in arms]
        if stale:
            raise ValueError(
                f"{len(stale)} runs were evaluated under another config ({stale[:4]}): run the "
                "study again to bring them up to date"
            )
    records = {
        arm: {seed: json.loads(path_of(arm, seed).read_text()) for seed in seeds} for arm in arms
    }
    loaded = {
        arm: {
            seed: _evaluated(record, float(record.get("sampled_tokens", 0.0)))
            for seed, record in runs.items()
        }
        for arm, runs in records.items()
    }
    warm = _load(_eval_file(workdir / BASELINE, split))

    per_seed = {
        arm: {str(seed): _figures_of(loaded[arm][seed], metrics, frontier) for seed in seeds}
        for arm in arms
    }
    primary_metric = config.primary.metric
    levels_of_primary = frontier if config.primary.levels == "frontier" else None

    def matrix(arm, metric, levels):
        """[seeds, problems] values: those of `levels`' problems, or for the pooled scope
        (`levels` None) all of them scaled by `level_weights`, so that their mean (and the
        paired gain's ratio of means) weighs every level equally."""
        rows = []
        for seed in seeds:
            result = loaded[arm][seed]
            values = _per_problem(result, metric)
            if levels is None:
                values = values * level_weights(result.levels)
            else:
                values = values[np.isin(result.levels, levels)]
            rows.append(values)
        return np.stack(rows)

    def gain(arm, metric, levels, num_resamples=config.primary.num_resamples):
        """The paired gain, or None when undefined (no such problems, or a baseline at 0)."""
        if levels is not None and not levels:
            return None
        base = matrix(config.baseline, metric, levels)
        if base.mean() <= 0:
            return None
        paired = paired_relative_gain(
            matrix(arm, metric, levels),
            base,
            num_resamples=num_resamples,
            confidence=config.primary.confidence,
            seed=0,
        )
        return {
            "gain": paired.gain,
            "low": paired.low,
            "high": paired.high,
            "standard_error": paired.standard_error,
            "detectable_gain": detectable_gain(paired.standard_error),
            "per_seed": list(paired.per_seed),
        }

    others = [arm for arm in arms if arm != config.baseline]
    primary = {arm: gain(arm, primary_metric, levels_of_primary) for arm in others}
    secondary = {
        arm: {
            f"{scope} {metric}": gain(arm, metric, levels)
            for metric in metrics
            for scope, levels in (("pooled", None), ("frontier", frontier))
            if (scope, metric) != ("frontier" if levels_of_primary else "pooled", primary_metric)
        }
        for arm in others
    }
    # Each level's gain, for the per-level table's marks (fewer resamples: a mark, not a figure).
    levels_present = sorted(set(warm.levels.tolist()))
    level_gains = {
        arm: {
            f"L{level} {metric}": _interval_only(gain(arm, metric, [level], MARK_RESAMPLES))
            for metric in metrics
            for level in levels_present
        }
        for arm in others
    }
    means = {
        arm: {
            name: float(np.mean([per_seed[arm][str(s)][name] for s in seeds]))
            for name in per_seed[arm][str(seeds[0])]
        }
        for arm in arms
    }
    base_tokens = means[config.baseline]["sampled_tokens"]
    along = _along(records, config, frontier, primary=bool(config.get("along_primary")))
    summary = {
        "split": split,
        "arms": arms,
        "seeds": seeds,
        "baseline": config.baseline,
        "frontier_levels": frontier,
        "frontier_k": frontier_k,
        "primary_declaration": config.primary.to_dict(),
        "primary": primary,
        "secondary": secondary,
        "level_gains": level_gains,
        "mark_resamples": MARK_RESAMPLES,
        "mean": means,
        "per_seed": per_seed,
        "warm_start": _figures_of(warm, metrics, frontier),
        "token_ratio": {
            arm: means[arm]["sampled_tokens"] / base_tokens if base_tokens else float("nan")
            for arm in arms
        },
        "problems": {
            "total": int(len(warm.levels)),
            "frontier": int(np.isin(warm.levels, frontier).sum()),
        },
    }
    if along is not None:
        summary["along"] = along
        reference = _along_reference(config, arms, seeds, frontier)
        if reference is not None:
            summary["along_reference"] = reference
    training = _training(records)
    if training is not None:
        summary["training"] = training
    warm_record = json.loads(_eval_file(workdir / BASELINE, split).read_text())
    summary["environments"] = _environments(records, warm_record)
    return summary


# Paired bootstrap resamples behind the per-level and along-the-run tables' marks.
MARK_RESAMPLES = 2000


def _interval_only(g: dict[str, Any] | None) -> dict[str, float] | None:
    return None if g is None else {name: g[name] for name in ("gain", "low", "high")}


def _environments(records: dict[str, dict[int, dict]], warm: dict[str, Any]) -> dict[str, Any]:
    """Which machine made which file: the distinct `environment` records of the runs' files and
    the warm start's evaluation, each with the runs it made (`<arm>/seed_<s>`, `warm_start`),
    and the runs whose files hold none (trained before the files recorded it)."""
    named = [(f"{arm}/seed_{seed}", r) for arm, runs in records.items() for seed, r in runs.items()]
    named.append((BASELINE, warm))
    groups: dict[str, dict[str, Any]] = {}
    unrecorded = []
    for name, record in named:
        if "environment" not in record:
            unrecorded.append(name)
            continue
        key = json.dumps(record["environment"], sort_keys=True)
        groups.setdefault(key, {"environment": record["environment"], "runs": []})
        groups[key]["runs"].append(name)
    return {"recorded": list(groups.values()), "unrecorded": unrecorded}


def _training(records: dict[str, dict[int, dict]]) -> dict[str, Any] | None:
    """What each arm did in training, from its runs' decisions and compact logs (after the first
    pass over the pool, the decisions' `after_step`), mean and min-max over seeds: the fraction of
    groups with a non-zero gradient, and the premise's bin occupancy (the largest bin's share of
    the batch, the middle bins' share) and all-equal share, pooled over the steps and batch by
    batch (`batches_failing`). None for files without them."""
    if not all("decisions" in r and "log" in r for runs in records.values() for r in runs.values()):
        return None
    out: dict[str, Any] = {}
    for arm, runs in records.items():
        values: dict[str, list[float]] = {}
        for record in runs.values():
            after = int(record["decisions"]["after_step"])
            rows = log_rows(record["log"])
            shares = bin_shares(rows, after_step=after)
            failing = batches_failing(rows, after_step=after)
            figures = {
                "nonzero_gradient_fraction": record["decisions"]["nonzero_gradient_fraction"],
                "largest_bin_share": float(shares.max()),
                "middle_bins_share": float(shares[1:-1].sum()),
                "all_equal_share": all_equal_share(rows, after_step=after),
                # The same criteria batch by batch: batches that break each on their own.
                "batches": failing["batches"],
                "batches_with_a_bin_over_max": failing["bins_max"],
                "batches_with_middle_under_min": failing["bins_middle"],
                "batches_all_equal_over_max": failing["all_equal"],
            }
            for name, value in figures.items():
                values.setdefault(name, []).append(float(value))
        out[arm] = {
            name: {"mean": float(np.mean(v)), "min": float(np.min(v)), "max": float(np.max(v))}
            for name, v in values.items()
        }
        out[arm]["after_step"] = int(next(iter(runs.values()))["decisions"]["after_step"])
    return out


def _along(
    records: dict[str, dict[int, dict]], config, frontier, *, primary: bool = False
) -> dict[str, Any] | None:
    """The held-out figures along the runs (`checkpoint.snapshot_steps`), when every run has
    them at the same steps and every arm has the baseline's seeds: per arm, the seeds' mean
    frontier and pooled pass@1 at each point, the rollouts it first took to reach the baseline's
    final frontier pass@1 (None: never), and (other arms) its frontier pass@1 gain over the
    baseline at each point with its interval (`MARK_RESAMPLES` resamples).

    Points pair by their step and runs by their seed, never by their order in the files. With
    `primary` (a study that declares its primary along the run, `config.along_primary`), also,
    per arm: the mean of the primary figure at each point; its gain over the baseline at each
    point (`primary gain`, `config.primary.num_resamples` resamples) and how that gain changed
    from the first point to the last (`primary change`, paired over seeds and problems); the
    pooled pass@1 gain at each point; and the fraction of groups with a non-zero gradient in each
    segment of steps ending at a point (from the compact logs)."""
    if config.baseline not in records or not all(
        "along" in r for runs in records.values() for r in runs.values()
    ):
        return None
    seeds = sorted(records[config.baseline])
    if any(sorted(runs) != seeds for runs in records.values()):
        return None
    by_step = {
        arm: {seed: {int(p["step"]): p for p in r["along"]} for seed, r in runs.items()}
        for arm, runs in records.items()
    }
    step_sets = {tuple(sorted(points)) for runs in by_step.values() for points in runs.values()}
    if len(step_sets) != 1:
        return None
    (steps,) = step_sets
    first = by_step[config.baseline][seeds[0]]
    rollouts = [int(first[step]["sampled_rollouts"]) for step in steps]
    if any(
        int(points[step]["sampled_rollouts"]) != r
        for runs in by_step.values()
        for points in runs.values()
        for step, r in zip(steps, rollouts, strict=True)
    ):
        return None  # the same step at other sampled rollouts: not comparable
    metric = config.primary.metric
    names = ("frontier pass@1", "pooled pass@1", *((f"frontier {metric}",) if primary else ()))
    metrics = tuple(dict.fromkeys(("pass@1", metric)))

    def evaluated(arm: str, seed: int, step: int) -> Evaluated:
        return _evaluated(by_step[arm][seed][step], 0.0)

    curves: dict[str, Any] = {}
    for arm in records:
        figures = {
            step: [_figures_of(evaluated(arm, s, step), metrics, frontier) for s in seeds]
            for step in steps
        }
        curves[arm] = {
            name: [float(np.mean([f[name] for f in figures[step]])) for step in steps]
            for name in names
        }
    target = curves[config.baseline]["frontier pass@1"][-1]
    for curve in curves.values():
        reached = [
            r for r, v in zip(rollouts, curve["frontier pass@1"], strict=True) if v >= target
        ]
        curve["rollouts_to_baseline_final"] = reached[0] if reached else None

    def matrix(arm: str, step: int, metric: str, levels) -> np.ndarray:
        """[seeds, problems] figures after `step` steps: `levels`' problems, or all of them
        weighted so that every level counts equally (`levels` None, the pooled scope)."""
        rows = []
        for seed in seeds:
            result = evaluated(arm, seed, step)
            values = _per_problem(result, metric)
            if levels is None:
                rows.append(values * level_weights(result.levels))
            else:
                rows.append(values[np.isin(result.levels, levels)])
        return np.stack(rows)

    def gains(arm: str, metric: str, levels, num_resamples: int) -> list:
        out = []
        for step in steps:
            base = matrix(config.baseline, step, metric, levels)
            paired = None
            if base.size and base.mean() > 0:
                paired = paired_relative_gain(
                    matrix(arm, step, metric, levels), base, num_resamples=num_resamples,
                    confidence=config.primary.confidence, seed=0,
                )  # fmt: skip
            out.append(None if paired is None else _interval_only(paired._asdict()))
        return out

    primary_levels = frontier if config.primary.levels == "frontier" else None
    for arm, curve in curves.items():
        if primary:
            curve["nonzero_gradient_fraction"] = _segment_means(
                [records[arm][s]["log"] for s in seeds], steps, "nonzero_advantage_fraction"
            )
        if arm == config.baseline:
            continue
        if frontier:
            curve["frontier pass@1 gain"] = gains(arm, "pass@1", frontier, MARK_RESAMPLES)
        if not primary:
            continue
        resamples = config.primary.num_resamples
        curve["primary gain"] = gains(arm, metric, primary_levels, resamples)
        curve["pooled pass@1 gain"] = gains(arm, "pass@1", None, MARK_RESAMPLES)
        first_step, last_step = steps[0], steps[-1]
        ends = (first_step, last_step)
        bases = [matrix(config.baseline, step, metric, primary_levels) for step in ends]
        change = None
        if all(b.size and b.mean() > 0 for b in bases):
            change = paired_gain_change(
                matrix(arm, first_step, metric, primary_levels), bases[0],
                matrix(arm, last_step, metric, primary_levels), bases[1],
                num_resamples=resamples, confidence=config.primary.confidence, seed=0,
            )  # fmt: skip
            change = _interval_only(change._asdict())
        curve["primary change"] = change
        curve["reading"] = reading_of(change)
    out: dict[str, Any] = {"sampled_rollouts": rollouts, "arms": curves}
    if primary:
        out["steps"] = list(steps)
        out["primary_name"] = f"{'frontier' if primary_levels else 'pooled'} {metric}"
    return out


def _along_reference(config, arms: list[str], seeds: list[int], frontier) -> dict | None:
    """The points of the study a horizon study continues (`config.warm_start_store`, its
    results folder), for the arms and seeds both have: its figures along its own runs, computed
    as this study's (`_along` with the primary); None without such a study or points."""
    if not (config.get("along_primary") and config.get("warm_start_store")):
        return None
    store = pathlib.Path(config.warm_start_store) / STORE
    split = config.eval.split
    records: dict[str, dict[int, dict]] = {}
    for arm in arms:
        paths = {seed: _eval_file(store / arm / f"seed_{seed}", split) for seed in seeds}
        if not all(path.exists() for path in paths.values()):
            continue
        records[arm] = {seed: json.loads(path.read_text()) for seed, path in paths.items()}
    along = _along(records, config, frontier, primary=True)
    if along is None:
        return None
    return {"results": str(config.warm_start_store), **along}


def reading_of(change: dict[str, float] | None) -> str:
    """The horizon study's declared reading of a gain's change from the first point to the last:
    `grows` / `closes` where the change's interval lies above / below 0, else `holds`
    (`undefined` without a change)."""
    if change is None:
        return "undefined"
    return {" (+)": "grows", " (-)": "closes", "": "holds"}[_mark(change)]


def _segment_means(logs: list[dict[str, list]], steps: tuple[int, ...], name: str) -> list:
    """The mean over seeds of each run's mean of `name` over the steps in each segment
    `(previous point, point]` (the first from step 1); None for a segment no log covers."""
    out = []
    for low, high in zip((0, *steps[:-1]), steps, strict=True):
        per_run = []
        for log in logs:
            values = [
                float(v)
                for step, v in zip(log["step"], log[name], strict=True)
                if low < int(step) <= high
            ]
            if values:
                per_run.append(float(np.mean(values)))
        out.append(float(np.mean(per_run)) if per_run else None)
    return out


# --- Writing the results ----------------------------------------------------------------------

RESULTS_BEGIN = "<!-- study results: written by experiments/compare.py; do not edit by hand -->"
RESULTS_END = "<!-- end of study results -->"


def results_markers(name: str = "") -> tuple[str, str]:
    """The lines around a study's block in a Markdown file: `RESULTS_BEGIN` / `RESULTS_END`, or
    for a named study (`config.name`, e.g. a profile) lines that carry its name, so that one
    file holds a block per study."""
    if not name:
        return RESULTS_BEGIN, RESULTS_END
    return (
        f"<!-- study results ({name}): written by experiments/compare.py; do not edit by hand -->",
        f"<!-- end of study results ({name}) -->",
    )


def run_figures(config: ml_collections.ConfigDict, workdir: pathlib.Path, spec: RunSpec) -> str:
    """One line with a finished run's held-out figures (what RESULTS.md's per-seed table shows)."""
    folder = workdir / spec.arm / f"seed_{spec.seed}"
    frontier, _ = warm_start_frontier(workdir / BASELINE)
    result = _load(_eval_file(folder, config.eval.split))
    figures = _figures_of(result, (config.primary.metric, "pass@1"), frontier)
    shown = ", ".join(
        f"{name} {figures[name]:.4f}"
        for name in (
            f"frontier {config.primary.metric}",
            f"pooled {config.primary.metric}",
            "pooled pass@1",
        )  # fmt: skip
    )
    return f"{spec.name}: {shown}, sampled tokens {result.sampled_tokens:.0f}"


def write_results(
    config: ml_collections.ConfigDict,
    workdir: str | pathlib.Path,
    results_dir: str | pathlib.Path,
    results_md: str | pathlib.Path | None = None,
) -> dict[str, Any]:
    """Collects a finished study into `results_dir` (`study.json`, `tables.md`, the figures of
    `gdro_jax.study._report`) and, given `results_md`, replaces the block between its
    markers (`results_markers(config.name)`) with the tables (the file's prose is kept)."""
    workdir, results_dir = pathlib.Path(workdir), pathlib.Path(results_dir)
    begin, end = results_markers(config.get("name", ""))
    if results_md is not None:  # checked before anything is written
        results_md = pathlib.Path(results_md)
        text = results_md.read_text() if results_md.exists() else ""
        if text and (begin not in text or end not in text):
            raise ValueError(f"{results_md}: no '{begin}' ... '{end}' block to replace")
    summary = collect(config, workdir)
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / "study.json").write_text(json.dumps(summary, indent=2) + "\n")
    tables = format_tables(summary)
    (results_dir / "tables.md").write_text(tables + "\n")
    draw_figures(summary, workdir, results_dir)
    if results_md is not None:
        block = f"{begin}\n{tables}\n{end}"
        if text:
            head, _, rest = text.partition(begin)
            _, _, tail = rest.partition(end)
            results_md.write_text(head + block + tail)
        else:
            results_md.write_text(block + "\n")
    return summary
