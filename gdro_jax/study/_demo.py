"""The miniature study of `make demo`: warm start, equal-compute RL runs per method, a table, plots.

    warm start (reused when its config is unchanged) -> for each method: RL run from the warm
    start with the same steps, prompts per step, rollouts per step and max new tokens -> held-out
    evaluation (unbiased pass@k per level and pooled, bootstrap intervals) -> table and plots.

Everything lands in the work directory: `warm_start/`, one folder per method (metrics.jsonl,
TensorBoard events, eval.json), `table.txt`, `results.json` and the PNG plots.
"""

from __future__ import annotations

import copy
import json
import pathlib
import time
from typing import Any

import ml_collections
import numpy as np
from flax import nnx
from matplotlib.figure import Figure

from gdro_jax import configs, controllers, models, plots, tasks
from gdro_jax import eval as evaluation
from gdro_jax.eval import evaluate_chain, pass_at_k
from gdro_jax.train import read_metrics, train
from gdro_jax.warmstart import FRONTIER_FILE, pretrain

BASELINE = "warm_start"


def warm_start_frontier(warm_start_dir: str | pathlib.Path) -> tuple[list[int], int]:
    """`(levels, k)`: the frontier levels, those where the warm start's validation pass@k (from
    its `frontier.json`; k = min(8, its samples)) is below `eval.FRONTIER_PASS` (0.95)."""
    stored = json.loads((pathlib.Path(warm_start_dir) / FRONTIER_FILE).read_text())["evaluation"]
    k = min(evaluation.FRONTIER_K, stored["num_samples"])
    levels = sorted(
        int(level)
        for level, summary in stored["levels"].items()
        if summary["pass@k"][str(k)] < evaluation.FRONTIER_PASS
    )
    return levels, k


def frontier_pass_at(result: evaluation.ChainEvaluation, k: int, levels: list[int]) -> float:
    """Unbiased pass@k pooled over the problems of `levels` (NaN when there are none)."""
    chosen = np.isin(result.levels, levels)
    if not chosen.any():
        return float("nan")
    return float(np.mean(pass_at_k(result.num_samples, result.correct[chosen], k)))


def format_comparison(
    results: dict[str, evaluation.ChainEvaluation],
    ks=(1, 8),
    frontier_levels: list[int] | None = None,
    frontier_k: int = evaluation.FRONTIER_K,
) -> str:
    """One table per k (`pass@k`), each with a column per method and a row per level, `pooled`
    and (given `frontier_levels`) `frontier`, pooled over those levels only. One metric per table
    keeps it narrow (five methods fit 80 columns). The pooled figure is mostly the easy levels at
    their ceiling: the frontier row is where methods can differ."""
    methods = list(results)
    levels = list(next(iter(results.values())).by_level)
    width = max(9, *(len(m) + 1 for m in methods))
    rows: list[tuple[str, Any]] = [(f"L{level}", level) for level in levels]
    rows.append(("pooled", None))
    if frontier_levels is not None:
        rows.append(("frontier", frontier_levels))
    tables = []
    for k in ks:
        lines = [f"{f'pass@{k}':<9}" + "".join(f"{m:>{width}}" for m in methods)]
        for name, level in rows:
            cells = []
            for m in methods:
                if isinstance(level, list):
                    value = frontier_pass_at(results[m], k, level)
                else:
                    value = results[m].pass_at(k, level)
                cells.append(f"{value:>{width}.3f}")
            lines.append(f"{name:<9}" + "".join(cells))
        tables.append("\n".join(lines))
    text = "\n\n".join(tables)
    if frontier_levels is not None:
        shown = ", ".join(f"L{level}" for level in frontier_levels) or "none"
        text += (
            f"\nfrontier: {shown} (the warm start's validation pass@{frontier_k} below "
            f"{evaluation.FRONTIER_PASS})"
        )
    return text


def _plot_rewards(workdir: pathlib.Path, methods: list[str]) -> None:
    runs = {method: read_metrics(workdir / method / "metrics.jsonl") for method in methods}
    fig = plots.plot_curves(runs, ("reward",))
    fig.suptitle("Training reward (equal rollouts per step)", fontsize="medium")
    fig.savefig(workdir / "reward.png", dpi=120)


