"""Group advantages over ragged segments and Prompt-GDRO weighting against a loop reference."""

import functools

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gdro_jax.losses import (
    group_advantages,
    group_statistics,
    informative_fraction,
    weighted_advantages,
)


def reference_advantages(rewards, slots, num_prompts, *, normalize_std, eps, clip, valid=None):
    """Per prompt: gather its valid rewards, centre, scale by the population std, clip."""
    rewards = np.asarray(rewards, np.float64)
    valid = np.ones(len(rewards), bool) if valid is None else np.asarray(valid, bool)
    adv = np.zeros(len(rewards))
    for prompt in range(num_prompts):
        members = [j for j in range(len(rewards)) if slots[j] == prompt and valid[j]]
        group = [rewards[j] for j in members]
        if not group or max(group) == min(group):
            continue
        mean = sum(group) / len(group)
        std = (sum((r - mean) ** 2 for r in group) / len(group)) ** 0.5
        for j in members:
            value = rewards[j] - mean
            if normalize_std:
                value /= std + eps
            adv[j] = min(max(value, -clip), clip)
    return adv


def reference_stats(rewards, slots, num_prompts, valid):
    mean, std, count, informative = [], [], [], []
    for prompt in range(num_prompts):
        group = [rewards[j] for j in range(len(rewards)) if slots[j] == prompt and valid[j]]
        count.append(len(group))
        mean.append(sum(group) / len(group) if group else 0.0)
        std.append(float(np.sqrt(np.mean((np.array(group) - mean[-1]) ** 2))) if group else 0.0)
        informative.append(bool(group) and max(group) > min(group))
    return np.array(mean), np.array(std), np.array(count), np.array(informative)


# Ragged groups: prompt 0 has 3 slots, 1 has 5 (all equal, 0.1 is inexact in float32), 2 has 1,
# 3 has 6 (31-to-1 would clip; here a 5-to-1 split), 4 has none, 5 has 4 with one invalid slot.
SLOTS = np.array([0, 0, 0, 1, 1, 1, 1, 1, 2, 3, 3, 3, 3, 3, 3, 5, 5, 5, 5], np.int32)
REWARDS = np.array([1, -1, 1, 0.1, 0.1, 0.1, 0.1, 0.1, 1, 0, 0, 0, 0, 0, 1, 1, 0, 0, 7], np.float32)
VALID = np.array([True] * 18 + [False])
NUM_PROMPTS = 6


@functools.partial(jax.jit, static_argnames=("num_prompts", "normalize_std", "clip"))
def jitted_advantages(rewards, slots, valid, num_prompts, normalize_std, clip=5.0):
    return group_advantages(
        rewards,
        slots,
        num_prompts,
        normalize_std=normalize_std,
        clip=clip,
        valid_R=valid,
        estimator="population",
    )


@pytest.mark.parametrize("normalize_std", [True, False])
def test_ragged_groups_match_the_loop_reference(normalize_std):
    expected = reference_advantages(
        REWARDS, SLOTS, NUM_PROMPTS, normalize_std=normalize_std, eps=1e-6, clip=5.0, valid=VALID
    )
    got = jitted_advantages(REWARDS, SLOTS, VALID, NUM_PROMPTS, normalize_std)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-6)


def test_all_equal_groups_single_slots_and_invalid_slots_get_exactly_zero():
    for normalize_std in (True, False):
        adv = np.asarray(jitted_advantages(REWARDS, SLOTS, VALID, NUM_PROMPTS, normalize_std))
        assert np.all(adv[3:9] == 0.0)  # all-equal group of 0.1s and the group of one
        assert adv[18] == 0.0  # invalid slot


def test_invalid_slot_reward_does_not_change_any_advantage():
    changed = REWARDS.copy()
    changed[18] = -100.0
    np.testing.assert_array_equal(
        np.asarray(jitted_advantages(REWARDS, SLOTS, VALID, NUM_PROMPTS, True)),
        np.asarray(jitted_advantages(changed, SLOTS, VALID, NUM_PROMPTS, True)),
    )


def test_grpo_advantages_are_standardised_within_each_informative_group():
    adv = np.asarray(jitted_advantages(REWARDS, SLOTS, VALID, NUM_PROMPTS, True), np.float64)
    for members in ([0, 1, 2], [9, 10, 11, 12, 13, 14], [15, 16, 17]):
        assert abs(adv[members].sum()) < 1e-5
        # Population variance 1, up to eps = 1e-6 in the denominator.
        assert abs(np.mean(adv[members] ** 2) - 1.0) < 1e-4


