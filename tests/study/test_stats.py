"""The study's paired gain and its bootstrap interval, against hand-computed values and a loop."""

import numpy as np
import pytest

from gdro_jax.study import _stats

# Two seeds x three problems (e.g. each frontier problem's pass@8).
METHOD = np.array([[1.0, 0.5, 0.0], [1.0, 1.0, 0.5]])
BASE = np.array([[0.5, 0.5, 0.0], [1.0, 0.5, 0.5]])


def test_the_gain_and_the_per_seed_gains_equal_hand_computed_values():
    result = _stats.paired_relative_gain(METHOD, BASE, num_resamples=200)
    # mean(method) = 4/6, mean(base) = 3/6: +1/3. Seed 0: (1.5/3) / (1/3) - 1 = 0.5; seed 1:
    # (2.5/3) / (2/3) - 1 = 0.25.
    assert result.gain == pytest.approx(1 / 3, abs=1e-12)
    assert result.per_seed == pytest.approx((0.5, 0.25), abs=1e-12)


def test_bootstrap_gains_use_the_same_draws_for_both_methods():
    seeds = np.array([[0, 0], [1, 1], [0, 1]])
    problems = np.array([[0, 1, 2], [2, 2, 0], [1, 1, 1]])
    gains = _stats.bootstrap_gains(METHOD, BASE, seeds, problems)
    # Resample 0: seed 0 twice, every problem: 0.5 / (1/3) - 1 = 0.5. Resample 1: seed 1 twice,
    # problems 2, 2, 0: (0.5 + 0.5 + 1) / (0.5 + 0.5 + 1) - 1 = 0. Resample 2: both seeds,
    # problem 1 thrice: (0.5 + 1) / (0.5 + 0.5) - 1 = 0.5.
    np.testing.assert_allclose(gains, [0.5, 0.0, 0.5], atol=1e-12)


def test_the_interval_equals_a_loop_over_the_same_draws():
    rng = np.random.default_rng(3)
    base = rng.random((5, 40))
    method = np.clip(base + rng.normal(0.05, 0.1, base.shape), 0, 1)
    result = _stats.paired_relative_gain(method, base, num_resamples=500, seed=7)
    draws = np.random.default_rng(7)
    seeds = draws.integers(0, 5, size=(500, 5))
    problems = draws.integers(0, 40, size=(500, 40))
    looped = []
    for k in range(500):
        m = np.mean([method[s, p] for s in seeds[k] for p in problems[k]])
        b = np.mean([base[s, p] for s in seeds[k] for p in problems[k]])
        looped.append(m / b - 1)
    low, high = np.percentile(looped, [2.5, 97.5])
    assert result.low == pytest.approx(low, rel=1e-9)
    assert result.high == pytest.approx(high, rel=1e-9)
    assert result.standard_error == pytest.approx(np.std(looped, ddof=1), rel=1e-9)
    assert result.low < result.gain < result.high


def test_a_constant_ratio_gives_a_point_interval():
    result = _stats.paired_relative_gain(2 * BASE, BASE, num_resamples=300)
    assert result.gain == pytest.approx(1.0)
    assert result.low == pytest.approx(1.0) and result.high == pytest.approx(1.0)


def test_the_detectable_gain_is_2_8_standard_errors():
    assert _stats.detectable_gain(0.05) == pytest.approx(0.05 * (1.959964 + 0.841621), rel=1e-4)


@pytest.mark.parametrize(
    "method, base, match",
    [
        (METHOD, BASE[:1], "one non-empty shape"),
        (METHOD, np.zeros_like(BASE), "base's mean is 0"),
        (METHOD * np.nan, BASE, "finite"),
    ],
)
def test_bad_input_is_named(method, base, match):
    with pytest.raises(ValueError, match=match):
        _stats.paired_relative_gain(method, base)
