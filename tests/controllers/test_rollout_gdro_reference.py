"""Rollout-GDRO against loop references on the inputs that make its sanitising paths run.

The references are written from SPEC 5 and the factory's docstring: the greedy hand-out of units
to the largest marginal gain `v / (n (n + 1))` one at a time, a brute-force search over arm
configurations, and the per-bin EMA of the Bernoulli-family proxies scaled by `(r_hi - r_lo)^2`.
Inputs hold NaN, negative, tiny and huge variances, NaN and -inf log-probabilities, bins never
observed (with and without `p_hat`), and rewards other than +-1.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdro_jax.controllers import arms_allocation, integer_allocation, rollout_gdro

NUM_BINS = 5


def sanitized(v):
    """NaN, negative and below-1e-30 variances count as 0; above 1e30 (inf included) as 1e30."""
    if math.isnan(v) or v < 1e-30:
        return 0.0
    return min(v, 1e30)


def greedy_allocation(variance, *, n_min, n_max, total):
    """Fox's greedy, one unit at a time to the largest gain v / (n (n + 1)); returns (n, mu).

    Ties go to the fewest units, then the lowest prompt index, as documented for `key=None`
    (unit-major order); a near tie between different nonzero gains would make float32 and float64
    disagree, so it fails.
    """
    v = [sanitized(float(x)) for x in variance]
    n = [n_min] * len(v)
    last_gain = None
    for _ in range(total - n_min * len(v)):
        gains = [v[i] / (n[i] * (n[i] + 1)) if n[i] < n_max else -1.0 for i in range(len(v))]
        best = max(range(len(v)), key=lambda i: (gains[i], -n[i], -i))
        if gains[best] > 0:
            near = [i for i in range(len(v)) if abs(gains[i] - gains[best]) <= 1e-5 * gains[best]]
            assert all((v[i], n[i]) == (v[best], n[best]) for i in near), "ill-posed near tie"
        n[best] += 1
        last_gain = gains[best]
    return n, last_gain


@pytest.mark.parametrize(
    ("total", "huge_n", "zero_n"), [(28, 8, [2, 2, 2]), (40, 12, [2, 2, 2]), (70, 12, [4, 3, 3])]
)
def test_integer_allocation_sanitizes_nan_negative_tiny_and_huge_variances(total, huge_n, zero_n):
    variance = np.array([np.nan, -3.0, 1e35, 2.2, 0.45, 1e-40, 7.0, np.inf], np.float32)
    got_n, got_mu = jax.jit(
        lambda v: integer_allocation(v, n_min=2, n_max=12, total=total)
    )(variance)  # fmt: skip
    expected_n, expected_mu = greedy_allocation(variance, n_min=2, n_max=12, total=total)
    np.testing.assert_array_equal(np.asarray(got_n), expected_n)
    assert float(got_mu) == pytest.approx(expected_mu, rel=1e-6)
    # 1e35 and inf are both capped at 1e30, so they tie: 12 units to hand out are shared (8 each).
    # NaN, negative and tiny variances all count as 0: they stay at n_min until every positive
    # prompt is at n_max, then share what is left evenly (70 = 16 + 50 + 4).
    assert [expected_n[2], expected_n[7]] == [huge_n, huge_n]
    assert [expected_n[0], expected_n[1], expected_n[5]] == zero_n


def brute_force_arms(log_probs, *, n_min, total):
    """The configuration of largest summed log-probability (NaN and -inf as -1e6), by search."""
    floor = -1e6
    lp = [[floor if math.isnan(x) or x < floor else float(x) for x in row] for row in log_probs]
    num_arms = len(lp[0])
    budget = total - n_min * len(lp)
    scored = sorted(
        (sum(lp[i][a] for i, a in enumerate(arms)), arms)
        for arms in itertools.product(range(num_arms), repeat=len(lp))
        if sum(arms) == budget
    )
    (best, arms), (second, _) = scored[-1], scored[-2]
    assert best - second > 1e-3, "ill-posed: the optimum must be unique"
    return [n_min + a for a in arms]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_arms_allocation_treats_nan_and_minus_inf_log_probs_as_the_floor(seed):
    rng = np.random.default_rng(seed)
    log_probs = rng.normal(-1.5, 1.0, size=(5, 4)).astype(np.float32)
    log_probs[rng.random(log_probs.shape) < 0.3] = np.nan
    log_probs[rng.random(log_probs.shape) < 0.2] = -np.inf
    log_probs[np.arange(5), rng.integers(0, 4, size=5)] = -0.5  # every prompt has a finite arm
    got = jax.jit(lambda lp: arms_allocation(lp, n_min=2, total=18))(log_probs)
    np.testing.assert_array_equal(np.asarray(got), brute_force_arms(log_probs, n_min=2, total=18))


# ------------------------------------------------------------------ allocate and update


REWARD_VALUES = [(0.0, 1.0), (-0.5, 2.0)]


def _seeded_state(gdro, variance, seen):
    return gdro.init()._replace(
        variance=jnp.asarray(variance, jnp.float32), seen=jnp.asarray(seen, bool)
    )


@pytest.mark.parametrize("reward_values", REWARD_VALUES)
def test_allocate_without_p_hat_gives_unseen_bins_the_largest_bernoulli_variance(reward_values):
    gdro = rollout_gdro(NUM_BINS, n_min=2, n_max=12, n_mean=4, reward_values=reward_values)
    scale = (reward_values[1] - reward_values[0]) ** 2
    variance = [3.1, 0.7, 0.0, 0.23, 0.0]
    seen = [True, True, False, True, False]
    bins = np.array([0, 1, 2, 2, 3, 4, 0, 3], np.int32)
    n, info = jax.jit(lambda s, b: gdro.allocate(s, b, None, None))(
        _seeded_state(gdro, variance, seen), bins
    )
    # Unseen bins: (r_hi - r_lo)^2 / 4, the variance of a reward that is r_hi half the time.
    per_bin = [variance[b] if seen[b] else scale / 4 for b in range(NUM_BINS)]
    per_prompt = [per_bin[b] for b in bins]
    expected_n, expected_mu = greedy_allocation(per_prompt, n_min=2, n_max=12, total=32)
    np.testing.assert_allclose(np.asarray(info.variance_per_bin), per_bin, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(n), expected_n)
    assert float(info.mu) == pytest.approx(expected_mu, rel=1e-6)
    assert float(info.objective) == pytest.approx(
        sum(v / k for v, k in zip(per_prompt, expected_n, strict=True)), rel=1e-6
    )


@pytest.mark.parametrize("reward_values", REWARD_VALUES)
def test_allocate_with_p_hat_gives_unseen_bins_the_batch_proxy(reward_values):
    floor = 0.05
    gdro = rollout_gdro(
        NUM_BINS, n_min=2, n_max=12, n_mean=4, reward_values=reward_values, variance_floor=floor
    )
    scale = (reward_values[1] - reward_values[0]) ** 2
    variance = [3.1, 0.7, 0.0, 0.23, 0.0]
    seen = [True, True, False, True, False]
    bins = np.array([0, 1, 2, 2, 3, 4, 0, 4], np.int32)
    p_hat = np.array([0.1, 0.5, 0.3, 0.6, 0.9, 0.0, 0.2, 1.0], np.float32)
    n, info = jax.jit(lambda s, b, p: gdro.allocate(s, b, p, None))(
        _seeded_state(gdro, variance, seen), bins, p_hat
    )
    per_bin = list(variance)
    for b in range(NUM_BINS):
        members = [i for i in range(len(bins)) if bins[i] == b]
        if not seen[b] and members:
            mean = sum(p_hat[i] * (1 - p_hat[i]) for i in members) / len(members)
            per_bin[b] = scale * max(mean, floor)  # bin 4 (p = 0 and 1) sits on the floor
    per_prompt = [per_bin[b] for b in bins]
    expected_n, expected_mu = greedy_allocation(per_prompt, n_min=2, n_max=12, total=32)
    np.testing.assert_allclose(np.asarray(info.variance_per_bin)[[2, 4]], [per_bin[2], per_bin[4]])
    np.testing.assert_array_equal(np.asarray(n), expected_n)
    assert float(info.mu) == pytest.approx(expected_mu, rel=1e-6)


class ReferenceVariance:
    """SPEC 5's per-bin EMA of a variance proxy; the first observation of a bin initialises it."""

    def __init__(self, proxy, ema, floor, reward_values, n_mean):
        self.proxy, self.ema, self.floor, self.n_mean = proxy, ema, floor, n_mean
        self.scale = (reward_values[1] - reward_values[0]) ** 2
        self.variance = [0.0] * NUM_BINS
        self.seen = [False] * NUM_BINS

    def observe(self, values):
        if self.proxy == "empirical":  # population variance of the bin's losses
            mean = sum(values) / len(values)
            return max(sum((x - mean) ** 2 for x in values) / len(values), self.floor)
        terms = []
        for p in values:
            term = p * (1 - p)
            if self.proxy == "signal":
                term *= 1 - p**self.n_mean - (1 - p) ** self.n_mean
            terms.append(term)
        return self.scale * max(sum(terms) / len(terms), self.floor)

    def update(self, bins, p, losses, valid):
        for b in range(NUM_BINS):
            members = [
                i
                for i in range(len(bins))
                if bins[i] == b and valid[i] and math.isfinite(losses[i])
            ]
            if not members:
                continue
            source = losses if self.proxy == "empirical" else p
            observation = self.observe([float(source[i]) for i in members])
            if self.seen[b]:
                self.variance[b] = (1 - self.ema) * self.variance[b] + self.ema * observation
            else:
                self.variance[b] = observation
            self.seen[b] = True


