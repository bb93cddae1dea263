"""The controllers' private `segment_mean` (they import no other gdro_jax package) against a numpy
loop, and bit for bit equal to `gdro_jax.losses.segment_mean`, its twin for the losses."""

import numpy as np
import pytest

from gdro_jax import losses
from gdro_jax.controllers._segments import segment_mean


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_segment_mean_matches_a_loop_and_the_losses_copy(seed):
    rng = np.random.default_rng(seed)
    values = rng.normal(size=40).astype(np.float32)
    segments = rng.integers(0, 6, size=40).astype(np.int32)  # segments 6 and 7 stay empty
    weights = rng.uniform(0.0, 0.3, size=40).astype(np.float32)
    weights[rng.random(40) < 0.3] = 0.0
    mean, total = segment_mean(values, segments, weights, 8)
    for s in range(8):
        w = weights[segments == s]
        expected = (w * values[segments == s]).sum() / w.sum() if w.sum() > 0 else 0.0
        np.testing.assert_allclose(mean[s], expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(total[s], w.sum(), rtol=1e-5, atol=1e-7)
    twin_mean, twin_total = losses.segment_mean(values, segments, weights, 8)
    np.testing.assert_array_equal(np.asarray(mean), np.asarray(twin_mean))
    np.testing.assert_array_equal(np.asarray(total), np.asarray(twin_total))
