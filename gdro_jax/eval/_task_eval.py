"""Evaluation on the chain task: k samples per problem, graded by exact match, per level and pooled.

`evaluate_task` samples `num_samples` completions of every problem with the KV-cache sampler
(`gdro_jax.sampling.generate`, one compiled shape for the whole set: the last batch is padded),
grades them with the task's jittable reward (`tasks.solution_correct`: the whole worked solution
must match), and summarises the correct counts with `summarize_counts`: mean@n and the unbiased
pass@k for every k <= n, per level and pooled, with bootstrap intervals over problems (SPEC 9).
`format_level_table` prints the result.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from gdro_jax import tasks
from gdro_jax.eval._passk import PassSummary, summarize_counts
from gdro_jax.sampling import generate


@dataclasses.dataclass(frozen=True)
class TaskEvaluation:
    """The result of `evaluate_task`.

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

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: per level and pooled mean@n and pass@k with intervals, and the
        per-problem correct counts and levels (enough to recompute any statistic)."""

        def plain(summary: PassSummary) -> dict[str, Any]:
            return {
                "num_problems": summary.num_problems,
                f"mean@{self.num_samples}": summary.mean,
                f"mean@{self.num_samples}_interval": summary.mean_interval.tolist(),
                "pass@k": {str(k + 1): float(v) for k, v in enumerate(summary.pass_at)},
                "pass@k_interval": {
                    str(k + 1): v.tolist() for k, v in enumerate(summary.pass_interval)
                },
            }

        return {
            "num_samples": self.num_samples,
            "levels": {str(level): plain(s) for level, s in self.by_level.items()},
            "pooled": plain(self.pooled),
            "correct": self.correct.tolist(),
            "problem_levels": self.levels.tolist(),
        }


def sample_correct_counts(
    model,
    arrays: tasks.ChainArrays,
    *,
    num_samples: int,
    key: jax.Array,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    batch_size: int = 32,
    progress: bool = False,
    sampler: Callable[..., Any] = generate,
    on_batch: Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], None] | None = None,
) -> np.ndarray:
    """Samples `num_samples` completions of every problem and counts the exact solutions.

    Args:
      model: a `gdro_jax.models.Decoder` (or anything `sampling.generate` accepts).
      arrays: the problems' `ChainArrays` (prompts and gold solutions).
      num_samples: completions per problem (>= 1).
      key: PRNG key; batch b samples with `fold_in(key, b)`.
      max_new_tokens: tokens sampled per completion (>= the longest gold solution).
      temperature, top_p, top_k: sampling settings (`sampling.generate`).
      batch_size: prompts per sampler call (`batch_size * num_samples` sequences at once).
      progress: show a tqdm bar over batches.
      sampler: the sampling function, called like `gdro_jax.sampling.generate` and returning
        `.tokens` [R, M] and `.lengths` [R] (tests pass a fake with known odds).
      on_batch: called after each batch with its real problems' indices int[b], and their
        slots' tokens int32[b * num_samples, M], lengths int32[b * num_samples] and correctness
        bool[b * num_samples] (slot r continues problem r // num_samples), e.g. to keep the
        completions.

    Returns:
      int64[N] correct completions of each problem, in [0, num_samples].
    """
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be an int >= 1, got num_samples={num_samples!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got batch_size={batch_size!r}")
    longest = int(arrays.solution_lengths.max())
    if max_new_tokens < longest:
        raise ValueError(
            f"max_new_tokens must be >= the longest gold solution ({longest} tokens), "
            f"got max_new_tokens={max_new_tokens!r}"
        )
    num_problems = len(arrays.levels)
    batch_size = min(batch_size, num_problems)
    # Slot r of a batch continues prompt r // num_samples.
    prompt_of_slot_R = np.repeat(np.arange(batch_size, dtype=np.int32), num_samples)
    correct_N = np.zeros((num_problems,), np.int64)
    starts = range(0, num_problems, batch_size)
    for batch, start in enumerate(tqdm(starts, desc="eval", disable=not progress, leave=False)):
        # Pad the last batch with the first problem, so every call has one compiled shape.
        rows_B = np.arange(start, start + batch_size) % num_problems
        result = sampler(
            model,
            arrays.prompt_tokens[rows_B],
            prompt_lengths=arrays.prompt_lengths[rows_B],
            prompt_of_slot=prompt_of_slot_R,
            key=jax.random.fold_in(key, batch),
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            eos_ids=(tasks.EOS_ID,),
            pad_id=tasks.PAD_ID,
        )
        gold_RS = jnp.asarray(arrays.solution_tokens[rows_B])[prompt_of_slot_R]
        correct_R = tasks.solution_correct(
            result.tokens, gold_RS, completion_lengths=result.lengths, eos_id=tasks.EOS_ID
        )
        counts_B = np.asarray(correct_R).reshape(batch_size, num_samples).sum(axis=1)
        real = min(batch_size, num_problems - start)
        correct_N[start : start + real] = counts_B[:real]
        if on_batch is not None:
            slots = real * num_samples
            on_batch(
                rows_B[:real],
                np.asarray(result.tokens)[:slots],
                np.asarray(result.lengths)[:slots],
                np.asarray(correct_R)[:slots],
            )
    return correct_N


def evaluate_task(
    model,
    rows_or_arrays: Sequence[dict] | tasks.ChainArrays,
    config: tasks.ChainTaskConfig,
    *,
    key: jax.Array,
    num_samples: int = 8,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    batch_size: int = 32,
    num_resamples: int = 1000,
    confidence: float = 0.95,
    progress: bool = False,
    sampler: Callable[..., Any] = generate,
    on_batch: Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], None] | None = None,
) -> TaskEvaluation:
    """Evaluates a policy on chain-task problems: mean@n and pass@k per level and pooled.

    Args:
      model: the policy (`gdro_jax.models.Decoder`).
      rows_or_arrays: task rows (e.g. `build_splits(config).validation`) or their `ChainArrays`.
      config: the task config (fixes padded lengths; completions get
        `config.max_solution_length` new tokens).
      key: PRNG key of the samples (the bootstrap uses a fixed numpy seed).
      num_samples: n, completions per problem; pass@k is reported for k = 1..n.
      temperature, top_p, top_k: sampling settings (SPEC 11's frontier check: T = 1, no
        truncation; the paper's evaluation: T = 0.6, top-p 0.8, top-k 20).
      batch_size: prompts per sampler call.
      num_resamples, confidence: bootstrap settings (`summarize_counts`).
      progress: show a tqdm bar over batches.
      sampler: the sampling function (see `sample_correct_counts`).
      on_batch: called with each batch's problems and completions (see `sample_correct_counts`).

    Returns:
      `TaskEvaluation`.

    References:
      Chen et al., 2021 (arXiv 2107.03374): the unbiased pass@k estimator.
    """
    if isinstance(rows_or_arrays, tasks.ChainArrays):
        arrays = rows_or_arrays
    else:
        arrays = tasks.encode_rows(rows_or_arrays, config)
    correct_N = sample_correct_counts(
        model,
        arrays,
        num_samples=num_samples,
        key=key,
        max_new_tokens=config.max_solution_length,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        batch_size=batch_size,
        progress=progress,
        sampler=sampler,
        on_batch=on_batch,
    )
    by_level, pooled = summarize_counts(
        correct_N, num_samples, arrays.levels, num_resamples=num_resamples, confidence=confidence
    )
    return TaskEvaluation(
        num_samples=num_samples,
        by_level=by_level,
        pooled=pooled,
        correct=correct_N,
        levels=np.asarray(arrays.levels, np.int32),
    )


def evaluate_with(
    model, task_config: tasks.ChainTaskConfig, rows, eval_config, progress: bool, **kwargs
) -> TaskEvaluation:
    """`evaluate_task` with the sampling settings of an `eval` config block (`seed`,
    `num_samples`, `temperature`, `top_p`, `top_k`, `batch_size`: a ConfigDict or a
    `TaskEvalSettings`), as the warm start, the demo and the evaluation entry point use it;
    `kwargs` (`sampler`, `on_batch`) go to `evaluate_task`."""
    return evaluate_task(
        model,
        rows,
        task_config,
        key=jax.random.key(eval_config.seed),
        num_samples=eval_config.num_samples,
        temperature=eval_config.temperature,
        top_p=eval_config.top_p,
        top_k=eval_config.top_k,
        batch_size=eval_config.batch_size,
        progress=progress,
        **kwargs,
    )


def format_level_table(evaluation: TaskEvaluation, ks: Sequence[int] | None = None) -> str:
    """A plain-text table: one row per level and a pooled row; pass@k with bootstrap intervals.

    Args:
      evaluation: a `TaskEvaluation`.
      ks: the k columns (default: 1 and n).

    Returns:
      The table as a string (no trailing newline).
    """
    n = evaluation.num_samples
    ks = sorted({1, n}) if ks is None else list(ks)
    for k in ks:
        if not 1 <= k <= n:
            raise ValueError(f"ks must lie in [1, {n}], got {k!r}")

    def cell(value: float, interval: np.ndarray) -> str:
        return f"{value:.3f} [{interval[0]:.3f}, {interval[1]:.3f}]"

    header = ["level", "problems", f"mean@{n}"] + [f"pass@{k}" for k in ks]
    lines = []
    rows = [(str(level), s) for level, s in evaluation.by_level.items()]
    rows.append(("pooled", evaluation.pooled))
    for name, s in rows:
        lines.append(
            [name, str(s.num_problems), cell(s.mean, s.mean_interval)]
            + [cell(s.pass_at[k - 1], s.pass_interval[k - 1]) for k in ks]
        )
    widths = [max(len(r[i]) for r in [header, *lines]) for i in range(len(header))]
    out = [
        "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)),
        "  ".join("-" * w for w in widths),
    ]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in lines]
    return "\n".join(line.rstrip() for line in out)
