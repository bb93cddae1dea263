"""The chain-task evaluation: k samples of each problem graded by exact match, per level and
pooled (`evaluate_chain`), and a policy's report on its task's test split with its frontier
levels (`chain_report`; docs/evaluation.md).

`evaluate_chain` samples batch b with `fold_in(key(seed), b)`, grades with the task's jittable
reward (`tasks.solution_correct`: the whole worked solution must match) and summarises the counts
with `summarize_counts` (SPEC 9).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from gdro_jax import runtime, tasks
from gdro_jax.eval._harness import (
    CHAIN_FIELDS,
    REPORT_JSON,
    REPORT_MARKDOWN,
    EvalSettings,
    batch_rows,
    check_int,
    sample_batch,
)
from gdro_jax.eval._math_files import COMPLETIONS_FILE, SAMPLES_FILE, SETTINGS_FILE
from gdro_jax.eval._passk import (
    PassSummary,
    markdown_table,
    summarize_counts,
    summary_cells,
    summary_dict,
)
from gdro_jax.sampling import generate

FRONTIER_K = 8
FRONTIER_PASS = 0.95
OnBatch = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]


@dataclasses.dataclass(frozen=True)
class ChainEvaluation:
    """The result of `evaluate_chain`.

    Attributes:
      num_samples: n, samples per problem; pass@k is given for k = 1..n.
      by_level: level -> `PassSummary` (levels ascending).
      pooled: `PassSummary` over all problems (intervals stratified by level).
      correct: int64[N] correct samples of each problem, in the input order.
      levels: int32[N] each problem's level.
    """

    num_samples: int
    by_level: dict[int, PassSummary]
    pooled: PassSummary
    correct: np.ndarray
    levels: np.ndarray

    def pass_at(self, k: int, level: int | None = None) -> float:
        """pass@k of one level, or pooled when `level` is None."""
        if not 1 <= k <= self.num_samples:
            raise ValueError(f"k must be in [1, {self.num_samples}], got k={k!r}")
        summary = self.pooled if level is None else self.by_level[level]
        return float(summary.pass_at[k - 1])

    @property
    def frontier_k(self) -> int:
        """The k of the frontier: min(8, n)."""
        return min(FRONTIER_K, self.num_samples)

    def frontier_levels(self, k: int | None = None, threshold: float = FRONTIER_PASS) -> list[int]:
        """The levels whose pass@k is below `threshold` (k: default `frontier_k`), ascending."""
        k = self.frontier_k if k is None else k
        return [level for level in self.by_level if self.pass_at(k, level) < threshold]

    def frontier(self) -> PassSummary | None:
        """The `frontier_levels()`' problems pooled (intervals stratified by level); None when
        there is no frontier level."""
        on_frontier = np.isin(self.levels, self.frontier_levels())
        if not on_frontier.any():
            return None
        correct, levels = self.correct[on_frontier], self.levels[on_frontier]
        return summarize_counts(correct, self.num_samples, levels)[1]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: per level and pooled mean@n and pass@k with intervals, and the
        per-problem correct counts and levels (enough to recompute any statistic)."""
        n = self.num_samples
        return {
            "num_samples": n,
            "levels": {str(level): summary_dict(s, n) for level, s in self.by_level.items()},
            "pooled": summary_dict(self.pooled, n),
            "correct": self.correct.tolist(),
            "problem_levels": self.levels.tolist(),
        }

    def to_table(self, ks: Sequence[int] | None = None) -> str:
        """A plain-text table, a row per level and a pooled row: problems and pass@k (`ks`,
        default 1 and n; pass@1 is also mean@n, the fraction of samples right) as `estimate
        [95 % bootstrap interval]`; no trailing newline."""
        n = self.num_samples
        ks = sorted({1, n}) if ks is None else list(ks)
        for k in ks:
            if not 1 <= k <= n:
                raise ValueError(f"ks must lie in [1, {n}], got {k!r}")
        header = ["level", "problems"] + [f"pass@{k}" for k in ks]
        named = [(str(level), s) for level, s in self.by_level.items()] + [("pooled", self.pooled)]
        lines = [[name, *summary_cells(s, ks)] for name, s in named]
        widths = [max(len(r[i]) for r in [header, *lines]) for i in range(len(header))]
        out = [
            "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)),
            "  ".join("-" * w for w in widths),
        ]
        out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in lines]
        return "\n".join(line.rstrip() for line in out)


