"""A chain-task policy's evaluation on the held-out test split: per level, pooled, and on the
frontier, written as `report.json`, `report.md` and `completions.jsonl`.

`evaluate_task_policy` samples `num_samples` completions of every test problem of the run's task
(`tasks.build_splits(config).test`, or its first `limit` problems per level) with `evaluate_task`
and reports mean@n and the unbiased pass@k for every k <= n per level and pooled, with bootstrap
intervals over problems, as the demo and the warm start do. Defaults follow SPEC 11's frontier
check: 8 samples at T = 1 without truncation.

The frontier levels are the levels the policy does not yet solve reliably: pass@min(8, n) below
0.95 (`frontier_levels`). Pooled figures are dominated by the easy levels, which make up most
problems and sit at the ceiling; the frontier row pools only the levels where a method can still
show a difference.

Nothing is written until sampling is done, and the folder is checked first: one holding a math
evaluation's resume files (`settings.json`, `samples.jsonl`) is refused, so the two never mix.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from gdro_jax import runtime, tasks
from gdro_jax.eval._math_eval import REPORT_JSON, REPORT_MARKDOWN, _check_int
from gdro_jax.eval._math_files import COMPLETIONS_FILE, SAMPLES_FILE, SETTINGS_FILE
from gdro_jax.eval._passk import PassSummary, summarize_counts
from gdro_jax.eval._task_eval import TaskEvaluation, evaluate_with
from gdro_jax.sampling import generate

FRONTIER_K = 8
FRONTIER_PASS = 0.95


@dataclasses.dataclass(frozen=True)
class TaskEvalSettings:
    """Sampling settings of a chain-task evaluation (the attributes `evaluate_with` reads).

    Attributes:
      num_samples: n, completions per problem; pass@k is reported for k = 1..n.
      temperature, top_p, top_k: sampling settings (SPEC 11: T = 1, no truncation).
      batch_size: problems per sampler call.
      seed: PRNG seed of the samples.
    """

    num_samples: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    batch_size: int = 64
    seed: int = 0

    def __post_init__(self):
        for name in ("num_samples", "batch_size"):
            _check_int(name, getattr(self, name), minimum=1)
        _check_int("top_k", self.top_k, minimum=0)
        _check_int("seed", self.seed, minimum=0)
        if not (isinstance(self.temperature, int | float) and self.temperature >= 0):
            raise ValueError(f"temperature must be >= 0, got temperature={self.temperature!r}")
        if not (isinstance(self.top_p, int | float) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be a float in (0, 1], got top_p={self.top_p!r}")


def frontier_levels(
    evaluation: TaskEvaluation, *, k: int | None = None, threshold: float = FRONTIER_PASS
) -> list[int]:
    """The levels whose pass@k is below `threshold` (k: default min(8, n)), ascending."""
    k = min(FRONTIER_K, evaluation.num_samples) if k is None else k
    return [level for level in evaluation.by_level if evaluation.pass_at(k, level) < threshold]


def _plain(summary: PassSummary | None, n: int) -> dict[str, Any] | None:
    if summary is None:
        return None
    return {
        "num_problems": summary.num_problems,
        f"mean@{n}": summary.mean,
        f"mean@{n}_interval": summary.mean_interval.tolist(),
        "pass@k": {str(k + 1): float(v) for k, v in enumerate(summary.pass_at)},
        "pass@k_interval": {str(k + 1): v.tolist() for k, v in enumerate(summary.pass_interval)},
    }


@dataclasses.dataclass(frozen=True)
class TaskReport:
    """The result of `evaluate_task_policy` (`to_dict` is what `report.json` holds).

    Attributes:
      settings: the policy's name, its checkpoint step (None for an HF folder), the split, the
        sampling settings and the task config.
      evaluation: the per-level and pooled `TaskEvaluation`.
      frontier_k: the k of the frontier test.
      frontier_levels: levels with pass@frontier_k < 0.95.
      frontier: `PassSummary` pooled over the frontier levels' problems (intervals stratified by
        level); None when there is no frontier level.
      problem_ids: each problem's id, in the order of `evaluation.correct`.
      timing: `total_s`, seconds of the sampling and grading.
    """

    settings: dict[str, Any]
    evaluation: TaskEvaluation
    frontier_k: int
    frontier_levels: list[int]
    frontier: PassSummary | None
    problem_ids: list[str]
    timing: dict[str, float]

    def pass_at(self, k: int, level: int | None = None) -> float:
        """pass@k of one level, or pooled when `level` is None."""
        return self.evaluation.pass_at(k, level)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of everything (the content of `report.json`)."""
        n = self.evaluation.num_samples
        return {
            "task": "chain",
            "settings": self.settings,
            "num_samples": n,
            "levels": {str(lv): _plain(s, n) for lv, s in self.evaluation.by_level.items()},
            "pooled": _plain(self.evaluation.pooled, n),
            "frontier": {
                "k": self.frontier_k,
                "threshold": FRONTIER_PASS,
                "levels": list(self.frontier_levels),
                "summary": _plain(self.frontier, n),
            },
            "problems": [
                {"id": i, "level": int(level), "n": n, "c": int(c)}
                for i, level, c in zip(
                    self.problem_ids, self.evaluation.levels, self.evaluation.correct, strict=True
                )
            ],
            "timing": self.timing,
        }

    def to_markdown(self) -> str:
        """A Markdown table: one row per level, pooled and frontier, with mean@n and pass@k for
        k = 1, the frontier's k and n (`report.json` has every k); 95 % intervals."""
        n, s = self.evaluation.num_samples, self.settings
        ks = sorted({1, self.frontier_k, n})
        header = ["level", "problems", f"mean@{n}"] + [f"pass@{k}" for k in ks]

        def row(name: str, summary: PassSummary | None) -> str:
            if summary is None:
                cells = [name, "0"] + ["-"] * (len(ks) + 1)
            else:
                cells = [
                    name,
                    str(summary.num_problems),
                    _cell(summary.mean, summary.mean_interval),
                ]
                cells += [_cell(summary.pass_at[k - 1], summary.pass_interval[k - 1]) for k in ks]
            return "| " + " | ".join(cells) + " |"

        step = "" if s.get("step") is None else f" (checkpoint step {s['step']})"
        levels = ", ".join(map(str, self.frontier_levels)) or "none"
        lines = [
            f"# Chain-task evaluation: {s.get('policy') or '(unnamed policy)'}{step}",
            "",
            f"The {s['split']} split, {len(self.problem_ids)} problems; {n} samples per problem at "
            f"T={s['temperature']}, top-p {s['top_p']}, top-k {s['top_k']}; seed {s['seed']}. "
            "Cells: estimate [95 % bootstrap interval over problems]; pass@k is the unbiased "
            "estimator, graded by exact match of the whole worked solution.",
            "",
            "| " + " | ".join(header) + " |",
            "|---|" + "---:|" * (len(header) - 1),
        ]
        lines += [row(str(level), summary) for level, summary in self.evaluation.by_level.items()]
        lines += [row("pooled", self.evaluation.pooled), row("frontier", self.frontier)]
        lines += [
            "",
            f"Frontier levels (pass@{self.frontier_k} < {FRONTIER_PASS}): {levels}. "
            f"Sampling and grading took {self.timing['total_s']:.1f} s.",
        ]
        return "\n".join(lines) + "\n"


