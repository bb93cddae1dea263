"""The horizon study's statistics (`along_primary`), on fabricated evaluation files.

Every figure is checked against values computed here by hand from the fabricated counts: the
primary gain at each point, its change from the first point to the last with its reading, the
pooled pass@1 gain, the non-zero-gradient fraction per segment and the continued study's points.
The files list their points in reverse step order, so a pairing by position instead of by step
gives other numbers (planted: seen failing), as does a baseline matched at another step.
"""

import json

import numpy as np
import pytest

from experiments.configs import horizon_study
from gdro_jax import study
from tests.study.test_compare import LEVELS, _fabricated_study

# Correct samples of 4 per problem (levels 1-3, two problems each; the frontier is levels 2-3)
# after steps 10, 20 and 30, per arm and seed. gdro_both leads at step 10 on every frontier
# problem and seed, and its lead grows.
ALONG = {
    ("grpo", 0): {10: [4, 4, 1, 1, 1, 1], 20: [4, 4, 2, 1, 1, 1], 30: [4, 4, 2, 2, 1, 1]},
    ("grpo", 1): {10: [4, 3, 1, 1, 1, 0], 20: [4, 3, 2, 1, 1, 1], 30: [4, 3, 2, 2, 2, 1]},
    ("gdro_both", 0): {10: [4, 4, 2, 2, 2, 2], 20: [4, 4, 3, 3, 3, 3], 30: [4, 4, 4, 4, 4, 4]},
    ("gdro_both", 1): {10: [4, 3, 2, 2, 2, 1], 20: [4, 3, 3, 3, 3, 3], 30: [4, 3, 4, 4, 4, 4]},
}
STEPS = (10, 20, 30)
ROLLOUTS = 16  # sampled rollouts a step


def _pass2(c):
    """Unbiased pass@2 of a problem with c of 4 samples right: 1 - C(4-c, 2) / C(4, 2)."""
    return 1 - {0: 6, 1: 3, 2: 1, 3: 0, 4: 0}[c] / 6


def _frontier_pass2(arm, step):
    """[seeds, frontier problems] pass@2, by hand."""
    return np.array([[_pass2(c) for c in ALONG[(arm, s)][step][2:]] for s in (0, 1)])


def _write_along(root, along=ALONG, steps=STEPS, logs=True):
    """Each run's points in reverse step order (pairing must go by step), its final evaluation
    the last point's, and a compact log whose non-zero-gradient fraction is step / 100."""
    for (arm, seed), points in along.items():
        path = root / arm / f"seed_{seed}" / "eval_test.json"
        record = json.loads(path.read_text())
        record["evaluation"]["correct"] = points[steps[-1]]
        record["along"] = [
            {"step": step, "sampled_rollouts": ROLLOUTS * step, "sampled_tokens": 0.0,
             "evaluation": {**record["evaluation"], "correct": points[step]}}
            for step in reversed(steps)
        ]  # fmt: skip
        if logs:
            log_steps = list(range(1, steps[-1] + 1))
            record["log"] = {
                "step": log_steps,
                "nonzero_advantage_fraction": [(s + 100 * seed) / 1000 for s in log_steps],
            }
        path.write_text(json.dumps(record))


@pytest.fixture
def horizon(tmp_path):
    config = _fabricated_study(tmp_path)
    config.along_primary = True
    config.primary.num_resamples = 400
    _write_along(tmp_path)
    return config, tmp_path


def test_the_primary_gain_at_each_point_pairs_by_step_and_seed(horizon):
    config, root = horizon
    summary = study.collect(config, root, check_stamps=False)
    along = summary["along"]
    assert along["steps"] == list(STEPS)
    assert along["sampled_rollouts"] == [ROLLOUTS * s for s in STEPS]
    assert along["primary_name"] == "frontier pass@2"
    curve = along["arms"]["gdro_both"]
    for i, step in enumerate(STEPS):
        method, base = _frontier_pass2("gdro_both", step), _frontier_pass2("grpo", step)
        want = method.mean() / base.mean() - 1
        assert curve["primary gain"][i]["gain"] == pytest.approx(want, abs=1e-12), step
        assert curve["primary gain"][i]["low"] <= want <= curve["primary gain"][i]["high"]
        assert curve["frontier pass@2"][i] == pytest.approx(method.mean())
        assert along["arms"]["grpo"]["frontier pass@2"][i] == pytest.approx(base.mean())
    # The change from step 10 to step 30, by hand, and each seed's.
    gains = [
        _frontier_pass2("gdro_both", s).mean() / _frontier_pass2("grpo", s).mean() - 1
        for s in (10, 30)
    ]
    change = curve["primary change"]
    assert change["gain"] == pytest.approx(gains[1] - gains[0], abs=1e-12)
    assert change["low"] <= change["gain"] <= change["high"]


