"""The demo's held-out evaluation: the same table as `experiments.evaluate` by default, kept while
the policy and settings are unchanged, printed with its intervals; the demo's console lines."""

import json

import jax
import numpy as np
import pytest
from flax import nnx

from experiments.configs import demo
from gdro_jax import eval as evaluation
from gdro_jax import models, study, tasks
from tests.eval.fakes import chain_sampler


def _coin(problem: dict, sample: int, u: float) -> bool:
    """Right on a fair coin of the call's key: the verdicts follow the sampling key (the seed)."""
    del problem, sample
    return u < 0.5


def _recording(calls: list):
    """The fake sampler, recording each call's key and sampling settings."""
    sample = chain_sampler(_coin)

    def sampler(*args, **kwargs):
        settings = {name: kwargs[name] for name in ("temperature", "top_p", "top_k")}
        calls.append((np.asarray(jax.random.key_data(kwargs["key"])).tolist(), settings))
        return sample(*args, **kwargs)

    return sampler


@pytest.fixture(scope="module")
def demo_config():
    config = demo.get_config()
    config.train.task.test_per_level = 3  # 24 problems: one sampler call
    return config


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory, demo_config):
    """A finished demo run's folder as `experiments.evaluate` reads it: its config, `model/`."""
    folder = tmp_path_factory.mktemp("grpo")
    (folder / "config.json").write_text(demo_config.train.to_json_best_effort(indent=2))
    config = models.DecoderConfig.tiny(vocab_size=tasks.VOCAB_SIZE, eos_token_ids=(tasks.EOS_ID,))
    policy = models.init_decoder(config, seed=0)
    models.save_pretrained(policy, folder / "model", tokenizer=tasks.hf_tokenizer())
    return folder


def test_the_demo_and_experiments_evaluate_give_one_table_by_default(
    demo_config, run_folder, tmp_path
):
    """The same policy, the demo's evaluation and `evaluate_policy` with no sampling setting:
    the same sampling keys and settings reach the sampler, so the same counts and tables come
    out. Planted: the demo's `eval.seed=1` of before (the keys, then the counts, differ)."""
    policy = models.from_pretrained(run_folder / "model")
    demo_calls, evaluate_calls = [], []
    shown = study.demo_evaluation(policy, demo_config, sampler=_recording(demo_calls))
    report = evaluation.evaluate_policy(
        run_folder, tmp_path / "eval", progress=False, sampler=_recording(evaluate_calls)
    )
    assert demo_calls == evaluate_calls and demo_calls
    np.testing.assert_array_equal(shown.correct, report.evaluation.correct)
    assert 0 < shown.correct.sum() < shown.correct.size * shown.num_samples  # a coin, not 0 or n
    assert shown.to_table() == report.evaluation.to_table()
    assert (
        report.settings["seed"] == demo_config.eval.seed == evaluation.EvalSettings.of("chain").seed
    )


def test_an_evaluation_is_reused_only_for_the_same_policy_and_settings(demo_config, tmp_path):
    config = models.DecoderConfig.tiny(vocab_size=tasks.VOCAB_SIZE, eos_token_ids=(tasks.EOS_ID,))
    policy = models.init_decoder(config, seed=0)
    calls = []
    sampler = _recording(calls)

    def cached(policy, settings=demo_config):
        return study.cached_evaluation(
            policy, settings, tmp_path, label="eval grpo", sampler=sampler
        )

    first, reused = cached(policy)
    assert not reused and len(calls) == 1
    stored = json.loads((tmp_path / "eval.json").read_text())
    assert stored["environment"]["packages"]["jax"] == jax.__version__
    again, reused = cached(policy)
    assert reused and len(calls) == 1  # read back: the sampler is not called
    np.testing.assert_array_equal(again.correct, first.correct)
    for level, summary in first.by_level.items():  # the summaries rebuilt from the counts
        np.testing.assert_array_equal(again.by_level[level].pass_interval, summary.pass_interval)
    np.testing.assert_array_equal(again.pooled.pass_at, first.pooled.pass_at)
    # One parameter changed by one float32 step: another policy, evaluated again.
    state = nnx.state(policy)
    leaves, treedef = jax.tree.flatten(state)
    leaves[0] = leaves[0].at[(0,) * leaves[0].ndim].set(np.nextafter(leaves[0].ravel()[0], 1))
    nnx.update(policy, jax.tree.unflatten(treedef, leaves))
    _, reused = cached(policy)
    assert not reused and len(calls) == 2
    # Another sampling seed: evaluated again.
    other = demo_config.copy_and_resolve_references()
    other.eval.seed = 3
    _, reused = cached(policy, other)
    assert not reused and len(calls) == 3


def _fabricated(correct, levels, n=4):
    correct, levels = np.asarray(correct), np.asarray(levels)
    by_level, pooled = evaluation.summarize_counts(correct, n, levels)
    return evaluation.ChainEvaluation(n, by_level, pooled, correct, levels)


def test_the_comparison_prints_each_cell_with_half_its_interval():
    levels = [1, 1, 1, 2, 2, 2]
    results = {
        "warm_start": _fabricated([4, 4, 4, 1, 0, 2], levels),  # level 1: no spread at all
        "grpo": _fabricated([4, 3, 4, 0, 0, 4], levels),
    }
    table = study.format_comparison(results, ks=(1, 4), frontier_levels=[2], frontier_k=4)
    rows = {line.split()[0]: line.split()[1:] for line in table.split("\n\n")[0].splitlines()}
    assert rows["L1"][0] == "1.000±0.000"  # every problem 4 of 4: the interval is a point
    # By hand: grpo's level-2 pass@1 is (0 + 0 + 1) / 3; its cell's half-width is the larger
    # distance from it to the ends of the stored bootstrap interval.
    low, high = results["grpo"].by_level[2].pass_interval[0]
    half = max(1 / 3 - low, high - 1 / 3)
    assert rows["L2"][1] == f"{1 / 3:.3f}±{half:.3f}"
    # The frontier (level 2 alone) is level 2's row.
    assert rows["frontier"] == rows["L2"]
    assert "within noise" in table and "frontier: L2" in table


def test_the_opening_line_says_what_runs_and_skips_what_is_done(demo_config, tmp_path):
    line = study.plan_line(demo_config, tmp_path, ["grpo", "gdro_both"])
    assert line.startswith("demo: the warm start (240 supervised steps)")
    assert "for grpo, gdro_both" in line and "(24 problems x 8 samples)" in line
    # At PACE: 240 x 3.35 s + 2 x (32 s + 30 x 1.2 s) + 3 policies x 24 x 8 samples x 3.2 ms.
    minutes = (240 * 3.35 + 2 * (32 + 30 * 1.2) + 3 * 24 * 8 * 0.0032) / 60
    assert f"About {round(minutes)} min at the pace measured on a shared 2-core CPU" in line
    (tmp_path / "grpo").mkdir()
    (tmp_path / "grpo" / "summary.json").write_text(json.dumps({"completed_steps": 30}))
    assert "for gdro_both;" in study.plan_line(demo_config, tmp_path, ["grpo", "gdro_both"])
    counts = {"grpo": 63740.0, "gdro_both": 70012.4}
    assert study.format_counts(counts) == "grpo 63,740, gdro_both 70,012"