def _cell(value: float, interval: np.ndarray) -> str:
    return f"{value:.3f} [{interval[0]:.3f}, {interval[1]:.3f}]"


def _first_per_level(rows: list[dict], limit: int | None) -> list[dict]:
    if limit is None:
        return rows
    _check_int("limit", limit, minimum=1)
    seen: dict[int, int] = {}
    kept = []
    for row in rows:
        seen[row["level"]] = seen.get(row["level"], 0) + 1
        if seen[row["level"]] <= limit:
            kept.append(row)
    return kept


def check_task_out_dir(out_dir) -> Path:
    """Refuses an output folder that is a file or holds a math evaluation's resume files."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out_dir must be a folder, got out_dir={str(out_dir)!r} (a file)")
    for name in (SETTINGS_FILE, SAMPLES_FILE):
        if (out / name).exists():
            raise ValueError(
                f"out_dir={str(out_dir)!r} holds a math evaluation ({name}); a chain-task "
                "evaluation goes to another folder"
            )
    return out


def evaluate_task_policy(
    model,
    task_config: tasks.ChainTaskConfig,
    out_dir,
    *,
    settings: TaskEvalSettings | None = None,
    policy_name: str = "",
    step: int | None = None,
    limit: int | None = None,
    save_completions: bool = True,
    progress: bool = True,
    sampler: Callable[..., Any] = generate,
) -> TaskReport:
    """Evaluates a chain-task policy on its task's test split and writes the reports.

    Args:
      model: the policy (`gdro_jax.models.Decoder` over the task's 18 symbols).
      task_config: the run's task (`ChainTaskConfig(**run_config["task"])`): it fixes the
        test split and the completion length.
      out_dir: the output folder (created at the end): `report.json`, `report.md` and, with
        `save_completions`, `completions.jsonl` (per problem: id, level, prompt, gold solution,
        and each completion's text, special tokens written out, and whether it is correct).
      settings: sampling settings (None: `TaskEvalSettings()`).
      policy_name, step: recorded in the report.
      limit: evaluate only the first `limit` test problems of each level.
      save_completions: write `completions.jsonl`.
      progress: show a progress bar over batches.
      sampler: the sampling function (see `sample_correct_counts`); tests pass fakes.

    Returns:
      The `TaskReport`. Several processes (`jax.distributed` initialised) each evaluate the
      whole split on their own devices (the same report: the split is small and the keys are
      fixed); process 0 alone writes.

    Raises:
      ValueError: an output folder that is a file or holds a math evaluation, or bad settings;
        before anything is sampled or written.
    """
    settings = TaskEvalSettings() if settings is None else settings
    out = check_task_out_dir(out_dir)
    rows = _first_per_level(list(tasks.build_splits(task_config).test), limit)
    completions: dict[int, list[dict[str, Any]]] = {}

    def keep_completions(problems_b, tokens_RM, lengths_R, correct_R):
        for position, problem in enumerate(problems_b):
            slots = range(position * settings.num_samples, (position + 1) * settings.num_samples)
            completions[int(problem)] = [
                {
                    "text": tasks.decode(tokens_RM[r, : lengths_R[r]], skip_special_tokens=False),
                    "correct": bool(correct_R[r]),
                }
                for r in slots
            ]

    tick = time.perf_counter()
    evaluation = evaluate_with(
        model,
        task_config,
        rows,
        settings,
        progress and runtime.is_primary(),
        sampler=sampler,
        on_batch=keep_completions if save_completions else None,
    )
    k = min(FRONTIER_K, settings.num_samples)
    levels = frontier_levels(evaluation, k=k)
    frontier = None
    on_frontier = np.isin(evaluation.levels, levels)
    if levels:
        _, frontier = summarize_counts(
            evaluation.correct[on_frontier], settings.num_samples, evaluation.levels[on_frontier]
        )
    report = TaskReport(
        settings={
            "policy": policy_name,
            "step": step,
            "split": "test",
            "limit_per_level": limit,
            **dataclasses.asdict(settings),
            "task": dataclasses.asdict(task_config),
        },
        evaluation=evaluation,
        frontier_k=k,
        frontier_levels=levels,
        frontier=frontier,
        problem_ids=[str(row["id"]) for row in rows],
        timing={"total_s": time.perf_counter() - tick},
    )
    if not runtime.is_primary():  # several processes: each evaluated the split, 0 writes
        return report
    out.mkdir(parents=True, exist_ok=True)
    (out / REPORT_JSON).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    (out / REPORT_MARKDOWN).write_text(report.to_markdown())
    (out / COMPLETIONS_FILE).unlink(missing_ok=True)  # never a file of an earlier run
    if save_completions:
        with open(out / COMPLETIONS_FILE, "w") as file:
            for index, row in enumerate(rows):
                entry = {key: row[key] for key in ("id", "level", "prompt", "solution")}
                entry["completions"] = completions[index]
                file.write(json.dumps(entry) + "\n")
    return report
