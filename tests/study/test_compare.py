"""The comparison study (`experiments/compare.py`).

- End to end on tiny settings (`_study_config.py`: 2 arms x 2 seeds x 3 steps): every run is
  trained and evaluated, the results and the store of small files are written, a second pass
  reruns nothing, a fresh work directory collects the same results from the store alone, a
  warm start unlike the stored runs' is refused, and one run deleted and rerun alone in a
  subprocess with the `--config.only` command reproduces its metrics rows, final parameters
  and stored file bit for bit (the tiny policy scores 0 held out, so its figures cannot show
  that).
- `collect`'s arithmetic on fabricated evaluation files: the frontier levels, per-seed figures
  and the primary paired gain, against values computed here by hand.
"""

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys

import matplotlib
import matplotlib.container
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


def _files(folder):
    """Every file under `folder`, relative path -> bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    base = tmp_path_factory.mktemp("study")
    workdir, results = base / "runs", base / "results"
    results_md = base / "RESULTS.md"
    begin, end = study.results_markers(_study_config.get_config().name)
    results_md.write_text(README_BLOCK.format(begin=begin, end=end))
    config = _study_config.get_config()
    todo = study.pending(config, workdir, results / "runs")
    summary = study.run_study(config, workdir, results=results, results_md=results_md)
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
def test_the_store_holds_every_run_its_log_and_the_warm_start(finished):
    """`<results>/runs/` holds each run's evaluation file (the work directory's, byte for byte,
    one top-level key per line), whose compact log matches the metrics rows to 5 significant
    digits, and the warm start's evaluation, frontier and weights fingerprint."""
    workdir, store = finished["workdir"], finished["results"] / "runs"
    for spec in finished["todo"]:
        kept = store / spec.arm / f"seed_{spec.seed}" / "eval_test.json"
        made = workdir / spec.arm / f"seed_{spec.seed}" / "eval_test.json"
        assert kept.read_bytes() == made.read_bytes()
        text = kept.read_text()
        record = json.loads(text)
        assert len(text.splitlines()) == len(record) + 2  # "{", a line per key, "}"
        rows = _rows(workdir / spec.arm / f"seed_{spec.seed}")
        log = record["log"]
        assert log["step"] == [1, 2, 3]
        for name in ("accuracy", "tokens", "nonzero_advantage_fraction", "bin/q", "q_entropy"):
            want = np.asarray([row[name] for row in rows], np.float64)
            np.testing.assert_allclose(np.asarray(log[name], np.float64), want, rtol=1e-4)
        # The decisions after the first pass (48 prompts / 4 a step: past the 3 steps, so the
        # last step): the groups with a non-zero gradient, by hand.
        decisions = record["decisions"]
        assert decisions["after_step"] == 2
        assert decisions["nonzero_gradient_fraction"] == rows[-1]["nonzero_advantage_fraction"]
    # The whole warm start folder, weights included, and the weights' fingerprint.
    warm = _files(store / "warm_start")
    identity = json.loads(warm.pop("warm_start.json"))
    assert warm == _files(workdir / "warm_start")
    assert {"model/model.safetensors", "pretrain.json", "frontier.json", "eval_test.json"} <= set(
        warm
    )
    weights = (workdir / "warm_start" / "model" / "model.safetensors").read_bytes()
    assert identity["fingerprint"] == hashlib.sha256(weights).hexdigest()
    training = finished["summary"]["training"]
    for arm in ("grpo", "gdro_both"):
        fractions = [
            json.loads((store / arm / f"seed_{s}" / "eval_test.json").read_text())["decisions"][
                "nonzero_gradient_fraction"
            ]
            for s in (0, 1)
        ]
        assert training[arm]["nonzero_gradient_fraction"]["mean"] == pytest.approx(
            np.mean(fractions)
        )
    assert (
        "groups with a non-zero gradient (steps > 2)"
        in (finished["results"] / "tables.md").read_text()
    )