def test_the_pooled_pass1_gain_and_the_nonzero_gradient_segments_by_hand(horizon):
    config, root = horizon
    summary = study.collect(config, root, check_stamps=False)
    weights = study.level_weights(LEVELS)  # equal counts per level: all 1
    for i, step in enumerate(STEPS):

        def pooled(arm, step=step):
            return np.mean([np.asarray(ALONG[(arm, s)][step]) * weights / 4 for s in (0, 1)])

        want = pooled("gdro_both") / pooled("grpo") - 1
        got = summary["along"]["arms"]["gdro_both"]["pooled pass@1 gain"][i]["gain"]
        assert got == pytest.approx(want, abs=1e-12)
    # Segments (0, 10], (10, 20], (20, 30]: the mean of (s + 100 seed) / 1000 over their steps
    # and the two seeds.
    for arm in ("grpo", "gdro_both"):
        got = summary["along"]["arms"][arm]["nonzero_gradient_fraction"]
        want = [
            np.mean([np.mean([(s + 100 * seed) / 1000 for s in range(a + 1, b + 1)])
                     for seed in (0, 1)])
            for a, b in ((0, 10), (10, 20), (20, 30))
        ]  # fmt: skip
        assert got == pytest.approx(want)


def test_the_reading_follows_the_changes_interval():
    assert study.reading_of({"gain": 0.1, "low": 0.01, "high": 0.2}) == "grows"
    assert study.reading_of({"gain": -0.1, "low": -0.2, "high": -0.01}) == "closes"
    assert study.reading_of({"gain": 0.1, "low": -0.01, "high": 0.2}) == "holds"
    assert study.reading_of(None) == "undefined"


def test_a_gain_that_grows_on_every_seed_and_problem_reads_grows(horizon):
    """gdro_both's frontier problems: 2 right of 4 against GRPO's 1 at step 10 and 4 against 1
    at step 30, on every seed and problem; every resample then gives the same change."""
    config, root = horizon
    along = {
        (arm, s): {
            step: [4, 4] + [{"grpo": 1, "gdro_both": {10: 2, 20: 3, 30: 4}[step]}[arm]] * 4
            for step in STEPS
        }
        for arm in ("grpo", "gdro_both")
        for s in (0, 1)
    }
    _write_along(root, along)
    curve = study.collect(config, root, check_stamps=False)["along"]["arms"]["gdro_both"]
    want = (_pass2(4) / _pass2(1) - 1) - (_pass2(2) / _pass2(1) - 1)
    assert curve["primary change"] == pytest.approx({"gain": want, "low": want, "high": want})
    assert curve["reading"] == "grows"
    # Swapped (the lead falls from 4 of 4 right to 2): it closes.
    for key in along:
        if key[0] == "gdro_both":
            along[key][10], along[key][30] = along[key][30], along[key][10]
    _write_along(root, along)
    curve = study.collect(config, root, check_stamps=False)["along"]["arms"]["gdro_both"]
    assert curve["primary change"]["gain"] == pytest.approx(-want)
    assert curve["reading"] == "closes"


def test_runs_at_other_steps_give_no_along_figures(horizon):
    config, root = horizon
    path = root / "gdro_both" / "seed_1" / "eval_test.json"
    record = json.loads(path.read_text())
    record["along"][0]["step"] = 31  # the 30-step point now says 31
    path.write_text(json.dumps(record))
    assert "along" not in study.collect(config, root, check_stamps=False)


