"""The training-inference mismatch: truncated importance weights and the gap's metrics against
plain-Python loops, and the weighted policy loss against a loop over its tokens."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdro_jax.losses import logprob_mismatch, policy_loss, truncated_is_weights
from tests.losses.test_surrogate import EPS_HIGH, EPS_LOW, make_batch, reference_surrogate

CAP = 2.0


def _engine_logp(trainer_logp, mask, seed=1):
    """The trainer's log-probs moved by up to +-1.2 nats: some ratios far above C = 2 (e^1.2 is
    3.3), some far below, padding NaN."""
    rng = np.random.default_rng(seed)
    engine = (trainer_logp + rng.uniform(-1.2, 1.2, size=trainer_logp.shape)).astype(np.float32)
    engine[~mask] = np.nan
    return engine


def test_truncated_weights_are_the_capped_ratio_token_by_token():
    _, trainer, _, _, mask = make_batch()
    engine = _engine_logp(trainer, mask)
    weights = np.asarray(truncated_is_weights(trainer, engine, mask, cap=CAP))
    capped = 0
    for i in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            if not mask[i, t]:
                assert weights[i, t] == 0.0
                continue
            ratio = math.exp(float(trainer[i, t]) - float(engine[i, t]))
            capped += ratio > CAP
            np.testing.assert_allclose(weights[i, t], min(ratio, CAP), rtol=1e-6)
    assert 0 < capped < mask.sum()  # both sides of the cap occur
    assert weights.max() <= CAP


def test_a_huge_gap_is_capped_without_overflow():
    trainer = np.array([[0.0, -1.0]], np.float32)
    engine = np.array([[-200.0, -1.0]], np.float32)  # the engine found token 0 e^-200 likely
    weights = np.asarray(truncated_is_weights(trainer, engine, np.ones((1, 2), bool), cap=3.0))
    np.testing.assert_allclose(weights, [[3.0, 1.0]], rtol=1e-6)


def test_the_cap_is_validated():
    with pytest.raises(ValueError, match="cap must be >= 1"):
        truncated_is_weights(np.zeros((1, 1)), np.zeros((1, 1)), np.ones((1, 1)), cap=0.5)


def test_mismatch_metrics_against_a_loop_and_zero_for_equal_logprobs():
    _, trainer, _, _, mask = make_batch()
    engine = _engine_logp(trainer, mask)
    metrics = {k: float(v) for k, v in logprob_mismatch(trainer, engine, mask, cap=CAP).items()}
    gaps, above = [], []
    for i, t in np.argwhere(mask):
        gap = float(trainer[i, t]) - float(engine[i, t])
        gaps.append(abs(gap))
        above.append(gap > math.log(CAP))
    assert metrics["logprob_mismatch_mean"] == pytest.approx(np.mean(gaps), rel=1e-6)
    assert metrics["logprob_mismatch_max"] == pytest.approx(max(gaps), rel=1e-6)
    assert metrics["is_weight_capped_fraction"] == pytest.approx(np.mean(above), rel=1e-6)
    same = logprob_mismatch(trainer, np.where(mask, trainer, np.nan), mask, cap=CAP)
    assert {k: float(v) for k, v in same.items()} == {
        "logprob_mismatch_mean": 0.0,
        "logprob_mismatch_max": 0.0,
        "is_weight_capped_fraction": 0.0,
    }


def test_token_weights_scale_each_token_of_the_loss_and_its_gradient():
    logp, old_logp, _, adv, mask = make_batch()
    engine = _engine_logp(old_logp, mask, seed=2)
    weights = np.asarray(truncated_is_weights(old_logp, engine, mask, cap=CAP))
    value, grad, _, _ = reference_surrogate(logp, old_logp, adv, mask)
    tokens = mask.sum()
    expected_loss = -np.sum(value * weights) / tokens
    expected_grad = -grad * weights / tokens

    def loss(logp):
        return policy_loss(
            logp, old_logp, adv, mask, eps_low=EPS_LOW, eps_high=EPS_HIGH,
            aggregation="token_mean", token_weight_RT=weights,
        )[0]  # fmt: skip

    got, got_grad = jax.value_and_grad(loss)(jnp.asarray(logp))
    assert float(got) == pytest.approx(expected_loss, rel=1e-5)
    np.testing.assert_allclose(np.where(mask, got_grad, 0.0), expected_grad, rtol=1e-5, atol=1e-7)
    # Weights of one: the unweighted loss.
    unweighted = policy_loss(logp, old_logp, adv, mask, eps_low=EPS_LOW, eps_high=EPS_HIGH)[0]
    ones = policy_loss(
        logp, old_logp, adv, mask, eps_low=EPS_LOW, eps_high=EPS_HIGH,
        token_weight_RT=mask.astype(np.float32),
    )[0]  # fmt: skip
    assert float(ones) == pytest.approx(float(unweighted), rel=1e-6)
