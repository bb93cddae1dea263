"""The simulator fitted to a real run (`sim/_calibrate.py`, `sim/_study.py`): fits
checked against Monte Carlo and brute force, gains against hand computation, and the experiment
end to end on a tiny configuration."""

import dataclasses
import json
from typing import NamedTuple

import numpy as np
import pytest

from experiments.configs import rivals_study, sim_study, sim_tiny
from gdro_jax import sim


def monte_carlo_pass1(theta_L, offset_std, samples=400_000, seed=0):
    """E_c[prod_{j<l} sigmoid(theta_j + c)] per level by sampling the offsets."""
    c = np.random.default_rng(seed).normal(0.0, offset_std, size=(samples, 1))
    chain = np.cumprod(1.0 / (1.0 + np.exp(-(np.asarray(theta_L)[None, :] + c))), axis=1)
    return chain.mean(axis=0)


def test_fitted_logits_reproduce_the_pass_rates_and_recover_the_skills():
    theta = np.array([3.1, 2.4, 2.9, 1.7, 1.2, 1.5, 0.4, -2.6])
    target = monte_carlo_pass1(theta, 1.0)
    fitted = sim.fit_skill_logits(target, 1.0)
    np.testing.assert_allclose(monte_carlo_pass1(fitted, 1.0, seed=1), target, atol=3e-3)
    np.testing.assert_allclose(fitted, theta, atol=0.06)
    # Without offsets the chain is a plain product: sigmoid(theta_j) = p_{j+1} / p_j.
    rates = np.array([0.9, 0.72, 0.36, 0.036])
    ratios = rates / np.concatenate([[1.0], rates[:-1]])
    np.testing.assert_allclose(
        sim.fit_skill_logits(rates, 0.0), np.log(ratios / (1 - ratios)), atol=1e-9
    )


def brute_force_non_increasing(y):
    """The min-max formula of isotonic (non-increasing) regression, in O(n^3)."""
    n = len(y)
    return np.array(
        [
            min(max(np.mean(y[j : k + 1]) for k in range(i, n)) for j in range(i + 1))
            for i in range(n)
        ]
    )


@pytest.mark.parametrize("seed", range(5))
def test_non_increasing_equals_brute_force(seed):
    y = np.random.default_rng(seed).uniform(0, 1, size=9)
    np.testing.assert_allclose(sim.non_increasing(y), brute_force_non_increasing(y), atol=1e-12)


def test_rising_rates_are_pooled_before_fitting():
    # Levels 2 and 3 rise (0.91 -> 0.926): both are fitted to their mean, 0.918.
    rates = [0.957, 0.91, 0.926, 0.5]
    np.testing.assert_allclose(sim.non_increasing(rates), [0.957, 0.918, 0.918, 0.5])
    fitted = sim.expected_pass_at_1(sim.fit_skill_logits(rates, 1.0), 1.0)
    np.testing.assert_allclose(fitted, [0.957, 0.918, 0.918, 0.5], atol=1e-4)


def test_fit_errors_name_the_parameter():
    with pytest.raises(ValueError, match="pass1_L"):
        sim.fit_skill_logits([0.5, 1.2], 1.0)
    with pytest.raises(ValueError, match="offset_std"):
        sim.fit_skill_logits([0.5], -1.0)
    with pytest.raises(ValueError, match="init_logits"):
        sim.SimConfig(num_levels=8, init_logits=(1.0,) * 7)


class _Trace(NamedTuple):
    pass1: np.ndarray


class _Output(NamedTuple):
    trace: _Trace
    final_pass1: np.ndarray
    final_pass_k: np.ndarray


def _output(initial_SL, final_SL, final_k_SL=None):
    initial_SL = np.asarray(initial_SL, np.float64)
    trace = _Trace(pass1=np.stack([initial_SL, initial_SL + 0.5], axis=1))  # [S, T=2, L]
    final_k = final_SL if final_k_SL is None else final_k_SL
    return _Output(trace, np.asarray(final_SL, np.float64), np.asarray(final_k, np.float64))


