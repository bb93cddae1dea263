"""Prompt-GDRO's `resample` realisation in the trainer: the config builds it, and a step samples,
grades and updates on the prompts the plan drew, not on the pipeline's (the draw itself and
the importance-weighted update are checked in tests/controllers/test_compose.py)."""

import types

import jax.numpy as jnp
import numpy as np
import pytest

from gdro_jax import configs, controllers, train
from tests.train.configs import tiny_config


def test_the_config_builds_a_resampling_adversary_only_where_prompt_gdro_is_on():
    config = tiny_config("gdro_both", **{"prompt_gdro.realisation": "resample"})
    prompt = configs.build_controllers(config, 64).prompt_adversary
    assert prompt.realisation == "resample"
    config = tiny_config("rollout_gdro", **{"prompt_gdro.realisation": "resample"})
    assert configs.build_controllers(config, 64).prompt_adversary is None
    config = tiny_config("prompt_gdro", **{"prompt_gdro.realisation": "resampled"})
    with pytest.raises(ValueError, match=r"config\.prompt_gdro\.realisation must be one of"):
        configs.build_controllers(config, 64)


def test_a_step_uses_the_prompts_the_plan_drew():
    drawn = jnp.asarray([7, 7, 3, 9], jnp.int32)
    pipeline = np.asarray([0, 1, 2, 3], np.int32)
    seen = {}

    def plan(gdro, ids, key):
        seen["plan"] = np.asarray(ids)
        return controllers.Plan(
            bins=jnp.zeros(4, jnp.int32),
            p_hat=jnp.zeros(4),
            num_rollouts=jnp.full(4, 2, jnp.int32),
            prompt_of_slot=jnp.repeat(jnp.arange(4), 2),
            advantage_weights=jnp.ones(4),
            mu=jnp.zeros(()),
            prompt_ids=drawn,
            importance=jnp.full(10, 0.1),
        )

    def rollout(params, plan, ids, key):
        seen["rollout"] = np.asarray(ids)
        return types.SimpleNamespace(rewards=jnp.ones(8))

    def reward(ids, rollouts, plan):
        seen["reward"] = np.asarray(ids)
        return rollouts

    def update(state, plan, ids, rollouts):
        seen["update"] = np.asarray(ids)
        return state, {"consecutive_skips": jnp.zeros((), jnp.int32)}

    run = types.SimpleNamespace(
        settings=configs.read_run_config(tiny_config("prompt_gdro")),
        mesh=None,
        plan=plan,
        rollout=rollout,
        reward=reward,
        reward_name="stand-in",
        update=update,
    )
    state = types.SimpleNamespace(step=jnp.zeros((), jnp.int32), gdro=None, params=None)
    train.run_step(run, state, pipeline)
    np.testing.assert_array_equal(seen["plan"], pipeline)
    for phase in ("rollout", "reward", "update"):
        np.testing.assert_array_equal(seen[phase], np.asarray(drawn), err_msg=phase)
