"""Grading throughput: MathGrader with 1 and 2 worker processes against math-verify inline.

All sides grade the 800 labelled completions of `grader_test_completions.jsonl` (100 MATH
problems x 8 samples, so golds repeat in runs of 8 as in a GRPO batch) and report items/s:
  - math-verify inline: `verify(parse("\\boxed{gold}"), parse(completion))` in one process, with
    math-verify's own extraction and its signal-based timeouts (main thread only);
  - grade_completion inline: our extraction, then math-verify, in one process, no timeout;
  - MathGrader(num_workers=1 | 2): the same verdicts in worker processes with per-item timeouts.
Each run starts fresh (a new interpreter for the inline sides, a new pool for MathGrader) and
makes two passes over the 800 items: "cold" is the first pass (math-verify's LaTeX parser still
filling its caches, as after a worker restart), "warm" the second. A pool's start-up (until every
worker is ready) is timed on its own, outside both passes. The table gives medians over
`--repeats` runs.

Run:  python -m benchmarks.grading [--repeats 3] [--data-dir ../shared/data]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import itertools
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import time

import math_verify
import sympy

from gdro_jax import data, rewards


def _inline_math_verify(completions, golds):
    return [
        float(
            math_verify.verify(math_verify.parse("\\boxed{" + gold + "}"), math_verify.parse(text))
        )
        for text, gold in zip(completions, golds, strict=True)
    ]


def _inline_grade_completion(completions, golds):
    return [
        rewards.grade_completion(text, gold).score
        for text, gold in zip(completions, golds, strict=True)
    ]


def _inline_in_fresh_process(name, data_dir):
    """Cold and warm items/s of an inline grader run in a fresh interpreter, and its scores.

    A fresh process is the only honest cold start: math-verify's LaTeX parser (ANTLR) fills its
    DFA cache over the first few hundred answers, and that cache lives as long as the process.
    """
    code = (
        "import json, sys, logging; from benchmarks import grading; "
        "logging.getLogger('math_verify').setLevel(logging.ERROR); "
        f"print(json.dumps(grading._inline_passes({name!r}, {data_dir!r})))"
    )
    output = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    return json.loads(output.strip().splitlines()[-1])


def _inline_passes(name, data_dir):
    completions, golds = _items(data_dir)
    fn = {"math-verify": _inline_math_verify, "grade_completion": _inline_grade_completion}[name]
    cold, _ = _time_pass(fn, completions, golds)
    warm, scores = _time_pass(fn, completions, golds)
    return cold, warm, scores


def _items(data_dir):
    rows = data.read_jsonl(data.resolve_data_dir(data_dir) / "grader_test_completions.jsonl")
    return [row["completion"] for row in rows], [row["answer"] for row in rows]


def _time_pass(fn, completions, golds):
    start = time.perf_counter()
    scores = fn(completions, golds)
    return len(completions) / (time.perf_counter() - start), scores


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--timeout-s", type=float, default=5.0)
    parser.add_argument("--max-in-flight", type=int, nargs="+", default=[1])
    args = parser.parse_args()
    logging.getLogger("math_verify").setLevel(logging.ERROR)

    path = data.resolve_data_dir(args.data_dir) / "grader_test_completions.jsonl"
    rows = data.read_jsonl(path)
    completions, golds = _items(args.data_dir)
    labels = [float(row["is_correct"]) for row in rows]

    load = os.getloadavg()[0]
    print(f"{platform.machine()}, {os.cpu_count()} cores, load {load:.1f}")
    print(f"math-verify {importlib.metadata.version('math-verify')}, sympy {sympy.__version__}")
    results = []  # (name, start-up s | None, cold items/s, warm items/s, agreement)

    def record(name, startups, colds, warms, scores):
        agree = sum(s == label for s, label in zip(scores, labels, strict=True)) / len(labels)
        startup = statistics.median(startups) if startups else None
        results.append((name, startup, statistics.median(colds), statistics.median(warms), agree))

    for name in ("math-verify", "grade_completion"):
        colds, warms = [], []
        for _ in range(args.repeats):
            cold, warm, scores = _inline_in_fresh_process(name, args.data_dir)
            colds.append(cold)
            warms.append(warm)
        record(f"{name} inline", [], colds, warms, scores)

    for num_workers, max_in_flight in itertools.product((1, 2), args.max_in_flight):
        startups, colds, warms, timeouts, crashes = [], [], [], 0, 0
        for _ in range(args.repeats):
            start = time.perf_counter()
            with rewards.MathGrader(
                num_workers=num_workers, timeout_s=args.timeout_s, max_in_flight=max_in_flight
            ) as grader:
                grader.wait_ready()
                startups.append(time.perf_counter() - start)
                colds.append(_time_pass(grader.grade, completions, golds)[0])
                rate, scores = _time_pass(grader.grade, completions, golds)
                warms.append(rate)
                timeouts += grader.stats.timeouts
                crashes += grader.stats.crashes
        name = f"MathGrader({num_workers} worker{'s' * (num_workers > 1)}"
        name += f", max_in_flight={max_in_flight})" if len(args.max_in_flight) > 1 else ")"
        record(name, startups, colds, warms, scores)
        print(f"  {name}: timeouts {timeouts}, crashes {crashes}")

    load_after = os.getloadavg()[0]
    print(f"\n{len(rows)} items, median of {args.repeats} runs, load after: {load_after:.1f}")
    print("| grader | start-up s | cold items/s | warm items/s | agreement with labels |")
    print("|---|---:|---:|---:|---:|")
    for name, startup, cold, warm, agree in results:
        startup_text = "-" if startup is None else f"{startup:.2f}"
        print(f"| {name} | {startup_text} | {cold:.0f} | {warm:.0f} | {100 * agree:.2f} % |")


if __name__ == "__main__":
    main()
