"""Tests of Rollout-GDRO: exact budgets, optimality against brute force, the square-root rule,
the shadow price, the arms DP, EMA updates against numpy references, and hyperparameter errors."""

import functools
import itertools

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gdro_jax.controllers import (
    arms_allocation,
    continuous_allocation,
    integer_allocation,
    rollout_gdro,
)

# (N, n_min, n_max, n_mean): a few fixed shapes so each jitted function compiles a handful of
# times per module. They cover R = 0 (n_min == n_mean), R = N*K (n_max == n_mean), K = 0, N = 1.
SMALL_CONFIGS = [
    (1, 1, 4, 2),
    (2, 2, 5, 3),
    (3, 1, 4, 2),
    (4, 2, 5, 3),
    (3, 2, 5, 2),
    (3, 1, 3, 3),
    (2, 2, 2, 2),
    (4, 1, 3, 2),
]
SETTINGS = settings(max_examples=40, deadline=None)

variance_values = st.one_of(st.just(0.0), st.floats(1e-4, 100.0, allow_subnormal=False))


@st.composite
def allocation_problems(draw, configs=SMALL_CONFIGS):
    num_prompts, n_min, n_max, n_mean = draw(st.sampled_from(configs))
    variance = draw(st.lists(variance_values, min_size=num_prompts, max_size=num_prompts))
    return np.asarray(variance, np.float32), n_min, n_max, num_prompts * n_mean


@functools.cache
def jitted_integer(n_min, n_max, total):
    return jax.jit(functools.partial(integer_allocation, n_min=n_min, n_max=n_max, total=total))


@functools.cache
def jitted_continuous(n_min, n_max, total):
    return jax.jit(functools.partial(continuous_allocation, n_min=n_min, n_max=n_max, total=total))


@functools.cache
def jitted_arms(n_min, total):
    return jax.jit(functools.partial(arms_allocation, n_min=n_min, total=total))


def objective(variance, n):
    return float(np.sum(np.asarray(variance, np.float64) / np.asarray(n, np.float64)))


def feasible_vectors(num_prompts, n_min, n_max, total):
    for n in itertools.product(range(n_min, n_max + 1), repeat=num_prompts):
        if sum(n) == total:
            yield np.asarray(n)


@SETTINGS
@given(allocation_problems(), st.booleans(), st.integers(0, 2**31 - 1))
def test_integer_allocation_budget_exact_and_in_bounds(problem, use_key, seed):
    variance, n_min, n_max, total = problem
    key = jax.random.key(seed) if use_key else None
    n, _ = jitted_integer(n_min, n_max, total)(variance, key=key)
    n = np.asarray(n)
    assert n.dtype == np.int32
    assert int(n.sum()) == total
    assert np.all((n >= n_min) & (n <= n_max))


@SETTINGS
@given(allocation_problems(), st.booleans(), st.integers(0, 2**31 - 1))
def test_integer_allocation_matches_brute_force_optimum(problem, use_key, seed):
    variance, n_min, n_max, total = problem
    key = jax.random.key(seed) if use_key else None
    n, _ = jitted_integer(n_min, n_max, total)(variance, key=key)
    best = min(objective(variance, m) for m in feasible_vectors(len(variance), n_min, n_max, total))
    assert objective(variance, n) == pytest.approx(best, rel=1e-5, abs=1e-9)


@SETTINGS
@given(allocation_problems())
def test_mu_is_the_marginal_gain_at_the_cut(problem):
    variance, n_min, n_max, total = problem
    n, mu = jitted_integer(n_min, n_max, total)(variance)
    n, mu, v = np.asarray(n, np.float64), float(mu), variance.astype(np.float64)
    if n_max == n_min:
        assert mu == 0.0
        return
    if total == len(v) * n_min:  # nothing handed out: the largest gain declined
        assert mu == pytest.approx(np.max(v) / (n_min * (n_min + 1)), rel=1e-6, abs=1e-12)
        return
    raised = n > n_min
    last_gain = np.min(v[raised] / ((n[raised] - 1) * n[raised]))
    assert mu == pytest.approx(last_gain, rel=1e-6, abs=1e-12)
    # KKT: no unit left out is worth more than the price.
    open_ = n < n_max
    if open_.any():
        assert np.max(v[open_] / (n[open_] * (n[open_] + 1))) <= mu * (1 + 1e-6) + 1e-12


