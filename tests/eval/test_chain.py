"""The chain-task evaluation: the harness with a fake sampler of known per-level odds (exact
levels, a probabilistic level, counts against a direct reference, the table), and a policy's
report on its test split through `evaluate_policy` (per level, pooled, the frontier, the saved
completions, `limit`, and the output-folder checks) with a fake sampler of known verdicts.
"""

import dataclasses
import json
import math

import jax
import numpy as np
import pytest

from gdro_jax import eval as evaluation
from gdro_jax import models, tasks
from tests.eval.fakes import chain_sampler

# ------------------------------------------------------------------------------------------------
# The harness with a fake sampler of known per-level success probabilities.

_LEVEL_ODDS = {1: 1.0, 2: 0.0, 5: 0.3}  # chance that a sample is the gold solution
_PROBLEMS_PER_LEVEL = 24
_NUM_SAMPLES = 8
_odds_sampler = chain_sampler(lambda problem, sample, u: u < _LEVEL_ODDS[problem["level"]])


def _problem_rows():
    rng = np.random.default_rng(0)
    return [
        tasks.make_problem(
            int(rng.integers(10)),
            [tasks.OPERATIONS[i] for i in rng.integers(3, size=level)],
            rng.integers(10, size=level).tolist(),
        )
        for level in _LEVEL_ODDS
        for _ in range(_PROBLEMS_PER_LEVEL)
    ]


@pytest.fixture(scope="module")
def fake_evaluation():
    rows = _problem_rows()
    config = tasks.ChainTaskConfig(num_levels=6, validation_per_level=4, test_per_level=4)
    # 72 problems in batches of 20: the last batch is padded.
    settings = evaluation.EvalSettings.of("chain", seed=3, num_samples=_NUM_SAMPLES, batch_size=20)
    result = evaluation.evaluate_chain(
        None, rows, config, settings, num_resamples=200, sampler=_odds_sampler
    )
    return rows, config, result


def test_harness_deterministic_levels_are_exact(fake_evaluation):
    _, _, result = fake_evaluation
    assert sorted(result.by_level) == sorted(_LEVEL_ODDS)
    np.testing.assert_array_equal(result.by_level[1].pass_at, np.ones(_NUM_SAMPLES))
    assert result.by_level[1].mean == 1.0
    np.testing.assert_array_equal(result.by_level[2].pass_at, np.zeros(_NUM_SAMPLES))
    assert result.by_level[2].mean == 0.0
    assert all(s.num_problems == _PROBLEMS_PER_LEVEL for s in result.by_level.values())


def test_harness_probabilistic_level_matches_its_odds(fake_evaluation):
    _, _, result = fake_evaluation
    odds = _LEVEL_ODDS[5]
    samples = _PROBLEMS_PER_LEVEL * _NUM_SAMPLES
    # Four binomial standard errors of the sample mean.
    tolerance = 4 * math.sqrt(odds * (1 - odds) / samples)
    assert result.by_level[5].mean == pytest.approx(odds, abs=tolerance)
    assert result.pass_at(1, 5) == pytest.approx(odds, abs=tolerance)
    for k in (2, 4, 8):
        assert result.pass_at(k, 5) == pytest.approx(1 - (1 - odds) ** k, abs=0.1)
    # Pooled numbers are the problem-weighted average of the levels (equal sizes here).
    for k in range(1, _NUM_SAMPLES + 1):
        levels = [result.pass_at(k, level) for level in _LEVEL_ODDS]
        assert result.pass_at(k) == pytest.approx(np.mean(levels), abs=1e-12)


