"""The declared study's committed results rebuild from the committed per-run files alone.

`results/study_<profile>/runs/` holds every finished run's evaluation file and the warm start's;
`collect` must rebuild from them, without training or evaluating anything, exactly the tables
and summary committed beside them and the block `compare` wrote into RESULTS.md. A run file
edited or lost (or, in a clean clone, left uncommitted), or a table edited by hand, fails here.
"""

import json
from pathlib import Path

import pytest

from experiments.configs import horizon_study, rivals_study
from gdro_jax import study

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # about a minute: 10,000 paired bootstrap resamples per figure


@pytest.fixture(scope="module", params=rivals_study.PROFILES)
def rebuilt(request):
    profile = request.param
    results = ROOT / "results" / f"study_{profile}"
    config = rivals_study.get_config(profile)
    return profile, config, results, study.collect(config, results / "runs")


def _assert_five_stored_seeds(results, arms):
    for arm in arms:
        stored = sorted(p.name for p in (results / "runs" / arm).iterdir())
        assert stored == [f"seed_{s}" for s in range(5)], arm


def _assert_rebuilds_exactly(config, results, summary):
    """The committed tables.md, RESULTS.md block and study.json equal what `summary` gives."""
    tables = study.format_tables(summary)
    assert (results / "tables.md").read_text() == tables + "\n"
    begin, end = study.results_markers(config.name)
    text = (ROOT / "RESULTS.md").read_text()
    assert text.count(begin) == 1, f"RESULTS.md: no single {config.name} block"
    assert text.split(begin, 1)[1].split(end, 1)[0] == f"\n{tables}\n"
    committed = json.loads((results / "study.json").read_text())
    assert json.loads(json.dumps(summary)) == committed


def test_every_arm_has_five_stored_seeds(rebuilt):
    profile, config, results, summary = rebuilt
    assert summary["arms"] == list(study.arms_of(config))
    ten = profile in rivals_study.TEN_ARMS_STORED  # issue 45's arms 9 and 10 stored
    assert len(summary["arms"]) == (10 if ten else 8)
    assert ("vip" in summary["arms"]) == ten and ("pilot_commit" in summary["arms"]) == ten
    assert summary["seeds"] == [0, 1, 2, 3, 4]
    _assert_five_stored_seeds(results, summary["arms"])


def test_the_tables_summary_and_block_rebuild_exactly(rebuilt):
    _, config, results, summary = rebuilt
    _assert_rebuilds_exactly(config, results, summary)


# --- The horizon study (issue 48) -------------------------------------------------------------


@pytest.fixture(scope="module")
def horizon(monkeypatch_module):
    results = ROOT / "results" / "horizon_graded"
    config = horizon_study.get_config()
    # `warm_start_store` (the 150-step study whose points the horizon marks) is relative to the
    # repository's root, as `make horizon` runs it.
    monkeypatch_module.chdir(ROOT)
    return config, results, study.collect(config, results / "runs")


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_the_horizon_has_four_arms_of_five_seeds_with_four_points(horizon):
    config, results, summary = horizon
    points = [*horizon_study.SNAPSHOT_STEPS, horizon_study.STEPS]
    assert summary["arms"] == list(horizon_study.ARMS)
    assert summary["seeds"] == [0, 1, 2, 3, 4]
    _assert_five_stored_seeds(results, summary["arms"])
    for arm in summary["arms"]:
        for seed in range(5):
            path = results / "runs" / arm / f"seed_{seed}" / "eval_test.json"
            steps = [point["step"] for point in json.loads(path.read_text())["along"]]
            assert steps == points, (arm, seed)
    assert summary["along"]["steps"] == points


def test_the_horizon_tables_summary_and_block_rebuild_exactly(horizon):
    _assert_rebuilds_exactly(*horizon)