def test_clip_binds_on_a_lone_success_in_a_large_group():
    rewards = np.array([1.0] + [0.0] * 30, np.float32)
    slots = np.zeros(31, np.int32)
    adv = np.asarray(jitted_advantages(rewards, slots, np.ones(31, bool), 1, True))
    expected = reference_advantages(rewards, slots, 1, normalize_std=True, eps=1e-6, clip=5.0)
    assert expected[0] == 5.0  # unclipped value (30/31)/sqrt(30/31^2) = sqrt(30) > 5
    np.testing.assert_allclose(adv, expected, rtol=1e-5, atol=1e-6)


def test_group_statistics_population_std_counts_and_informative_fraction():
    stats = jax.jit(group_statistics, static_argnums=2)(REWARDS, SLOTS, NUM_PROMPTS, valid_R=VALID)
    mean, std, count, informative = reference_stats(REWARDS, SLOTS, NUM_PROMPTS, VALID)
    np.testing.assert_allclose(np.asarray(stats.mean_N), mean, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(stats.std_N), std, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(stats.count_N), count)
    np.testing.assert_array_equal(np.asarray(stats.informative_N), informative)
    # Non-empty groups 0, 1, 2, 3, 5; informative 0, 3, 5.
    assert float(informative_fraction(stats)) == pytest.approx(3 / 5, abs=1e-7)


def test_weights_multiply_each_slot_by_its_prompts_weight():
    adv = np.asarray(jitted_advantages(REWARDS, SLOTS, VALID, NUM_PROMPTS, True))
    weights = np.array([0.5, 2.0, 3.0, 1.5, 9.0, 0.25], np.float32)
    got = np.asarray(jax.jit(weighted_advantages)(adv, SLOTS, weights))
    expected = np.array([adv[j] * weights[SLOTS[j]] for j in range(len(adv))])
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_jit_equals_eager():
    eager = group_advantages(REWARDS, SLOTS, NUM_PROMPTS, valid_R=VALID, estimator="population")
    jitted = jitted_advantages(REWARDS, SLOTS, VALID, NUM_PROMPTS, True)
    np.testing.assert_allclose(np.asarray(eager), np.asarray(jitted), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"eps": -1e-3}, "eps"), ({"clip": 0.0}, "clip"), ({"clip": -1.0}, "clip")],
)
def test_bad_hyperparameters_raise_naming_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=rf"{name}={list(kwargs.values())[0]}"):
        group_advantages(REWARDS, SLOTS, NUM_PROMPTS, **kwargs)


def test_mismatched_shapes_raise():
    with pytest.raises(AssertionError):
        group_advantages(REWARDS, SLOTS[:-1], NUM_PROMPTS)


@settings(max_examples=40, deadline=None)
@given(
    data=st.lists(
        st.tuples(st.integers(0, 4), st.sampled_from([-1.0, 0.0, 0.5, 1.0]), st.booleans()),
        min_size=16,
        max_size=16,
    ),
    normalize_std=st.booleans(),
)
def test_random_ragged_groups_match_the_reference(data, normalize_std):
    slots = np.array([d[0] for d in data], np.int32)
    rewards = np.array([d[1] for d in data], np.float32)
    valid = np.array([d[2] for d in data])
    expected = reference_advantages(
        rewards, slots, 5, normalize_std=normalize_std, eps=1e-6, clip=2.0, valid=valid
    )
    got = jitted_advantages(rewards, slots, valid, 5, normalize_std, clip=2.0)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-6)


def test_slots_sharded_over_eight_devices_give_the_same_advantages():
    # Auto axes, as the project's meshes (gdro_jax.models.make_mesh): the compiler propagates.
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    rng = np.random.default_rng(1)
    slots = np.sort(rng.integers(0, 5, size=32)).astype(np.int32)
    rewards = rng.choice([-1.0, 1.0], size=32).astype(np.float32)
    valid = rng.random(32) > 0.1
    sharded = [jax.device_put(x, sharding) for x in (rewards, slots, valid)]
    got = jitted_advantages(*sharded, 5, True)
    expected = reference_advantages(
        rewards, slots, 5, normalize_std=True, eps=1e-6, clip=5.0, valid=valid
    )
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-6)


# --- The released code's estimator: verl's compute_grpo_outcome_advantage.


