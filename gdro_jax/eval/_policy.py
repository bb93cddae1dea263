"""A policy to evaluate, found from a path, with the task it was trained for.

A path names:

- a training work directory (`checkpoints/`, `config.json`): its newest usable checkpoint, the
  policy alone (`checkpoint.restore_policy`: on one device, whatever mesh it trained on; no task,
  data, grader or optimizer is built), or its exported `model/` when several processes evaluate
  it;
- its `model/` folder (an HF folder whose parent holds the run's `config.json`), or the `model/`
  folder of a warm start (whose parent holds `pretrain.json`); a finished run's folder without
  checkpoints is read through its `model/`;
- any other HF folder (`config.json`, `*.safetensors`, tokenizer files): a math policy.

The saved run config decides the task (`task_kind`, default "chain"). An HF folder with the chain
task's tokenizer but no run config beside it is refused: its test split cannot be rebuilt, and
math prompts do not encode in its 18 symbols.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any

import jax
import jax.numpy as jnp

from gdro_jax import checkpoint, configs, models, tasks

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
DTYPES = ("auto", "float32", "bfloat16")
RUN_CONFIG_FILES = ("config.json", "pretrain.json")


def resolve_dtype(dtype: str) -> str:
    """`"auto"` -> float32 on CPU, bfloat16 on accelerators; other names pass through.

    On CPU bfloat16 is emulated and rounds differently from a float32 reference: greedy MATH500
    completions of a pretrained model differed from transformers' on 9 of 16 problems in
    bfloat16 and matched on all 16 in float32.
    """
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


def _is_chain_tokenizer(tokenizer) -> bool:
    try:
        return set(tokenizer.get_vocab()) == set(tasks.VOCAB)
    except (AttributeError, TypeError):
        return False


def _task_kind(run_config: dict | None, tokenizer, path: str) -> str:
    if run_config is not None:
        return configs.task_kind(run_config)
    if _is_chain_tokenizer(tokenizer):
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
    """Loads a policy and finds the task it was trained for (module docstring).

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
