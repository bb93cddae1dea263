"""The demo's held-out evaluation: one evaluation per policy, kept and reused while the policy and
the settings are the same (`cached_evaluation`), and the table that compares the policies with
their intervals (`format_comparison`).

The demo evaluates with the `eval` block of `experiments/configs/demo.py`, which is the chain
task's defaults (`eval.EvalSettings.of("chain")`), the settings `experiments.evaluate` uses: the
same policy gives the same table either way (tests/study/test_heldout.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx

from gdro_jax import configs, tasks
from gdro_jax import eval as evaluation
from gdro_jax.eval import pass_at_k, summarize_counts
from gdro_jax.runtime import environment
from gdro_jax.sampling import generate

EVAL_FILE = "eval.json"  # a policy's evaluation, in its folder, with the key that made it


def policy_fingerprint(policy: nnx.Module) -> str:
    """sha256 of a policy's parameters: every leaf's shape, dtype and bytes (the same bits: the
    same policy, however it was loaded)."""
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(nnx.state(policy)):
        array = np.asarray(leaf)
        digest.update(f"{array.shape} {array.dtype}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def _settings(config: ml_collections.ConfigDict) -> dict[str, Any]:
    return {name: config.eval[name] for name in evaluation.CHAIN_FIELDS}


def evaluation_key(policy: nnx.Module, config: ml_collections.ConfigDict) -> str:
    """What decides a demo evaluation: the policy's parameters, the sampling settings and the
    task (its test split)."""
    task = configs.chain_task_config(config.train)
    fields = {
        "policy": policy_fingerprint(policy),
        "eval": _settings(config),
        "task": dataclasses.asdict(task),
    }
    text = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def demo_evaluation(
    policy: nnx.Module,
    config: ml_collections.ConfigDict,
    *,
    label: str = "eval",
    progress: bool = False,
    sampler: Callable[..., Any] = generate,
) -> evaluation.ChainEvaluation:
    """A policy on the demo's test split (`config.train`'s task) with `config.eval`'s settings.

    Args:
      policy: the policy.
      config: the demo config.
      label: the progress bar's label (the policy's name).
      progress: show the bar.
      sampler: called like `sampling.generate` (tests pass fakes).
    """
    task = configs.chain_task_config(config.train)
    rows = tasks.build_splits(task).test
    return evaluation.evaluate_chain(
        policy, rows, task, config.eval, progress=progress, label=label, sampler=sampler
    )


def _from_counts(stored: dict[str, Any]) -> evaluation.ChainEvaluation:
    """A `ChainEvaluation` rebuilt from its per-problem counts (`to_dict`): the summaries are a
    function of the counts and the bootstrap's fixed seed, so they come back equal."""
    n = int(stored["num_samples"])
    correct = np.asarray(stored["correct"], np.int64)
    levels = np.asarray(stored["problem_levels"], np.int32)
    by_level, pooled = summarize_counts(correct, n, levels)
    return evaluation.ChainEvaluation(n, by_level, pooled, correct, levels)


def cached_evaluation(
    policy: nnx.Module,
    config: ml_collections.ConfigDict,
    folder: str | pathlib.Path,
    *,
    label: str,
    progress: bool = False,
    sampler: Callable[..., Any] = generate,
) -> tuple[evaluation.ChainEvaluation, bool]:
    """`demo_evaluation`, read back from `folder/eval.json` when that file was made by the same
    policy and settings (`evaluation_key`), else computed and written there with its key and
    the machine that made it. Returns `(evaluation, reused)`."""
    path = pathlib.Path(folder) / EVAL_FILE
    key = evaluation_key(policy, config)
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        stored = None
    if isinstance(stored, dict) and stored.get("key") == key:
        return _from_counts(stored), True
    result = demo_evaluation(policy, config, label=label, progress=progress, sampler=sampler)
    record = {"key": key, **result.to_dict(), "environment": environment()}
    path.write_text(json.dumps(record, indent=2) + "\n")
    return result, False


def frontier_pass_at(result: evaluation.ChainEvaluation, k: int, levels: list[int]) -> float:
    """Unbiased pass@k pooled over the problems of `levels` (NaN when there are none)."""
    chosen = np.isin(result.levels, levels)
    if not chosen.any():
        return float("nan")
    return float(np.mean(pass_at_k(result.num_samples, result.correct[chosen], k)))


def _frontier_summary(result: evaluation.ChainEvaluation, levels: list[int]):
    """The `PassSummary` of `levels`' problems pooled (intervals stratified by level)."""
    chosen = np.isin(result.levels, levels)
    if not chosen.any():
        return None
    return summarize_counts(result.correct[chosen], result.num_samples, result.levels[chosen])[1]


def _cell(summary, k: int, width: int) -> str:
    """`estimate±half`: the larger half of the 95 % bootstrap interval, so the cell covers it."""
    if summary is None:
        return f"{'-':>{width}}"
    value = float(summary.pass_at[k - 1])
    low, high = summary.pass_interval[k - 1]
    half = max(value - low, high - value)
    return f"{f'{value:.3f}±{half:.3f}':>{width}}"


def format_comparison(
    results: dict[str, evaluation.ChainEvaluation],
    ks=(1, 8),
    frontier_levels: list[int] | None = None,
    frontier_k: int = evaluation.FRONTIER_K,
) -> str:
    """One table per k (`pass@k`), each with a column per method and a row per level, `pooled`
    and (given `frontier_levels`) `frontier`, pooled over those levels only. Each cell is
    `estimate±half`, half the 95 % bootstrap interval over the test problems (its larger side):
    methods whose cells overlap are within noise of each other. One metric per table keeps it
    narrow (five methods fit 80 columns). The pooled figure is mostly the easy levels at their
    ceiling: the frontier row is where methods can differ."""
    methods = list(results)
    levels = list(next(iter(results.values())).by_level)
    width = max(13, *(len(m) + 1 for m in methods))
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
                    summary = _frontier_summary(results[m], level)
                else:
                    summary = results[m].pooled if level is None else results[m].by_level[level]
                cells.append(_cell(summary, k, width))
            lines.append(f"{name:<9}" + "".join(cells))
        tables.append("\n".join(lines))
    text = "\n\n".join(tables)
    text += (
        "\n±: half the 95 % bootstrap interval over the test problems (its larger side).\n"
        "One RL seed per method: cells that overlap are within noise (another seed moves\n"
        "them more)."
    )
    if frontier_levels is not None:
        shown = ", ".join(f"L{level}" for level in frontier_levels) or "none"
        text += (
            f"\nfrontier: {shown} (the warm start's validation pass@{frontier_k} below "
            f"{evaluation.FRONTIER_PASS})"
        )
    return text
