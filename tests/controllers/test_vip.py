"""VIP's allocation and Gaussian process against references written here.

- The allocation: brute-force enumeration of every integer allocation on small cases, scipy's
  SLSQP on the continuous relaxation (a lower bound the integer optimum cannot beat, and a
  rounding of it that the optimum cannot lose to), and the exact total whatever the budget.
- The GP: a float64 numpy loop of the posterior-mean update, carried over several batches.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import minimize

from gdro_jax import controllers
from gdro_jax.controllers import vip_allocation


def _objective(p, n, gamma):
    """VIP's objective in float64: sum_i p(1-p)(n-1)/n^2 + gamma log(p) n."""
    p, n = np.asarray(p, np.float64), np.asarray(n, np.float64)
    return float(np.sum(p * (1 - p) * (n - 1) / n**2 + gamma * np.log(p) * n))


def _brute_force(p, total, n_min, n_max, gamma):
    best = None
    for counts in itertools.product(range(n_min, n_max + 1), repeat=len(p)):
        if sum(counts) == total:
            value = _objective(p, counts, gamma)
            if best is None or value < best:
                best = value
    return best


RATES = [
    [0.5, 0.5, 0.5],
    [0.1, 0.5, 0.9],
    [1e-6, 0.3, 0.999999],
    [0.02, 0.2, 0.6, 0.95],
    [0.7, 0.7, 0.05, 0.4],
]


@pytest.mark.parametrize("gamma", [0.0, 4e-4, 0.02])
@pytest.mark.parametrize("rates", RATES)
def test_the_allocation_is_the_brute_force_optimum(rates, gamma):
    n_min, n_max = 2, 7
    for n_mean in (2, 4, 5, 7):
        total = len(rates) * n_mean
        counts, value = vip_allocation(
            jnp.asarray(rates), total, n_min=n_min, n_max=n_max, gamma=gamma
        )
        counts = np.asarray(counts)
        assert counts.sum() == total and counts.min() >= n_min and counts.max() <= n_max
        best = _brute_force(rates, total, n_min, n_max, gamma)
        assert _objective(rates, counts, gamma) == pytest.approx(best, abs=2e-7), (n_mean, counts)
        assert float(value) == pytest.approx(best, abs=2e-6)


def test_the_log_term_sends_rollouts_to_the_unlikely_prompts():
    # Equal variance a = p(1-p) for p and 1-p: only gamma's term tells them apart.
    counts, _ = vip_allocation(jnp.asarray([0.2, 0.8]), 12, n_min=2, n_max=10, gamma=0.02)
    assert counts[0] > counts[1]


@pytest.mark.parametrize("seed", range(4))
def test_the_integer_optimum_against_slsqp_on_the_continuous_relaxation(seed):
    # VIP's own bounds (4..32, where every term is convex) and a budget of 16 a prompt.
    rng = np.random.default_rng(seed)
    rates = rng.uniform(0.02, 0.98, 8)
    gamma, n_min, n_max, total = 4e-4, 4, 32, 8 * 16
    relaxed = minimize(
        lambda n: _objective(rates, n, gamma),
        np.full(8, total / 8),
        method="SLSQP",
        bounds=[(n_min, n_max)] * 8,
        constraints=[{"type": "eq", "fun": lambda n: np.sum(n) - total}],
        options={"ftol": 1e-12, "maxiter": 500},
    )
    assert relaxed.success, relaxed.message
    counts, _ = vip_allocation(jnp.asarray(rates), total, n_min=n_min, n_max=n_max, gamma=gamma)
    counts = np.asarray(counts)
    value = _objective(rates, counts, gamma)
    # The relaxation bounds the integer optimum from below...
    assert value >= relaxed.fun - 1e-7
    # ...and a largest-remainder rounding of it is a feasible allocation the optimum beats.
    floor = np.floor(relaxed.x).astype(int)
    floor[np.argsort(-(relaxed.x - floor))[: total - floor.sum()]] += 1
    assert value <= _objective(rates, floor, gamma) + 1e-9
    # Separable and convex here: the optimum lies within one rollout of the relaxed one.
    assert np.max(np.abs(counts - relaxed.x)) < 1.0 + 1e-3


def test_the_total_is_exact_whatever_the_budget_and_the_rates():
    rng = np.random.default_rng(1)
    for _ in range(16):
        num = int(rng.integers(1, 9))
        rates = np.clip(rng.uniform(-0.2, 1.2, num), 1e-6, 1 - 1e-6)
        n_min = int(rng.integers(1, 4))
        n_max = n_min + int(rng.integers(0, 9))
        total = int(rng.integers(num * n_min, num * n_max + 1))
        counts, _ = vip_allocation(
            jnp.asarray(rates),
            total,
            n_min=n_min,
            n_max=n_max,
            gamma=float(rng.choice([0.0, 4e-4, 0.05])),
        )
        counts = np.asarray(counts)
        assert counts.sum() == total, (rates, n_min, n_max, total, counts)
        assert counts.min() >= n_min and counts.max() <= n_max


def test_a_total_outside_the_bounds_is_refused():
    with pytest.raises(ValueError, match="total=40 must lie in"):
        vip_allocation(jnp.full((3,), 0.5), 40, n_min=2, n_max=12, gamma=0.0)


LENGTH, NOISE, PRIOR, EPS = 0.4, 1e-4, -1.0, 1e-6


