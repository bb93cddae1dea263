"""The comparison study (`experiments/compare.py`).

- End to end on tiny settings (`_study_config.py`: 2 arms x 2 seeds x 3 steps): every run is
  trained and evaluated, the results are written, a second pass reruns nothing, and one run
  deleted and rerun alone in a subprocess with the `--config.only` command reproduces its
  metrics rows and final parameters bit for bit (the tiny policy scores 0 held out, so its
  figures cannot show that).
- `collect`'s arithmetic on fabricated evaluation files: the frontier levels, per-seed figures
  and the primary paired gain, against values computed here by hand.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import ml_collections
import numpy as np
import pytest
import safetensors.numpy

from experiments.configs import ablations
from experiments.configs import study as study_configs
from gdro_jax import configs, study
from tests.study import _study_config
from tests.test_notebooks import execute_notebook

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README_BLOCK = "# Results\n\nProse above.\n\n{begin}\nold numbers\n{end}\n\nProse below.\n"


def _rows(folder):
    with open(folder / "metrics.jsonl", encoding="utf-8") as file:
        rows = [json.loads(line) for line in file]
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    base = tmp_path_factory.mktemp("study")
    workdir, results = base / "runs", base / "results"
    results_md = base / "RESULTS.md"
    results_md.write_text(README_BLOCK.format(begin=study.RESULTS_BEGIN, end=study.RESULTS_END))
    config = _study_config.get_config()
    study.prepare_warm_start(config, workdir)
    todo = study.pending(config, workdir)
    for spec in todo:
        study.run_one(config, workdir, spec)
    summary = study.write_results(config, workdir, results, results_md)
    return dict(
        config=config,
        workdir=workdir,
        results=results,
        results_md=results_md,
        todo=todo,
        summary=summary,
    )


@pytest.mark.slow
def test_every_run_is_trained_and_evaluated_seed_major(finished):
    assert [spec.name for spec in finished["todo"]] == [
        "grpo/seed_0",
        "gdro_both/seed_0",
        "grpo/seed_1",
        "gdro_both/seed_1",
    ]
    for spec in finished["todo"]:
        folder = finished["workdir"] / spec.arm / f"seed_{spec.seed}"
        assert [row["step"] for row in _rows(folder)] == [1, 2, 3]
        config = json.loads((folder / "config.json").read_text())
        assert (config["method"], config["seed"]) == (spec.arm, spec.seed)
        assert config["init_from"] == str(finished["workdir"] / "warm_start" / "model")
        record = json.loads((folder / "eval_test.json").read_text())
        assert record["evaluation"]["num_samples"] == 2
        assert len(record["evaluation"]["correct"]) == 6 * 3  # 6 levels x 3 test problems
        tokens = sum(row["tokens"] for row in _rows(folder))
        assert record["sampled_tokens"] == tokens > 0
        # Along the run: after steps 1 and 2 (the snapshots) and 3 (the final policy), at equal
        # sampled rollouts (R = 4 prompts x 4 a step) and the tokens sampled up to each point.
        along = record["along"]
        assert [p["step"] for p in along] == [1, 2, 3]
        assert [p["sampled_rollouts"] for p in along] == [16, 32, 48]
        rows = _rows(folder)
        for point in along:
            assert point["sampled_tokens"] == sum(r["tokens"] for r in rows[: point["step"]])
            assert len(point["evaluation"]["correct"]) == 6 * 3
        assert along[-1]["evaluation"] == record["evaluation"]
        assert sorted(os.listdir(folder / "snapshots")) == ["step_1", "step_2"]


@pytest.mark.slow
def test_the_results_are_written_and_the_markdown_block_replaced(finished):
    results, summary = finished["results"], finished["summary"]
    assert json.loads((results / "study.json").read_text()) == json.loads(json.dumps(summary))
    for name in (*study.FIGURES, study.ALONG_FIGURE):  # the tiny runs are evaluated along
        assert (results / name).stat().st_size > 0, name
    assert "Along the runs" in (results / "tables.md").read_text()
    tables = (results / "tables.md").read_text()
    text = finished["results_md"].read_text()
    assert text.startswith("# Results\n\nProse above.\n\n")
    assert text.endswith("\n\nProse below.\n")
    assert "old numbers" not in text and tables.strip() in text
    assert "| grpo (frontier pass@2) |" in tables
    assert summary["arms"] == ["grpo", "gdro_both"] and summary["seeds"] == [0, 1]


@pytest.mark.slow
def test_the_curriculum_notebook_draws_the_tiny_study(finished, monkeypatch):
    monkeypatch.setenv("GDRO_STUDY", str(finished["workdir"]))
    monkeypatch.setenv("GDRO_STUDY_RESULTS", str(finished["results"]))
    execute_notebook(pathlib.Path(ROOT) / "notebooks" / "curriculum.py")


@pytest.mark.slow
def test_a_second_pass_finds_nothing_to_run_and_a_changed_eval_everything(finished):
    config = finished["config"]
    assert study.pending(config, finished["workdir"]) == []
    changed = _study_config.get_config()
    changed.eval.seed = 7
    assert len(study.pending(changed, finished["workdir"])) == 4
    with pytest.raises(ValueError, match="4 runs were evaluated under another config"):
        study.collect(changed, finished["workdir"])
    retrained = _study_config.get_config()
    retrained.pretrain.train.steps = 21
    with pytest.raises(ValueError, match="its warm start was trained from another pretrain"):
        study.prepare_warm_start(retrained, finished["workdir"])


@pytest.mark.slow
def test_one_run_rerun_alone_reproduces_it_bit_for_bit(finished, tmp_path):
    workdir = finished["workdir"]
    folder = workdir / "grpo" / "seed_1"
    kept = tmp_path / "kept"
    shutil.copytree(folder, kept)
    shutil.rmtree(folder)
    command = [
        sys.executable,
        "-m",
        "experiments.compare",
        "--config=tests/study/_study_config.py",
        f"--workdir={workdir}",
        "--config.only=grpo/seed_1",
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _rows(folder) == _rows(kept)
    params = safetensors.numpy.load_file(str(folder / "model" / "model.safetensors"))
    expected = safetensors.numpy.load_file(str(kept / "model" / "model.safetensors"))
    assert sorted(params) == sorted(expected)
    for name, value in expected.items():
        assert np.array_equal(params[name], value), name
    record = json.loads((folder / "eval_test.json").read_text())
    assert record["evaluation"] == json.loads((kept / "eval_test.json").read_text())["evaluation"]
    assert done.stdout.strip().splitlines()[-1].startswith("grpo/seed_1: frontier pass@2 ")


def test_an_unknown_arm_field_is_named():
    config = _study_config.get_config()
    config.arms.grpo = "method=grpo grpo.loss_sginal=surrogate"
    with pytest.raises(ValueError, match=r"arms\.grpo: unknown field 'grpo\.loss_sginal'"):
        study.run_config(config, study.RunSpec("grpo", 0), "warm")
    config.run = "grpo,nope"
    with pytest.raises(ValueError, match=r"run: unknown arms \['nope'\]"):
        study.run_specs(config)


# --- collect() on fabricated files -------------------------------------------------------------

LEVELS = np.array([1, 1, 2, 2, 3, 3])
# Correct samples of 4 per problem, per arm and seed (levels 2 and 3 are the frontier).
CORRECT = {
    ("grpo", 0): [4, 4, 3, 0, 1, 0],
    ("grpo", 1): [4, 3, 2, 1, 0, 0],
    ("gdro_both", 0): [4, 4, 4, 1, 1, 1],
    ("gdro_both", 1): [4, 2, 2, 2, 0, 1],
}


def _write_eval(folder, correct, tokens, levels=LEVELS):
    folder.mkdir(parents=True, exist_ok=True)
    evaluation = {"num_samples": 4, "correct": correct, "problem_levels": [int(x) for x in levels]}
    record = {"stamp": "x", "sampled_tokens": tokens, "evaluation": evaluation}
    (folder / "eval_test.json").write_text(json.dumps(record))


def _fabricated_study(tmp_path, levels=LEVELS):
    config = _study_config.get_config()
    config.eval.num_samples = 4
    config.primary.update(metric="pass@2", num_resamples=500)
    # The warm start's validation pass@2 per level: levels 2 and 3 are under 0.95.
    warm = {str(lv): {"pass@k": {"2": p}} for lv, p in ((1, 1.0), (2, 0.9), (3, 0.2))}
    (tmp_path / "warm_start").mkdir()
    frontier_file = {"evaluation": {"num_samples": 2, "levels": warm}}
    (tmp_path / "warm_start" / "frontier.json").write_text(json.dumps(frontier_file))
    _write_eval(tmp_path / "warm_start", [4, 4, 1, 0, 0, 0], 0.0, levels)
    for (arm, seed), correct in CORRECT.items():
        tokens = 100.0 * (1 + (arm == "gdro_both"))
        _write_eval(tmp_path / arm / f"seed_{seed}", correct, tokens, levels)
    return config


def test_collect_on_fabricated_evaluations_equals_the_hand_computation(tmp_path):
    config = _fabricated_study(tmp_path)

    with pytest.raises(ValueError, match="4 runs were evaluated under another config"):
        study.collect(config, tmp_path)  # the files carry no real stamp
    summary = study.collect(config, tmp_path, check_stamps=False)

    assert summary["frontier_levels"] == [2, 3]

    # pass@2 of a problem with c of 4 right: 1 - C(4-c, 2) / C(4, 2), by hand.
    def pass2(c):
        return 1 - {0: 6, 1: 3, 2: 1, 3: 0, 4: 0}[c] / 6

    frontier = {key: [pass2(c) for c in correct[2:]] for key, correct in CORRECT.items()}
    assert summary["per_seed"]["grpo"]["0"]["frontier pass@2"] == pytest.approx(
        np.mean([1, 0, 0.5, 0])
    )
    base = np.mean([frontier[("grpo", s)] for s in (0, 1)])
    method = np.mean([frontier[("gdro_both", s)] for s in (0, 1)])
    primary = summary["primary"]["gdro_both"]
    assert primary["gain"] == pytest.approx(method / base - 1, abs=1e-12)
    per_seed = [
        np.mean(frontier[("gdro_both", s)]) / np.mean(frontier[("grpo", s)]) - 1 for s in (0, 1)
    ]
    assert primary["per_seed"] == pytest.approx(per_seed)
    assert primary["low"] <= primary["gain"] <= primary["high"]
    assert primary["detectable_gain"] == pytest.approx(2.8016 * primary["standard_error"], rel=1e-4)
    assert summary["token_ratio"] == {"grpo": 1.0, "gdro_both": 2.0}
    assert summary["problems"] == {"total": 6, "frontier": 4}
    # A secondary figure: pooled pass@1, the fraction of samples right, by hand.
    pooled = summary["secondary"]["gdro_both"]["pooled pass@1"]
    method = np.mean([CORRECT[("gdro_both", s)] for s in (0, 1)]) / 4
    base = np.mean([CORRECT[("grpo", s)] for s in (0, 1)]) / 4
    assert pooled["gain"] == pytest.approx(method / base - 1)


def test_the_figures_along_the_runs_and_the_rollouts_to_the_baselines_final(tmp_path):
    """Evaluations after 16, 32 and 48 sampled rollouts: each arm's mean frontier pass@1 over
    seeds (levels 2 and 3: the last four problems, 4 samples each), by hand."""
    config = _fabricated_study(tmp_path)
    along = {  # correct samples of the 6 problems at each point; the last is the final one
        ("grpo", 0): [[4, 4, 0, 0, 1, 0], [4, 4, 1, 0, 2, 0], CORRECT[("grpo", 0)]],
        ("grpo", 1): [[4, 3, 0, 0, 0, 0], [4, 3, 1, 1, 0, 0], CORRECT[("grpo", 1)]],
        ("gdro_both", 0): [[4, 4, 2, 1, 1, 1], [4, 4, 4, 1, 1, 1], CORRECT[("gdro_both", 0)]],
        ("gdro_both", 1): [[4, 2, 1, 0, 0, 0], [4, 2, 2, 2, 0, 1], CORRECT[("gdro_both", 1)]],
    }
    for (arm, seed), points in along.items():
        path = tmp_path / arm / f"seed_{seed}" / "eval_test.json"
        record = json.loads(path.read_text())
        record["along"] = [
            {"step": 1 + i, "sampled_rollouts": 16 * (1 + i), "sampled_tokens": 0.0,
             "evaluation": {**record["evaluation"], "correct": correct}}
            for i, correct in enumerate(points)
        ]  # fmt: skip
        path.write_text(json.dumps(record))
    summary = study.collect(config, tmp_path, check_stamps=False)
    curves = summary["along"]["arms"]
    assert summary["along"]["sampled_rollouts"] == [16, 32, 48]

    def frontier_mean(arm, i):
        return np.mean([np.sum(along[(arm, s)][i][2:]) / 16 for s in (0, 1)])

    for arm in ("grpo", "gdro_both"):
        want = [frontier_mean(arm, i) for i in range(3)]
        assert curves[arm]["frontier pass@1"] == pytest.approx(want)
    # GRPO's final frontier pass@1 is (3 + 4) / 32; gdro_both has 6 / 32 after 16 rollouts.
    assert frontier_mean("grpo", 2) == pytest.approx(7 / 32)
    assert curves["gdro_both"]["rollouts_to_baseline_final"] == 32
    assert curves["grpo"]["rollouts_to_baseline_final"] == 48
    assert curves["grpo"]["pooled pass@1"][-1] == pytest.approx(
        summary["mean"]["grpo"]["pooled pass@1"]
    )


def test_levels_count_equally_whatever_their_problem_counts(tmp_path):
    """Pooled figures are means of per-level means (with 2 problems on level 1, 3 on level 2
    and 1 on level 3, a level-3 problem weighs three times a level-2 one); frontier figures,
    the primary metric's, stay means over the frontier's problems, as declared."""
    levels = [1, 1, 2, 2, 2, 3]
    config = _fabricated_study(tmp_path, levels)
    summary = study.collect(config, tmp_path, check_stamps=False)

    def by_levels(values, chosen):
        values, at = np.asarray(values, float), np.asarray(levels)
        return np.mean([values[at == level].mean() for level in chosen])

    def pass2(c):
        return 1 - {0: 6, 1: 3, 2: 1, 3: 0, 4: 0}[c] / 6

    figures = summary["per_seed"]["gdro_both"]["1"]
    correct = CORRECT[("gdro_both", 1)]  # [4, 2, 2, 2, 0, 1]
    assert figures["pooled pass@1"] == pytest.approx((0.75 + 1 / 3 + 0.25) / 3)
    # Level 2: 2, 2, 0 of 4 right -> pass@2 5/6, 5/6, 0; level 3: 1 right -> 1/2.
    assert figures["frontier pass@2"] == pytest.approx((5 / 6 + 5 / 6 + 0 + pass2(1)) / 4)
    assert figures["L2 pass@1"] == pytest.approx(1 / 3)

    def mean_over_seeds(arm, metric, chosen):
        return np.mean([by_levels(metric(CORRECT[(arm, s)]), chosen) for s in (0, 1)])

    def fraction(correct):
        return [c / 4 for c in correct]

    def pass2_all(correct):
        return [pass2(c) for c in correct]

    pooled = summary["secondary"]["gdro_both"]["pooled pass@1"]["gain"]
    expected = mean_over_seeds("gdro_both", fraction, (1, 2, 3))
    assert pooled == pytest.approx(expected / mean_over_seeds("grpo", fraction, (1, 2, 3)) - 1)
    frontier = np.asarray(levels) >= 2

    def frontier_mean(arm):
        return np.mean([np.asarray(pass2_all(CORRECT[(arm, s)]))[frontier] for s in (0, 1)])

    primary = summary["primary"]["gdro_both"]["gain"]
    assert primary == pytest.approx(frontier_mean("gdro_both") / frontier_mean("grpo") - 1)
    assert correct == [4, 2, 2, 2, 0, 1]


@pytest.mark.parametrize("group", ["", *ablations.GROUPS])
def test_every_ablation_arm_builds_its_controllers(group):
    config = ablations.get_config(group)
    arms = study.arms_of(config)
    assert next(iter(arms)) == "grpo" and len(arms) >= 2
    for arm in arms:
        run = study.run_config(config, study.RunSpec(arm, 0), "warm")
        gdro, _ = configs.build_controllers(run, 64)
        assert run.method == study.parse_overrides(config.arms[arm], where=arm)["method"]
    with pytest.raises(ValueError, match="unknown ablation group"):
        ablations.get_config("nope")


def test_a_plus_field_adds_a_library_default_and_refuses_an_existing_one():
    config = ml_collections.ConfigDict({"method": "grpo", "prompt_gdro": {"eta": 0.1}})
    config.lock()  # as `--config` hands it over
    overrides = study.parse_overrides("+prompt_gdro.clip=None prompt_gdro.eta=0.5", where="arm")
    assert overrides == {"+prompt_gdro.clip": None, "prompt_gdro.eta": 0.5}
    run = study.apply_overrides(config, overrides, where="arm")
    assert run.prompt_gdro.to_dict() == {"eta": 0.5, "clip": None}
    assert "clip" not in config.prompt_gdro  # the study's config is left as it was
    with pytest.raises(ValueError, match=r"arm: \+prompt_gdro.eta: the field exists"):
        study.apply_overrides(config, {"+prompt_gdro.eta": 1.0}, where="arm")
    with pytest.raises(ValueError, match=r"arm: unknown field 'rollout_gdro'"):
        study.apply_overrides(config, {"+rollout_gdro.n_max": 8}, where="arm")
    with pytest.raises(ValueError, match=r"arm: unknown field 'prompt_gdro.clip'"):
        study.apply_overrides(config, {"prompt_gdro.clip": None}, where="arm")


def test_an_arm_with_an_unknown_method_is_named():
    config = study_configs.get_config()
    config.arms.grpo_typo = "method=gpro"
    with pytest.raises(ValueError, match=r"arms.grpo_typo: method must be one of .*'gpro'"):
        study.arms_of(config)


def test_ablations_share_the_study_runs_of_its_arms():
    """The ablations' reference arms are the study's runs (same RL config and evaluation, so the
    same stamps in a shared workdir); the changed arms carry their settings."""
    main = study_configs.get_config()
    config = ablations.get_config()
    config.lock()
    assert config.eval.to_dict() == main.eval.to_dict()
    assert config.pretrain.to_dict() == main.pretrain.to_dict()
    shared = set(study.arms_of(config)) & set(main.arms)
    assert shared == {"grpo", "prompt_gdro", "rollout_gdro", "gdro_both"}
    for arm in shared:
        spec = study.RunSpec(arm, 2)
        mine = study.run_config(config, spec, "warm").to_dict()
        assert mine == study.run_config(main, spec, "warm").to_dict(), arm
    released = study.run_config(config, study.RunSpec("pg_released", 0), "warm")
    assert released.prompt_gdro.clip is None and released.prompt_gdro.share_floor == 1e-6
    three = study.run_config(config, study.RunSpec("both_3_bins", 0), "warm")
    _, prompt = configs.build_controllers(three, 64)
    assert three.classifier.edges == (0.33, 0.67) and prompt.num_bins == 3
    lagged = study.run_config(config, study.RunSpec("pg_lagged", 0), "warm")
    gdro, _ = configs.build_controllers(lagged, 64)
    assert gdro.init().previous_bins.shape == (lagged.num_prompts,)
