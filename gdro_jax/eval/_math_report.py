"""The math evaluation's report: `MathEvaluation` (summaries, `report.json`, `report.md`).

`summarize_problems` turns per-problem counts `(n, c)` with their benchmark and difficulty bin
into mean@k and pass@j summaries with bootstrap intervals, per benchmark, per bin, and pooled
(stratified by benchmark); `evaluate_math` (`_math.py`) samples and grades.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import numpy as np

from gdro_jax.eval._passk import (
    PassSummary,
    markdown_table,
    summarize_counts,
    summary_cells,
    summary_dict,
)
from gdro_jax.rewards import STATUSES

UNBINNED = "unbinned"


@dataclasses.dataclass(frozen=True)
class MathEvaluation:
    """The result of `evaluate_math` (`to_dict` is what `report.json` holds).

    Attributes:
      settings: the sampling settings and the policy's name, as stored in `settings.json`.
      num_samples: k.
      by_benchmark: benchmark -> `PassSummary` (intervals stratified by bin); None when none of
        its problems was evaluated (all skipped).
      by_benchmark_bin: benchmark -> bin label -> `PassSummary`.
      by_bin: bin label -> `PassSummary` over the problems of all benchmarks with that bin.
        Labels are the bins as strings, ascending, then `"unbinned"`.
      pooled: `PassSummary` over all evaluated problems (intervals stratified by benchmark);
        None when there are none.
      problems: one dict per evaluated problem: benchmark, id, bin (None: unbinned), n, c,
        truncated (samples that hit max_new_tokens), mean_length (tokens).
      skipped: benchmark -> ids skipped for a prompt over `max_prompt_tokens`.
      grader: outcome counts over all evaluated samples (`correct`, `wrong`, `no_answer`,
        `timeout`, `crash`) and `restarts_this_run` (workers the grader replaced in this run).
      timing: seconds of this run: `sampling_s` (all sampler calls, including compilation),
        `first_call_s` (the first call alone, mostly compilation), `decoding_s`, `grading_s`,
        `total_s`; `batches` and `problems` sampled in this run.
      bin_source: where the bins came from (`field:<name>` or `mapping`).
    """

    settings: dict[str, Any]
    num_samples: int
    by_benchmark: dict[str, PassSummary | None]
    by_benchmark_bin: dict[str, dict[str, PassSummary]]
    by_bin: dict[str, PassSummary]
    pooled: PassSummary | None
    problems: list[dict[str, Any]]
    skipped: dict[str, list[str]]
    grader: dict[str, int]
    timing: dict[str, float]
    bin_source: str

    def pass_at(self, k: int, benchmark: str | None = None, bin_label: str | None = None) -> float:
        """pass@k of one benchmark, one bin (over all benchmarks, or within `benchmark`), or
        pooled when both are None."""
        if not 1 <= k <= self.num_samples:
            raise ValueError(f"k must be in [1, {self.num_samples}], got k={k!r}")
        return float(self._summary(benchmark, bin_label).pass_at[k - 1])

    def mean_at_k(self, benchmark: str | None = None, bin_label: str | None = None) -> float:
        """mean@k (average accuracy), selected as in `pass_at`."""
        return float(self._summary(benchmark, bin_label).mean)

    def _summary(self, benchmark, bin_label) -> PassSummary:
        if benchmark is None:
            summary = self.pooled if bin_label is None else self.by_bin[bin_label]
        elif bin_label is None:
            summary = self.by_benchmark[benchmark]
        else:
            summary = self.by_benchmark_bin[benchmark][bin_label]
        if summary is None:
            raise ValueError(f"no evaluated problems in benchmark={benchmark!r}")
        return summary

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of everything (the content of `report.json`)."""
        k = self.num_samples
        benchmarks = {}
        for name, summary in self.by_benchmark.items():
            benchmarks[name] = {
                "summary": summary_dict(summary, k),
                "skipped_long_prompts": len(self.skipped[name]),
                "skipped_ids": list(self.skipped[name]),
                "bins": {lb: summary_dict(s, k) for lb, s in self.by_benchmark_bin[name].items()},
            }
        evaluated = [s for s in self.by_benchmark.values() if s is not None]
        average = None
        if evaluated:  # unweighted mean over benchmarks, as papers' "average" columns
            average = {
                f"mean@{k}": float(np.mean([s.mean for s in evaluated])),
                "pass@k": {
                    str(j + 1): float(np.mean([s.pass_at[j] for s in evaluated])) for j in range(k)
                },
            }
        return {
            "settings": self.settings,
            "num_samples": k,
            "bin_source": self.bin_source,
            "benchmarks": benchmarks,
            "pooled": summary_dict(self.pooled, k),
            "benchmark_average": average,
            "bins": {label: summary_dict(s, k) for label, s in self.by_bin.items()},
            "grader": self.grader,
            "timing": self.timing,
            "problems": self.problems,
        }

    def to_markdown(self) -> str:
        """Markdown tables: per benchmark (and pooled), per bin, with 95 % intervals."""
        k = self.num_samples
        ks = range(1, k + 1)
        header = ["problems"] + [f"pass@{j}" for j in ks]  # pass@1 is also mean@k

        def row(name: str, summary: PassSummary | None, extra: str = "") -> list[str]:
            cells = summary_cells(summary, ks)
            return [name, cells[0] + extra, *cells[1:]]

        def table(first: str, rows: list[list[str]]) -> list[str]:
            return markdown_table([first, *header], rows)

        s = self.settings
        out = [
            f"# Math evaluation: {s.get('policy') or '(unnamed policy)'}",
            "",
            f"{k} samples per problem at T={s['temperature']}, top-p {s['top_p']}, "
            f"top-k {s['top_k']}, up to {s['max_new_tokens']} new tokens; seed {s['seed']}. "
            "Cells: estimate [95 % bootstrap interval over problems]; pass@j is the unbiased "
            f"estimator (pass@1 is also mean@{k}, the fraction of samples right).",
            "",
            "## Per benchmark",
            "",
        ]
        rows = []
        for name, summary in self.by_benchmark.items():
            skipped = len(self.skipped[name])
            rows.append(row(name, summary, f" (+{skipped} skipped)" if skipped else ""))
        rows.append(row("pooled", self.pooled))
        out += table("benchmark", rows)
        out += ["", f"## Per difficulty bin ({self.bin_source}, all benchmarks)", ""]
        out += table("bin", [row(label, s) for label, s in self.by_bin.items()])
        for name, by_bin in self.by_benchmark_bin.items():
            if len(by_bin) > 1 or (by_bin and UNBINNED not in by_bin):
                out += ["", f"### {name} by bin", ""]
                out += table("bin", [row(label, s) for label, s in by_bin.items()])
        g, t = self.grader, self.timing
        truncated = sum(p["truncated"] for p in self.problems)
        samples = sum(p["n"] for p in self.problems)
        out += [
            "",
            "## Grading and timing",
            "",
            f"Samples graded: {samples} (correct {g['correct']}, wrong {g['wrong']}, no answer "
            f"{g['no_answer']}, timeouts {g['timeout']}, crashes {g['crash']}); "
            f"{truncated} hit max_new_tokens. Grader workers restarted in this run: "
            f"{g['restarts_this_run']}.",
            "",
            f"This run: {t['problems']} problems in {t['batches']} batches; sampling "
            f"{t['sampling_s']:.1f} s (first call, mostly compilation, {t['first_call_s']:.1f} s), "
            f"decoding {t['decoding_s']:.1f} s, grading {t['grading_s']:.1f} s, total "
            f"{t['total_s']:.1f} s.",
        ]
        return "\n".join(out) + "\n"


