"""The miniature study end to end on tiny settings: warm start, two methods, table, plots."""

import json

import jax
import numpy as np
import pytest

from experiments.configs import demo
from gdro_jax import eval as eval_lib
from tests.study import _study_config


@pytest.mark.slow
def test_demo_writes_the_table_plots_and_results(tmp_path, capsys):
    from gdro_jax.study import run_demo

    config = demo.get_config()
    config.methods = "grpo,gdro_both"
    config.progress = False
    _study_config.shrink(config)  # the tiny study's warm start, task, policy and evaluation
    config.train.tensorboard = False

    out = run_demo(config, tmp_path)

    assert list(out["results"]) == ["warm_start", "grpo", "gdro_both"]
    for name in ("table.txt", "results.json", "reward.png", "pass_at_2.png", "curriculum.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    table = (tmp_path / "table.txt").read_text()
    assert max(len(line) for line in table.splitlines()) <= 100  # one table per metric
    pass1, pass2 = table.split("\n\n")
    assert pass1.splitlines()[0].split() == ["pass@1", "warm_start", "grpo", "gdro_both"]
    assert pass2.splitlines()[0].split() == ["pass@2", "warm_start", "grpo", "gdro_both"]
    for part in (pass1, pass2):
        names = [line.split()[0] for line in part.splitlines()[1:] if line.strip()]
        assert names[:8] == [*(f"L{level}" for level in range(1, 7)), "pooled", "frontier"]
    results = json.loads((tmp_path / "results.json").read_text())
    # The frontier row pools the levels where the warm start's validation pass@2 is under 0.95.
    warm = json.loads((tmp_path / "warm_start" / "frontier.json").read_text())["evaluation"]
    frontier = [int(lv) for lv, s in warm["levels"].items() if s["pass@k"]["2"] < 0.95]
    assert results["frontier_levels"] == frontier and frontier
    shown = ", ".join(f"L{level}" for level in frontier)
    assert f"frontier: {shown} (the warm start's validation pass@2 below 0.95)" in table
    for method in ("warm_start", "grpo", "gdro_both"):
        evaluation = results["results"][method]
        on_frontier = [
            c for c, lv in zip(evaluation["correct"], evaluation["problem_levels"], strict=True)
            if lv in frontier
        ]  # fmt: skip
        # pass@2 of a problem with c of 2 samples right: 1 if c > 0 (by hand, not the estimator).
        expected = np.mean([c > 0 for c in on_frontier])
        row = next(line for line in pass2.splitlines() if line.startswith("frontier "))
        column = list(out["results"]).index(method) + 1  # the pass@2 table, one column a method
        value, half = (float(x) for x in row.split()[column].split("±"))
        assert value == pytest.approx(expected, abs=5e-4), method
        assert 0 <= half <= 1, method
    assert set(results["results"]) == {"warm_start", "grpo", "gdro_both"}
    assert results["sampled_tokens"]["grpo"] > 0
    for method in ("grpo", "gdro_both"):
        rows = (tmp_path / method / "metrics.jsonl").read_text().splitlines()
        assert len(rows) == 3
        assert (tmp_path / method / "eval.json").exists()
    printed = capsys.readouterr().out
    assert printed.startswith("demo: the warm start (20 supervised steps); RL runs of 3 steps")
    assert "held-out test split" in printed
    assert "sampled tokens during RL: grpo " in printed and "{" not in printed
    assert results["environment"]["packages"]["jax"] == jax.__version__
    assert results["eval"]["seed"] == eval_lib.EvalSettings.of("chain").seed

    # experiments.evaluate on a run's folder (its checkpoint) with the demo's settings: the
    # demo's counts, from the real sampler.
    report = eval_lib.evaluate_policy(
        tmp_path / "grpo", tmp_path / "grpo_eval", progress=False,
        sampling={name: config.eval[name] for name in eval_lib.CHAIN_FIELDS},
    )  # fmt: skip
    assert report.evaluation.correct.tolist() == results["results"]["grpo"]["correct"]

    # A rerun trains nothing and evaluates nothing: every policy and setting is unchanged.
    stored = {m: (tmp_path / m / "eval.json").read_bytes() for m in ("grpo", "gdro_both")}
    again = run_demo(config, tmp_path)
    assert again["reused"] == ["warm_start", "grpo", "gdro_both"]
    assert again["table"] == out["table"]
    assert {m: (tmp_path / m / "eval.json").read_bytes() for m in stored} == stored
    assert "evaluations reused (policy and settings unchanged)" in capsys.readouterr().out