@SETTINGS
@given(allocation_problems())
def test_continuous_allocation_follows_square_root_rule(problem):
    variance, n_min, n_max, total = problem
    n, mu = jitted_continuous(n_min, n_max, total)(variance)
    n, mu, v = np.asarray(n, np.float64), float(mu), variance.astype(np.float64)
    assert abs(n.sum() - total) <= 1e-3
    assert np.all((n >= n_min - 1e-6) & (n <= n_max + 1e-6))
    positive = v > 0
    if mu == 0.0:  # the positive prompts cannot absorb the budget: they saturate at n_max
        assert np.all(n[positive] == n_max)
        assert np.ptp(n[~positive]) <= 1e-5 if (~positive).any() else True
        return
    assert np.all(n[~positive] == n_min)
    target = np.sqrt(v / mu)
    free = positive & (n > n_min + 1e-4) & (n < n_max - 1e-4)
    np.testing.assert_allclose(n[free], target[free], rtol=1e-3)
    at_min = positive & (n <= n_min + 1e-4)
    at_max = positive & (n >= n_max - 1e-4)
    assert np.all(target[at_min] <= n_min * (1 + 1e-3))
    assert np.all(target[at_max] >= n_max * (1 - 1e-3))


@SETTINGS
@given(allocation_problems())
def test_continuous_relaxation_lower_bounds_the_integer_optimum(problem):
    variance, n_min, n_max, total = problem
    n_real, _ = jitted_continuous(n_min, n_max, total)(variance)
    n_int, _ = jitted_integer(n_min, n_max, total)(variance)
    assert objective(variance, n_real) <= objective(variance, n_int) * (1 + 1e-4) + 1e-9


# (N, A, n_min, total): includes A = 1, the smallest and largest totals, and a single prompt.
ARMS_CONFIGS = [(1, 4, 2, 4), (2, 2, 1, 3), (3, 4, 1, 3), (3, 4, 2, 10), (4, 4, 1, 9), (4, 1, 2, 8)]


@st.composite
def arms_problems(draw):
    num_prompts, num_arms, n_min, total = draw(st.sampled_from(ARMS_CONFIGS))
    log_probs = draw(
        st.lists(
            st.floats(-5.0, 0.0, allow_subnormal=False),
            min_size=num_prompts * num_arms,
            max_size=num_prompts * num_arms,
        )
    )
    return np.asarray(log_probs, np.float32).reshape(num_prompts, num_arms), n_min, total


@SETTINGS
@given(arms_problems())
def test_arms_allocation_matches_brute_force(problem):
    log_probs, n_min, total = problem
    num_prompts, num_arms = log_probs.shape
    n = np.asarray(jitted_arms(n_min, total)(log_probs))
    assert int(n.sum()) == total
    assert np.all((n >= n_min) & (n < n_min + num_arms))

    def joint(m):
        return float(np.sum(log_probs[np.arange(num_prompts), m - n_min], dtype=np.float64))

    best = max(joint(m) for m in feasible_vectors(num_prompts, n_min, n_min + num_arms - 1, total))
    assert joint(n) == pytest.approx(best, abs=1e-4)


def test_arms_allocation_breaks_exact_ties_evenly():
    log_probs = np.full((5, 11), -np.log(11.0), np.float32)
    for total in (10, 20, 23, 60):
        n = np.asarray(jitted_arms(2, total)(log_probs))
        assert int(n.sum()) == total
        assert np.ptp(n) <= 1


def test_equal_variance_gives_even_allocation():
    for value in (0.0, 0.7):
        variance = np.full(6, value, np.float32)
        n, _ = jitted_integer(2, 12, 24)(variance)
        np.testing.assert_array_equal(np.asarray(n), 4)
        n, _ = jitted_integer(2, 12, 27)(variance, key=jax.random.key(3))
        assert int(np.sum(n)) == 27 and np.ptp(np.asarray(n)) == 1
        n_real, _ = jitted_continuous(2, 12, 27)(variance)
        np.testing.assert_allclose(np.asarray(n_real), 4.5, rtol=1e-5)