def _reference_gp(features, batches):
    """VIP's posterior-mean update in float64 numpy, carried over the batches."""
    mean = np.full(len(features), PRIOR, np.float64)
    dist2 = ((features[:, None, :] - features[None, :, :]) ** 2).sum(-1)
    kernel = np.exp(-0.5 * dist2 / LENGTH**2)
    for ids, correct, rollouts in batches:
        rate = np.clip(correct / rollouts, EPS, 1 - EPS)
        target = np.log(rate / (1 - rate))
        k_oo = kernel[np.ix_(ids, ids)] + NOISE * np.eye(len(ids))
        alpha = np.linalg.solve(k_oo, target - mean[ids])
        mean = mean + kernel[:, ids] @ alpha
        mean[ids] = target
    return mean


def _batches(rng, num_prompts, steps, batch):
    out = []
    for _ in range(steps):
        ids = rng.choice(num_prompts, batch, replace=False)
        rollouts = rng.integers(2, 9, batch)
        out.append((ids, rng.integers(0, rollouts + 1), rollouts))
    return out


def test_the_gaussian_process_carries_its_posterior_mean_as_the_reference_does():
    rng = np.random.default_rng(0)
    num_prompts = 24
    features = rng.uniform(0, 1, (num_prompts, 2)).astype(np.float32)
    part = controllers.vip(
        num_prompts,
        prompt_features=features,
        lengthscale=LENGTH,
        noise=NOISE,
        prior_logit=PRIOR,
        eps=EPS,
    )
    state = part.init()
    # Never seen: every prompt predicts the prior.
    np.testing.assert_allclose(
        part.predict(state, jnp.arange(num_prompts)), 1 / (1 + np.exp(-PRIOR)), rtol=1e-6
    )
    batches = _batches(rng, num_prompts, 3, 4)
    update = jax.jit(part.update)
    for ids, correct, rollouts in batches:
        state = update(state, prompt_ids=ids, num_correct=correct, num_rollouts=rollouts)
    want = _reference_gp(features.astype(np.float64), batches)
    # A float32 Cholesky of K + noise I (condition number up to ~1/noise = 1e4) is good to about
    # 1e4 * 2^-24 = 6e-4 of the largest logit: allow 1e-3 of it (the interpolated logits reach
    # +-44 here). A sigmoid's slope is at most 1/4.
    bound = 1e-3 * np.max(np.abs(want))
    assert np.max(np.abs(np.asarray(state.mean) - want)) <= bound
    p = np.asarray(part.predict(state, jnp.arange(num_prompts)))
    assert np.max(np.abs(p - np.clip(1 / (1 + np.exp(-want)), EPS, 1 - EPS))) <= bound / 4
    # The carried mean matters: a mean reset to the prior before each batch would differ.
    reset = _reference_gp(features.astype(np.float64), batches[-1:])
    assert np.max(np.abs(reset - want)) > 0.1


def test_without_features_a_prompt_learns_only_from_its_own_visits():
    part = controllers.vip(6, prior_logit=0.0)
    state = part.update(
        part.init(),
        prompt_ids=jnp.asarray([1, 4]),
        num_correct=jnp.asarray([1, 3]),
        num_rollouts=jnp.asarray([4, 4]),
    )
    p = np.asarray(part.predict(state, jnp.arange(6)))
    np.testing.assert_allclose(p[[1, 4]], [0.25, 0.75], rtol=1e-5)
    np.testing.assert_allclose(p[[0, 2, 3, 5]], 0.5, rtol=1e-6)


def test_unobserved_rows_change_nothing():
    rng = np.random.default_rng(2)
    features = rng.uniform(0, 1, (10, 3))
    part = controllers.vip(10, prompt_features=features)
    update = jax.jit(part.update)
    ids, correct, rollouts = jnp.asarray([2, 5, 7]), jnp.asarray([1, 2, 0]), jnp.asarray([4, 4, 0])
    masked = update(
        part.init(),
        prompt_ids=ids,
        num_correct=correct,
        num_rollouts=rollouts,
        valid=jnp.asarray([True, False, True]),
    )
    alone = update(
        part.init(), prompt_ids=ids[:1], num_correct=correct[:1], num_rollouts=rollouts[:1]
    )
    np.testing.assert_allclose(masked.mean, alone.mean, atol=1e-5)


def test_allocate_spends_the_batch_on_the_predicted_rates():
    part = controllers.vip(8, n_mean=4, n_min=2, n_max=8, gamma=4e-4)
    state = part.update(
        part.init(),
        prompt_ids=jnp.arange(4),
        num_correct=jnp.asarray([0, 1, 3, 4]),
        num_rollouts=jnp.full((4,), 4),
    )
    ids = jnp.asarray([0, 1, 2, 3, 5])
    counts, info = part.allocate(state, None, None, None, prompt_ids=ids)
    p = np.asarray(part.predict(state, ids))
    np.testing.assert_allclose(info.success_rate, p)
    assert int(np.sum(counts)) == 20
    best = _brute_force(p, 20, 2, 8, 4e-4)
    assert _objective(p, np.asarray(counts), 4e-4) == pytest.approx(best, abs=2e-7)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n_min=0), "n_min must be an int >= 1"),
        (dict(n_mean=13), "n_min <= n_mean <= n_max"),
        (dict(gamma=-1.0), "gamma must be >= 0"),
        (dict(lengthscale=0.0), "lengthscale must be > 0"),
        (dict(noise=0.0), "noise must be > 0"),
        (dict(eps=0.5), r"eps must be in \(0, 0.5\)"),
        (dict(prompt_features=np.zeros((3, 2))), r"prompt_features must be \[num_prompts=8"),
    ],
)
def test_bad_settings_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        controllers.vip(8, **kwargs)
