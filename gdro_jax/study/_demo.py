"""The miniature study of `make demo`: warm start, equal-compute RL runs per method, a table, plots.

    warm start (reused when its config is unchanged) -> for each method: RL run from the warm
    start with the same steps, prompts per step, rollouts per step and max new tokens -> held-out
    evaluation (unbiased pass@k per level and pooled, bootstrap intervals; reused while the
    policy and the settings are unchanged) -> table and plots.

Everything lands in the work directory: `warm_start/`, one folder per method (metrics.jsonl,
TensorBoard events, eval.json), `table.txt`, `results.json` and the PNG plots. The console says
first what will run and about how long (`plan_line`), and last where the figures went.
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

from gdro_jax import configs, controllers, models, plots, tasks
from gdro_jax import eval as evaluation
from gdro_jax.runtime import environment
from gdro_jax.study._heldout import cached_evaluation, format_comparison
from gdro_jax.train import read_metrics, train
from gdro_jax.warmstart import CONFIG_FILE, FRONTIER_FILE, config_hash, pretrain

BASELINE = "warm_start"
# The pace `plan_line` estimates with: `make demo`'s default run on a 2-core CPU shared with
# other work (19 min 55 s in all; docs/studies.md): seconds per warm-start step (its validation
# evaluation included; 804 s for 240), per RL step (the four methods' mean step, 0.94-1.64 s),
# to start an RL run (building and compiling it: 23-37 s), and per sampled test completion
# (11-29 s for 800 problems x 8).
PACE = {"warm_start_step": 3.35, "rl_step": 1.2, "rl_start": 32.0, "eval_sample": 0.0032}


def plan_line(config: ml_collections.ConfigDict, workdir: pathlib.Path, methods: list[str]) -> str:
    """What `run_demo` will run and about how long it takes (at `PACE`), skipping what the work
    directory already holds: a warm start of the same config, runs that reached their steps."""
    stored = workdir / BASELINE / CONFIG_FILE
    warm_reused = stored.exists() and (
        json.loads(stored.read_text()).get("config_hash") == config_hash(config.pretrain)
    )
    steps = config.train.steps
    to_train = [m for m in methods if _finished_steps(workdir / m) != steps]
    problems = len(tasks.build_splits(configs.chain_task_config(config.train)).test)
    policies = len(to_train) + (0 if warm_reused else 1)  # the others' evaluations are kept
    seconds = 0 if warm_reused else PACE["warm_start_step"] * config.pretrain.train.steps
    seconds += len(to_train) * (PACE["rl_start"] + PACE["rl_step"] * steps)
    seconds += policies * PACE["eval_sample"] * problems * config.eval.num_samples
    warm = (
        "the warm start (reused)"
        if warm_reused
        else f"the warm start ({config.pretrain.train.steps} supervised steps)"
    )
    trained = ", ".join(to_train) if to_train else "none (all finished)"
    return (
        f"demo: {warm}; RL runs of {steps} steps ({config.train.num_prompts} prompts x "
        f"{config.train.n_mean} rollouts) for {trained}; then the held-out test split "
        f"({problems} problems x {config.eval.num_samples} samples) for every policy not "
        f"evaluated yet. About {max(1, round(seconds / 60))} min at the pace measured on a "
        "shared 2-core CPU."
    )


def _finished_steps(folder: pathlib.Path) -> int | None:
    try:
        return json.loads((folder / "summary.json").read_text()).get("completed_steps")
    except (OSError, ValueError):
        return None


def format_counts(counts: dict[str, float], unit: str = "") -> str:
    """`name 63,740, name 64,012` (a dict printed for a person)."""
    return ", ".join(f"{name} {value:,.0f}{unit}" for name, value in counts.items())


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
    fig = plots.figure(figsize=(8, 3.5))
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
      A dict with `results` (method -> `ChainEvaluation`, the warm start included), `table`,
      `seconds` (wall time per phase) and `reused` (the policies whose stored evaluation was
      read back: the policy and the settings were unchanged).
    """
    methods = [m for m in config.methods.split(",") if m]
    for method in methods:  # before the warm start's minutes, not after them
        controllers.get_method(method)
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    print(plan_line(config, workdir, methods), flush=True)
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    model_dir = pretrain(config.pretrain, workdir / BASELINE)
    seconds["warm_start"] = time.perf_counter() - start

    results: dict[str, evaluation.ChainEvaluation] = {}
    reused: list[str] = []

    def evaluate(name: str, policy) -> None:
        start = time.perf_counter()
        results[name], again = cached_evaluation(
            policy, config, workdir / name, label=f"eval {name}", progress=config.progress
        )
        seconds[f"eval/{name}"] = time.perf_counter() - start
        if again:
            reused.append(name)

    # The warm start's own row: the same evaluation before any RL.
    evaluate(BASELINE, models.from_pretrained(model_dir))
    for method in methods:
        run_config = copy.deepcopy(config.train)
        run_config.method = method
        run_config.init_from = str(model_dir)
        run_config.progress = config.progress
        start = time.perf_counter()
        out = train(run_config, workdir / method)
        seconds[f"train/{method}"] = time.perf_counter() - start
        evaluate(method, nnx.merge(out["run"].program.graphdef, out["state"].params))

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
        "eval": {name: config.eval[name] for name in evaluation.CHAIN_FIELDS},
        "seconds": seconds,
        "reused_evaluations": reused,
        "results": {m: r.to_dict() for m, r in results.items()},
        "sampled_tokens": {
            m: float(sum(r["tokens"] for r in read_metrics(workdir / m / "metrics.jsonl")))
            for m in methods
        },
        "environment": environment(),
    }
    (workdir / "results.json").write_text(json.dumps(summary, indent=2))
    problems = len(results[BASELINE].correct)
    print(
        f"\nheld-out test split ({problems} problems), {config.eval.num_samples} samples at "
        f"T={config.eval.temperature}, seed {config.eval.seed}; unbiased pass@k\n{table}"
    )
    print(f"sampled tokens during RL: {format_counts(summary['sampled_tokens'])}")
    print(f"wall time: {format_counts(seconds, ' s')}")
    if reused:
        print(f"evaluations reused (policy and settings unchanged): {', '.join(reused)}")
    return {"results": results, "table": table, "seconds": seconds, "reused": reused}
