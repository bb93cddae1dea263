"""DAPO's dynamic sampling against a reference written from the paper: a Python list as the
buffer, groups with all-equal rewards dropped, the rest appended in batch order until N wait, an
update then (or after the round cap, on what waits)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdro_jax import controllers

N, G = 4, 3  # groups per round, rollouts per group


def _reference(rounds, num_groups, max_rounds):
    """For each round's rewards [N, G]: the groups the buffer holds after it (as lists of the
    round and group index), whether it was taken, and which of the round's groups were kept."""
    buffer, waited, log = [], 0, []
    for index, rewards in enumerate(rounds):
        kept = []
        for g, group in enumerate(rewards):
            signal = max(group) > min(group)
            kept.append(signal and len(buffer) < num_groups)
            if kept[-1]:
                buffer.append((index, g))
        waited += 1
        ready = len(buffer) == num_groups or waited == max_rounds
        log.append(dict(ready=ready, partial=ready and len(buffer) < num_groups, kept=kept,
                        taken=list(buffer) if ready else None, held=list(buffer)))  # fmt: skip
        if ready:
            buffer, waited = [], 0
    return log


def _rounds(seed, num_rounds, mixed_share):
    rng = np.random.default_rng(seed)
    rounds = []
    for _ in range(num_rounds):
        mixed = rng.random(N) < mixed_share
        rewards = np.where(rng.random((N, 1)) < 0.5, 1.0, -1.0) * np.ones((N, G))
        flips = rng.random((N, G)) < 0.5
        flips[:, 0] = True  # a mixed group gets both values
        flips[:, 1] = False
        rewards = np.where(mixed[:, None] & flips, -rewards, rewards)
        rounds.append(rewards.astype(np.float32))
    return rounds


@pytest.mark.parametrize(("seed", "mixed_share", "max_rounds"), [(0, 0.6, 10), (1, 0.15, 3)])
def test_the_buffer_fills_across_rounds_as_the_reference(seed, mixed_share, max_rounds):
    ds = controllers.dynamic_sampling(N, max_rounds=max_rounds)
    rounds = _rounds(seed, 12, mixed_share)
    expected = _reference(rounds, N, max_rounds)

    # The buffer holds each group's (round, group) index, so its contents can be read back.
    def step(state, round_index, rewards):
        groups = {"rewards": rewards, "where": jnp.stack(
            [jnp.full((N,), round_index), jnp.arange(N)], axis=1)}  # fmt: skip
        state, info = ds.add(state, groups, keep=ds.keep(rewards))
        taken, filled, emptied = ds.take(state)
        state = jax.tree.map(lambda a, b: jnp.where(info.ready, a, b), emptied, state)
        return state, info, taken, filled

    step = jax.jit(step)
    example = {"rewards": jnp.zeros((N, G)), "where": jnp.zeros((N, 2), jnp.int32)}
    state = ds.init(example)
    for index, (rewards, want) in enumerate(zip(rounds, expected, strict=True)):
        state, info, taken, filled = step(state, index, jnp.asarray(rewards))
        assert np.asarray(info.kept).tolist() == want["kept"], index
        assert bool(info.ready) == want["ready"] and bool(info.partial) == want["partial"]
        if want["ready"]:
            count = int(np.sum(filled))
            assert [tuple(w) for w in np.asarray(taken["where"])[:count].tolist()] == want["taken"]
            # Every group taken carries a signal: its rewards are not all equal.
            rows = np.asarray(taken["rewards"])[:count]
            assert np.all(rows.max(axis=1) > rows.min(axis=1))
            assert int(state.count) == 0 and int(state.rounds) == 0
        else:
            assert int(state.count) == len(want["held"])
    total_kept = sum(sum(w["kept"]) for w in expected)
    assert int(state.kept) == total_kept and int(state.sampled) == 12 * N
    assert int(state.updates) == sum(w["ready"] for w in expected)
    assert any(w["ready"] for w in expected) and any(not w["ready"] for w in expected)


def test_keep_marks_groups_whose_rewards_differ():
    ds = controllers.dynamic_sampling(3)
    rewards = jnp.array([[1.0, 1.0, 1.0], [0.0, 0.5, 0.0], [-1.0, -1.0, -1.0]])
    assert np.asarray(ds.keep(rewards)).tolist() == [False, True, False]
    with pytest.raises(ValueError, match="num_groups=3"):
        ds.keep(jnp.zeros((2, 3)))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="max_rounds"):
        controllers.dynamic_sampling(4, max_rounds=0)
    with pytest.raises(ValueError, match="num_groups"):
        controllers.dynamic_sampling(0)
    with pytest.raises(ValueError, match="leading axis of num_groups=4"):
        controllers.dynamic_sampling(4).init({"x": jnp.zeros((3, 2))})