def test_integer_allocation_rejects_infeasible_total():
    with pytest.raises(ValueError, match="total=13"):
        integer_allocation(np.ones(3, np.float32), n_min=2, n_max=4, total=13)
    with pytest.raises(ValueError, match="total=5"):
        arms_allocation(np.zeros((3, 3), np.float32), n_min=2, total=5)


# ---- the controller ---------------------------------------------------------------------------

NUM_BINS, NUM_PROMPTS, N_MIN, N_MAX, N_MEAN = 4, 8, 2, 8, 4


@functools.cache
def controller(proxy="bernoulli", mode="sqrt", num_bins=NUM_BINS, ema=0.3):
    gdro = rollout_gdro(
        num_bins=num_bins, n_min=N_MIN, n_max=N_MAX, n_mean=N_MEAN, proxy=proxy, ema=ema,
        mode=mode, variance_floor=0.02, arm_eta=0.5, mu_lr=0.1, mu_init=0.05,
    )  # fmt: skip
    return gdro, jax.jit(gdro.allocate), jax.jit(gdro.update)


def numpy_proxy(proxy, bins, valid, p, losses, num_bins, floor=0.02, scale=4.0):
    """Per-bin proxy observation of one batch (None where the bin is absent)."""
    observation = [None] * num_bins
    for b in range(num_bins):
        member = (bins == b) & valid
        if not member.any():
            continue
        if proxy == "empirical":
            observation[b] = max(float(np.var(losses[member].astype(np.float64))), floor)
            continue
        q = p[member].astype(np.float64)
        term = q * (1 - q)
        if proxy == "signal":
            term = term * (1 - q**N_MEAN - (1 - q) ** N_MEAN)
        observation[b] = scale * max(float(term.mean()), floor)
    return observation


def random_batch(rng, num_bins=NUM_BINS):
    bins = rng.integers(0, num_bins - 1, NUM_PROMPTS).astype(np.int32)  # last bin stays absent
    valid = rng.uniform(size=NUM_PROMPTS) > 0.2
    p_hat = rng.uniform(size=NUM_PROMPTS).astype(np.float32)
    p_hat[rng.uniform(size=NUM_PROMPTS) < 0.2] = 0.0
    losses = rng.normal(size=NUM_PROMPTS).astype(np.float32)
    return bins, valid, p_hat, losses


@pytest.mark.parametrize("proxy", ["bernoulli", "empirical", "signal"])
def test_update_ema_matches_numpy_reference(proxy):
    _, _, update = controller(proxy)
    state = controller(proxy)[0].init()
    rng = np.random.default_rng(0)
    variance, seen = np.zeros(NUM_BINS), np.zeros(NUM_BINS, bool)
    for _ in range(6):
        bins, valid, p_hat, losses = random_batch(rng)
        state = update(state, bins, p_hat=p_hat, losses=losses, valid=valid)
        for b, obs in enumerate(numpy_proxy(proxy, bins, valid, p_hat, losses, NUM_BINS)):
            if obs is not None:
                variance[b] = (1 - 0.3) * variance[b] + 0.3 * obs if seen[b] else obs
                seen[b] = True
        np.testing.assert_allclose(np.asarray(state.variance), variance, rtol=1e-5, atol=1e-7)
        np.testing.assert_array_equal(np.asarray(state.seen), seen)
    assert int(state.step) == 6
    assert not seen[-1]


def test_bernoulli_from_counts_equals_p_hat():
    gdro, _, update = controller("bernoulli")
    correct = np.array([0, 1, 2, 3, 4, 1, 0, 2], np.int32)
    rollouts = np.array([4, 4, 4, 4, 4, 2, 6, 8], np.int32)
    bins = np.array([0, 0, 1, 1, 2, 2, 2, 0], np.int32)
    from_counts = update(gdro.init(), bins, num_correct=correct, num_rollouts=rollouts)
    from_p_hat = update(gdro.init(), bins, p_hat=(correct / rollouts).astype(np.float32))
    np.testing.assert_allclose(from_counts.variance, from_p_hat.variance, rtol=1e-6)


def test_update_ignores_out_of_range_bins():
    gdro, _, update = controller("bernoulli")
    p_hat = np.full(NUM_PROMPTS, 0.5, np.float32)
    bins = np.array([0, -1, NUM_BINS, 0, 0, 0, 0, 0], np.int32)
    state = update(gdro.init(), bins, p_hat=p_hat)
    np.testing.assert_array_equal(np.asarray(state.seen), [True, False, False, False])


