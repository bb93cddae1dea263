"""Guards: configs that cannot work, misbehaving rewards, and steps with a non-finite loss."""

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdro_jax import configs, train
from gdro_jax.step import HostRewardCaller, NonFiniteStepsError, RewardError
from gdro_jax.train import check_model_fits
from tests.train.configs import small_run_config


def _config(method="grpo", **overrides):
    return small_run_config(method, **{"task.pool_size": 32, **overrides})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"method": "rollout_gdro", "n_mean": 1},
            r"rollout budget is infeasible: N \* n_mean = 4 \* 1 .*n_min=2",
        ),
        (
            {"method": "gdro_both", "rollout_gdro.n_max": 1},
            r"config.rollout_gdro.n_min and n_max .* n_min=2, n_max=1",
        ),
        ({"classifier.edges": (0.5, 0.2)}, r"config.classifier.edges must be strictly ascending"),
        ({"classifier.edges": (0.0, 0.5)}, r"config.classifier.edges must be bin edges strictly"),
        ({"mesh.data": 16}, r"config.mesh .* = 16 devices, but only 8 are available"),
        (
            {"num_prompts": 3, "n_mean": 3, "mesh.data": 2},
            r"R = config.num_prompts \* config.n_mean = 9 rollouts must divide evenly .* = 2\)",
        ),
        ({"grpo.num_minibatches": 3}, r"num_minibatches=3 equal mini-batches"),
        (
            {"num_prompts": 0},
            r"config.num_prompts must be a positive int, got config.num_prompts=0",
        ),
        ({"mesh.tensor": 0}, r"config.mesh.tensor must be a positive int"),
        (
            # R = 8 in 2 mini-batches of 4, micro-batches of 1 over 2 batch shards.
            {"grpo.micro_batch_slots": 1, "mesh.fsdp": 2},
            r"config.grpo.micro_batch_slots must be a multiple of .* = 2\), or every device",
        ),
    ],
)
def test_configs_that_cannot_work_name_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        configs.read_run_config(_config(**overrides))


def test_guard_limit_is_validated_and_a_bad_config_builds_nothing():
    config = _config()
    config.guards = {"max_consecutive_skips": -1}
    with pytest.raises(ValueError, match="config.guards.max_consecutive_skips must be an int >= 0"):
        train.build_run(config)
    with pytest.raises(
        ValueError, match=r"longest prompt \(30 tokens\) plus config.max_new_tokens"
    ):
        check_model_fits(30, 100, 128)


def _raises(*args):
    raise KeyError("no gold answer")


def _nan(ids, tokens, lengths, slots):
    rewards = np.ones(len(lengths), np.float32)
    rewards[3] = np.nan
    return rewards, rewards > 0


def _short(ids, tokens, lengths, slots):
    return np.ones(2, np.float32), np.ones(2, bool)


def _slow(ids, tokens, lengths, slots):
    time.sleep(2.0)
    return np.ones(len(lengths), np.float32), np.ones(len(lengths), bool)


def _args(num_slots=8):
    return (
        np.arange(4),
        np.zeros((num_slots, 5), np.int32),
        np.full(num_slots, 5),
        np.arange(8) // 2,
    )


@pytest.mark.parametrize(
    ("fn", "timeout", "message"),
    [
        (_raises, None, r"reward function my_reward raised KeyError: 'no gold answer'"),
        (_nan, None, r"non-finite rewards for 1 of 8 rollouts \(slots \[3\], values \[nan\]\)"),
        (_short, None, r"returned rewards of shape \(2,\) .* expected \(8,\) each"),
        (_slow, 0.2, r"did not return within 0.2 s \(config.reward_timeout_s\)"),
    ],
)
def test_host_rewards_that_misbehave_raise_naming_the_function(fn, timeout, message):
    caller = HostRewardCaller(fn, "my_reward", timeout)
    with pytest.raises(RewardError, match=message):
        caller(*_args())
    caller.close()