@pytest.mark.slow
def test_a_fresh_workdir_collects_the_same_results_from_the_store_alone(finished, tmp_path):
    """A new machine with only the committed results: nothing is trained (no warm start), and
    the summary, tables and figures are rebuilt from the store."""
    results = tmp_path / "results"
    shutil.copytree(finished["results"] / "runs", results / "runs")
    workdir = tmp_path / "runs"
    summary = study.run_study(finished["config"], workdir, results=results)
    assert json.loads(json.dumps(summary)) == json.loads(json.dumps(finished["summary"]))
    assert not (workdir / "warm_start").exists()
    assert (results / "tables.md").read_text() == (finished["results"] / "tables.md").read_text()
    for name in (*study.FIGURES, study.ALONG_FIGURE):
        assert (results / name).stat().st_size > 0, name


@pytest.mark.slow
def test_without_a_store_the_results_folder_gets_the_summary_only(finished, tmp_path):
    summary = study.run_study(
        finished["config"], finished["workdir"], results=tmp_path, store=False
    )
    assert json.loads(json.dumps(summary)) == json.loads(json.dumps(finished["summary"]))
    assert not (tmp_path / "runs").exists() and (tmp_path / "study.json").exists()


@pytest.mark.slow
def test_a_fresh_workdir_starts_from_the_stored_warm_start_and_trains_only_the_missing_run(
    finished, tmp_path
):
    """The stored weights are used, not retrained: here they are changed on purpose (one weight
    moved, its fingerprint updated), and the rerun run's warm start is the changed file."""
    results = tmp_path / "results"
    shutil.copytree(finished["results"] / "runs", results / "runs")
    kept = results / "runs" / "warm_start"
    weights_file = kept / "model" / "model.safetensors"
    weights = safetensors.numpy.load_file(str(weights_file))
    name = sorted(weights)[0]
    weights[name] = weights[name] + np.float32(0.5)
    safetensors.numpy.save_file(weights, str(weights_file))
    identity = json.loads((kept / "warm_start.json").read_text())
    identity["fingerprint"] = hashlib.sha256(weights_file.read_bytes()).hexdigest()
    (kept / "warm_start.json").write_text(json.dumps(identity))
    shutil.rmtree(results / "runs" / "gdro_both" / "seed_1")
    workdir = tmp_path / "runs"
    study.run_study(finished["config"], workdir, results=results)
    restored = workdir / "warm_start" / "model" / "model.safetensors"
    assert restored.read_bytes() == weights_file.read_bytes()
    assert sorted(p.parent.name + "/" + p.name for p in workdir.glob("*/seed_*")) == [
        "gdro_both/seed_1"
    ]
    assert (results / "runs" / "gdro_both" / "seed_1" / "eval_test.json").exists()


@pytest.mark.slow
def test_a_warm_start_unlike_the_stored_runs_is_refused_before_anything_is_written(
    finished, tmp_path
):
    """The store's runs started from other weights of the same config (another machine): the
    study stops before training or copying anything."""
    results = tmp_path / "results"
    shutil.copytree(finished["results"] / "runs", results / "runs")
    identity_file = results / "runs" / "warm_start" / "warm_start.json"
    identity = json.loads(identity_file.read_text())
    identity_file.write_text(json.dumps({**identity, "fingerprint": "0" * 64}))
    shutil.rmtree(results / "runs" / "grpo" / "seed_1")  # finished in the workdir, not stored
    before = _files(results)
    with pytest.raises(ValueError, match="are not those the runs in .* started from"):
        study.run_study(finished["config"], finished["workdir"], results=results)
    assert _files(results) == before


@pytest.mark.slow
def test_the_curriculum_notebook_draws_the_tiny_study(finished, monkeypatch):
    monkeypatch.setenv("GDRO_STUDIES", f"tiny={finished['results']}")
    execute_notebook(pathlib.Path(ROOT) / "notebooks" / "curriculum.py")


