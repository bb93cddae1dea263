"""`evaluate_policy`, `experiments/evaluate.py` as a function: a policy evaluated on its own task.

A chain-task policy (`open_policy` reads the run config saved beside it) is evaluated on its
task's held-out test split (`_chain.chain_report`: pass@k per level, pooled and on the frontier
levels); a math policy on the math benchmarks (`evaluate_math`, resumable). Every check (the
benchmark names, the sampling settings, the output folder, the policy and its tokenizer, the
benchmark files, the prompts) comes before anything is written to the output folder.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gdro_jax import configs, data, rewards
from gdro_jax.eval._chain import ChainReport, chain_report
from gdro_jax.eval._harness import CHAIN_FIELDS, EvalSettings, check_int
from gdro_jax.eval._math import evaluate_math, load_bins
from gdro_jax.eval._math_report import MathEvaluation
from gdro_jax.eval._policy import open_policy
from gdro_jax.sampling import generate


def evaluate_policy(
    policy: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    benchmarks: Sequence[str] | None = None,
    sampling: Mapping[str, Any] | None = None,
    limit: int | None = None,
    dtype: str = "auto",
    save_completions: bool = True,
    data_dir: str | None = None,
    num_workers: int = 2,
    grader_timeout_s: float = 5.0,
    bins_from: str | None = None,
    bin_field: str = "level",
    chat_template: bool = True,
    on_long_prompt: str = "skip",
    progress: bool = True,
    sampler: Callable[..., Any] = generate,
) -> MathEvaluation | ChainReport:
    """Evaluates a policy on the task it was trained for (module docstring).

    Args:
      policy: a training work directory, its `model/` folder, or an HF model folder.
      out_dir: where the reports go: `report.json`, `report.md`, with `save_completions`
        `completions.jsonl`, and for a math policy the resume files (see `evaluate_math`).
      benchmarks: math benchmark names (None: all of `data.BENCHMARKS`); math policies only.
      sampling: `EvalSettings` fields to change; the rest keep the task's defaults
        (`EvalSettings.of(kind)`: the chain task's 8 samples at T = 1, batches of 64; the
        paper's 8 samples at T = 0.6, top-p 0.8, top-k 20 for math). `max_new_tokens`,
        `max_prompt_tokens` and `prompt_bucket` apply to math policies only.
      limit: evaluate only the first `limit` problems of each benchmark (math) or of each level
        of the test split (chain task).
      dtype: parameter dtype of an HF folder's weights (`resolve_dtype`: "auto" is float32 on
        CPU, bfloat16 on accelerators); a checkpoint keeps the run's dtype.
      save_completions: write `completions.jsonl` (each completion's text and verdict).
      data_dir, num_workers, grader_timeout_s, bins_from, bin_field, chat_template,
        on_long_prompt: math only: the benchmark files' folder (default: `$GDRO_DATA_DIR`, else
        `../shared/data`), the grader's workers and per-answer limit, a JSON file of problem
        id -> bin (`load_bins`; else each row's `bin_field`), the chat template when the
        tokenizer has one, and "skip" (counted) or "raise" for prompts over the limit.
      progress: show progress bars.
      sampler: called like `sampling.generate` (tests pass fakes).

    Returns:
      A `ChainReport` (chain task) or a `MathEvaluation` (math); both have `to_markdown()`.

    Raises:
      ValueError or FileNotFoundError: naming the argument, before anything is written.
    """
    for name in benchmarks or ():
        if name not in data.PRESETS:
            raise ValueError(
                f"unknown benchmark {name!r}; known: {', '.join(data.BENCHMARKS)}; got "
                f"benchmarks={','.join(benchmarks)}"
            )
    sampling = dict(sampling or {})
    known = {f.name for f in dataclasses.fields(EvalSettings)}
    if unknown := sorted(set(sampling) - known):
        raise ValueError(f"unknown sampling setting {unknown[0]!r}; known: {sorted(known)}")
    settings = EvalSettings.of("math", **sampling)  # checks the values before anything loads
    if limit is not None:
        check_int("limit", limit, minimum=1)
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f"out_dir must be a folder, got out_dir={os.fspath(out_dir)!r} (a file)")
    loaded = open_policy(policy, dtype=dtype)
    if loaded.task_kind == "math":
        tokenizer = loaded.tokenizer
        templated = chat_template and bool(getattr(tokenizer, "chat_template", None))
        rows = {
            name: data.load_preset(name, data_dir, tokenizer=tokenizer if templated else None)[
                :limit
            ]
            for name in benchmarks or data.BENCHMARKS
        }
        bins = load_bins(bins_from) if bins_from else None
        with rewards.MathGrader(num_workers, grader_timeout_s) as grader:
            return evaluate_math(
                loaded.model, tokenizer, rows,
                grader=grader, out_dir=out_dir, settings=settings, policy_name=loaded.path,
                bins=bins, bin_field=bin_field, on_long_prompt=on_long_prompt,
                # Chat-templated prompts carry their special tokens as text.
                add_special_tokens=not templated, save_completions=save_completions,
                progress=progress, sampler=sampler,
            )  # fmt: skip
    for name, value in (("benchmarks", ",".join(benchmarks or ())), ("bins_from", bins_from)):
        if value:
            raise ValueError(
                f"{name} applies to math policies; policy={loaded.path!r} is a chain-task "
                f"policy (evaluated on its test split): drop {name}={value}"
            )
    for name in sorted(set(sampling) - set(CHAIN_FIELDS)):
        raise ValueError(
            f"{name} applies to math policies; a chain-task completion gets its task's "
            f"longest solution: drop {name}={sampling[name]!r}"
        )
    try:
        task_config = configs.chain_task_config(loaded.run_config)
    except ValueError as error:
        raise ValueError(
            f"policy={loaded.path!r}: its run config has no valid task block ({error})"
        ) from error
    return chain_report(
        loaded.model, task_config, out_dir, EvalSettings.of("chain", **sampling),
        policy_name=loaded.path, step=loaded.step, limit=limit,
        save_completions=save_completions, progress=progress, sampler=sampler,
    )  # fmt: skip