@pytest.mark.parametrize("proxy", ["bernoulli", "empirical", "signal"])
def test_sqrt_allocate_is_the_integer_optimum_of_the_bin_variances(proxy):
    gdro, allocate, update = controller(proxy)
    rng = np.random.default_rng(1)
    bins, valid, p_hat, losses = random_batch(rng)
    state = update(gdro.init(), bins, p_hat=p_hat, losses=losses, valid=valid)
    bins = rng.integers(0, NUM_BINS, NUM_PROMPTS).astype(np.int32)  # may include unseen bins
    n, info = allocate(state, bins, p_hat, jax.random.key(0))
    n = np.asarray(n)
    # Unseen bins fall back to this batch's Bernoulli-family proxy from p_hat.
    batch_proxy = numpy_proxy(
        "bernoulli" if proxy == "empirical" else proxy, bins, np.ones(NUM_PROMPTS, bool), p_hat,
        losses, NUM_BINS,
    )  # fmt: skip
    seen = np.asarray(state.seen)
    for b in range(NUM_BINS):
        expected = state.variance[b] if seen[b] else batch_proxy[b]
        if expected is not None:
            assert float(info.variance_per_bin[b]) == pytest.approx(float(expected), rel=1e-5)
    v = np.asarray(info.variance_per_prompt)
    np.testing.assert_allclose(v, np.asarray(info.variance_per_bin)[bins])
    assert int(n.sum()) == NUM_PROMPTS * N_MEAN
    best, expected_mu = jitted_integer(N_MIN, N_MAX, NUM_PROMPTS * N_MEAN)(v)
    assert float(info.mu) == pytest.approx(float(expected_mu), rel=1e-6)
    assert objective(v, n) == pytest.approx(objective(v, best), rel=1e-6)
    assert float(info.objective) == pytest.approx(objective(v, n), rel=1e-5)
    np.testing.assert_array_equal(info.rollouts_per_bin, np.bincount(bins, n, NUM_BINS))
    np.testing.assert_array_equal(info.prompts_per_bin, np.bincount(bins, minlength=NUM_BINS))


def test_sqrt_update_leaves_the_price_to_allocate():
    gdro, allocate, update = controller("bernoulli")
    bins, valid, p_hat, losses = random_batch(np.random.default_rng(2))
    state = update(gdro.init(), bins, p_hat=p_hat)
    _, info = allocate(state, bins, p_hat, None)
    assert float(state.mu) == 0.0
    assert float(info.mu) > 0.0


def test_single_bin_and_zero_variance_give_an_even_split():
    gdro, allocate, update = controller("empirical", num_bins=1)
    bins = np.zeros(NUM_PROMPTS, np.int32)
    state = update(gdro.init(), bins, losses=np.zeros(NUM_PROMPTS, np.float32))
    n, _ = allocate(state, bins, np.zeros(NUM_PROMPTS, np.float32), jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(n), N_MEAN)
    n, mu = jitted_integer(2, 12, 20)(np.zeros(5, np.float32))
    np.testing.assert_array_equal(np.asarray(n), 4)
    assert float(mu) == 0.0
    n, mu = jitted_continuous(2, 12, 22)(np.zeros(5, np.float32))
    np.testing.assert_allclose(np.asarray(n), 4.4, rtol=1e-6)
    assert float(mu) == 0.0


