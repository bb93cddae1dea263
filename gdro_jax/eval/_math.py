"""Evaluation on math benchmarks: k samples per problem, math-verify grading, pass@k tables;
resumable (docs/evaluation.md: shapes, long prompts, resuming, bins; docs/scaling.md: processes).

`evaluate_math` tokenizes and checks the whole request before it writes anything, samples batch b
of a benchmark (`_harness.sample_batch`) with `fold_in(fold_in(key(seed), crc32(benchmark)), b)`
(so a resumed run draws an uninterrupted one's samples), grades with a `rewards.MathGrader` and
summarises (`_math_report.py`); `_math_files.py` reads and writes the resume files. With several
processes each samples and grades the batches dealt to it, and process 0 alone reads and writes.
One module over 400 lines, on purpose: the request's checks, the resume and the dealing of
batches are one loop's, and `_math_files.py` and `_math_report.py` already hold the rest.

References:
  Panaganti et al., 2026 (arXiv 2601.19280): evaluation with 8 samples, T = 0.6, top-p 0.8,
  top-k 20, mean@8 and pass@8.

Over 350 lines on purpose: sampling, grading and the resumable per-problem files share one loop.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import json
import os
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from tqdm.auto import tqdm

from gdro_jax import rewards, runtime
from gdro_jax.eval import _math_files as files
from gdro_jax.eval._harness import (
    REPORT_JSON,
    REPORT_MARKDOWN,
    EvalSettings,
    batch_rows,
    sample_batch,
)
from gdro_jax.eval._math_files import COMPLETIONS_FILE, SAMPLES_FILE, SETTINGS_FILE
from gdro_jax.eval._math_report import MathEvaluation, summarize_problems
from gdro_jax.sampling import FinishReason, generate

TIMED = ("sampling_s", "first_call_s", "decoding_s", "grading_s")  # seconds, in report order


def load_bins(path: str | os.PathLike) -> dict[str, Any]:
    """Reads a JSON object mapping problem ids to integer bins.

    Keys are problem ids (as strings); a value is an integer bin, or an object mapping that
    benchmark's ids to bins (`{"math500": {"test/algebra/1.json": 3}, "17": 1}`): a
    per-benchmark entry wins over a plain id, which applies to every benchmark.

    Raises:
      ValueError: naming the file, when it is not a JSON object.
    """
    with open(path) as f:
        bins = json.load(f)
    if not isinstance(bins, dict):
        raise ValueError(f"{path}: bins must be a JSON object id -> bin, got {type(bins).__name__}")
    return bins


def _bin_value(raw: Any, where: str) -> int | None:
    if raw is None or (isinstance(raw, int) and not isinstance(raw, bool)):
        return raw
    whole_float = isinstance(raw, float) and raw.is_integer()
    if whole_float or (isinstance(raw, str) and raw.strip().lstrip("-").isdigit()):
        return int(raw)
    raise ValueError(f"{where}: a bin must be an integer, got {raw!r}")


def _bin_of(name: str, row: Mapping, bins: Mapping | None, bin_field: str | None) -> int | None:
    problem_id = str(row["id"])
    if bins is not None:
        nested = bins.get(name)
        if isinstance(nested, Mapping) and problem_id in nested:
            return _bin_value(nested[problem_id], f"bins[{name!r}][{problem_id!r}]")
        plain = bins.get(problem_id)
        if plain is not None and not isinstance(plain, Mapping):
            return _bin_value(plain, f"bins[{problem_id!r}]")
        return None
    if bin_field is None or bin_field not in row:
        return None
    return _bin_value(row[bin_field], f"{name} problem {problem_id!r}, field {bin_field!r}")


def _stable_hash(text: str) -> int:
    return zlib.crc32(text.encode()) & 0x7FFFFFFF  # fold_in takes a non-negative int32


def _prompt_hash(token_ids: Sequence[int]) -> str:
    return hashlib.sha256(json.dumps(list(token_ids)).encode()).hexdigest()[:16]


def _tokenize_request(
    benchmarks, tokenizer, settings, bins, bin_field, on_long_prompt, add_special_tokens
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Mapping]]]:
    """Tokenizes every prompt and reads every bin (the padded prompt length is one for the whole
    request); returns the plan (per benchmark: kept `(id, bin, tokens, prompt hash)` and skipped
    ids) and the rows by id."""
    plan: dict[str, dict[str, Any]] = {}
    rows_by_id: dict[str, dict[str, Mapping]] = {}
    for name, rows in benchmarks.items():
        ids = [str(row["id"]) for row in rows]
        repeated = [i for i, count in collections.Counter(ids).items() if count > 1]
        if repeated:
            raise ValueError(f"benchmark {name!r} has duplicate problem ids, e.g. {repeated[0]!r}")
        kept, skipped = [], []
        for row, problem_id in zip(rows, ids, strict=True):
            try:
                encoded = tokenizer(row["prompt"], add_special_tokens=add_special_tokens)
            except Exception as error:  # tokenizers raises its own types, e.g. a missing [UNK]
                raise ValueError(
                    f"{name} problem {problem_id!r}: the tokenizer cannot encode the prompt "
                    f"({error}); is it a math policy's tokenizer?"
                ) from error
            tokens = encoded["input_ids"]
            if len(tokens) > settings.max_prompt_tokens:
                if on_long_prompt == "raise":
                    raise ValueError(
                        f"{name} problem {problem_id!r}: prompt of {len(tokens)} tokens exceeds "
                        f"max_prompt_tokens={settings.max_prompt_tokens}"
                    )
                skipped.append(problem_id)
                continue
            if not tokens:
                raise ValueError(f"{name} problem {problem_id!r}: the prompt has no tokens")
            problem_bin = _bin_of(name, row, bins, bin_field)
            kept.append((problem_id, problem_bin, tokens, _prompt_hash(tokens)))
        plan[name] = {"kept": kept, "skipped": skipped}
        rows_by_id[name] = dict(zip(ids, rows, strict=True))
    return plan, rows_by_id


def _open_folder(out: Path, plan, stored_settings) -> dict[tuple[str, str], dict[str, Any]]:
    """Reads and checks the stored samples, then prepares the folder; returns the finished
    problems' records. Every check comes before the first write: a refusal (ValueError) leaves
    `out` as it was."""
    records, repair = files.read_records(out / SAMPLES_FILE)
    files.check_settings(out / SETTINGS_FILE, stored_settings, has_samples=bool(records))
    for name, p in plan.items():
        for problem_id, _, _, prompt_hash in p["kept"]:
            done = records.get((name, problem_id))
            if done is not None and done["prompt_sha"] != prompt_hash:
                raise ValueError(
                    f"{out / SAMPLES_FILE}: setting 'prompt' differs for {name} problem "
                    f"{problem_id!r}: its stored samples continue another prompt (another "
                    "tokenizer, template or suffix); use another output folder"
                )
    out.mkdir(parents=True, exist_ok=True)
    if not records or not (out / SETTINGS_FILE).exists():
        (out / SETTINGS_FILE).write_text(json.dumps(stored_settings, indent=2) + "\n")
    if repair is not None:
        repair()
    if records:
        files.keep_finished_completions(out / COMPLETIONS_FILE, records)
    else:  # a fresh start: no line of an earlier run stays
        (out / COMPLETIONS_FILE).unlink(missing_ok=True)
    return records


def evaluate_math(
    model,
    tokenizer,
    benchmarks: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    grader,
    out_dir: str | os.PathLike,
    settings: EvalSettings | None = None,
    policy_name: str = "",
    bins: Mapping[str, Any] | None = None,
    bin_field: str | None = "level",
    on_long_prompt: str = "skip",
    add_special_tokens: bool = False,
    num_resamples: int = 1000,
    confidence: float = 0.95,
    save_completions: bool = True,
    progress: bool = True,
    sampler: Callable[..., Any] = generate,
    on_batch_done: Callable[[str, int], None] | None = None,
) -> MathEvaluation:
    """Samples, grades and summarises a policy on math benchmarks; resumable (module docstring).

    Args:
      model: the policy (`gdro_jax.models.Decoder`, sharded or not).
      tokenizer: its transformers tokenizer (encodes prompts, decodes completions; its
        `eos_token_id` joins `model.config.eos_token_ids` as stop ids).
      benchmarks: benchmark name -> rows `{"id", "prompt", "answer", ...}` with formatted
        prompts (`data.load_preset(name, tokenizer=tokenizer)`); ids unique per benchmark.
      grader: a `rewards.MathGrader` (started once by the caller, reused across calls).
      out_dir: the output folder (created): the resume files and the reports.
      settings: the sampling settings (`EvalSettings`; None: the paper's defaults).
      policy_name: recorded with the settings, so resuming with another policy fails.
      bins: optional mapping problem id -> integer bin (`load_bins`); replaces `bin_field`.
      bin_field: the row field holding the bin when `bins` is None (None: no bins).
      on_long_prompt: `"skip"` (counted) or `"raise"` for prompts over `max_prompt_tokens`.
      add_special_tokens: passed to the tokenizer (False for chat-templated prompts).
      num_resamples, confidence: bootstrap settings (`summarize_counts`; seed 0).
      save_completions: write `completions.jsonl` (a resumed run may switch it: the samples
        stay the same, and the file covers some problems only).
      progress: show a tqdm bar over problems.
      sampler: called like `sampling.generate`, returning `.tokens` [R, M] and `.lengths` [R]
        (and optionally `.finish_reasons`); tests pass fakes.
      on_batch_done: called with (benchmark, batch index) after each batch is written.

    Returns:
      `MathEvaluation`, also written to `report.json` and `report.md` (process 0's; the other
      processes return None).

    Raises:
      ValueError: naming the cause (an argument, a prompt, a bin, a setting or prompt that
        differs from the stored samples'), before anything is written to `out_dir`.
    """
    if on_long_prompt not in ("skip", "raise"):
        raise ValueError(f"on_long_prompt must be 'skip' or 'raise', got {on_long_prompt!r}")
    start_time = time.perf_counter()
    settings = EvalSettings() if settings is None else settings
    k, batch_size = settings.num_samples, settings.batch_size
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out_dir must be a folder, got out_dir={os.fspath(out_dir)!r} (a file)")
    # Every check comes before the first write: a refused run leaves `out` as it was.
    plan, rows_by_id = _tokenize_request(
        benchmarks, tokenizer, settings, bins, bin_field, on_long_prompt, add_special_tokens
    )
    stored_settings = json.loads(
        json.dumps({"policy": policy_name, **dataclasses.asdict(settings)})
    )
    batches = [  # (benchmark, batch index, its first problem): the same in every process
        (name, batch, first)
        for name, p in plan.items()
        for batch, first in enumerate(range(0, len(p["kept"]), batch_size))
    ]
    # Which problems of each batch are left: process 0 reads, checks and prepares the folder (a
    # refusal leaves it as it was) and tells the other processes.
    records: dict[tuple[str, str], dict[str, Any]] = {}
    refused = None
    todo_JB = np.zeros((len(batches), batch_size), bool)
    if runtime.is_primary():
        try:
            records = _open_folder(out, plan, stored_settings)
        except ValueError as error:
            refused = error
        for j, (name, _, first) in enumerate(batches):
            real = plan[name]["kept"][first : first + batch_size]
            todo_JB[j, : len(real)] = [(name, pid) not in records for pid, *_ in real]
    failed, todo_JB = runtime.from_primary((np.int32(refused is not None), todo_JB))
    if refused is not None:
        raise refused
    if failed:
        raise ValueError(f"process 0 refused the request for {out} (its error names the cause)")

    longest = max((len(t) for p in plan.values() for _, _, t, _ in p["kept"]), default=1)
    prompt_pad = -(-longest // settings.prompt_bucket) * settings.prompt_bucket
    eos_ids = sorted(
        {int(i) for i in getattr(getattr(model, "config", None), "eos_token_ids", ())}
        | ({int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set())
    )
    pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
    base_key = jax.random.key(settings.seed)
    timing = collections.Counter()
    restarts_before = grader.stats.restarts

    def decode(tokens_RM, lengths_R, slots) -> list[str]:
        return tokenizer.batch_decode(
            [tokens_RM[r, : lengths_R[r]].tolist() for r in slots], skip_special_tokens=True
        )

    def sample_and_grade(j: int) -> tuple[dict[str, np.ndarray], list[str]]:
        """Batch j's samples and the grades of its problems left to do (this process's work)."""
        name, batch, first = batches[j]
        kept = plan[name]["kept"]
        rows_B = [kept[i] for i in batch_rows(first, batch_size, len(kept))]
        tokens_BP = np.full((batch_size, prompt_pad), pad_id, np.int32)
        for i, (_, _, tokens, _) in enumerate(rows_B):
            tokens_BP[i, : len(tokens)] = tokens
        lengths_B = np.asarray([len(t) for _, _, t, _ in rows_B], np.int32)
        key = jax.random.fold_in(jax.random.fold_in(base_key, _stable_hash(name)), batch)
        tick = time.perf_counter()
        result = sample_batch(
            model, sampler, tokens_BP, lengths_B, settings=settings, key=key,
            max_new_tokens=settings.max_new_tokens, eos_ids=eos_ids, pad_id=pad_id,
        )  # fmt: skip
        tokens_RM = np.asarray(result.tokens, np.int32)
        lengths_R = np.asarray(result.lengths, np.int32)
        finish = getattr(result, "finish_reasons", None)
        truncated_R = (
            lengths_R >= settings.max_new_tokens
            if finish is None
            else np.asarray(finish) == int(FinishReason.LENGTH)
        )
        elapsed = time.perf_counter() - tick
        timing["sampling_s"] += elapsed
        if timing["batches"] == 0:
            timing["first_call_s"] = elapsed
        timing["batches"] += 1

        tick = time.perf_counter()
        slots = [i * k + sample for i in np.flatnonzero(todo_JB[j]) for sample in range(k)]
        completions = decode(tokens_RM, lengths_R, slots)
        timing["decoding_s"] += time.perf_counter() - tick
        tick = time.perf_counter()
        golds = [str(rows_by_id[name][rows_B[r // k][0]]["answer"]) for r in slots]
        grades = grader.grade_items(completions, golds, progress=False)
        timing["grading_s"] += time.perf_counter() - tick
        scores_R = np.zeros(len(lengths_R), np.float64)
        statuses_R = np.zeros(len(lengths_R), np.int32)
        scores_R[slots] = [g.score for g in grades]
        statuses_R[slots] = [rewards.STATUSES.index(g.status) for g in grades]
        arrays = dict(
            tokens=tokens_RM,
            lengths=lengths_R,
            truncated=truncated_R.astype(np.int32),
            scores=scores_R,
            statuses=statuses_R,
        )
        return arrays, completions

    def write(j: int, arrays: dict[str, np.ndarray], completions: list[str] | None) -> None:
        """Batch j's finished problems into the files (process 0); `completions` None: decoded
        here from the tokens (another process sampled the batch)."""
        name, batch, first = batches[j]
        real = plan[name]["kept"][first : first + batch_size]
        missing = np.flatnonzero(todo_JB[j])
        slots = [i * k + sample for i in missing for sample in range(k)]
        lengths_R, truncated_R = arrays["lengths"], arrays["truncated"].astype(bool)
        if completions is None:
            completions = decode(arrays["tokens"], lengths_R, slots)
        grades = [
            rewards.Grade(float(arrays["scores"][r]), rewards.STATUSES[arrays["statuses"][r]])
            for r in slots
        ]
        if save_completions:  # before samples.jsonl: a finished problem has its line
            for position, i in enumerate(missing):
                row = rows_by_id[name][real[i][0]]
                slots_k = range(i * k, (i + 1) * k)
                texts = completions[position * k : (position + 1) * k]
                items = grades[position * k : (position + 1) * k]
                entry = files.completions_entry(
                    name, row, texts, items, lengths_R[slots_k], truncated_R[slots_k]
                )
                completions_file.write(json.dumps(entry) + "\n")
            completions_file.flush()
        for position, i in enumerate(missing):
            problem_id, _, _, prompt_hash = real[i]
            items = grades[position * k : (position + 1) * k]
            record = {
                "benchmark": name,
                "id": problem_id,
                "prompt_sha": prompt_hash,
                "n": k,
                "c": int(sum(g.score > 0 for g in items)),
                "scores": [float(g.score) for g in items],
                "statuses": [g.status for g in items],
                "lengths": [int(lengths_R[i * k + sample]) for sample in range(k)],
                "truncated": int(truncated_R[i * k : (i + 1) * k].sum()),
            }
            records[(name, problem_id)] = record
            samples_file.write(json.dumps(record) + "\n")
        samples_file.flush()
        os.fsync(samples_file.fileno())
        timing["problems"] += len(missing)
        bar.update(len(missing))
        if on_batch_done is not None:
            on_batch_done(name, batch)

    # Several processes: round by round, process p samples and grades the round's p-th batch
    # left; process 0 writes the round's batches in order, so the files are a single process's.
    jobs = [j for j in range(len(batches)) if todo_JB[j].any()]
    count, me, primary = jax.process_count(), jax.process_index(), runtime.is_primary()
    idle = dict(
        tokens=np.zeros((batch_size * k, settings.max_new_tokens), np.int32),
        **{name: np.zeros(batch_size * k, np.int32) for name in ("lengths", "truncated")},
        scores=np.zeros(batch_size * k, np.float64),
        statuses=np.zeros(batch_size * k, np.int32),
    )
    bar = tqdm(
        total=int(todo_JB.sum()), disable=not (progress and primary), desc="math eval",
        unit="problem",
    )  # fmt: skip
    opened = contextlib.ExitStack()
    with bar, opened:
        if primary:
            samples_file = opened.enter_context(open(out / SAMPLES_FILE, "a"))
            if save_completions:
                completions_file = opened.enter_context(open(out / COMPLETIONS_FILE, "a"))
        for start in range(0, len(jobs), count):
            round_jobs = jobs[start : start + count]
            mine = round_jobs[me] if me < len(round_jobs) else None
            arrays, completions = sample_and_grade(mine) if mine is not None else (idle, None)
            shared = runtime.gather(arrays)
            if primary:
                for p, j in enumerate(round_jobs):
                    write(j, shared[p], completions if p == me else None)

    if not primary:
        return None
    evaluation = summarize_problems(
        plan,
        records,
        settings=stored_settings,
        k=k,
        bin_source="mapping" if bins is not None else f"field:{bin_field}",
        num_resamples=num_resamples,
        confidence=confidence,
        timing={
            **{name: float(timing[name]) for name in TIMED},
            "total_s": time.perf_counter() - start_time,
            "batches": int(timing["batches"]),
            "problems": int(timing["problems"]),
        },
        restarts=grader.stats.restarts - restarts_before,
    )
    record = {**evaluation.to_dict(), "environment": runtime.environment()}
    (out / REPORT_JSON).write_text(json.dumps(record, indent=2) + "\n")
    (out / REPORT_MARKDOWN).write_text(evaluation.to_markdown())
    return evaluation