def test_learning_rate_is_interpolated_in_log_lr():
    calls = []

    def run_grpo(lr):  # gain = 0.01 * log10(lr) + 0.03: 0.018 at lr = 10^-1.2
        calls.append(lr)
        gain = 0.01 * np.log10(lr) + 0.03
        return _output([[0.2, 0.4]], [[0.2 + gain, 0.4 + gain]])

    lr, table = sim.calibrate_learning_rate(run_grpo, 0.018, [1.0, 0.01, 0.1])
    assert calls == [0.01, 0.1, 1.0]
    assert lr == pytest.approx(10**-1.2, rel=1e-9)
    assert [g for _, g in table] == pytest.approx([0.01, 0.02, 0.03])
    with pytest.raises(ValueError, match="brackets"):
        sim.calibrate_learning_rate(run_grpo, 0.5, [0.01, 0.1])


def test_predicted_gains_by_hand():
    # Two seeds, three levels, frontier = level 3.
    grpo = _output(np.zeros((2, 3)), [[0.9, 0.5, 0.1], [0.8, 0.4, 0.3]], [[1, 1, 0.2], [1, 1, 0.4]])
    other = _output(
        np.zeros((2, 3)), [[0.9, 0.6, 0.2], [0.8, 0.5, 0.2]], [[1, 1, 0.3], [1, 1, 0.6]]
    )
    gains = sim.predicted_gains({"grpo": grpo, "prompt_gdro": other}, "grpo", [3], 8)
    assert list(gains) == ["prompt_gdro"]
    assert gains["prompt_gdro"]["frontier pass@8"] == pytest.approx(0.45 / 0.3 - 1)
    assert gains["prompt_gdro"]["pooled pass@1"] == pytest.approx((3.2 / 6) / (3.0 / 6) - 1)
    assert gains["prompt_gdro"]["frontier pass@1"] == pytest.approx(0.2 / 0.2 - 1)
    assert sim.pass1_gain(other) == pytest.approx(3.2 / 6)
    # Frontier levels 2 and 3 with 1 and 3 real test problems: level 3 weighs 3/4.
    weighted = sim.predicted_gains({"grpo": grpo, "o": other}, "grpo", [2, 3], 8, [1, 3])["o"]
    base, method = 0.25 * 1 + 0.75 * 0.3, 0.25 * 1 + 0.75 * 0.45
    assert weighted["frontier pass@8"] == pytest.approx(method / base - 1)
    base, method = 0.25 * 0.45 + 0.75 * 0.2, 0.25 * 0.55 + 0.75 * 0.2
    assert weighted["frontier pass@1"] == pytest.approx(method / base - 1)
    with pytest.raises(ValueError, match="frontier_problems"):
        sim.predicted_gains({"grpo": grpo, "o": other}, "grpo", [2, 3], 8, [1])


def test_init_logits_replace_first_and_slope():
    config = dataclasses.replace(
        sim.SimConfig.from_mapping(sim_tiny.get_config(), ignore=sim.EXPERIMENT_KEYS), steps=2
    )
    logits = np.asarray(sim.initial_skill_logits(config.num_levels, 2.0, 0.5))
    by_slope = dataclasses.replace(config, init_logit_first=2.0, init_logit_slope=0.5)
    by_list = dataclasses.replace(config, init_logits=list(logits))
    assert by_list.init_logits == tuple(float(x) for x in logits)
    a = sim.simulate(by_slope, ("grpo",), num_seeds=1, fast_compile=True)["grpo"]
    b = sim.simulate(by_list, ("grpo",), num_seeds=1, fast_compile=True)["grpo"]
    np.testing.assert_array_equal(a.final_theta, b.final_theta)
    np.testing.assert_array_equal(b.trace.pass1[:, 0], a.trace.pass1[:, 0])


