"""A policy to evaluate (an HF folder or a training run's checkpoint) on the math benchmarks."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import jax.numpy as jnp

from gdro_jax import data, models, rewards
from gdro_jax.eval._math_eval import MathEvalSettings, evaluate_math, load_bins
from gdro_jax.eval._math_report import MathEvaluation

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_policy(path: str | os.PathLike, *, dtype: str = "bfloat16"):
    """Loads a policy to evaluate: a HuggingFace model folder, or a training run's checkpoint.

    Args:
      path: a folder holding `config.json`, `*.safetensors` (or an index) and tokenizer files;
        or a training work directory holding `checkpoints/`, whose newest usable checkpoint is
        read (the run's config rebuilds the policy and its tokenizer).
      dtype: parameter dtype ("float32" or "bfloat16") of an HF folder's weights.

    Returns:
      `(model, tokenizer)`: a `gdro_jax.models.Decoder` and a transformers tokenizer.

    Raises:
      FileNotFoundError: naming the folder and what it lacks.
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"policy={path!r} is not a folder")
    names = set(os.listdir(path))
    weights = any(name.endswith(".safetensors") or name.endswith(".index.json") for name in names)
    if not weights and "checkpoints" in names:
        from gdro_jax import train  # noqa: PLC0415 (train imports eval: import when needed)

        model, tokenizer, step = train.policy_from_checkpoint(path)
        logging.info("evaluating %s at checkpoint step %d", path, step)
        return model, tokenizer
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
    model = models.from_pretrained(path, dtype=jnp.dtype(dtype))
    return model, models.load_tokenizer(path)


def evaluate_math_policy(
    policy: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    benchmarks: Sequence[str],
    settings: MathEvalSettings,
    data_dir: str | None = None,
    limit: int | None = None,
    dtype: str = "bfloat16",
    num_workers: int = 2,
    grader_timeout_s: float = 5.0,
    bins_from: str | None = None,
    bin_field: str = "level",
    chat_template: bool = True,
    on_long_prompt: str = "skip",
) -> MathEvaluation:
    """`experiments/evaluate.py` as a function: load the policy and benchmarks, sample, grade.

    Args:
      policy: an HF model folder or a training work directory (see `load_policy`).
      out_dir: where reports and resume files go (see `evaluate_math`).
      benchmarks: names from `data.BENCHMARKS`; an unknown name raises before anything loads.
      settings: sampling settings.
      data_dir: the benchmark files' folder (default: `$GDRO_DATA_DIR`, else `../shared/data`).
      limit: evaluate only the first `limit` problems of each benchmark.
      dtype: parameter dtype of an HF folder's weights.
      num_workers, grader_timeout_s: the math-verify grader's workers and per-answer limit.
      bins_from: a JSON file mapping problem id -> bin (else each row's `bin_field`).
      bin_field: the row field holding the difficulty bin.
      chat_template: wrap prompts in the tokenizer's chat template when it has one.
      on_long_prompt: "skip" (counted) or "raise" for prompts over `max_prompt_tokens`.

    Returns:
      The `MathEvaluation` (also written to `out_dir` as JSON and Markdown).
    """
    unknown = [name for name in benchmarks if name not in data.PRESETS]
    if unknown:
        raise ValueError(f"unknown benchmark {unknown[0]!r}; known: {data.BENCHMARKS}")
    model, tokenizer = load_policy(policy, dtype=dtype)
    templated = chat_template and bool(getattr(tokenizer, "chat_template", None))
    rows = {
        name: data.load_preset(name, data_dir, tokenizer=tokenizer if templated else None)[:limit]
        for name in benchmarks
    }
    bins = load_bins(bins_from) if bins_from else None
    with rewards.MathGrader(num_workers, grader_timeout_s) as grader:
        return evaluate_math(
            model,
            tokenizer,
            rows,
            grader=grader,
            out_dir=out_dir,
            settings=settings,
            policy_name=os.path.abspath(policy),
            bins=bins,
            bin_field=bin_field,
            on_long_prompt=on_long_prompt,
            # Chat-templated prompts carry their special tokens as text.
            add_special_tokens=not templated,
        )
