"""A saved policy (`open_policy`) and its evaluation on the task it was trained for
(`evaluate_policy`, `experiments/evaluate.py` as a function). docs/evaluation.md says which
folders are policies and how their task is found; docs/scaling.md, how several processes share
the work. Every check (arguments, policy, tokenizer, benchmark files, prompts) comes before
anything is written to the output folder.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from gdro_jax import checkpoint, configs, data, models, rewards, runtime, tasks
from gdro_jax.eval._chain import ChainReport, chain_report
from gdro_jax.eval._harness import CHAIN_FIELDS, EvalSettings, check_int
from gdro_jax.eval._math import evaluate_math, load_bins
from gdro_jax.eval._math_report import MathEvaluation
from gdro_jax.sampling import generate

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
DTYPES = ("auto", "float32", "bfloat16")
RUN_CONFIG_FILES = ("config.json", "pretrain.json")


def resolve_dtype(dtype: str) -> str:
    """`"auto"` -> float32 on CPU (docs/evaluation.md: bfloat16 is emulated there and rounds
    differently), bfloat16 on accelerators; other names pass through."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got dtype={dtype!r}")
    if dtype != "auto":
        return dtype
    return "float32" if jax.default_backend() == "cpu" else "bfloat16"


@dataclasses.dataclass(frozen=True)
class Policy:
    """A loaded policy and what it was trained for.

    Attributes:
      model: the `gdro_jax.models.Decoder`.
      tokenizer: its transformers tokenizer.
      task_kind: `"chain"` or `"math"`.
      run_config: the training run's config (a dict) when one was found beside the policy.
      path: the absolute path it was loaded from.
      step: the checkpoint step (None for an HF folder).
    """

    model: Any
    tokenizer: Any
    task_kind: str
    run_config: dict[str, Any] | None
    path: str
    step: int | None