def test_harness_counts_match_a_direct_reference(fake_evaluation):
    rows, config, result = fake_evaluation
    arrays = tasks.encode_rows(rows, config)
    key = jax.random.key(3)
    # Each harness batch b holds problems 20b .. 20b+19 (the last one wraps around to problem 0);
    # redo its sampler call and grade with the string reference grader.
    for batch in range(4):
        rows_B = np.arange(20 * batch, 20 * batch + 20) % len(rows)
        out = _odds_sampler(
            None,
            arrays.prompt_tokens[rows_B],
            prompt_lengths=arrays.prompt_lengths[rows_B],
            prompt_of_slot=np.repeat(np.arange(20), _NUM_SAMPLES),
            key=jax.random.fold_in(key, batch),
            max_new_tokens=config.max_solution_length,
            eos_ids=(tasks.EOS_ID,),
        )
        tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
        for i, problem in enumerate(rows_B[: len(rows) - 20 * batch]):
            want = sum(
                tasks.grade_tokens(tokens[r], rows[problem]["solution"], length=lengths[r])
                for r in range(i * _NUM_SAMPLES, (i + 1) * _NUM_SAMPLES)
            )
            assert result.correct[problem] == want
    assert result.correct.shape == (len(rows),)


def test_the_table_lists_every_level_and_pooled(fake_evaluation):
    *_, result = fake_evaluation
    lines = result.to_table().splitlines()
    # No mean@8 column: it is pass@1 to the last digit (`test_mean_at_n_is_pass_at_1`).
    assert lines[0].split() == ["level", "problems", "pass@1", "pass@8"]
    assert [line.split()[0] for line in lines[2:]] == ["1", "2", "5", "pooled"]
    assert lines[2].split()[2:4] == ["1.000", "[1.000,"]
    with pytest.raises(ValueError, match="ks"):
        result.to_table(ks=[9])
    assert result.to_dict()["levels"]["5"]["num_problems"] == _PROBLEMS_PER_LEVEL


# ------------------------------------------------------------------------------------------------
# A policy's report on its test split, with a fake sampler whose verdicts are known per level and
# per problem.

CONFIG = tasks.ChainTaskConfig(num_levels=6, validation_per_level=4, test_per_level=6)
SAMPLING = dict(num_samples=4, batch_size=5)


def _solved(problem: dict, sample: int, u: float = 0.0) -> bool:
    """Levels 1-2 always; level 3 only its first sample (pass@4 = 1 but pass@1 = 1/4); level 4
    when the chain starts with an even digit; levels 5-6 never."""
    level = problem["level"]
    if level == 3:
        return sample == 0
    if level == 4:
        return int(problem["prompt"][0]) % 2 == 0
    return level <= 2


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    """A tiny random chain-task policy's `model/` folder beside its run's `config.json`."""
    run = tmp_path_factory.mktemp("run")
    (run / "config.json").write_text(json.dumps({"task": dataclasses.asdict(CONFIG)}))
    config = models.DecoderConfig.tiny(vocab_size=tasks.VOCAB_SIZE, eos_token_ids=(tasks.EOS_ID,))
    model = models.init_decoder(config, seed=0)
    models.save_pretrained(model, run / "model", tokenizer=tasks.hf_tokenizer())
    return run / "model"


def _run(policy, out, **kwargs):
    return evaluation.evaluate_policy(
        policy, out, sampling=SAMPLING, progress=False, sampler=chain_sampler(_solved), **kwargs
    )


