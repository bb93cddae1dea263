"""Clipped surrogate, k3 KL, aggregation and the policy loss against loop references."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gdro_jax.losses import AGGREGATIONS, aggregate, clipped_surrogate, k3_kl, policy_loss

EPS_LOW, EPS_HIGH = 0.2, 0.28
R, T, MAX_LENGTH = 5, 6, 8.0


def make_batch(seed=0):
    """Five rollouts of up to six tokens; row 3 is a fully masked slot, rows differ in length."""
    rng = np.random.default_rng(seed)
    lengths = [6, 2, 4, 0, 5]
    mask = np.array([[t < n for t in range(T)] for n in lengths])
    old_logp = rng.uniform(-3.0, -0.1, size=(R, T)).astype(np.float32)
    # Log-ratios rise from -0.6 to 0.6 along each row (jittered off the clip edges), so that the
    # low clip binds on the short negative-advantage rows and the high clip on the long positive.
    log_ratio = np.linspace(-0.6, 0.6, T)[None, :] + rng.uniform(-0.03, 0.03, size=(R, T))
    logp = (old_logp + log_ratio).astype(np.float32)
    ref_logp = (old_logp + rng.uniform(-0.5, 0.5, size=(R, T))).astype(np.float32)
    adv = np.array([1.3, -0.7, -1.1, 0.4, 0.9], np.float32)
    # Padding carries garbage: it must not reach any output or gradient.
    for array in (logp, old_logp, ref_logp):
        array[~mask] = np.nan
    return logp, old_logp, ref_logp, adv, mask


def reference_surrogate(logp, old_logp, adv, mask, eps_low=EPS_LOW, eps_high=EPS_HIGH):
    """Per token objective, its derivative w.r.t. logp, and the low/high clip indicators."""
    value = np.zeros(logp.shape)
    grad = np.zeros(logp.shape)
    low = np.zeros(logp.shape, bool)
    high = np.zeros(logp.shape, bool)
    for i in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if not mask[i, t]:
                continue
            rho = math.exp(float(logp[i, t]) - float(old_logp[i, t]))
            a = float(adv[i])
            unclipped = rho * a
            clipped = min(max(rho, 1 - eps_low), 1 + eps_high) * a
            value[i, t] = min(unclipped, clipped)
            low[i, t] = a < 0 and rho < 1 - eps_low
            high[i, t] = a > 0 and rho > 1 + eps_high
            grad[i, t] = 0.0 if (low[i, t] or high[i, t]) else rho * a
    return value, grad, low, high


def reference_k3(logp, ref_logp, mask):
    value = np.zeros(logp.shape)
    grad = np.zeros(logp.shape)
    for i in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if mask[i, t]:
                u = math.exp(float(ref_logp[i, t]) - float(logp[i, t]))
                value[i, t] = u - math.log(u) - 1
                grad[i, t] = 1 - u
    return value, grad


def reference_token_weights(mask, mode, max_length=MAX_LENGTH):
    """d aggregate / d x_it: the weight each token gets in each aggregation mode."""
    weights = np.zeros(mask.shape)
    lengths = mask.sum(axis=1)
    num_tokens = lengths.sum()
    num_sequences = sum(1 for n in lengths if n > 0)
    for i in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            if not mask[i, t]:
                continue
            if mode == "token_mean":
                weights[i, t] = 1 / num_tokens
            elif mode == "seq_mean_token_mean":
                weights[i, t] = 1 / (num_sequences * lengths[i])
            else:
                weights[i, t] = 1 / (num_sequences * max_length)
    return weights


def reference_aggregate(values, mask, mode, max_length=MAX_LENGTH):
    weights = reference_token_weights(mask, mode, max_length)
    return sum(
        weights[i, t] * values[i, t]
        for i in range(mask.shape[0])
        for t in range(mask.shape[1])
        if mask[i, t]
    )


@functools.partial(jax.jit, static_argnames=("aggregation", "kl_coef"))
def jitted_loss_and_grad(logp, old_logp, adv, mask, ref_logp, aggregation, kl_coef):
    def loss_fn(logp):
        return policy_loss(
            logp,
            old_logp,
            adv,
            mask,
            eps_low=EPS_LOW,
            eps_high=EPS_HIGH,
            aggregation=aggregation,
            kl_coef=kl_coef,
            ref_logp_RT=ref_logp if kl_coef > 0 else None,
            max_length=MAX_LENGTH,
        )

    return jax.value_and_grad(loss_fn, has_aux=True)(logp)


@pytest.fixture(scope="module")
def batch():
    return make_batch()


def test_surrogate_and_clip_fractions_match_the_reference(batch):
    logp, old_logp, _, adv, mask = batch
    surrogate, stats = jax.jit(clipped_surrogate)(logp, old_logp, adv, mask)
    value, _, low, high = reference_surrogate(logp, old_logp, adv, mask)
    np.testing.assert_allclose(np.asarray(surrogate), value, rtol=1e-5, atol=1e-6)
    assert low.sum() > 0 and high.sum() > 0  # the batch exercises both clip sides
    assert float(stats.clip_fraction_low) == pytest.approx(low.sum() / mask.sum(), abs=1e-6)
    assert float(stats.clip_fraction_high) == pytest.approx(high.sum() / mask.sum(), abs=1e-6)
    ratios = [math.exp(logp[i, t] - old_logp[i, t]) for i, t in zip(*np.nonzero(mask), strict=True)]
    assert float(stats.ratio_mean) == pytest.approx(np.mean(ratios), rel=1e-5)


def test_clip_higher_is_asymmetric():
    # Rows: A = +1 and A = -1; columns: rho = 0.5, 0.75, 0.85, 1.25, 1.5.
    rho = np.array([0.5, 0.75, 0.85, 1.25, 1.5])
    logp = np.log(np.stack([rho, rho])).astype(np.float32)
    old_logp = np.zeros_like(logp)
    adv = np.array([1.0, -1.0], np.float32)
    mask = np.ones_like(logp, bool)
    surrogate, stats = clipped_surrogate(logp, old_logp, adv, mask, eps_low=0.2, eps_high=0.28)
    # A > 0: only the top is clipped, at 1 + eps_high (1.25 < 1.28 passes, 1.5 -> 1.28).
    np.testing.assert_allclose(np.asarray(surrogate[0]), [0.5, 0.75, 0.85, 1.25, 1.28], rtol=1e-5)
    # A < 0: only the bottom is clipped, at 1 - eps_low (0.75 -> 0.8, 0.5 -> 0.8).
    np.testing.assert_allclose(
        np.asarray(surrogate[1]), [-0.8, -0.8, -0.85, -1.25, -1.5], rtol=1e-5
    )
    assert float(stats.clip_fraction_high) == pytest.approx(1 / 10)
    assert float(stats.clip_fraction_low) == pytest.approx(2 / 10)
    grad = jax.grad(lambda lp: clipped_surrogate(lp, old_logp, adv, mask)[0].sum())(logp)
    # Active clips pass no gradient; elsewhere d(rho A)/dlogp = rho A.
    np.testing.assert_allclose(
        np.asarray(grad), [[0.5, 0.75, 0.85, 1.25, 0.0], [0.0, 0.0, -0.85, -1.25, -1.5]], rtol=1e-5
    )


def test_k3_is_nonnegative_zero_when_equal_and_matches_the_reference(batch):
    logp, _, ref_logp, _, mask = batch
    kl = np.asarray(jax.jit(k3_kl)(logp, ref_logp, mask))
    value, _ = reference_k3(logp, ref_logp, mask)
    np.testing.assert_allclose(kl, value, rtol=1e-4, atol=1e-7)
    assert np.all(kl >= 0.0)
    same = np.where(mask, logp, 0.0)
    assert np.all(np.asarray(k3_kl(same, same)) == 0.0)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(-30.0, 30.0, allow_nan=False), min_size=8, max_size=8),
    st.lists(st.floats(-1e-3, 1e-3, allow_nan=False), min_size=8, max_size=8),
)
def test_k3_is_nonnegative_for_any_log_ratio(logps, offsets):
    logp = np.array([logps], np.float32)
    # Tiny offsets probe rounding near the minimum; large ones probe the tails.
    ref_logp = np.array([[a + b for a, b in zip(logps[::-1], offsets, strict=True)]], np.float32)
    assert np.all(np.asarray(k3_kl(logp, ref_logp)) >= 0.0)


@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_aggregate_matches_the_reference_and_ignores_padding(batch, mode):
    logp, _, _, _, mask = batch  # logp is NaN on padding and on the masked slot
    got = float(
        jax.jit(aggregate, static_argnames=("mode", "max_length"))(
            logp, mask, mode=mode, max_length=MAX_LENGTH
        )
    )
    assert got == pytest.approx(reference_aggregate(logp, mask, mode), rel=1e-5)


def test_aggregate_of_an_all_masked_batch_is_zero():
    for mode in AGGREGATIONS:
        assert float(aggregate(np.ones((2, 3)), np.zeros((2, 3)), mode=mode, max_length=3)) == 0.0


@pytest.mark.parametrize("mode", AGGREGATIONS)
@pytest.mark.parametrize("kl_coef", [0.0, 0.05])
def test_policy_loss_value_and_gradient_match_the_analytic_reference(batch, mode, kl_coef):
    logp, old_logp, ref_logp, adv, mask = batch
    (loss, metrics), grad = jitted_loss_and_grad(
        logp, old_logp, adv, mask, ref_logp, aggregation=mode, kl_coef=kl_coef
    )
    surrogate, surrogate_grad, _, _ = reference_surrogate(logp, old_logp, adv, mask)
    kl, kl_grad = reference_k3(logp, ref_logp, mask)
    weights = reference_token_weights(mask, mode)
    expected_loss = -reference_aggregate(surrogate, mask, mode) + kl_coef * reference_aggregate(
        kl, mask, mode
    )
    assert float(loss) == pytest.approx(expected_loss, rel=1e-5, abs=1e-7)
    expected_grad = weights * (-surrogate_grad + kl_coef * kl_grad)
    np.testing.assert_allclose(np.asarray(grad), expected_grad, rtol=1e-4, atol=1e-7)
    assert np.all(np.asarray(grad)[~mask] == 0.0)  # padding (NaN inputs) gets no gradient
    assert float(metrics["loss"]) == pytest.approx(float(loss))
    if kl_coef > 0:
        assert float(metrics["kl"]) == pytest.approx(
            reference_aggregate(kl, mask, "token_mean"), rel=1e-4
        )
    else:
        assert "kl" not in metrics


def test_policy_loss_gradient_matches_finite_differences_of_the_reference(batch):
    logp, old_logp, ref_logp, adv, mask = batch
    (_, _), grad = jitted_loss_and_grad(
        logp, old_logp, adv, mask, ref_logp, aggregation="seq_mean_token_mean", kl_coef=0.05
    )

    def reference_loss(logp64):
        surrogate, _, _, _ = reference_surrogate(logp64, old_logp, adv, mask)
        kl, _ = reference_k3(logp64, ref_logp, mask)
        mode = "seq_mean_token_mean"
        return -reference_aggregate(surrogate, mask, mode) + 0.05 * reference_aggregate(
            kl, mask, mode
        )

    step = 1e-6
    for i, t in zip(*np.nonzero(mask), strict=True):
        plus, minus = logp.astype(np.float64), logp.astype(np.float64)
        plus[i, t] += step
        minus[i, t] -= step
        finite_difference = (reference_loss(plus) - reference_loss(minus)) / (2 * step)
        assert float(grad[i, t]) == pytest.approx(finite_difference, rel=1e-3, abs=1e-6)


def test_policy_loss_jit_equals_eager_and_needs_no_reference_without_kl(batch):
    logp, old_logp, _, adv, mask = batch
    eager_loss, eager_metrics = policy_loss(
        logp, old_logp, adv, mask, aggregation="token_mean", ref_logp_RT=None
    )
    (jit_loss, jit_metrics), _ = jitted_loss_and_grad(
        logp, old_logp, adv, mask, None, aggregation="token_mean", kl_coef=0.0
    )
    assert float(eager_loss) == pytest.approx(float(jit_loss), rel=1e-6)
    assert (
        set(eager_metrics)
        == set(jit_metrics)
        == {
            "loss",
            "pg_loss",
            "clip_fraction_low",
            "clip_fraction_high",
            "ratio_mean",
        }
    )
    for key in eager_metrics:
        assert float(eager_metrics[key]) == pytest.approx(float(jit_metrics[key]), rel=1e-6)


def test_first_mini_batch_has_unit_ratio_and_no_clipping(batch):
    logp, _, _, adv, mask = batch
    _, metrics = policy_loss(logp, logp, adv, mask, aggregation="token_mean")
    assert float(metrics["ratio_mean"]) == pytest.approx(1.0, abs=1e-7)
    assert float(metrics["clip_fraction_low"]) == 0.0
    assert float(metrics["clip_fraction_high"]) == 0.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"eps_low": -0.1}, "eps_low=-0.1"),
        ({"eps_low": 1.0}, "eps_low=1.0"),
        ({"eps_high": -0.01}, "eps_high=-0.01"),
        ({"kl_coef": -1.0}, "kl_coef=-1.0"),
        ({"kl_coef": 0.1}, "ref_logp_RT is required"),
        ({"aggregation": "sum"}, "aggregation='sum'"),
        ({"aggregation": "seq_mean_token_sum_norm"}, "max_length=None"),
        ({"aggregation": "seq_mean_token_sum_norm", "max_length": 0}, "max_length=0"),
    ],
)
def test_policy_loss_rejects_bad_hyperparameters(batch, kwargs, message):
    logp, old_logp, _, adv, mask = batch
    with pytest.raises(ValueError, match=message):
        policy_loss(logp, old_logp, adv, mask, **kwargs)


def test_aggregate_rejects_an_unknown_mode_naming_it():
    with pytest.raises(ValueError, match="mode='mean'"):
        aggregate(jnp.zeros((2, 2)), jnp.ones((2, 2)), mode="mean")


def test_shape_mismatches_raise():
    with pytest.raises(ValueError, match="old_logp_RT"):
        clipped_surrogate(np.zeros((2, 3)), np.zeros((2, 4)), np.zeros(2), np.ones((2, 3)))
    with pytest.raises(ValueError, match="adv_R"):
        clipped_surrogate(np.zeros((2, 3)), np.zeros((2, 3)), np.zeros(3), np.ones((2, 3)))


def test_rollouts_sharded_over_eight_devices_give_the_same_loss_and_gradient():
    # Auto axes, as the project's meshes (gdro_jax.models.make_mesh): the compiler propagates.
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    logp, old_logp, ref_logp, adv, mask = (np.concatenate([x] * 2)[:8] for x in make_batch(2))
    args = (logp, old_logp, adv, mask, ref_logp)
    (loss, _), grad = jitted_loss_and_grad(*args, aggregation="seq_mean_token_mean", kl_coef=0.05)
    sharded = [jax.device_put(x, rows) for x in args]
    (sharded_loss, _), sharded_grad = jitted_loss_and_grad(
        *sharded, aggregation="seq_mean_token_mean", kl_coef=0.05
    )
    assert float(sharded_loss) == pytest.approx(float(loss), rel=1e-6)
    np.testing.assert_allclose(np.asarray(sharded_grad), np.asarray(grad), rtol=1e-6, atol=1e-9)
