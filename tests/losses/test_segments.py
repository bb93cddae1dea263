"""`segment_mean` against a plain numpy loop: fractional weights, masks and empty segments."""

import numpy as np
import pytest

from gdro_jax import losses


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_segment_mean_matches_a_loop(seed):
    rng = np.random.default_rng(seed)
    values = rng.normal(size=40).astype(np.float32)
    segments = rng.integers(0, 6, size=40).astype(np.int32)  # segment 6 and 7 stay empty
    weights = rng.uniform(0.0, 0.3, size=40).astype(np.float32)  # sums below 1 in a segment
    weights[rng.random(40) < 0.3] = 0.0
    mean, total = losses.segment_mean(values, segments, weights, 8)
    for s in range(8):
        w = weights[segments == s]
        expected = (w * values[segments == s]).sum() / w.sum() if w.sum() > 0 else 0.0
        np.testing.assert_allclose(mean[s], expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(total[s], w.sum(), rtol=1e-5, atol=1e-7)
    assert float(mean[6]) == 0.0 and float(total[7]) == 0.0