@pytest.fixture(scope="module")
def evaluated(policy, tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "eval"
    return out, _run(policy, out)


def test_levels_pooled_and_frontier_match_the_known_verdicts(evaluated):
    _, report = evaluated
    test = tasks.build_splits(CONFIG).test
    n = SAMPLING["num_samples"]
    want_c = [sum(_solved(row, j) for j in range(n)) for row in test]
    result = report.evaluation
    np.testing.assert_array_equal(result.correct, want_c)
    assert result.pass_at(1, 3) == pytest.approx(0.25, abs=1e-12)
    assert result.pass_at(n, 3) == 1.0
    # Frontier: pass@4 (= n < 8) below 0.95; level 3 is solved at pass@4 although pass@1 is low.
    even = [int(row["prompt"][0]) % 2 == 0 for row in test if row["level"] == 4]
    assert 0 < sum(even) < len(even), "the fixed split must mix level-4 verdicts"
    assert result.frontier_k == n
    assert result.frontier_levels() == [4, 5, 6]
    frontier_c = [c for c, row in zip(want_c, test, strict=True) if row["level"] >= 4]
    assert result.frontier().num_problems == len(frontier_c)
    assert result.frontier().pass_at[n - 1] == pytest.approx(np.mean(frontier_c) / n, abs=1e-12)
    assert result.frontier_levels(k=1) == [3, 4, 5, 6]


def test_reports_and_completions_are_written(policy, evaluated):
    out, report = evaluated
    saved = json.loads((out / "report.json").read_text())
    environment = saved.pop("environment")  # the machine that made it (tests/runtime)
    assert environment["packages"]["jax"] == jax.__version__
    assert saved == json.loads(json.dumps(report.to_dict()))
    assert saved["frontier"]["levels"] == [4, 5, 6] and saved["frontier"]["threshold"] == 0.95
    assert saved["settings"]["policy"] == str(policy) and saved["settings"]["step"] is None
    assert saved["settings"]["task"]["test_per_level"] == 6
    assert saved["levels"]["1"]["pass@k"]["1"] == 1.0
    markdown = (out / "report.md").read_text()
    assert f"# Chain-task evaluation: {policy}\n" in markdown
    assert "| level | problems | pass@1 | pass@4 |" in markdown
    assert "| frontier | 18 |" in markdown and "(pass@4 < 0.95): 4, 5, 6." in markdown
    at_step = dataclasses.replace(report, settings={**report.settings, "step": 7})
    assert f"# Chain-task evaluation: {policy} (checkpoint step 7)\n" in at_step.to_markdown()
    test = tasks.build_splits(CONFIG).test
    lines = (out / "completions.jsonl").read_text().splitlines()
    assert len(lines) == len(test)
    for line, row in zip(lines, test, strict=True):
        entry = json.loads(line)
        assert (entry["id"], entry["level"], entry["solution"]) == (
            row["id"],
            row["level"],
            row["solution"],
        )
        verdicts = [c["correct"] for c in entry["completions"]]
        assert verdicts == [_solved(row, j) for j in range(SAMPLING["num_samples"])]
        for completion in entry["completions"]:
            assert completion["text"].endswith(tasks.EOS_TOKEN)
            assert tasks.grade_text(completion["text"], row["solution"]) == completion["correct"]


def test_limit_keeps_the_first_problems_of_each_level(policy, tmp_path):
    report = _run(policy, tmp_path / "eval", limit=2, save_completions=False)
    test = tasks.build_splits(CONFIG).test
    kept = [row for level in range(1, 7) for row in [r for r in test if r["level"] == level][:2]]
    assert report.problem_ids == [row["id"] for row in kept]
    assert report.evaluation.pooled.num_problems == 12
    assert not (tmp_path / "eval" / "completions.jsonl").exists()


def test_a_math_evaluation_folder_or_a_file_is_refused_untouched(policy, tmp_path):
    (tmp_path / "samples.jsonl").write_text("{}\n")
    with pytest.raises(ValueError, match="holds a math evaluation"):
        _run(policy, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["samples.jsonl"]
    with pytest.raises(ValueError, match="out_dir must be a folder"):
        _run(policy, tmp_path / "samples.jsonl")


def test_an_out_dir_that_cannot_be_written_is_refused_before_sampling(policy, tmp_path):
    """A folder under a file (no folder can be made there, whoever runs the test): the error
    names out_dir before the sampler is ever called, so no sampled work is lost. Planted: the
    library's writability check removed (the sampler ran, then NotADirectoryError)."""
    (tmp_path / "notes.txt").write_text("mine\n")
    calls = []
    sampler = chain_sampler(_solved)

    def counting_sampler(*args, **kwargs):
        calls.append(1)
        return sampler(*args, **kwargs)

    out = tmp_path / "notes.txt" / "eval"
    with pytest.raises(ValueError, match=r"out_dir=.*notes\.txt is a file"):
        evaluation.evaluate_policy(
            policy, out, sampling=SAMPLING, progress=False, sampler=counting_sampler
        )
    assert calls == [] and (tmp_path / "notes.txt").read_text() == "mine\n"
