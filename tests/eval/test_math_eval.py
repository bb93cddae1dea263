"""The math evaluation harness: exact scores from a fake sampler with known completions, the saved
completions, resuming (same report and files, finished problems not re-sampled), settings
checks, long prompts, and refused starts that write nothing.

Everything here uses synthetic problems, so no data directory is needed.
"""

import json
import math

import numpy as np
import pytest

from gdro_jax import data, models, rewards, sampling, tasks
from gdro_jax import eval as evaluation

K = 4
WRONG_ANSWER = "123456789"


def _rows(prefix: str, count: int, *, levels: bool) -> list[dict]:
    rows = []
    for i in range(count):
        row = {
            "id": f"{prefix}-{i}",
            "prompt": f"Problem {prefix} {i}: compute {i} * 7 + 3 and simplify $x^{i}$.",
            "answer": str(i * 7 + 3),
        }
        if levels:
            row["level"] = 1 + i % 3
        rows.append(row)
    return rows


@pytest.fixture(scope="module")
def tokenizer():
    texts = [r["prompt"] for r in _rows("alpha", 50, levels=False)]
    texts += [f"The answer is \\boxed{{{i}}}." for i in range(100)]
    return data.build_tokenizer(texts, vocab_size=400)


@pytest.fixture(scope="module")
def benchmarks(tokenizer):
    # alpha carries a level field (bins 1-3); beta has none (unbinned).
    raw = {"alpha": _rows("alpha", 6, levels=True), "beta": _rows("beta", 4, levels=False)}
    return {name: data.with_prompts(rows, tokenizer=tokenizer) for name, rows in raw.items()}


@pytest.fixture(scope="module")
def grader():
    with rewards.MathGrader(num_workers=1, timeout_s=5.0) as pool:
        yield pool


@pytest.fixture(scope="module")
def model(tokenizer):
    config = models.DecoderConfig.tiny(vocab_size=len(tokenizer), eos_token_ids=(2,))
    return models.init_decoder(config, seed=0)


class KnownSampler:
    """A sampler whose completions are known: problem `i` of a run gets `correct[id]` boxed gold
    answers out of K, then boxed wrong answers (or no answer at all for ids in `no_answer`)."""

    def __init__(self, tokenizer, benchmarks, correct, no_answer=()):
        self.tokenizer = tokenizer
        self.correct = correct
        self.no_answer = set(no_answer)
        self.calls = 0
        self.by_prompt = {}
        for rows in benchmarks.values():
            for row in rows:
                ids = tuple(tokenizer(row["prompt"], add_special_tokens=False)["input_ids"])
                self.by_prompt[ids] = row

    def completion(self, row, j):
        if j < self.correct[row["id"]]:
            return f"So the result is \\boxed{{{row['answer']}}}."
        if row["id"] in self.no_answer:
            return "I do not know."
        return f"So the result is \\boxed{{{WRONG_ANSWER}}}."

    def __call__(self, model, tokens_BP, *, prompt_lengths, prompt_of_slot, max_new_tokens, **_):
        self.calls += 1
        tokens_BP, lengths_B = np.asarray(tokens_BP), np.asarray(prompt_lengths)
        prompt_of_slot = np.asarray(prompt_of_slot)
        R = len(prompt_of_slot)
        out_RM = np.zeros((R, max_new_tokens), np.int32)
        lengths_R = np.zeros((R,), np.int32)
        for r, b in enumerate(prompt_of_slot):
            row = self.by_prompt[tuple(tokens_BP[b, : lengths_B[b]].tolist())]
            j = int(np.sum(prompt_of_slot[:r] == b))  # sample index of this slot
            ids = self.tokenizer(self.completion(row, j))["input_ids"] + [2]
            assert len(ids) <= max_new_tokens
            out_RM[r, : len(ids)] = ids
            lengths_R[r] = len(ids)
        return sampling.GenerationResult(
            tokens=out_RM,
            logprobs=np.zeros_like(out_RM, np.float32),
            lengths=lengths_R,
            finish_reasons=np.ones((R,), np.int32),
            prompt_tokens=tokens_BP[prompt_of_slot],
            prompt_lengths=lengths_B[prompt_of_slot],
        )