def test_arms_update_matches_numpy_reference():
    gdro, allocate, update = controller("bernoulli", mode="arms")
    state = gdro.init()
    rng = np.random.default_rng(3)
    num_arms = N_MAX - N_MIN + 1
    scores, mu = np.zeros((NUM_BINS, num_arms)), 0.05
    for _ in range(5):
        bins, valid, p_hat, losses = random_batch(rng)
        n, info = allocate(state, bins, p_hat, jax.random.key(0))
        n = np.asarray(n)
        assert int(n.sum()) == NUM_PROMPTS * N_MEAN
        assert float(info.mu) == pytest.approx(mu, rel=1e-5, abs=1e-7)
        # The allocation maximises the joint log-probability of the current arm scores.
        log_probs = np.asarray(jax.nn.log_softmax(0.5 * state.arm_scores, axis=-1))[bins]
        chosen = log_probs[np.arange(NUM_PROMPTS), n - N_MIN].sum()
        best = jitted_arms(N_MIN, NUM_PROMPTS * N_MEAN)(log_probs)
        best = log_probs[np.arange(NUM_PROMPTS), np.asarray(best) - N_MIN].sum()
        assert chosen == pytest.approx(best, abs=1e-4)
        state = update(state, bins, losses=losses, num_rollouts=n, valid=valid)
        bin_means = []
        for b in range(NUM_BINS):
            member = (bins == b) & valid
            if not member.any():
                continue
            n_b = n[member].mean()
            bin_means.append(n_b)
            delta = losses[member].astype(np.float64).mean() - mu * (n_b - N_MEAN)
            for arm in n[member] - N_MIN:
                scores[b, arm] += delta / member.sum()
        if bin_means:
            mu = mu + 0.1 * (np.mean(bin_means) - N_MEAN)
        np.testing.assert_allclose(np.asarray(state.arm_scores), scores, rtol=1e-5, atol=1e-6)
        assert float(state.mu) == pytest.approx(mu, rel=1e-5, abs=1e-7)


def test_missing_observation_fails_loudly():
    bins = np.zeros(NUM_PROMPTS, np.int32)
    with pytest.raises(ValueError, match="p_hat"):
        controller("bernoulli")[0].update(controller("bernoulli")[0].init(), bins)
    gdro = controller("empirical")[0]
    with pytest.raises(ValueError, match="losses"):
        gdro.update(gdro.init(), bins, p_hat=np.zeros(NUM_PROMPTS, np.float32))
    gdro = controller("bernoulli", mode="arms")[0]
    with pytest.raises(ValueError, match="losses"):
        gdro.update(gdro.init(), bins, num_rollouts=np.full(NUM_PROMPTS, 4, np.int32))


def test_observation_of_the_wrong_shape_is_rejected():
    gdro = controller("bernoulli")[0]
    with pytest.raises(ValueError, match="p_hat"):
        gdro.update(gdro.init(), np.zeros(NUM_PROMPTS, np.int32), p_hat=np.zeros(3, np.float32))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"n_min": 0}, "n_min"),
        ({"n_min": 5, "n_mean": 4}, "n_mean"),  # budget N*n_mean below N*n_min
        ({"n_max": 3, "n_mean": 4}, "n_max"),
        ({"num_bins": 0}, "num_bins"),
        ({"ema": 0.0}, "ema"),
        ({"ema": 1.5}, "ema"),
        ({"proxy": "gaussian"}, "proxy"),
        ({"mode": "greedy"}, "mode"),
        ({"variance_floor": -0.1}, "variance_floor"),
        ({"arm_eta": -1.0}, "arm_eta"),
        ({"mu_lr": -0.5}, "mu_lr"),
        ({"reward_values": (1.0, 1.0)}, "reward_values"),
    ],
)
def test_bad_hyperparameters_raise_value_error_naming_them(kwargs, name):
    with pytest.raises(ValueError, match=name) as error:
        rollout_gdro(**kwargs)
    assert repr(kwargs[name]) in str(error.value)


@pytest.mark.parametrize(("proxy", "mode"), [("empirical", "sqrt"), ("bernoulli", "arms")])
def test_non_finite_loss_drops_its_prompt(proxy, mode):
    gdro, _, update = controller(proxy, mode=mode)
    bins, valid, p_hat, losses = random_batch(np.random.default_rng(4))
    rollouts = np.full(NUM_PROMPTS, N_MEAN, np.int32)
    poisoned = losses.copy()
    poisoned[[1, 5]] = [np.nan, np.inf]
    dropped = valid.copy()
    dropped[[1, 5]] = False
    common = {"p_hat": p_hat, "num_rollouts": rollouts}
    with_nan = update(gdro.init(), bins, losses=poisoned, valid=valid, **common)
    masked = update(gdro.init(), bins, losses=losses, valid=dropped, **common)
    for got, want in zip(with_nan, masked, strict=True):
        assert np.all(np.isfinite(np.asarray(got, np.float64)))
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
