"""`evaluate_policy`, `experiments/evaluate.py` as a function: a policy evaluated on its own task.

A chain-task policy (`open_policy` reads the run config saved beside it) is evaluated on its
task's held-out test split (`evaluate_task_policy`: pass@k per level, pooled and on the frontier
levels); a math policy on the math benchmarks (`evaluate_math`, resumable). Every check (the
benchmark names, the sampling settings, the output folder, the policy and its tokenizer, the
benchmark files, the prompts) comes before anything is written to the output folder.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

from gdro_jax import configs, data, rewards
from gdro_jax.eval._math_eval import MathEvalSettings, _check_int, evaluate_math, load_bins
from gdro_jax.eval._math_report import MathEvaluation
from gdro_jax.eval._policy import Policy, open_policy
from gdro_jax.eval._task_report import TaskEvalSettings, TaskReport, evaluate_task_policy

_MATH_ONLY_SAMPLING = ("max_new_tokens", "max_prompt_tokens")
# The sampling settings `experiments/evaluate.py` takes as flags: name -> (absl flag kind, help),
# the help giving the default as (chain task; math).
SAMPLING_FLAGS = {
    "num_samples": ("integer", "Samples per problem k (8; 8)."),
    "temperature": ("float", "Sampling temperature, 0: greedy (1.0; 0.6)."),
    "top_p": ("float", "Nucleus filter, 1: off (1.0; 0.8)."),
    "top_k": ("integer", "Top-k filter, 0: off (0; 20)."),
    "max_new_tokens": ("integer", "Math only: most tokens per completion (4096)."),
    "max_prompt_tokens": ("integer", "Math only: longer prompts: --long_prompts (2048)."),
    "batch_size": ("integer", "Problems per sampler call (64; 8)."),
    "seed": ("integer", "Sampling seed (0; 0)."),
}


def _check_benchmarks(benchmarks: Sequence[str] | None) -> None:
    for name in benchmarks or ():
        if name not in data.PRESETS:
            raise ValueError(
                f"unknown benchmark {name!r}; known: {', '.join(data.BENCHMARKS)}; got "
                f"benchmarks={','.join(benchmarks)}"
            )


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
) -> MathEvaluation | TaskReport:
    """Evaluates a policy on the task it was trained for (module docstring).

    Args:
      policy: a training work directory, its `model/` folder, or an HF model folder.
      out_dir: where the reports go (see `evaluate_task_policy` and `evaluate_math`).
      benchmarks: math benchmark names (None: all of `data.BENCHMARKS`); math policies only.
      sampling: sampling settings to change; the rest keep the task's defaults
        (`TaskEvalSettings`: 8 samples at T = 1, batches of 64; `MathEvalSettings`: the paper's
        8 samples at T = 0.6, top-p 0.8, top-k 20). `max_new_tokens` and `max_prompt_tokens`
        apply to math policies only.
      limit: evaluate only the first `limit` problems of each benchmark (math) or of each level
        of the test split (chain task).
      dtype: parameter dtype of an HF folder's weights (`resolve_dtype`: "auto" is float32 on
        CPU, bfloat16 on accelerators).
      save_completions: write `completions.jsonl` (each completion's text and verdict).
      data_dir, num_workers, grader_timeout_s, bins_from, bin_field, chat_template,
        on_long_prompt: math policies only (see `evaluate_math_policy`).
      progress: show progress bars.

    Returns:
      A `TaskReport` (chain task) or a `MathEvaluation` (math); both have `to_markdown()`.

    Raises:
      ValueError or FileNotFoundError: naming the argument, before anything is written.
    """
    _check_benchmarks(benchmarks)
    sampling = dict(sampling or {})
    known = {f.name for f in dataclasses.fields(MathEvalSettings)}
    if unknown := sorted(set(sampling) - known):
        raise ValueError(f"unknown sampling setting {unknown[0]!r}; known: {sorted(known)}")
    math_settings = MathEvalSettings(**sampling)  # checks the values before anything loads
    if limit is not None:
        _check_int("limit", limit, minimum=1)
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f"out_dir must be a folder, got out_dir={os.fspath(out_dir)!r} (a file)")
    loaded = open_policy(policy, dtype=dtype)
    if loaded.task_kind == "math":
        return _evaluate_math(
            loaded, out_dir, benchmarks=list(benchmarks or data.BENCHMARKS),
            settings=math_settings, data_dir=data_dir, limit=limit,
            num_workers=num_workers, grader_timeout_s=grader_timeout_s, bins_from=bins_from,
            bin_field=bin_field, chat_template=chat_template, on_long_prompt=on_long_prompt,
            save_completions=save_completions, progress=progress,
        )  # fmt: skip
    for name, value in (("benchmarks", ",".join(benchmarks or ())), ("bins_from", bins_from)):
        if value:
            raise ValueError(
                f"{name} applies to math policies; policy={loaded.path!r} is a chain-task "
                f"policy (evaluated on its test split): drop {name}={value}"
            )
    for name in _MATH_ONLY_SAMPLING:
        if name in sampling:
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
    return evaluate_task_policy(
        loaded.model,
        task_config,
        out_dir,
        settings=TaskEvalSettings(**sampling),
        policy_name=loaded.path,
        step=loaded.step,
        limit=limit,
        save_completions=save_completions,
        progress=progress,
    )


def _evaluate_math(
    loaded: Policy,
    out_dir,
    *,
    benchmarks: Sequence[str],
    settings: MathEvalSettings,
    data_dir,
    limit,
    num_workers,
    grader_timeout_s,
    bins_from,
    bin_field,
    chat_template,
    on_long_prompt,
    save_completions,
    progress,
) -> MathEvaluation:
    tokenizer = loaded.tokenizer
    templated = chat_template and bool(getattr(tokenizer, "chat_template", None))
    rows = {
        name: data.load_preset(name, data_dir, tokenizer=tokenizer if templated else None)[:limit]
        for name in benchmarks
    }
    bins = load_bins(bins_from) if bins_from else None
    with rewards.MathGrader(num_workers, grader_timeout_s) as grader:
        return evaluate_math(
            loaded.model,
            tokenizer,
            rows,
            grader=grader,
            out_dir=out_dir,
            settings=settings,
            policy_name=loaded.path,
            bins=bins,
            bin_field=bin_field,
            on_long_prompt=on_long_prompt,
            # Chat-templated prompts carry their special tokens as text.
            add_special_tokens=not templated,
            save_completions=save_completions,
            progress=progress,
        )


def evaluate_math_policy(
    policy: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    benchmarks: Sequence[str],
    settings: MathEvalSettings,
    data_dir: str | None = None,
    limit: int | None = None,
    dtype: str = "auto",
    num_workers: int = 2,
    grader_timeout_s: float = 5.0,
    bins_from: str | None = None,
    bin_field: str = "level",
    chat_template: bool = True,
    on_long_prompt: str = "skip",
    save_completions: bool = True,
) -> MathEvaluation:
    """The math benchmarks for a math policy: load the policy and benchmarks, sample, grade.

    Args:
      policy: an HF model folder or a training work directory of a math run (see
        `open_policy`); a chain-task policy raises (use `evaluate_policy`).
      out_dir: where reports and resume files go (see `evaluate_math`).
      benchmarks: names from `data.BENCHMARKS`; an unknown name raises before anything loads.
      settings: sampling settings.
      data_dir: the benchmark files' folder (default: `$GDRO_DATA_DIR`, else `../shared/data`).
      limit: evaluate only the first `limit` problems of each benchmark.
      dtype: parameter dtype of an HF folder's weights (`resolve_dtype`).
      num_workers, grader_timeout_s: the math-verify grader's workers and per-answer limit.
      bins_from: a JSON file mapping problem id -> bin (else each row's `bin_field`).
      bin_field: the row field holding the difficulty bin.
      chat_template: wrap prompts in the tokenizer's chat template when it has one.
      on_long_prompt: "skip" (counted) or "raise" for prompts over `max_prompt_tokens`.
      save_completions: write `completions.jsonl` (see `evaluate_math`).

    Returns:
      The `MathEvaluation` (also written to `out_dir` as JSON and Markdown).
    """
    _check_benchmarks(benchmarks)
    loaded = open_policy(policy, dtype=dtype)
    if loaded.task_kind != "math":
        raise ValueError(
            f"policy={loaded.path!r} is a {loaded.task_kind}-task policy, not a math policy; "
            "evaluate it with evaluate_policy"
        )
    return _evaluate_math(
        loaded, out_dir, benchmarks=benchmarks, settings=settings, data_dir=data_dir,
        limit=limit, num_workers=num_workers, grader_timeout_s=grader_timeout_s,
        bins_from=bins_from, bin_field=bin_field, chat_template=chat_template,
        on_long_prompt=on_long_prompt, save_completions=save_completions, progress=True,
    )  # fmt: skip