def _expected(counts):
    """mean@K and pass@j (j = 1..K) averaged over problems, from the closed form."""
    mean = float(np.mean([c / K for c in counts]))
    passes = [
        float(np.mean([1 - math.comb(K - c, j) / math.comb(K, j) for c in counts]))
        for j in range(1, K + 1)
    ]
    return mean, passes


FAKE_SETTINGS = evaluation.EvalSettings(num_samples=K, max_new_tokens=48, batch_size=4)


def _correct_counts(benchmarks):
    # alpha: 0, 1, 2, 3, 4, 4 correct; beta: 2, 0, 4, 1.
    pattern = {"alpha": [0, 1, 2, 3, 4, 4], "beta": [2, 0, 4, 1]}
    return {
        row["id"]: pattern[name][i]
        for name, rows in benchmarks.items()
        for i, row in enumerate(rows)
    }


def test_scores_match_known_completions(tokenizer, benchmarks, grader, tmp_path):
    correct = _correct_counts(benchmarks)
    sampler = KnownSampler(tokenizer, benchmarks, correct, no_answer={"beta-1"})
    common = dict(grader=grader, settings=FAKE_SETTINGS, policy_name="fake", progress=False)
    result = evaluation.evaluate_math(
        None, tokenizer, benchmarks, out_dir=tmp_path, sampler=sampler, **common
    )
    assert sampler.calls == 3  # alpha: 2 batches of 4 (the second padded), beta: 1
    tol = 1e-12
    by_name = {name: [correct[r["id"]] for r in rows] for name, rows in benchmarks.items()}
    for name, counts in by_name.items():
        mean, passes = _expected(counts)
        assert result.mean_at_k(name) == pytest.approx(mean, abs=tol)
        for j in range(1, K + 1):
            assert result.pass_at(j, name) == pytest.approx(passes[j - 1], abs=tol)
    everything = by_name["alpha"] + by_name["beta"]
    mean, passes = _expected(everything)
    assert result.mean_at_k() == pytest.approx(mean, abs=tol)
    assert [result.pass_at(j) for j in range(1, K + 1)] == pytest.approx(passes, abs=tol)
    # Levels: alpha's rows i have level 1 + i % 3; beta has none.
    for level in (1, 2, 3):
        counts = [c for i, c in enumerate(by_name["alpha"]) if 1 + i % 3 == level]
        mean, passes = _expected(counts)
        assert result.mean_at_k(bin_label=str(level)) == pytest.approx(mean, abs=tol)
        assert result.pass_at(K, bin_label=str(level)) == pytest.approx(passes[-1], abs=tol)
        assert result.by_bin[str(level)].num_problems == len(counts)
    assert list(result.by_bin) == ["1", "2", "3", "unbinned"]
    assert result.by_bin["unbinned"].num_problems == 4
    assert list(result.by_benchmark_bin["beta"]) == ["unbinned"]

    # Grader counts: the no-answer problem's wrong samples have no answer at all.
    total_correct = sum(everything)
    no_answer = K - correct["beta-1"]
    assert result.grader["correct"] == total_correct
    assert result.grader["no_answer"] == no_answer
    assert result.grader["wrong"] == K * len(everything) - total_correct - no_answer
    assert result.grader["timeout"] == result.grader["crash"] == 0

    report = json.loads((tmp_path / "report.json").read_text())
    assert report["num_samples"] == K
    assert set(report["benchmarks"]) == {"alpha", "beta"}
    alpha = report["benchmarks"]["alpha"]
    assert alpha["summary"]["num_problems"] == 6
    assert set(alpha["summary"]["pass@k"]) == {str(j) for j in range(1, K + 1)}
    assert set(alpha["bins"]) == {"1", "2", "3"}
    low, high = alpha["summary"]["pass@k_interval"]["1"]
    assert low <= alpha["summary"]["pass@k"]["1"] <= high
    assert [p["c"] for p in report["problems"]] == everything
    assert report["problems"][0] == {
        "benchmark": "alpha",
        "id": "alpha-0",
        "bin": 1,
        "n": K,
        "c": 0,
        "truncated": 0,
        "mean_length": report["problems"][0]["mean_length"],
    }
    assert report["settings"]["policy"] == "fake"
    assert report["settings"]["num_samples"] == K
    assert set(report["timing"]) >= {"sampling_s", "grading_s", "decoding_s", "first_call_s"}
    assert report["benchmark_average"][f"mean@{K}"] == pytest.approx(
        (result.mean_at_k("alpha") + result.mean_at_k("beta")) / 2, abs=tol
    )
    markdown = (tmp_path / "report.md").read_text()
    assert "| benchmark | problems | pass@1 | pass@2 | pass@3 | pass@4 |" in markdown
    assert "| alpha | 6 |" in markdown and "| pooled | 10 |" in markdown
    assert "| unbinned | 4 |" in markdown

    # Rerunning with other bins only rewrites the report: nothing is sampled again.
    bins = {"alpha": {"alpha-0": 7, "alpha-1": "7"}, "beta-2": 9, "alpha-2": 9}
    rebinned = evaluation.evaluate_math(
        None, tokenizer, benchmarks, out_dir=tmp_path, sampler=sampler, bins=bins, **common
    )
    assert sampler.calls == 3
    assert list(rebinned.by_bin) == ["7", "9", "unbinned"]
    mean, _ = _expected([correct["beta-2"], correct["alpha-2"]])
    assert rebinned.mean_at_k(bin_label="9") == pytest.approx(mean, abs=tol)
    assert rebinned.by_bin["7"].num_problems == 2
    assert rebinned.by_bin["unbinned"].num_problems == 6
    assert rebinned.mean_at_k() == pytest.approx(result.mean_at_k(), abs=tol)
    assert rebinned.bin_source == "mapping"


