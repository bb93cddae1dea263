"""The chain-task report of a policy on its test split: per level, pooled, the frontier levels and
their pooled row, the saved completions, `limit`, and the output-folder checks; with a fake
sampler whose verdicts are known per level and per problem.
"""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from gdro_jax import eval as evaluation
from gdro_jax import sampling, tasks

CONFIG = tasks.ChainTaskConfig(num_levels=6, validation_per_level=4, test_per_level=6)
SETTINGS = evaluation.TaskEvalSettings(num_samples=4, batch_size=5)


def _solved(problem: dict, sample: int) -> bool:
    """Levels 1-2 always; level 3 only its first sample (pass@4 = 1 but pass@1 = 1/4); level 4
    when the chain starts with an even digit; levels 5-6 never."""
    level = problem["level"]
    if level == 3:
        return sample == 0
    if level == 4:
        return int(problem["prompt"][0]) % 2 == 0
    return level <= 2


def _fake_sampler(model, prompt_tokens, *, prompt_lengths, prompt_of_slot, max_new_tokens, **_):
    """Each slot's gold solution when `_solved`, else the gold with a wrong first token."""
    del model
    problems = []
    for tokens, length in zip(np.asarray(prompt_tokens), np.asarray(prompt_lengths), strict=True):
        chain = tasks.decode(tokens[:length])
        pairs = chain[1:-1]
        problems.append(
            tasks.make_problem(int(chain[0]), list(pairs[::2]), [int(d) for d in pairs[1::2]])
        )
    slots = np.asarray(prompt_of_slot)
    gold_RM, lengths_R = tasks.encode_solutions(
        [problems[i]["solution"] for i in slots], max_new_tokens
    )
    samples = SETTINGS.num_samples
    for r, i in enumerate(slots):
        if not _solved(problems[i], r % samples):
            gold_RM[r, 0] = tasks.VOCAB.index("*")
    return sampling.GenerationResult(
        tokens=jnp.asarray(gold_RM),
        logprobs=jnp.zeros(gold_RM.shape),
        lengths=jnp.asarray(lengths_R),
        finish_reasons=jnp.ones(len(slots), jnp.int32),
        prompt_tokens=jnp.asarray(prompt_tokens)[slots],
        prompt_lengths=jnp.asarray(prompt_lengths)[slots],
    )


def _run(out, **kwargs):
    return evaluation.evaluate_task_policy(
        None,
        CONFIG,
        out,
        settings=SETTINGS,
        policy_name="fake",
        progress=False,
        sampler=_fake_sampler,
        **kwargs,
    )


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "eval"
    return out, _run(out, step=7)


def test_levels_pooled_and_frontier_match_the_known_verdicts(evaluated):
    _, report = evaluated
    test = tasks.build_splits(CONFIG).test
    n = SETTINGS.num_samples
    want_c = [sum(_solved(row, j) for j in range(n)) for row in test]
    np.testing.assert_array_equal(report.evaluation.correct, want_c)
    assert report.pass_at(1, 3) == pytest.approx(0.25, abs=1e-12)
    assert report.pass_at(n, 3) == 1.0
    # Frontier: pass@4 (= n < 8) below 0.95; level 3 is solved at pass@4 although pass@1 is low.
    even = [int(row["prompt"][0]) % 2 == 0 for row in test if row["level"] == 4]
    assert 0 < sum(even) < len(even), "the fixed split must mix level-4 verdicts"
    assert report.frontier_k == n
    assert report.frontier_levels == [4, 5, 6]
    frontier_c = [c for c, row in zip(want_c, test, strict=True) if row["level"] >= 4]
    assert report.frontier.num_problems == len(frontier_c)
    assert report.frontier.pass_at[n - 1] == pytest.approx(np.mean(frontier_c) / n, abs=1e-12)
    assert evaluation.frontier_levels(report.evaluation, k=1) == [3, 4, 5, 6]


def test_reports_and_completions_are_written(evaluated):
    out, report = evaluated
    saved = json.loads((out / "report.json").read_text())
    assert saved == json.loads(json.dumps(report.to_dict()))
    assert saved["frontier"]["levels"] == [4, 5, 6] and saved["frontier"]["threshold"] == 0.95
    assert saved["settings"]["step"] == 7 and saved["settings"]["task"]["test_per_level"] == 6
    assert saved["levels"]["1"]["pass@k"]["1"] == 1.0
    markdown = (out / "report.md").read_text()
    assert "# Chain-task evaluation: fake (checkpoint step 7)" in markdown
    assert "| level | problems | mean@4 | pass@1 | pass@4 |" in markdown
    assert "| frontier | 18 |" in markdown and "(pass@4 < 0.95): 4, 5, 6." in markdown
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
        assert verdicts == [_solved(row, j) for j in range(SETTINGS.num_samples)]
        for completion in entry["completions"]:
            assert completion["text"].endswith(tasks.EOS_TOKEN)
            assert tasks.grade_text(completion["text"], row["solution"]) == completion["correct"]


def test_limit_keeps_the_first_problems_of_each_level(tmp_path):
    report = _run(tmp_path / "eval", limit=2, save_completions=False)
    test = tasks.build_splits(CONFIG).test
    kept = [row for level in range(1, 7) for row in [r for r in test if r["level"] == level][:2]]
    assert report.problem_ids == [row["id"] for row in kept]
    assert report.evaluation.pooled.num_problems == 12
    assert not (tmp_path / "eval" / "completions.jsonl").exists()


def test_a_math_evaluation_folder_or_a_file_is_refused_untouched(tmp_path):
    (tmp_path / "samples.jsonl").write_text("{}\n")
    with pytest.raises(ValueError, match="holds a math evaluation"):
        _run(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["samples.jsonl"]
    with pytest.raises(ValueError, match="out_dir must be a folder"):
        _run(tmp_path / "samples.jsonl")


@pytest.mark.parametrize(
    "field, value", [("num_samples", 0), ("temperature", -1.0), ("top_p", 0.0), ("seed", -1)]
)
def test_settings_validation_names_the_parameter(field, value):
    with pytest.raises(ValueError, match=field):
        evaluation.TaskEvalSettings(**{field: value})
