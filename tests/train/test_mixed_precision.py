"""Mixed precision: bfloat16 compute updates float32 master parameters, even at lr 1e-6."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gdro_jax import configs, sampling, train
from tests.train.configs import parity_reward, small_run_config, tiny_config


@pytest.fixture(scope="module")
def bf16_step():
    config = small_run_config("gdro_both", **{"model.compute_dtype": "bfloat16"})
    config.optimizer.learning_rate = 1e-6
    run = train.build_run(config, reward_fn=parity_reward)
    before = jax.tree.map(np.array, run.state.params)
    state, metrics, _ = train.run_step(run, run.state, next(run.prompt_batches))
    return run, before, state, metrics


def test_a_bf16_compute_step_at_lr_1e6_moves_the_float32_master_parameters(bf16_step):
    run, before, state, metrics = bf16_step
    assert run.program.graphdef is not None and int(metrics["skipped"]) == 0
    assert 0 < float(metrics["accuracy"]) < 1 and float(metrics["grad_norm"]) > 0
    leaves = jax.tree.leaves(state.params)
    assert all(leaf.dtype == jnp.float32 for leaf in leaves)
    pairs = list(zip(leaves, jax.tree.leaves(before), strict=True))
    # Adam's first step moves almost every coordinate by about lr = 1e-6 in float32 ...
    for new, old in pairs:
        delta = np.abs(np.asarray(new) - old)
        assert delta.max() < 1e-5 and (delta > 0).mean() > 0.9, (delta.max(), (delta > 0).mean())
    # ... and the same step on bfloat16 copies is mostly rounded away (only coordinates close to
    # a rounding boundary or near zero change): why the master parameters are float32.
    for new, old in pairs:
        changed = jnp.asarray(new, jnp.bfloat16) != jnp.asarray(old, jnp.bfloat16)
        assert float(jnp.mean(changed)) < 0.1


def test_the_kv_cache_is_bfloat16_and_the_log_probs_float32(bf16_step):
    run, _, state, _ = bf16_step
    policy = nnx.merge(run.program.graphdef, state.params)
    assert policy.config.compute_dtype == "bfloat16"
    cache = policy.init_cache(2, 8)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(cache))
    tokens = jnp.asarray(run.task.prompt_tokens[:2])
    lengths = jnp.asarray(run.task.prompt_lengths[:2])
    logp = sampling.completion_logprobs(policy, tokens, lengths, tokens[:, :4], lengths * 0 + 4)
    assert logp.dtype == jnp.float32 and bool(jnp.all(logp <= 0))


def test_bfloat16_master_parameters_are_refused_naming_the_field():
    config = tiny_config("grpo", **{"model.param_dtype": "bfloat16"})
    with pytest.raises(ValueError, match=r"config.model.param_dtype must be float32"):
        configs.read_run_config(config)