def _find_run_config(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The run config saved in `folder`: a training run's `config.json` (a JSON object with a
    `task` block or a `task_kind`), or the `config` of a warm start's `pretrain.json`; None when
    there is none (an HF `config.json` is not a run config)."""
    for name in RUN_CONFIG_FILES:
        path = os.path.join(os.fspath(folder), name)
        if not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as file:
                content = json.load(file)
        except (OSError, json.JSONDecodeError):
            continue
        if name == "pretrain.json" and isinstance(content, dict):
            content = content.get("config")
        if isinstance(content, dict) and (
            isinstance(content.get("task"), dict) or "task_kind" in content
        ):
            return content
    return None


def _task_kind(run_config: dict | None, tokenizer, path: str) -> str:
    if run_config is not None:
        return configs.task_kind(run_config)
    try:
        chain_vocabulary = set(tokenizer.get_vocab()) == set(tasks.VOCAB)
    except (AttributeError, TypeError):
        chain_vocabulary = False
    if chain_vocabulary:
        raise ValueError(
            f"policy={path!r} has the chain task's {tasks.VOCAB_SIZE}-symbol tokenizer but no run "
            f"config beside it ({' or '.join(RUN_CONFIG_FILES)} in its parent folder), so its "
            "test split is unknown; pass the training work directory or its model/ folder"
        )
    return "math"


def _check_hf_folder(path: str, names: set[str], weights: bool) -> None:
    if "config.json" not in names:
        raise FileNotFoundError(
            f"policy={path!r} is not a model folder (no config.json) nor a training work "
            "directory (no checkpoints/)"
        )
    if not weights:
        raise FileNotFoundError(
            f"policy={path!r} is not a model folder: it has no *.safetensors weights"
        )
    if not names & set(_TOKENIZER_FILES):
        raise FileNotFoundError(
            f"policy={path!r} has no tokenizer (none of {', '.join(_TOKENIZER_FILES)}); save one "
            "into the folder, e.g. models.save_pretrained(model, path, tokenizer=tokenizer)"
        )


def _run_tokenizer(run_config: dict[str, Any]):
    """A training run's tokenizer: the chain task's, or a math run's (its `tokenizer` folder,
    else the one in `init_from`; only the tokenizer files are read)."""
    if configs.task_kind(run_config) == "chain":
        return tasks.hf_tokenizer()
    return models.load_tokenizer(configs.tokenizer_folder(run_config))


def _load(path, dtype: str):
    """`(model, tokenizer, step, path, run_config)`: the policy at `path` (absolute; a finished
    run's folder is read through its `model/`) and the run config saved with it (the
    checkpoint's own, or found beside an HF folder; None)."""
    path = os.path.abspath(os.fspath(path))
    if not os.path.isdir(path):
        raise FileNotFoundError(f"policy={path!r} is not a folder")
    names = set(os.listdir(path))
    weights = any(n.endswith(".safetensors") or n.endswith(".index.json") for n in names)
    if not weights and "checkpoints" in names and jax.process_count() > 1:
        # Every process holds its own copy of the policy (`evaluate_math`) and reads it from
        # the export, an HF folder each reads alone.
        if os.path.isdir(os.path.join(path, models.MODEL_DIR)):
            return _load(os.path.join(path, models.MODEL_DIR), dtype)
        raise ValueError(
            f"policy={path!r} holds checkpoints but no exported {models.MODEL_DIR}/ folder; "
            "several processes evaluate an HF folder: evaluate the checkpoint with one process, "
            "or finish the run (it exports model/)"
        )
    if not weights and "checkpoints" in names:
        restored = checkpoint.restore_policy(path)
        logging.info("evaluating %s at checkpoint step %d", path, restored.step)
        tokenizer = _run_tokenizer(restored.config)
        return restored.model, tokenizer, restored.step, path, restored.config
    if not weights and os.path.isdir(os.path.join(path, models.MODEL_DIR)):
        # A run without checkpoints, or a warm start: its final policy.
        return _load(os.path.join(path, models.MODEL_DIR), dtype)
    _check_hf_folder(path, names, weights)
    model = models.from_pretrained(path, dtype=jnp.dtype(dtype))
    run_config = _find_run_config(os.path.dirname(path))
    return model, models.load_tokenizer(path), None, path, run_config


def open_policy(path: str | os.PathLike, *, dtype: str = "auto") -> Policy:
    """Loads a policy and finds the task it was trained for (docs/evaluation.md).

    Args:
      path: a training work directory, its `model/` folder, or an HF model folder.
      dtype: parameter dtype of an HF folder's weights (`resolve_dtype`); a checkpoint keeps
        the run's own dtype.

    Returns:
      The `Policy`.

    Raises:
      FileNotFoundError: naming the folder and what it lacks.
      ValueError: a bad dtype, a chain-task tokenizer without a run config, or a chain-task
        policy whose vocabulary is not the task's.
    """
    model, tokenizer, step, path, run_config = _load(path, resolve_dtype(dtype))
    kind = _task_kind(run_config, tokenizer, path)
    if kind == "chain" and model.config.vocab_size != tasks.VOCAB_SIZE:
        raise ValueError(
            f"policy={path!r}: its run config names the chain task, whose vocabulary has "
            f"{tasks.VOCAB_SIZE} symbols, but the model has vocab_size={model.config.vocab_size}"
        )
    return Policy(model, tokenizer, kind, run_config, path, step)


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
    """Evaluates a policy on the task it was trained for (docs/evaluation.md).

    Args:
      policy: a training work directory, its `model/` folder, or an HF model folder.
      out_dir: the output folder: the reports, the completions, a math policy's resume files.
      benchmarks: math benchmark names (None: all of `data.BENCHMARKS`).
      sampling: `EvalSettings` fields to change over the task's defaults (`EvalSettings.of`);
        `max_new_tokens`, `max_prompt_tokens` and `prompt_bucket` apply to math policies only.
      limit: only the first `limit` problems of each benchmark (math) or test level (chain).
      dtype: parameter dtype of an HF folder's weights (`resolve_dtype`); a checkpoint keeps
        the run's dtype.
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
      ValueError or FileNotFoundError: naming the argument, before anything is written (an
        `out_dir` this process cannot write in among them).
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
    # Before the policy loads and anything is sampled: sampled work is never lost to a folder
    # that cannot take it (a read-only share, a path through a file).
    runtime.check_writable_folder(out_dir, name="out_dir")
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
