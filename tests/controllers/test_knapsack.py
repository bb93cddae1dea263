"""Knapsack-RL's allocation against references written from the paper and the released code: its
success rates against a loop over the visits, the knapsack's optimum against brute force, the
fixed counts, the fallback and the exact total."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdro_jax import controllers

N_MEAN, N_MIN, N_MAX = 4, 2, 6


def _value(p, n):
    """The paper's value of n rollouts for a prompt of success rate p (numpy, float64)."""
    return (1 - p**n - (1 - p) ** n) * p * (1 - p) ** 2


def _state_with(allocator, visits_by_prompt):
    """The state after recording `visits_by_prompt[i]` = [(correct, rollouts), ...] (oldest
    first) for prompts 0..len-1, one update per visit."""
    update = jax.jit(allocator.update)
    state = allocator.init()
    for i, visits in enumerate(visits_by_prompt):
        for correct, rollouts in visits:
            state = update(
                state, prompt_ids=jnp.array([i]), num_correct=jnp.array([correct]),
                num_rollouts=jnp.array([rollouts]),
            )  # fmt: skip
    return state


def _recent_rate(visits, history):
    """The success rate a loop reads off the visits: the newest visit whole, then older visits'
    rollouts (at their visit's rate) until `history` rollouts are counted."""
    taken = correct = 0.0
    for index, (c, n) in enumerate(reversed(visits)):
        use = n if index == 0 else min(n, max(history - taken, 0))
        correct += use * c / n
        taken += use
    return correct / taken if taken else 0.0


def test_success_rates_follow_the_recent_visits():
    allocator = controllers.knapsack(8, n_mean=N_MEAN, history=6, window=3)
    visits = [
        [(1, 4)],
        [(0, 4), (4, 4)],  # the newest 4 at rate 1, then 2 of the older 4 at rate 0
        [(3, 3), (0, 2), (2, 8)],  # the newest visit alone holds history
        [(1, 2), (1, 2), (2, 2), (0, 2)],  # four visits in a window of three: the oldest dropped
        [],
    ]
    state = _state_with(allocator, visits)
    p, recorded = allocator.success_rate(state, jnp.arange(5))
    for i, prompt_visits in enumerate(visits):
        kept = prompt_visits[-3:]
        np.testing.assert_allclose(float(p[i]), _recent_rate(kept, 6), atol=1e-6)
        assert float(recorded[i]) == sum(n for _, n in kept)


def _brute_force(p_effective, budget):
    """The best total value over every way to give `budget` extra units to the prompts (at most
    N_MAX - N_MIN each; a prompt given k >= 1 extra is worth v(N_MIN + k), with k = 0 nothing)."""
    best = -1.0
    for units in itertools.product(range(N_MAX - N_MIN + 1), repeat=len(p_effective)):
        if sum(units) != budget:
            continue
        total = sum(_value(p, N_MIN + k) for p, k in zip(p_effective, units, strict=True) if k)
        best = max(best, total)
    return best


def test_the_knapsack_reaches_the_brute_force_optimum():
    rng = np.random.default_rng(0)
    num = 5
    allocator = controllers.knapsack(
        64, n_mean=N_MEAN, n_min=N_MIN, n_max=N_MAX, min_history=1, fallback=False
    )
    allocate = jax.jit(lambda state: allocator.allocate(state, prompt_ids=jnp.arange(num)))
    record = jax.jit(allocator.update)
    for _ in range(6):
        # Every prompt one visit of 8 rollouts with 1..7 right: all inside (0, 1).
        correct = rng.integers(1, 8, num)
        state = record(
            allocator.init(), prompt_ids=jnp.arange(num), num_correct=jnp.asarray(correct),
            num_rollouts=jnp.full(num, 8),
        )  # fmt: skip
        counts, info = allocate(state)
        counts = np.asarray(counts)
        assert counts.sum() == num * N_MEAN and np.all(info.effective)
        assert counts.min() >= N_MIN and counts.max() <= N_MAX
        p = correct / 8.0
        units = counts - N_MIN
        got = sum(_value(pi, N_MIN + k) for pi, k in zip(p, units, strict=True) if k)
        expected = _brute_force(p, num * (N_MEAN - N_MIN))
        np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_fixed_counts_the_fallback_and_the_exact_total():
    allocator = controllers.knapsack(
        64, n_mean=N_MEAN, n_min=N_MIN, n_max=N_MAX, negative_n=1, positive_n=3, min_history=4
    )
    visits = [
        [(0, 4)],  # p = 0
        [(4, 4)],  # p = 1
        [(1, 2)],  # too little history: n_mean
        [(4, 8)],  # p = 0.5, cost log(0.1)/log(0.5) = 3.3 -> 3
        [(0, 8)],  # p = 0
    ]
    state = _state_with(allocator, visits)
    counts, info = jax.jit(lambda s: allocator.allocate(s, prompt_ids=jnp.arange(5)))(state)
    counts = np.asarray(counts)
    # Base: 1 + 3 + 4 + 2 + 1 = 11 of 20; the knapsack prompt would need 3, so the other 6 go
    # to the two p = 0 prompts (3 each) and 3 to the knapsack (its cost).
    assert counts.tolist() == [1 + 3, 3, 4, 2 + 3, 1 + 3] and counts.sum() == 20
    assert bool(info.fallback) and info.effective.tolist() == [False, False, False, True, False]
    np.testing.assert_allclose(info.success_rate, [0.0, 1.0, 0.5, 0.5, 0.0])


def test_without_knapsack_prompts_the_rest_goes_to_the_hopeless_ones():
    allocator = controllers.knapsack(64, n_mean=N_MEAN, n_min=N_MIN, n_max=N_MAX, min_history=4)
    allocate = jax.jit(allocator.allocate)
    state = _state_with(allocator, [[(0, 4)], [(4, 4)], [(0, 4)], []])
    counts, info = allocate(state, prompt_ids=jnp.arange(4))
    # Base 2 + 2 + 2 + 4 = 10 of 16: the 6 left split over the two p = 0 prompts.
    assert np.asarray(counts).tolist() == [5, 2, 5, 4] and not bool(info.fallback)
    state = _state_with(allocator, [[(4, 4)], [(4, 4)]])
    counts, _ = allocate(state, prompt_ids=jnp.arange(2))
    assert np.asarray(counts).tolist() == [N_MEAN, N_MEAN]  # nothing to help: uniform


def test_a_prompt_twice_in_a_batch_records_two_visits():
    allocator = controllers.knapsack(8, n_mean=N_MEAN, window=4)
    state = allocator.update(
        allocator.init(), prompt_ids=jnp.array([3, 1, 3]), num_correct=jnp.array([1, 2, 0]),
        num_rollouts=jnp.array([4, 4, 2]),
    )  # fmt: skip
    assert int(state.visits[3]) == 2 and int(state.visits[1]) == 1
    p, recorded = allocator.success_rate(state, jnp.array([3]))
    assert float(recorded[0]) == 6.0
    np.testing.assert_allclose(float(p[0]), 1 / 6, atol=1e-6)  # the newest (0 of 2) + 4 older


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(n_min=0), "n_min must be an int >= 1"),
        (dict(n_min=5), "must bracket n_mean=4"),
        (dict(negative_n=5), "negative_n must be <= n_mean=4"),
        (dict(confidence=1.0), "confidence must be in"),
        (dict(window=0), "window must be an int >= 1"),
    ],
)
def test_hyperparameters_are_checked_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        controllers.knapsack(8, n_mean=4, **kwargs)