class Interrupt(Exception):
    pass


def test_resume_matches_an_uninterrupted_run(tokenizer, benchmarks, grader, model, tmp_path):
    settings = evaluation.EvalSettings(num_samples=2, max_new_tokens=16, batch_size=4)
    calls = []

    def counting_sampler(*args, **kwargs):
        calls.append(1)
        return sampling.generate(*args, **kwargs)

    common = dict(
        grader=grader,
        settings=settings,
        policy_name="tiny",
        sampler=counting_sampler,
        progress=False,
    )
    whole = evaluation.evaluate_math(model, tokenizer, benchmarks, out_dir=tmp_path / "a", **common)
    assert len(calls) == 3

    def stop_after_first(name, batch):
        raise Interrupt(f"{name}/{batch}")

    calls.clear()
    with pytest.raises(Interrupt):
        evaluation.evaluate_math(
            model,
            tokenizer,
            benchmarks,
            out_dir=tmp_path / "b",
            on_batch_done=stop_after_first,
            **common,
        )
    assert len(calls) == 1
    samples = tmp_path / "b" / "samples.jsonl"
    assert len(samples.read_text().splitlines()) == 4
    with open(samples, "a") as f:  # a torn line, as left by a kill in the middle of a write
        f.write('{"benchmark": "alpha", "id": "alp')
    completions = tmp_path / "b" / "completions.jsonl"
    assert len(completions.read_text().splitlines()) == 4
    with open(completions, "a") as f:  # a kill after a problem's completions, before its samples
        f.write(json.dumps({"benchmark": "alpha", "id": "alpha-4", "completions": []}) + "\n")
        f.write('{"benchmark": "alpha", "id": "alpha-5", "comp')
    calls.clear()
    resumed = evaluation.evaluate_math(
        model, tokenizer, benchmarks, out_dir=tmp_path / "b", **common
    )
    assert len(calls) == 2  # alpha's second batch and beta's; the first is not re-sampled
    assert resumed.timing["problems"] == 6

    def without_timing(path):
        report = json.loads(path.read_text())
        del report["timing"], report["grader"]["restarts_this_run"]
        return report

    assert without_timing(tmp_path / "b" / "report.json") == without_timing(
        tmp_path / "a" / "report.json"
    )

    def records(folder):
        lines = (folder / "samples.jsonl").read_text().splitlines()
        return {r["id"]: r for r in map(json.loads, lines)}

    # Same samples: every problem's completion lengths and verdicts agree, and the same texts.
    assert records(tmp_path / "b") == records(tmp_path / "a")
    assert completions.read_bytes() == (tmp_path / "a" / "completions.jsonl").read_bytes()
    assert len(records(tmp_path / "b")) == 10
    # A random policy solves nothing.
    assert whole.mean_at_k() <= 0.1
    assert whole.problems[0]["n"] == 2

    # Settings that differ from the stored ones raise, naming the setting.
    for change, name in [
        (
            dict(
                settings=evaluation.EvalSettings(
                    num_samples=2, max_new_tokens=16, batch_size=4, temperature=1.0
                )
            ),
            "temperature",
        ),
        (dict(policy_name="another"), "policy"),
    ]:
        kwargs = {**common, **change}
        with pytest.raises(ValueError, match=f"setting '{name}' differs"):
            evaluation.evaluate_math(model, tokenizer, benchmarks, out_dir=tmp_path / "a", **kwargs)
    # So does a finished problem whose prompt changed (another template or suffix).
    changed = {name: data.with_prompts(rows, suffix="Answer:") for name, rows in benchmarks.items()}
    with pytest.raises(ValueError, match="setting 'prompt' differs"):
        evaluation.evaluate_math(model, tokenizer, changed, out_dir=tmp_path / "a", **common)
    assert len(calls) == 2