def _plot_pass_at_k(
    workdir: pathlib.Path, results: dict[str, evaluation.ChainEvaluation], k: int
) -> None:
    methods = list(results)
    levels = list(next(iter(results.values())).by_level)
    labels = [f"L{lv}" for lv in levels] + ["pooled"]
    width = 0.8 / len(methods)
    colors = plots.colors_for(methods)
    fig = Figure(figsize=(8, 3.5))
    ax = fig.subplots()
    for i, method in enumerate(methods):
        summaries = [results[method].by_level[lv] for lv in levels] + [results[method].pooled]
        values = np.asarray([s.pass_at[k - 1] for s in summaries])
        low = np.asarray([s.pass_interval[k - 1][0] for s in summaries])
        high = np.asarray([s.pass_interval[k - 1][1] for s in summaries])
        x = np.arange(len(labels)) + (i - (len(methods) - 1) / 2) * width
        error = [values - low, high - values]
        ax.bar(x, values, width, label=method, yerr=error, capsize=2, color=colors[method])
    ax.set_xticks(np.arange(len(labels)), labels)
    ax.set_ylabel(f"held-out pass@{k}")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"pass@{k} per level (bootstrap 95% intervals)")
    ax.legend(fontsize=7, ncol=len(methods))
    fig.tight_layout()
    fig.savefig(workdir / f"pass_at_{k}.png", dpi=120)


def _plot_curriculum(workdir: pathlib.Path, methods: list[str]) -> None:
    """The batch's bins, Prompt-GDRO's q (methods with it) and rollouts per prompt by bin."""
    runs = {method: read_metrics(workdir / method / "metrics.jsonl") for method in methods}
    plots.plot_curriculum(runs).savefig(workdir / "curriculum.png", dpi=120)


def run_demo(config: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> dict[str, Any]:
    """Runs the miniature study; returns the per-method evaluations and timings.

    Args:
      config: `pretrain` (a pretrain config), `train` (an RL config whose `task` and `model`
        match it), `methods` (comma-separated), `eval` (samples and sampling settings for the
        held-out test split), `progress`.
      workdir: the output folder.

    Returns:
      A dict with `results` (method -> `ChainEvaluation`, the warm start included), `table`
      and `seconds` (wall time per phase).
    """
    methods = [m for m in config.methods.split(",") if m]
    for method in methods:  # before the warm start's minutes, not after them
        controllers.get_method(method)
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    model_dir = pretrain(config.pretrain, workdir / BASELINE)
    seconds["warm_start"] = time.perf_counter() - start

    task_config = configs.chain_task_config(config.train)
    test_rows = tasks.build_splits(task_config).test
    results: dict[str, evaluation.ChainEvaluation] = {}

    # The warm start's own row: the same evaluation before any RL.
    start = time.perf_counter()
    warm = models.from_pretrained(model_dir)
    results[BASELINE] = evaluate_chain(
        warm, test_rows, task_config, config.eval, progress=config.progress
    )
    seconds[f"eval/{BASELINE}"] = time.perf_counter() - start

    for method in methods:
        run_config = copy.deepcopy(config.train)
        run_config.method = method
        run_config.init_from = str(model_dir)
        run_config.progress = config.progress
        start = time.perf_counter()
        out = train(run_config, workdir / method)
        seconds[f"train/{method}"] = time.perf_counter() - start
        start = time.perf_counter()
        policy = nnx.merge(out["run"].program.graphdef, out["state"].params)
        result = evaluate_chain(
            policy, test_rows, task_config, config.eval, progress=config.progress
        )
        seconds[f"eval/{method}"] = time.perf_counter() - start
        (workdir / method / "eval.json").write_text(json.dumps(result.to_dict(), indent=2))
        results[method] = result

    frontier, frontier_k = warm_start_frontier(workdir / BASELINE)
    table = format_comparison(
        results, ks=(1, config.eval.num_samples), frontier_levels=frontier, frontier_k=frontier_k
    )
    (workdir / "table.txt").write_text(table + "\n")
    _plot_rewards(workdir, methods)
    _plot_pass_at_k(workdir, results, config.eval.num_samples)
    _plot_curriculum(workdir, methods)
    summary = {
        "methods": methods,
        "frontier_levels": frontier,
        "seconds": seconds,
        "results": {m: r.to_dict() for m, r in results.items()},
        "sampled_tokens": {
            m: float(sum(r["tokens"] for r in read_metrics(workdir / m / "metrics.jsonl")))
            for m in methods
        },
    }
    (workdir / "results.json").write_text(json.dumps(summary, indent=2))
    print(
        f"\nheld-out test split ({len(test_rows)} problems), {config.eval.num_samples} samples "
        f"at T={config.eval.temperature}; unbiased pass@k\n{table}"
    )
    print("sampled tokens during RL:", summary["sampled_tokens"])
    print("wall seconds:", {k: round(v, 1) for k, v in seconds.items()})
    return {"results": results, "table": table, "seconds": seconds}