def test_the_continued_studys_points_are_collected_beside_the_new_ones(horizon, tmp_path_factory):
    """`warm_start_store`'s runs, evaluated at steps 5 and 10 of their own: their primary gains
    by hand, in the summary and the tables, and the horizon figure drawn."""
    config, root = horizon
    other = tmp_path_factory.mktemp("other")
    store = other / "runs"
    store.mkdir()
    _fabricated_study(store)
    earlier = {key: {5: points[10], 10: points[20]} for key, points in ALONG.items()}
    _write_along(store, earlier, steps=(5, 10))
    config.warm_start_store = str(other)
    summary = study.collect(config, root, check_stamps=False)
    reference = summary["along_reference"]
    assert reference["steps"] == [5, 10] and reference["results"] == str(other)
    for i, step in enumerate((10, 20)):  # the counts its steps 5 and 10 hold
        want = _frontier_pass2("gdro_both", step).mean() / _frontier_pass2("grpo", step).mean() - 1
        assert reference["arms"]["gdro_both"]["primary gain"][i]["gain"] == pytest.approx(want)
    tables = study.format_tables(summary)
    assert "| arm | step 10 (160 rollouts) | step 20 (320 rollouts) | step 30 (480 rollouts) |" in (
        tables
    )
    assert "| arm | step 5 (80 rollouts) | step 10 (160 rollouts) |" in tables
    row = next(
        line for line in tables.splitlines()
        if line.startswith("| gdro_both |") and line.endswith(("| grows |", "| holds |"))
    )  # fmt: skip
    gain = summary["along"]["arms"]["gdro_both"]["primary gain"][0]["gain"]
    assert f"{100 * gain:+.1f} %" in row
    fig = study.plot_horizon(summary)
    left = fig.axes[0]
    labels = [c.get_label() for c in left.containers]
    assert labels == ["gdro_both", "gdro_both (150-step study)"]
    x, y = left.containers[0].lines[0].get_data()  # the new runs' points: rollouts, gain (%)
    assert list(x) == [160, 320, 480]
    assert y[0] == pytest.approx(100 * gain)


def test_paired_gain_change_by_hand_and_under_swapped_points():
    rng = np.random.default_rng(3)
    base_a, base_b = rng.uniform(0.2, 1, (3, 7)), rng.uniform(0.2, 1, (3, 7))
    method_a, method_b = rng.uniform(0.2, 1, (3, 7)), rng.uniform(0.2, 1, (3, 7))
    change = study.paired_gain_change(method_a, base_a, method_b, base_b, num_resamples=2000)
    want = (method_b.mean() / base_b.mean()) - (method_a.mean() / base_a.mean())
    assert change.gain == pytest.approx(want, abs=1e-12)
    assert change.per_seed == pytest.approx(
        [method_b[s].mean() / base_b[s].mean() - method_a[s].mean() / base_a[s].mean()
         for s in range(3)]
    )  # fmt: skip
    assert change.low < change.gain < change.high
    swapped = study.paired_gain_change(method_b, base_b, method_a, base_a, num_resamples=2000)
    # The same draws: the swapped change's resamples are the negated ones.
    assert (swapped.gain, swapped.low, swapped.high) == pytest.approx(
        (-change.gain, -change.high, -change.low), abs=1e-12
    )
    with pytest.raises(ValueError, match="same seeds and problems"):
        study.paired_gain_change(method_a, base_a, method_b[:, :6], base_b[:, :6])


def test_the_declared_horizon_config():
    config = horizon_study.get_config()
    assert config.run == "grpo,prompt_gdro,gdro_both,knapsack"
    assert sorted(config.arms) == sorted(config.run.split(","))
    assert config.run.split(",")[0] == config.baseline == "grpo"
    assert (config.seeds, config.train.steps) == (5, 600)
    assert config.train.steps * config.train.num_prompts * config.train.n_mean == 76_800
    assert tuple(config.train.checkpoint.snapshot_steps) == (150, 300, 450)
    assert config.train.grpo.pack_sequences and config.train.rollout.batching == "continuous"
    assert config.primary.metric == "pass@8" and config.primary.num_resamples == 10_000
    assert config.along_primary
    assert config.train.task.pool_size == 480  # the graded study's pool
    assert config.train.task.pool_size <= config.train.steps * config.train.num_prompts / 5


def test_a_continued_store_without_the_warm_start_is_refused(tmp_path):
    config = horizon_study.get_config()
    other = tmp_path / "other" / "runs"
    other.mkdir(parents=True)
    with pytest.raises(ValueError, match=r"warm_start_store: .* holds no warm start"):
        study.restore_other_warm_start(config, tmp_path / "work", other)
    assert not (tmp_path / "work").exists()  # nothing written