def test_long_prompts_are_skipped_and_counted_or_raise(tokenizer, benchmarks, grader, tmp_path):
    lengths = {
        row["id"]: len(tokenizer(row["prompt"], add_special_tokens=False)["input_ids"])
        for rows in benchmarks.values()
        for row in rows
    }
    limit = sorted(lengths.values())[len(lengths) // 2]
    too_long = {i for i, n in lengths.items() if n > limit}
    assert 0 < len(too_long) < len(lengths)
    settings = evaluation.EvalSettings(
        num_samples=K, max_new_tokens=48, batch_size=4, max_prompt_tokens=limit
    )
    correct = _correct_counts(benchmarks)
    sampler = KnownSampler(tokenizer, benchmarks, correct)
    common = dict(grader=grader, settings=settings, sampler=sampler, progress=False)
    result = evaluation.evaluate_math(
        None, tokenizer, benchmarks, out_dir=tmp_path / "skip", **common
    )
    assert {i for ids in result.skipped.values() for i in ids} == too_long
    assert {p["id"] for p in result.problems} == set(lengths) - too_long
    kept = [correct[i] for i in lengths if i not in too_long]
    assert result.mean_at_k() == pytest.approx(_expected(kept)[0], abs=1e-12)
    report = json.loads((tmp_path / "skip" / "report.json").read_text())
    skipped_alpha = [i for i in too_long if i.startswith("alpha")]
    assert report["benchmarks"]["alpha"]["skipped_long_prompts"] == len(skipped_alpha)
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        evaluation.evaluate_math(
            None,
            tokenizer,
            benchmarks,
            out_dir=tmp_path / "raise",
            on_long_prompt="raise",
            **common,
        )
    assert not (tmp_path / "raise").exists()  # refused before anything is written


def test_bins_must_be_integers(tokenizer, benchmarks, grader, tmp_path):
    sampler = KnownSampler(tokenizer, benchmarks, _correct_counts(benchmarks))
    with pytest.raises(ValueError, match="alpha-0"):
        evaluation.evaluate_math(
            None,
            tokenizer,
            benchmarks,
            grader=grader,
            out_dir=tmp_path,
            settings=FAKE_SETTINGS,
            bins={"alpha-0": "hard"},
            sampler=sampler,
            progress=False,
        )
    path = tmp_path / "bins.json"
    path.write_text(json.dumps({"alpha-0": 1, "beta": {"beta-0": 2}}))
    assert evaluation.load_bins(path) == {"alpha-0": 1, "beta": {"beta-0": 2}}
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        evaluation.load_bins(path)


def test_completions_hold_each_text_answer_and_verdict(tokenizer, benchmarks, grader, tmp_path):
    correct = _correct_counts(benchmarks)
    sampler = KnownSampler(tokenizer, benchmarks, correct, no_answer={"beta-1"})
    common = dict(grader=grader, settings=FAKE_SETTINGS, sampler=sampler, progress=False)
    evaluation.evaluate_math(None, tokenizer, benchmarks, out_dir=tmp_path, **common)
    lines = (tmp_path / "completions.jsonl").read_text().splitlines()
    saved = {entry["id"]: entry for entry in map(json.loads, lines)}
    rows = [(name, row) for name, rows in benchmarks.items() for row in rows]
    assert list(saved) == [row["id"] for _, row in rows]
    for name, row in rows:
        entry = saved[row["id"]]
        assert entry["benchmark"] == name and entry["prompt"] == row["prompt"]
        assert entry["answer"] == row["answer"]
        assert [c["text"] for c in entry["completions"]] == [
            sampler.completion(row, j) for j in range(K)
        ]
        for j, completion in enumerate(entry["completions"]):
            if j < correct[row["id"]]:
                want = (row["answer"], "correct", 1.0)
            elif row["id"] == "beta-1":
                want = (None, "no_answer", 0.0)
            else:
                want = (WRONG_ANSWER, "wrong", 0.0)
            got = (completion["extracted_answer"], completion["status"], completion["score"])
            assert got == want
            assert completion["truncated"] is False and completion["length"] > 0

    # Off: no file; a fresh start (no finished problem) drops an earlier run's file.
    (tmp_path / "off").mkdir()
    (tmp_path / "off" / "completions.jsonl").write_text(lines[0] + "\n")
    evaluation.evaluate_math(
        None, tokenizer, benchmarks, out_dir=tmp_path / "off", save_completions=False, **common
    )
    assert not (tmp_path / "off" / "completions.jsonl").exists()


def test_a_refused_start_writes_nothing_and_a_rerun_works(tokenizer, benchmarks, grader, tmp_path):
    sampler = KnownSampler(tokenizer, benchmarks, _correct_counts(benchmarks))
    common = dict(grader=grader, settings=FAKE_SETTINGS, sampler=sampler, progress=False)
    out = tmp_path / "eval"
    # The chain task's 18-symbol tokenizer cannot encode math prompts: refused, nothing written.
    with pytest.raises(ValueError, match="alpha problem 'alpha-0': the tokenizer cannot encode"):
        evaluation.evaluate_math(
            None, tasks.hf_tokenizer(), benchmarks, out_dir=out, policy_name="chain", **common
        )
    assert not out.exists()
    result = evaluation.evaluate_math(
        None, tokenizer, benchmarks, out_dir=out, policy_name="math", **common
    )
    assert result.pooled.num_problems == 10

    # A settings.json without samples (a start that failed before its first batch, as earlier
    # versions left it) does not bind the rerun.
    stale = tmp_path / "stale"
    stale.mkdir()
    (stale / "settings.json").write_text(json.dumps({"policy": "another", "temperature": 9}))
    evaluation.evaluate_math(
        None, tokenizer, benchmarks, out_dir=stale, policy_name="math", **common
    )
    assert json.loads((stale / "settings.json").read_text())["policy"] == "math"
    problems = json.loads((stale / "report.json").read_text())["problems"]
    assert problems == json.loads((out / "report.json").read_text())["problems"]