def evaluate_chain(
    model,
    rows_or_arrays: Sequence[dict] | tasks.ChainArrays,
    task_config: tasks.ChainTaskConfig,
    settings: Any = None,
    *,
    progress: bool = False,
    label: str = "eval",
    sampler: Callable[..., Any] = generate,
    on_batch: OnBatch | None = None,
    num_resamples: int = 1000,
    confidence: float = 0.95,
) -> ChainEvaluation:
    """Evaluates a policy on chain-task problems: mean@n and pass@k per level and pooled.

    Args:
      model: the policy (`gdro_jax.models.Decoder`).
      rows_or_arrays: task rows (e.g. `build_splits(config).validation`) or their `ChainArrays`.
      task_config: the task (fixes padded lengths; completions get its longest solution's
        length).
      settings: an `EvalSettings` (None: `EvalSettings.of("chain")`) or the `eval` block of a
        warm-start or study config; `CHAIN_FIELDS` are read (pass@k for k = 1..num_samples).
      progress: show a tqdm bar over batches.
      label: the bar's label (e.g. the policy's name).
      sampler: called like `sampling.generate` (tests pass fakes with known odds).
      on_batch: called after each batch with its real problems' indices int[b], and their
        slots' tokens int32[b * n, M], lengths int32[b * n] and correctness bool[b * n] (slot r
        continues problem r // n), e.g. to keep the completions.
      num_resamples, confidence: bootstrap settings (`summarize_counts`; seed 0).

    Returns:
      `ChainEvaluation`.
    """
    settings = EvalSettings.of("chain") if settings is None else settings
    if isinstance(rows_or_arrays, tasks.ChainArrays):
        arrays = rows_or_arrays
    else:
        arrays = tasks.encode_rows(rows_or_arrays, task_config)
    n = settings.num_samples
    check_int("num_samples", n, minimum=1)
    check_int("batch_size", settings.batch_size, minimum=1)
    longest = int(arrays.solution_lengths.max())
    if task_config.max_solution_length < longest:
        raise ValueError(
            f"max_new_tokens must be >= the longest gold solution ({longest} tokens), "
            f"got max_new_tokens={task_config.max_solution_length!r}"
        )
    num_problems = len(arrays.levels)
    batch_size = min(settings.batch_size, num_problems)
    key = jax.random.key(settings.seed)
    correct_N = np.zeros((num_problems,), np.int64)
    starts = range(0, num_problems, batch_size)
    for batch, start in enumerate(tqdm(starts, desc=label, disable=not progress, leave=False)):
        rows_B = batch_rows(start, batch_size, num_problems)
        result = sample_batch(
            model, sampler, arrays.prompt_tokens[rows_B], arrays.prompt_lengths[rows_B],
            settings=settings, key=jax.random.fold_in(key, batch),
            max_new_tokens=task_config.max_solution_length, eos_ids=(tasks.EOS_ID,),
            pad_id=tasks.PAD_ID,
        )  # fmt: skip
        gold_RS = np.repeat(arrays.solution_tokens[rows_B], n, axis=0)
        correct_R = np.asarray(
            tasks.solution_correct(
                result.tokens, gold_RS, completion_lengths=result.lengths, eos_id=tasks.EOS_ID
            )
        )
        real = min(batch_size, num_problems - start)
        correct_N[start : start + real] = correct_R.reshape(batch_size, n).sum(axis=1)[:real]
        if on_batch is not None:
            slots = real * n
            tokens_RM, lengths_R = np.asarray(result.tokens), np.asarray(result.lengths)
            on_batch(rows_B[:real], tokens_RM[:slots], lengths_R[:slots], correct_R[:slots])
    by_level, pooled = summarize_counts(
        correct_N, n, arrays.levels, num_resamples=num_resamples, confidence=confidence
    )
    levels = np.asarray(arrays.levels, np.int32)
    return ChainEvaluation(n, by_level, pooled, correct_N, levels)