def _summaries(correct, k, labels, order, **stats):
    """summarize_counts over string labels (ordered by `order`)."""
    codes = np.asarray([order.index(label) for label in labels], np.int64)
    by_code, pooled = summarize_counts(np.asarray(correct, np.int64), k, codes, **stats)
    return {order[code]: summary for code, summary in by_code.items()}, pooled


def _label_order(labels) -> list[str]:
    present = set(labels)
    ints = sorted(int(label) for label in present if label != UNBINNED)
    return [str(i) for i in ints] + ([UNBINNED] if UNBINNED in present else [])


def summarize_problems(
    plan, records, *, settings, k, bin_source, num_resamples, confidence, timing, restarts
) -> MathEvaluation:
    problems = []
    for name, p in plan.items():
        for problem_id, problem_bin, _, _ in p["kept"]:
            record = records[(name, problem_id)]
            if record["n"] != k:
                raise ValueError(f"{name} problem {problem_id!r}: stored n={record['n']}, k={k}")
            problems.append(
                {
                    "benchmark": name,
                    "id": problem_id,
                    "bin": problem_bin,
                    "n": record["n"],
                    "c": record["c"],
                    "truncated": record["truncated"],
                    "mean_length": float(np.mean(record["lengths"])),
                    "statuses": record["statuses"],
                }
            )
    status_counts = collections.Counter(s for p in problems for s in p.pop("statuses"))
    grader_counts = {status: int(status_counts[status]) for status in STATUSES}
    grader_counts["restarts_this_run"] = int(restarts)
    labels = [UNBINNED if p["bin"] is None else str(p["bin"]) for p in problems]
    correct = [p["c"] for p in problems]
    stats = dict(num_resamples=num_resamples, confidence=confidence, seed=0)
    names = list(plan)
    by_benchmark, by_benchmark_bin = {}, {}
    for name in names:
        rows = [i for i, p in enumerate(problems) if p["benchmark"] == name]
        if not rows:
            by_benchmark[name], by_benchmark_bin[name] = None, {}
            continue
        own = [labels[i] for i in rows]
        by_benchmark_bin[name], by_benchmark[name] = _summaries(
            [correct[i] for i in rows], k, own, _label_order(own), **stats
        )
    by_bin, pooled = {}, None
    if problems:
        by_bin, _ = _summaries(correct, k, labels, _label_order(labels), **stats)
        benchmark_labels = [p["benchmark"] for p in problems]
        _, pooled = _summaries(correct, k, benchmark_labels, names, **stats)
    return MathEvaluation(
        settings=settings,
        num_samples=k,
        by_benchmark=by_benchmark,
        by_benchmark_bin=by_benchmark_bin,
        by_bin=by_bin,
        pooled=pooled,
        problems=problems,
        skipped={name: list(p["skipped"]) for name, p in plan.items()},
        grader=grader_counts,
        timing=timing,
        bin_source=bin_source,
    )