@pytest.mark.slow
def test_simulate_study_end_to_end(tmp_path):
    """A tiny run: the fit matches the reference's warm start, the calibrated rate reproduces
    GRPO's gain at its interpolation point's neighbours, and the real gains are read from the
    study file."""
    levels = 6
    warm = {f"L{level} pass@1": p for level, p in enumerate([0.95, 0.9, 0.8, 0.6, 0.3, 0.05], 1)}
    warm["pooled pass@1"] = float(np.mean(list(warm.values())))
    reference = {
        "warm_start": warm,
        "mean": {"grpo_arm": {"pooled pass@1": warm["pooled pass@1"] + 0.01}},
        "frontier_levels": [6],
    }
    study = {
        "primary_declaration": {"metric": "pass@8"},
        "primary": {"prompt_gdro": {"gain": 0.1, "low": -0.05, "high": 0.2}},
        "secondary": {"prompt_gdro": {"pooled pass@1": {"gain": 0.01, "low": 0.0, "high": 0.02}}},
    }
    (tmp_path / "reference.json").write_text(json.dumps(reference))
    (tmp_path / "study.json").write_text(json.dumps(study))
    config = sim_study.get_config()
    tiny = sim_tiny.get_config()
    for key in ("seeds", "fast_compile", "steps", "num_prompts", "num_levels", "pool_size"):
        config[key] = tiny[key]
    config.heldout_per_level = tiny.heldout_per_level
    config.classifier.window = tiny.classifier.window
    config.rollout_gdro.n_max = tiny.rollout_gdro.n_max
    config.methods = "grpo,prompt_gdro"
    config.progress = False
    config.update(
        reference=str(tmp_path / "reference.json"),
        reference_arm="grpo_arm",
        study=str(tmp_path / "study.json"),
        lr_candidates="0.01,1.0",
        calibration_seeds=2,
        test_problems=(100,) * 5 + (1000,),
    )
    wrong = config.copy_and_resolve_references()
    wrong.test_problems = (100,) * 8  # the study's 8 levels, not this config's 6
    with pytest.raises(ValueError, match=r"config.test_problems must give one count per level"):
        sim.simulate_study(wrong, str(tmp_path / "wrong"))
    record = sim.simulate_study(config, str(tmp_path / "out"))
    assert record["frontier_problems"] == [1000]
    assert len(record["init_logits"]) == levels
    np.testing.assert_allclose(
        record["fitted_pass1"], [warm[f"L{level} pass@1"] for level in range(1, 7)], atol=1e-6
    )
    gains = [row["pass1_gain"] for row in record["calibration"]]
    assert min(gains) <= record["target_pass1_gain"] <= max(gains)
    assert 0.01 < record["learning_rate"] < 1.0
    assert record["real"]["prompt_gdro"] == {
        "frontier pass@8": [0.1, -0.05, 0.2],
        "pooled pass@1": [0.01, 0.0, 0.02],
    }
    assert set(record["predicted"]) == {"prompt_gdro"}
    saved = json.loads((tmp_path / "out" / "comparison.json").read_text())
    assert saved["predicted"] == record["predicted"]
    assert "prompt_gdro" in (tmp_path / "out" / "comparison.md").read_text()


@pytest.mark.parametrize(
    ("profile", "study_profile", "statistic"),
    [("graded", "graded", "mean_accuracy"), ("cliff_declared", "cliff", "pass_at_k")],
)
def test_each_declared_profiles_simulation_has_its_studys_shape(profile, study_profile, statistic):
    """`sim_study.py:graded` and `:cliff_declared` model the declared study's runs: levels, pool,
    prompts and rollouts per step, classifier statistic and test counts are the study's run
    config's, and the simulator is fitted to that study's own validation reference."""
    config = sim_study.get_config(profile)
    run = rivals_study.get_config(study_profile).train
    assert (config.num_levels, config.tail_base, config.pool_size) == (
        run.task.num_levels,
        run.task.tail_base,
        run.task.pool_size,
    )
    assert (config.num_prompts, config.n_mean, config.steps) == (
        run.num_prompts,
        run.n_mean,
        run.steps,
    )
    assert config.classifier.statistic == run.classifier.statistic == statistic
    assert config.test_problems == run.task.test_per_level
    assert config.reference == f"results/study_{study_profile}_validation/study.json"
    assert config.study == f"results/study_{study_profile}/study.json"