@pytest.mark.parametrize("proxy", ["bernoulli", "signal", "empirical"])
@pytest.mark.parametrize("reward_values", REWARD_VALUES)
@pytest.mark.parametrize("from_counts", [False, True])
def test_update_matches_the_loop_reference_over_several_steps(proxy, reward_values, from_counts):
    ema, floor, n_mean = 0.3, 0.02, 4
    gdro = rollout_gdro(
        NUM_BINS,
        n_min=2,
        n_max=8,
        n_mean=n_mean,
        proxy=proxy,
        ema=ema,
        reward_values=reward_values,
        variance_floor=floor,
    )
    reference = ReferenceVariance(proxy, ema, floor, reward_values, n_mean)
    rng = np.random.default_rng(3)

    @jax.jit
    def update(state, bins, p, correct, rollouts, losses, valid):
        if from_counts:  # p = num_correct / num_rollouts when no p_hat is passed
            return gdro.update(
                state, bins, num_correct=correct, num_rollouts=rollouts, losses=losses, valid=valid
            )
        return gdro.update(state, bins, p_hat=p, losses=losses, valid=valid)

    state = gdro.init()
    for step in range(6):
        bins = rng.choice(NUM_BINS - 1, size=10).astype(np.int32)  # bin 4 is never observed
        rollouts = rng.integers(2, 9, size=10).astype(np.int32)
        correct = rng.integers(0, rollouts + 1).astype(np.int32)
        p = correct / rollouts if from_counts else rng.uniform(0, 1, size=10)
        losses = rng.normal(0.5, 1.0, size=10)
        losses[rng.random(10) < 0.15] = np.nan  # a non-finite loss drops its prompt
        valid = rng.random(10) < 0.8
        state = update(
            state,
            bins,
            p.astype(np.float32),
            correct,
            rollouts,
            losses.astype(np.float32),
            valid,
        )
        reference.update(bins, p, losses, valid)
        np.testing.assert_allclose(
            np.asarray(state.variance), reference.variance, rtol=2e-5, err_msg=f"step {step}"
        )
        np.testing.assert_array_equal(np.asarray(state.seen), reference.seen)
    assert not reference.seen[4] and sum(reference.seen) == 4