def test_a_host_reward_within_its_time_returns_checked_arrays():
    caller = HostRewardCaller(lambda *a: (np.full(8, -1.0), np.zeros(8, bool)), "ok", 5.0)
    rewards, correct = caller(*_args())
    assert rewards.tolist() == [-1.0] * 8 and not correct.any()
    caller.close()


def test_a_device_reward_returning_nan_stops_the_step_naming_it():
    def poisoned(ids, tokens, lengths, slots):
        rewards = jnp.where(jnp.arange(lengths.shape[0]) == 5, jnp.nan, 1.0)
        return rewards, rewards > 0

    run = train.build_run(_config(), reward_fn=poisoned)
    with pytest.raises(
        RewardError, match=r"step 1: reward function reward_fn \(passed to build_run\)"
    ):
        train.run_step(run, run.state, next(run.prompt_batches))


@pytest.fixture(scope="module")
def gdro_run():
    return train.build_run(_config("gdro_both", **{"guards.max_consecutive_skips": 2}))


def _host_copy(tree):
    return jax.tree.map(
        lambda x: (
            np.asarray(jax.random.key_data(x))
            if jnp.issubdtype(x.dtype, jax.dtypes.prng_key)
            else np.asarray(x)
        ),
        tree,
    )


@pytest.mark.parametrize("poison", ["reward", "old_logprob"])
def test_a_poisoned_batch_is_skipped_counted_and_leaves_the_state_unchanged(gdro_run, poison):
    run = gdro_run
    state = jax.tree.map(jnp.copy, run.state)
    ids = jnp.asarray(next(run.prompt_batches), jnp.int32)
    plan = run.plan(state.gdro, ids, jax.random.key(0))
    rollouts = run.reward(ids, run.rollout(state.params, plan, ids, jax.random.key(1)), plan)
    # Mixed groups, so every prompt has a non-zero advantage and a NaN reaches the loss.
    rollouts = rollouts._replace(rewards=jnp.where(jnp.arange(8) % 2 == 0, 1.0, -1.0))
    if poison == "reward":
        poisoned = rollouts._replace(rewards=rollouts.rewards.at[2].set(jnp.nan))
    else:
        poisoned = rollouts._replace(logprobs=rollouts.logprobs.at[2, 0].set(jnp.nan))
    before = _host_copy((state.params, state.opt_state, state.gdro))

    state, metrics = run.update(state, plan, ids, poisoned)
    assert int(metrics["skipped"]) == 1 and int(state.skipped_steps) == 1
    assert int(state.consecutive_skips) == 1 and int(state.step) == 1
    after = _host_copy((state.params, state.opt_state, state.gdro))
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True):
        np.testing.assert_array_equal(a, b)
    assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(after[0]))

    # A clean batch afterwards trains again and resets the run of skips.
    state, metrics = run.update(state, plan, ids, rollouts)
    assert int(metrics["skipped"]) == 0 and int(state.skipped_steps) == 1
    assert int(state.consecutive_skips) == 0
    moved = [
        not np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(before[0]), jax.tree.leaves(state.params), strict=True)
    ]
    assert any(moved)


def test_too_many_nonfinite_steps_in_a_row_stop_the_run_naming_the_step(gdro_run):
    run = gdro_run
    state = jax.tree.map(jnp.copy, run.state)
    # A NaN weight makes every loss non-finite; the guard never writes NaN-updated values.
    leaves, treedef = jax.tree.flatten(state.params)
    leaves[0] = leaves[0].at[(0,) * leaves[0].ndim].set(jnp.nan)
    state = state._replace(params=jax.tree.unflatten(treedef, leaves))
    state, metrics, _ = train.run_step(run, state, next(run.prompt_batches))
    assert int(metrics["consecutive_skips"]) == 1
    with pytest.raises(NonFiniteStepsError, match=r"step 2: 2 consecutive steps .*=2\)"):
        train.run_step(run, state, next(run.prompt_batches))
