"""The simulator's gain table (`summarize`, `paired_gain`) against hand-computed values.

The outputs are fabricated: two seeds, three levels. With two seeds a bootstrap of the mean over
seeds draws each seed twice with probability 1/4, so over 2000 resamples the 2.5th and 97.5th
percentiles are exactly the smaller and the larger seed's value (the mixed draws fall between);
with one seed the interval is the point itself.
"""

import numpy as np
import pytest

from gdro_jax import sim

SHARES = np.array([0.5, 0.3, 0.2])
# final_pass_k[seed, level]; pass@1 a fixed fraction of it.
PASS_K = {
    "grpo": np.array([[0.5, 0.2, 0.1], [0.7, 0.4, 0.1]]),
    "prompt_gdro": np.array([[0.6, 0.3, 0.1], [0.7, 0.5, 0.3]]),
}


def _outputs(pass_k):
    return {
        method: sim.SimOutput(
            trace=None, final_pass1=0.5 * values, final_pass_k=values, final_theta=None
        )
        for method, values in pass_k.items()
    }


def _columns(values):
    """Per seed: the three levels, their plain mean (pooled) and their share-weighted mean."""
    rows = []
    for level_values in values:
        pooled = sum(level_values) / 3
        natural = sum(s * v for s, v in zip(SHARES, level_values, strict=True))
        rows.append([*level_values, pooled, natural])
    return np.array(rows)


def test_summarize_gives_the_seed_mean_and_the_seed_range_per_column():
    summary = sim.summarize(_outputs(PASS_K), SHARES, eval_k=8)
    assert set(summary) == {"pass@1", "pass@8"}
    for method, values in PASS_K.items():
        for metric, scale in (("pass@8", 1.0), ("pass@1", 0.5)):
            columns = _columns(scale * values)
            interval = summary[metric][method]
            np.testing.assert_allclose(interval.mean, (columns[0] + columns[1]) / 2, rtol=1e-12)
            np.testing.assert_allclose(interval.lower, np.minimum(*columns), rtol=1e-12)
            np.testing.assert_allclose(interval.upper, np.maximum(*columns), rtol=1e-12)


def test_paired_gain_is_the_ratio_of_seed_means_minus_one_with_the_per_seed_range():
    gains = sim.paired_gain(_outputs(PASS_K), SHARES)
    assert set(gains) == {"prompt_gdro"}
    ours, base = _columns(PASS_K["prompt_gdro"])[:, -2:], _columns(PASS_K["grpo"])[:, -2:]
    expected = (ours[0] + ours[1]) / (base[0] + base[1]) - 1  # pooled, natural
    per_seed = ours / base - 1  # what a draw of one seed twice gives
    np.testing.assert_allclose(gains["prompt_gdro"].mean, expected, rtol=1e-12)
    np.testing.assert_allclose(gains["prompt_gdro"].lower, per_seed.min(axis=0), rtol=1e-12)
    np.testing.assert_allclose(gains["prompt_gdro"].upper, per_seed.max(axis=0), rtol=1e-12)
    # Pooled by hand: grpo seeds 0.8/3 and 1.2/3, prompt_gdro 1.0/3 and 1.5/3: gain 2.5/2 - 1.
    assert gains["prompt_gdro"].mean[0] == pytest.approx(0.25, rel=1e-12)


def test_one_seed_gives_a_point_interval():
    one_seed = {method: values[:1] for method, values in PASS_K.items()}
    summary = sim.summarize(_outputs(one_seed), SHARES)
    gains = sim.paired_gain(_outputs(one_seed), SHARES)
    columns = _columns(PASS_K["grpo"][:1])[0]
    interval = summary["pass@8"]["grpo"]
    for bound in (interval.mean, interval.lower, interval.upper):
        np.testing.assert_allclose(bound, columns, rtol=1e-12)
    ratio = _columns(PASS_K["prompt_gdro"][:1])[0, -2:] / columns[-2:] - 1
    for bound in gains["prompt_gdro"]:
        np.testing.assert_allclose(bound, ratio, rtol=1e-12)