def released_grpo_advantages(scores, index, *, norm_adv_by_std_in_grpo, epsilon=1e-6):
    """verl's `compute_grpo_outcome_advantage` written out with numpy: per prompt id, a group of
    one gets mean 0 and std 1, a larger group its mean and `torch.std` (sample, N - 1); no clip."""
    scores = np.asarray(scores, np.float64)
    id2score = {}
    for i, idx in enumerate(index):
        id2score.setdefault(int(idx), []).append(scores[i])
    id2mean, id2std = {}, {}
    for idx, group in id2score.items():
        if len(group) == 1:
            id2mean[idx], id2std[idx] = 0.0, 1.0
        else:
            id2mean[idx] = np.mean(group)
            id2std[idx] = np.std(group, ddof=1)
    out = np.zeros_like(scores)
    for i, idx in enumerate(index):
        out[i] = scores[i] - id2mean[int(idx)]
        if norm_adv_by_std_in_grpo:
            out[i] /= id2std[int(idx)] + epsilon
    return out


@functools.partial(jax.jit, static_argnames=("num_prompts", "normalize_std"))
def released_advantages(rewards, slots, valid, num_prompts, normalize_std):
    return group_advantages(
        rewards,
        slots,
        num_prompts,
        normalize_std=normalize_std,
        clip=None,
        valid_R=valid,
        estimator="sample",
    )


@pytest.mark.parametrize("normalize_std", [True, False])
def test_sample_estimator_without_clip_matches_the_released_code(normalize_std):
    # REWARDS has a group of one (prompt 2) and an all-equal group (prompt 1); a lone success in
    # a group of 31 (prompt 6) gets 30 / sqrt(31) = 5.39 from the sample std, above the clip of 5.
    slots = np.concatenate([SLOTS[VALID], np.full(31, 6, np.int32)])
    rewards = np.concatenate([REWARDS[VALID], np.array([1.0] + [0.0] * 30, np.float32)])
    valid = np.ones(len(slots), bool)
    expected = released_grpo_advantages(rewards, slots, norm_adv_by_std_in_grpo=normalize_std)
    got = np.asarray(released_advantages(rewards, slots, valid, 7, normalize_std))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert got[slots == 2][0] != 0.0  # the group of one keeps its raw reward
    assert np.all(got[slots == 1] == 0.0)  # an all-equal group gets exactly 0
    if normalize_std:
        assert got[slots == 6][0] > 5.3  # unclipped


def test_sample_std_is_the_population_std_times_sqrt_n_over_n_minus_1():
    # One success in a group of n: the population advantage over the sample one is
    # sqrt(n / (n - 1)), 1.41 at n = 2 down to 1.04 at n = 12 (Rollout-GDRO's range).
    sizes = np.arange(2, 13)
    slots = np.repeat(np.arange(len(sizes)), sizes).astype(np.int32)
    rewards = np.concatenate([[1.0] + [-1.0] * (n - 1) for n in sizes]).astype(np.float32)
    valid = np.ones(len(slots), bool)
    first = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    population = np.asarray(jitted_advantages(rewards, slots, valid, len(sizes), True, clip=100.0))
    sample = np.asarray(released_advantages(rewards, slots, valid, len(sizes), True))
    np.testing.assert_allclose(
        population[first] / sample[first], np.sqrt(sizes / (sizes - 1)), rtol=1e-5
    )


def test_default_estimator_is_the_released_sample_one():
    default = group_advantages(REWARDS, SLOTS, NUM_PROMPTS, valid_R=VALID)
    sample = group_advantages(REWARDS, SLOTS, NUM_PROMPTS, valid_R=VALID, estimator="sample")
    population = group_advantages(
        REWARDS, SLOTS, NUM_PROMPTS, valid_R=VALID, estimator="population"
    )
    np.testing.assert_array_equal(np.asarray(default), np.asarray(sample))
    assert not np.array_equal(np.asarray(default), np.asarray(population))


def test_unknown_estimator_raises_naming_it():
    with pytest.raises(ValueError, match="estimator='torch'"):
        group_advantages(REWARDS, SLOTS, NUM_PROMPTS, estimator="torch")


@settings(max_examples=40, deadline=None)
@given(
    data=st.lists(
        st.tuples(st.integers(0, 5), st.sampled_from([-1.0, 0.0, 0.5, 1.0]), st.booleans()),
        min_size=16,
        max_size=16,
    ),
    normalize_std=st.booleans(),
)
def test_random_ragged_groups_match_the_released_code(data, normalize_std):
    slots = np.array([d[0] for d in data], np.int32)
    rewards = np.array([d[1] for d in data], np.float32)
    valid = np.array([d[2] for d in data])
    # The released code has no mask: its batch is the valid slots only; invalid slots get 0 here.
    expected = np.zeros(len(slots))
    expected[valid] = released_grpo_advantages(
        rewards[valid], slots[valid], norm_adv_by_std_in_grpo=normalize_std
    )
    got = released_advantages(rewards, slots, valid, 6, normalize_std)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-5)