@dataclasses.dataclass(frozen=True)
class ChainReport:
    """A chain-task policy's evaluation on its test split (`to_dict`: `report.json`).

    Attributes:
      settings: the policy's name, its checkpoint step (None for an HF folder), the split, the
        sampling settings and the task config.
      evaluation: the per-level, pooled and frontier figures (`ChainEvaluation`).
      problem_ids: each problem's id, in the order of `evaluation.correct`.
      timing: `total_s`, seconds of the sampling and grading.
    """

    settings: dict[str, Any]
    evaluation: ChainEvaluation
    problem_ids: list[str]
    timing: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of everything (the content of `report.json`)."""
        evaluation, n = self.evaluation, self.evaluation.num_samples
        figures = evaluation.to_dict()
        problems = zip(self.problem_ids, evaluation.levels, evaluation.correct, strict=True)
        return {
            "task": "chain",
            "settings": self.settings,
            **{key: figures[key] for key in ("num_samples", "levels", "pooled")},
            "frontier": {
                "k": evaluation.frontier_k,
                "threshold": FRONTIER_PASS,
                "levels": evaluation.frontier_levels(),
                "summary": summary_dict(evaluation.frontier(), n),
            },
            "problems": [
                {"id": i, "level": int(level), "n": n, "c": int(c)} for i, level, c in problems
            ],
            "timing": self.timing,
        }

    def to_markdown(self) -> str:
        """A Markdown table: one row per level, pooled and frontier, with pass@k for k = 1 (also
        mean@n), the frontier's k and n (`report.json` has every k and mean@n); 95 % intervals."""
        evaluation, n, s = self.evaluation, self.evaluation.num_samples, self.settings
        ks = sorted({1, evaluation.frontier_k, n})
        header = ["level", "problems"] + [f"pass@{k}" for k in ks]
        named = [(str(level), summary) for level, summary in evaluation.by_level.items()]
        named += [("pooled", evaluation.pooled), ("frontier", evaluation.frontier())]
        step = "" if s.get("step") is None else f" (checkpoint step {s['step']})"
        levels = ", ".join(map(str, evaluation.frontier_levels())) or "none"
        lines = [
            f"# Chain-task evaluation: {s.get('policy') or '(unnamed policy)'}{step}",
            "",
            f"The {s['split']} split, {len(self.problem_ids)} problems; {n} samples per problem at "
            f"T={s['temperature']}, top-p {s['top_p']}, top-k {s['top_k']}; seed {s['seed']}. "
            "Cells: estimate [95 % bootstrap interval over problems]; pass@k is the unbiased "
            f"estimator (pass@1 is also mean@{n}, the fraction of samples right), graded by "
            "exact match of the whole worked solution.",
            "",
            *markdown_table(header, [[name, *summary_cells(sm, ks)] for name, sm in named]),
            "",
            f"Frontier levels (pass@{evaluation.frontier_k} < {FRONTIER_PASS}): {levels}. "
            f"Sampling and grading took {self.timing['total_s']:.1f} s.",
        ]
        return "\n".join(lines) + "\n"


def chain_report(
    model,
    task_config: tasks.ChainTaskConfig,
    out_dir,
    settings: EvalSettings,
    *,
    policy_name: str,
    step: int | None,
    limit: int | None,
    save_completions: bool,
    progress: bool,
    sampler: Callable[..., Any] = generate,
) -> ChainReport:
    """Evaluates a chain-task policy on its task's test split and writes the reports, after
    sampling and never into a math evaluation's folder (docs/evaluation.md; `evaluate_policy`
    documents the arguments). Several processes each evaluate the split; process 0 writes."""
    out = Path(out_dir)
    for name in (SETTINGS_FILE, SAMPLES_FILE):
        if (out / name).exists():
            raise ValueError(
                f"out_dir={str(out_dir)!r} holds a math evaluation ({name}); a chain-task "
                "evaluation goes to another folder"
            )
    rows, seen = [], collections.Counter()
    for row in tasks.build_splits(task_config).test:
        seen[row["level"]] += 1
        if limit is None or seen[row["level"]] <= limit:
            rows.append(row)
    n = settings.num_samples
    completions: dict[int, list[dict[str, Any]]] = {}

    def keep_completions(problems_b, tokens_RM, lengths_R, correct_R):
        for position, problem in enumerate(problems_b):
            completions[int(problem)] = [
                {
                    "text": tasks.decode(tokens_RM[r, : lengths_R[r]], skip_special_tokens=False),
                    "correct": bool(correct_R[r]),
                }
                for r in range(position * n, (position + 1) * n)
            ]

    tick = time.perf_counter()
    evaluation = evaluate_chain(
        model, rows, task_config, settings, progress=progress and runtime.is_primary(),
        sampler=sampler, on_batch=keep_completions if save_completions else None,
    )  # fmt: skip
    report = ChainReport(
        settings={
            "policy": policy_name,
            "step": step,
            "split": "test",
            "limit_per_level": limit,
            **{name: getattr(settings, name) for name in CHAIN_FIELDS},
            "task": dataclasses.asdict(task_config),
        },
        evaluation=evaluation,
        problem_ids=[str(row["id"]) for row in rows],
        timing={"total_s": time.perf_counter() - tick},
    )
    if not runtime.is_primary():  # several processes: each evaluated the split, 0 writes
        return report
    out.mkdir(parents=True, exist_ok=True)
    record = {**report.to_dict(), "environment": runtime.environment()}
    (out / REPORT_JSON).write_text(json.dumps(record, indent=2) + "\n")
    (out / REPORT_MARKDOWN).write_text(report.to_markdown())
    (out / COMPLETIONS_FILE).unlink(missing_ok=True)  # never a file of an earlier run
    if save_completions:
        with open(out / COMPLETIONS_FILE, "w") as file:
            for index, row in enumerate(rows):
                entry = {key: row[key] for key in ("id", "level", "prompt", "solution")}
                entry["completions"] = completions[index]
                file.write(json.dumps(entry) + "\n")
    return report
