"""`build_controllers` hands the run's config to the controllers it builds."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdro_jax import configs
from tests.train.configs import tiny_config

NUM_DATASET_PROMPTS = 64
VARIANCE_FLOOR = 0.01  # rollout_gdro's default


@pytest.mark.parametrize("reward_values", [(0.0, 1.0), (-1.0, 1.0)])
def test_rollout_gdro_proxy_and_shadow_price_use_the_configs_reward_values(reward_values):
    config = tiny_config(
        "rollout_gdro", reward_values=reward_values, **{"classifier.statistic": "mean_accuracy"}
    )
    gdro = configs.build_controllers(config, NUM_DATASET_PROMPTS)
    num_prompts, n = config.num_prompts, config.n_mean
    ids = jnp.arange(num_prompts, dtype=jnp.int32)
    plan = gdro.plan(gdro.init(), ids, jax.random.key(0))
    # A reward of r_lo or r_hi, r_hi with probability p, has variance scale * p (1 - p).
    scale = (reward_values[1] - reward_values[0]) ** 2
    # Every prompt is unseen (p_hat 0, bin 0): v = scale * max(0, floor) for each, an even split
    # of n each, and mu is the gain v / ((n - 1) n) of the last unit handed out.
    np.testing.assert_array_equal(plan.num_rollouts, n)
    np.testing.assert_allclose(float(plan.mu), scale * VARIANCE_FLOOR / ((n - 1) * n), rtol=1e-6)
    # After the update bin 0's variance is the observed proxy scale * mean_i p_i (1 - p_i).
    num_correct = np.arange(num_prompts) % (n + 1)
    state = gdro.update(
        gdro.init(),
        plan,
        ids,
        num_correct=jnp.asarray(num_correct, jnp.int32),
        losses=jnp.zeros((num_prompts,)),
    )
    p = num_correct / n
    expected = scale * max(np.mean(p * (1 - p)), VARIANCE_FLOOR)
    assert bool(state.rollout.seen[0])
    assert float(state.rollout.variance[0]) == pytest.approx(expected, rel=1e-5)


def test_classifier_bins_from_reaches_multi_adversary_and_bad_values_name_the_field():
    config = tiny_config("prompt_gdro", **{"classifier.bins_from": "previous_batch"})
    gdro = configs.build_controllers(config, NUM_DATASET_PROMPTS)
    state = gdro.init()
    np.testing.assert_array_equal(state.previous_bins, np.full(config.num_prompts, -1))
    assert configs.build_controllers(tiny_config("prompt_gdro"), 64).init().previous_bins is None
    config = tiny_config("prompt_gdro", **{"classifier.bins_from": "last_batch"})
    with pytest.raises(ValueError, match=r"config\.classifier\.bins_from must be one of"):
        configs.build_controllers(config, NUM_DATASET_PROMPTS)
    config = tiny_config(
        "prompt_gdro",
        **{"classifier.bins_from": "previous_batch", "prompt_gdro.realisation": "resample"},
    )
    with pytest.raises(ValueError, match=r"config\.classifier\.bins_from=.*does not combine"):
        configs.build_controllers(config, NUM_DATASET_PROMPTS)