@pytest.mark.slow
def test_a_second_pass_finds_nothing_to_run_and_a_changed_eval_everything(finished):
    config = finished["config"]
    assert study.pending(config, finished["workdir"]) == []
    assert study.pending(config, finished["results"] / "runs") == []
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
    """RESULTS.md's command: the run's folder and its stored file deleted, rerun alone."""
    workdir = finished["workdir"]
    folder = workdir / "grpo" / "seed_1"
    stored = finished["results"] / "runs" / "grpo" / "seed_1" / "eval_test.json"
    kept = tmp_path / "kept"
    shutil.copytree(folder, kept)
    kept_lines = stored.read_text().splitlines()
    shutil.rmtree(folder)
    stored.unlink()
    command = [
        sys.executable,
        "-m",
        "experiments.compare",
        "--config=tests/study/_study_config.py",
        f"--workdir={workdir}",
        f"--results={finished['results']}",
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
    # The stored file again, every line but the wall-clock seconds (`git diff` shows that one).
    changed = [
        (a, b) for a, b in zip(kept_lines, stored.read_text().splitlines(), strict=True) if a != b
    ]
    assert [a.split(":")[0] for a, _ in changed] == ['"seconds"']
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


def test_an_arm_has_one_colour_in_both_panels_of_the_heldout_figure(tmp_path):
    """The per-level bars and the primary gains' markers: an arm's colour is the same in both
    (the right panel lists no warm start and no baseline, so a colour cycle per panel shifts)."""
    config = _fabricated_study(tmp_path)
    summary = study.collect(config, tmp_path, check_stamps=False)
    figure = study.plot_heldout(summary)
    left, right = figure.axes[:2]
    bars = {
        c.get_label(): c.patches[0].get_facecolor()
        for c in left.containers
        if isinstance(c, matplotlib.container.BarContainer)
    }
    markers = [line.get_color() for line in right.get_lines() if line.get_marker() == "o"]
    gains = [arm for arm, gain in summary["primary"].items() if gain is not None]
    assert gains == ["gdro_both"] and len(markers) == 1
    assert matplotlib.colors.to_rgba(markers[0]) == bars["gdro_both"]
    assert bars["gdro_both"] != bars["warm_start"] != bars["grpo"]


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
        configs.build_controllers(run, 64)  # the arm builds its controllers
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
    prompt = configs.build_controllers(three, 64).prompt_adversary
    assert three.classifier.edges == (0.33, 0.67) and prompt.num_bins == 3
    lagged = study.run_config(config, study.RunSpec("pg_lagged", 0), "warm")
    gdro = configs.build_controllers(lagged, 64)
    assert gdro.init().previous_bins.shape == (lagged.num_prompts,)


def test_compact_log_keeps_five_significant_digits_and_the_rows_come_back():
    rows = [
        {"step": 1, "accuracy": 0.123456789, "tokens": 1849.0, "bin/q": [1 / 3, 2 / 3],
         "nonzero_advantage_fraction": "nan", "prompt/ids": [4, 5]},
        {"step": 2, "accuracy": 98765.4321, "tokens": 2000.0, "bin/q": [0.25, 0.75],
         "nonzero_advantage_fraction": 0.5, "prompt/ids": [6, 7]},
    ]  # fmt: skip
    log = study.compact_log(rows)
    assert "prompt/ids" not in log  # per-prompt columns are left out
    assert log["accuracy"] == [0.12346, 98765.0]
    assert log["bin/q"] == [[0.33333, 0.66667], [0.25, 0.75]]
    assert log["nonzero_advantage_fraction"] == ["nan", 0.5]
    assert log["step"] == [1, 2]
    back = study.log_rows(log)
    assert [row["step"] for row in back] == [1, 2] and back[1]["bin/q"] == [0.25, 0.75]


def test_named_studies_write_their_own_blocks():
    assert study.results_markers("") == (study.RESULTS_BEGIN, study.RESULTS_END)
    graded, cliff = study.results_markers("graded"), study.results_markers("cliff")
    assert len({*graded, *cliff, study.RESULTS_BEGIN, study.RESULTS_END}) == 6
    assert all("graded" in line for line in graded)


def test_what_each_arm_did_in_training_by_hand(tmp_path):
    """`training` from fabricated logs and decisions: the non-zero-gradient fraction's mean and
    range over seeds, and the bin occupancy and all-equal share after the first pass (step 1),
    computed here from the rows; the headline table shows them."""
    config = _fabricated_study(tmp_path)
    prompts = {  # bin/prompts of steps 1-3 (3 bins), per arm and seed
        ("grpo", 0): [[4, 0, 0], [1, 2, 1], [0, 1, 3]],
        ("grpo", 1): [[2, 2, 0], [0, 0, 4], [2, 2, 0]],
        ("gdro_both", 0): [[0, 4, 0], [3, 1, 0], [1, 1, 2]],
        ("gdro_both", 1): [[1, 1, 2], [4, 0, 0], [0, 4, 0]],
    }
    nonzero = {("grpo", 0): 0.2, ("grpo", 1): 0.4, ("gdro_both", 0): 0.5, ("gdro_both", 1): 0.9}
    for (arm, seed), steps in prompts.items():
        path = tmp_path / arm / f"seed_{seed}" / "eval_test.json"
        record = json.loads(path.read_text())
        fractions = [0.1, nonzero[(arm, seed)] - 0.1, nonzero[(arm, seed)] + 0.1]
        record["log"] = {
            "step": [1, 2, 3],
            "bin/prompts": steps,
            "nonzero_advantage_fraction": fractions,
        }
        record["decisions"] = {"after_step": 1, "nonzero_gradient_fraction": nonzero[(arm, seed)]}
        path.write_text(json.dumps(record))
    summary = study.collect(config, tmp_path, check_stamps=False)
    both = summary["training"]["gdro_both"]
    assert both["after_step"] == 1
    assert both["nonzero_gradient_fraction"] == pytest.approx({"mean": 0.7, "min": 0.5, "max": 0.9})
    # Seed 0, steps 2-3: bins hold 4, 2, 2 of 8 -> largest 0.5, middle 0.25; seed 1: 4, 4, 0.
    assert both["largest_bin_share"]["mean"] == pytest.approx((0.5 + 0.5) / 2)
    assert both["middle_bins_share"]["mean"] == pytest.approx((2 / 8 + 4 / 8) / 2)
    assert both["all_equal_share"]["mean"] == pytest.approx(1 - 0.7)
    grpo = summary["training"]["grpo"]
    assert grpo["largest_bin_share"]["min"] == pytest.approx(4 / 8)  # seed 0: 1, 3, 4 of 8
    tables = study.format_tables(summary)
    header = tables.splitlines()[0]
    assert "groups with a non-zero gradient (steps > 1)" in header
    row = next(line for line in tables.splitlines() if line.startswith("| gdro_both | "))
    assert "| 0.700 |" in row and "+100.0 %" in row  # tokens: twice GRPO's
    # Batch by batch (steps 2-3, 4 prompts each): seed 0 [3, 1, 0] has a bin above 60 %, [1, 1, 2]
    # none; seed 1 [4, 0, 0] and [0, 4, 0] both. Middle bin under 25 %: seed 1's [4, 0, 0] only.
    assert both["batches_with_a_bin_over_max"] == pytest.approx({"mean": 1.5, "min": 1, "max": 2})
    assert both["batches_with_middle_under_min"] == pytest.approx({"mean": 0.5, "min": 0, "max": 1})
    assert both["batches"]["mean"] == 2


def test_the_per_level_and_along_tables_mark_only_what_lies_beyond_noise(tmp_path):
    """Cells where every seed and problem moves the same way against GRPO are marked (+) or (-)
    (every bootstrap resample gives the same gain, so the interval is that point); a level ahead
    on one problem and behind on the other is not, whatever its mean. Planted: per-level marks
    from the pooled gain, and marks from the gain's sign alone (both seen failing)."""
    config = _fabricated_study(tmp_path)
    # Level 1 ahead on one problem, behind on the other; level 2 better (3 of 4 right against
    # 1) and level 3 worse on every problem, in both seeds.
    correct = {"grpo": [2, 1, 1, 1, 3, 3], "gdro_both": [4, 0, 3, 3, 1, 1]}
    along = {
        "grpo": [[2, 2, 1, 1, 3, 3]] * 2,
        "gdro_both": [[2, 2, 1, 1, 3, 3], correct["gdro_both"]],
    }
    for arm, counts in correct.items():
        for seed in (0, 1):
            path = tmp_path / arm / f"seed_{seed}" / "eval_test.json"
            record = json.loads(path.read_text())
            record["evaluation"]["correct"] = counts
            record["along"] = [
                {"step": 1 + i, "sampled_rollouts": 16 * (1 + i), "sampled_tokens": 0.0,
                 "evaluation": {**record["evaluation"], "correct": point}}
                for i, point in enumerate(along[arm])
            ]  # fmt: skip
            path.write_text(json.dumps(record))
    summary = study.collect(config, tmp_path, check_stamps=False)
    gains = summary["level_gains"]["gdro_both"]
    # pass@1 by hand: level 2 3/4 against 1/4 (gain +200 %), level 3 1/4 against 3/4 (-66.7 %).
    assert gains["L2 pass@1"] == pytest.approx({"gain": 2.0, "low": 2.0, "high": 2.0})
    assert gains["L3 pass@1"] == pytest.approx({"gain": -2 / 3, "low": -2 / 3, "high": -2 / 3})
    # Level 1: 4/8 against 3/8 (+33 %), but a resample of its first problem twice gives +100 %,
    # of its second twice -100 %: within noise.
    assert gains["L1 pass@1"]["gain"] == pytest.approx(1 / 3)
    assert gains["L1 pass@1"]["low"] < 0 < gains["L1 pass@1"]["high"]
    rows = {line.split(" | ")[0]: line for line in study.format_tables(summary).splitlines()}
    assert rows["| L2 pass@1"].endswith("| 0.750 (+) |")
    assert rows["| L3 pass@1"].endswith("| 0.250 (-) |")
    assert rows["| L1 pass@1"].endswith("| 0.500 |")
    # Along the runs: equal at the first point (no mark), then the final figures' frontier gain.
    curve = summary["along"]["arms"]["gdro_both"]["frontier pass@1 gain"]
    assert curve[0] == pytest.approx({"gain": 0.0, "low": 0.0, "high": 0.0})
    assert curve[1]["gain"] == pytest.approx((3 + 1) / (1 + 3) - 1)  # frontier levels 2-3: 0
    assert rows["| gdro_both"].split(" | ")[1:3] == ["0.500", "0.500"]
    assert "unmarked: within noise" in study.format_tables(summary)


def test_the_summary_names_the_machines_that_made_its_files(tmp_path):
    config = _fabricated_study(tmp_path)
    machine = {"cpu": {"model": "Some CPU", "vector_extensions": ["avx2", "fma", "sse2"]},
               "backend": "cpu", "devices": {"kind": "cpu"},
               "packages": {"jax": "9.9", "jaxlib": "9.9"}}  # fmt: skip
    for arm in ("grpo", "gdro_both"):
        path = tmp_path / arm / "seed_0" / "eval_test.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "environment": machine}))
    summary = study.collect(config, tmp_path, check_stamps=False)
    recorded, unrecorded = (
        summary["environments"]["recorded"],
        summary["environments"]["unrecorded"],
    )
    assert recorded == [{"environment": machine, "runs": ["grpo/seed_0", "gdro_both/seed_0"]}]
    assert unrecorded == ["grpo/seed_1", "gdro_both/seed_1", "warm_start"]
    last = study.format_tables(summary).splitlines()[-1]
    assert "2 on Some CPU (avx2; cpu cpu, jax 9.9, jaxlib 9.9)" in last
    assert "3 with no record of their machine" in last
    # The same machine at two commits of the code: two records, one entry of the line.
    for arm, commit in (("grpo", "a" * 40), ("gdro_both", "b" * 40)):
        path = tmp_path / arm / "seed_1" / "eval_test.json"
        record = {**machine, "commit": commit}
        path.write_text(json.dumps({**json.loads(path.read_text()), "environment": record}))
    summary = study.collect(config, tmp_path, check_stamps=False)
    assert len(summary["environments"]["recorded"]) == 3
    last = study.format_tables(summary).splitlines()[-1]
    assert "4 on Some CPU (avx2; cpu cpu, jax 9.9, jaxlib 9.9; 2 commits of the code)" in last
    assert last.count(" on Some CPU") == 1 and "1 with no record of their machine" in last
