"""The simulation experiment end to end on `sim_tiny`, and the properties of `sim_default`."""

import re
import sys

import jax
import matplotlib.image
import numpy as np
import pytest
from absl import flags

from experiments import simulate_controllers
from experiments.configs import sim_default, sim_tiny
from gdro_jax import sim

TINY_CONFIG = "experiments/configs/sim_tiny.py"
PLOTS = (
    "q_heatmap.png",
    "rollouts_per_bin.png",
    "pass_rate_per_level.png",
    "final_pass_at_8.png",
    "controller_signals.png",
)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")
def test_main_writes_arrays_plots_and_table(tmp_path, capsys, monkeypatch):
    steps = 10  # overrides sim_tiny's steps from the command line
    argv = [
        "simulate_controllers",
        f"--config={TINY_CONFIG}",
        f"--workdir={tmp_path}",
        f"--config.steps={steps}",
    ]
    # ml_collections reads the `--config.*` overrides from sys.argv, as under `app.run`.
    monkeypatch.setattr(sys, "argv", argv)
    flags.FLAGS(argv)
    try:
        simulate_controllers.main(argv)
    finally:
        flags.FLAGS.unparse_flags()
    printed = capsys.readouterr().out

    tiny = sim_tiny.get_config()
    config = sim.SimConfig.from_mapping(tiny, ignore=sim.EXPERIMENT_KEYS)
    methods = tiny.methods.split(",")
    arrays = np.load(tmp_path / "arrays.npz")
    num_bins = 10
    for method in methods:
        rollouts = arrays[f"{method}/trace/rollouts_per_bin"]
        assert rollouts.shape == (tiny.seeds, steps, num_bins)
        assert np.all(rollouts.sum(-1) == config.num_slots)
        assert arrays[f"{method}/trace/q"].shape == (tiny.seeds, steps, num_bins)
        assert arrays[f"{method}/trace/pass1"].shape == (tiny.seeds, steps, config.num_levels)
        final = arrays[f"{method}/final_pass_k"]
        assert final.shape == (tiny.seeds, config.num_levels)
        assert np.all((final >= 0) & (final <= 1))
    np.testing.assert_array_equal(arrays["pool_counts"], config.pool_counts)

    # It ends by naming its folder and the files a person opens first, in words and sizes.
    ending = printed.rstrip().splitlines()
    start = ending.index(f"Wrote {tmp_path}/:")
    assert ending[start + 1].split()[0] == "summary.txt"
    assert re.search(r"\(\d+(\.\d+)? (B|KiB|MiB)\)$", ending[start + 1])
    assert ending[-1].startswith("  and ") and "[" not in "".join(ending[start:])
    for name in PLOTS:
        image = matplotlib.image.imread(tmp_path / name)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100, name
        assert image.std() > 0.01, name  # not a blank canvas

    summary = (tmp_path / "summary.txt").read_text()
    assert summary in printed
    for label in ["pass@1", "pass@8", "pooled", "natural", *methods]:
        assert label in summary
    for level in range(1, config.num_levels + 1):
        assert f"L{level} " in summary
    assert f"x {steps} steps" in summary


def test_default_config_meets_the_task_criteria():
    # SPEC 11: heavy tail, >= 5 visits per prompt, and a frontier after the warm start.
    config = sim.SimConfig.from_mapping(sim_default.get_config(), ignore=sim.EXPERIMENT_KEYS)
    assert config.num_levels >= 6
    assert config.visits_per_prompt >= 5
    counts = config.pool_counts
    assert np.all(np.diff(counts) < 0)
    assert counts[0] > 0.3 * config.pool_size and counts[-1] < 0.05 * config.pool_size

    heldout = sim.sample_prompt_set(
        jax.random.key(0), np.full(config.num_levels, 4096), config.offset_std
    )
    theta_L = sim.initial_skill_logits(
        config.num_levels, config.init_logit_first, config.init_logit_slope
    )
    p_P = sim.success_prob(theta_L, heldout.level_P, heldout.offset_P)
    pass1 = np.asarray(sim.per_level_mean(p_P, heldout.level_P, config.num_levels))
    pass8 = np.asarray(
        sim.per_level_mean(sim.exact_pass_at_k(p_P, 8), heldout.level_P, config.num_levels)
    )
    assert pass1[0] > 0.8
    assert pass1[-1] < 0.05
    assert pass8[-1] > 0.05
    assert np.all(np.diff(pass1) < 0)


def test_bootstrap_interval_and_pooled_columns():
    rng = np.random.default_rng(0)
    values_SL = rng.uniform(size=(16, 4))
    shares_L = sim.level_shares(4, 2.0)
    columns = sim.pooled_columns(values_SL, shares_L)
    np.testing.assert_allclose(columns[:, 4], values_SL.mean(1))
    np.testing.assert_allclose(columns[:, 5], values_SL @ shares_L)
    interval = sim.bootstrap_interval(columns)
    np.testing.assert_allclose(interval.mean, columns.mean(0))
    assert np.all(interval.lower <= interval.mean) and np.all(interval.mean <= interval.upper)
    assert np.all(interval.upper - interval.lower > 0)
    single = sim.bootstrap_interval(columns[:1])
    np.testing.assert_allclose(single.lower, columns[0])
    np.testing.assert_allclose(single.upper, columns[0])
