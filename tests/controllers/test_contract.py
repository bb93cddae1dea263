"""The contract every controller keeps: jit equals eager, vmap, scan, fixed structure, mesh.

Each controller is driven by a `step(state, key) -> (state, outputs)` function that draws a random
batch from `key` and applies the controller's queries and update, as a training loop would.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from gdro_jax import controllers

NUM_PROMPTS = 64  # dataset size D
BATCH = 16  # prompts per step N
NUM_BINS = 10


def _batch(key):
    k_ids, k_n, k_c, k_loss = jax.random.split(key, 4)
    ids = jax.random.randint(k_ids, (BATCH,), 0, NUM_PROMPTS)
    num_rollouts = jax.random.randint(k_n, (BATCH,), 1, 9)
    num_correct = jnp.floor(jax.random.uniform(k_c, (BATCH,)) * (num_rollouts + 1)).astype(int)
    losses = jax.random.uniform(k_loss, (BATCH,))
    return ids, num_rollouts, num_correct, losses


def _classifier_step(classifier, state, key):
    ids, num_rollouts, num_correct, _ = _batch(key)
    bins = classifier.bins(state, ids)
    p_hat = classifier.p_hat(state, ids)
    return classifier.update(state, ids, num_correct=num_correct, num_rollouts=num_rollouts), (
        bins,
        p_hat,
    )


def _prompt_step(adversary, state, key):
    ids, num_rollouts, _, losses = _batch(key)
    bins = ids % NUM_BINS
    weights = adversary.weights(state, bins, num_rollouts=num_rollouts)
    q = adversary.distribution(state, jnp.arange(NUM_BINS) < 7)
    return adversary.update(state, bins, losses=losses), (weights, q)


def _rollout_step(adversary, state, key):
    k_batch, k_alloc = jax.random.split(key)
    ids, _, num_correct, losses = _batch(k_batch)
    bins = ids % NUM_BINS
    p_hat = (ids % 7) / 7.0
    n, info = adversary.allocate(state, bins, p_hat, k_alloc)
    new_state = adversary.update(
        state,
        bins,
        p_hat=p_hat,
        losses=losses,
        num_correct=jnp.minimum(num_correct, n),
        num_rollouts=n,
    )
    return new_state, (n, info.mu)


def _knapsack_step(allocator, state, key):
    ids, _, num_correct, _ = _batch(key)
    n, info = allocator.allocate(state, prompt_ids=ids)
    new_state = allocator.update(
        state, prompt_ids=ids, num_correct=jnp.minimum(num_correct, n), num_rollouts=n
    )
    return new_state, (n, info.mu, info.success_rate)


def _mopps_step(sampler, state, key):
    k_batch, k_draw = jax.random.split(key)
    _, num_rollouts, num_correct, _ = _batch(k_batch)
    # A batch of 4 from 8 candidates: Beta draws run op by op eagerly, slowly.
    draw = sampler.draw(state, 4, k_draw)
    new_state = sampler.update(
        state,
        prompt_ids=draw.prompt_ids,
        num_correct=num_correct[:4],
        num_rollouts=num_rollouts[:4],
    )
    return new_state, (draw.prompt_ids, draw.sampled_rate)


def _dynamic_sampling_step(filter_, state, key):
    rewards = jnp.where(jax.random.uniform(key, (BATCH, 4)) < 0.2, 1.0, -1.0)
    groups = {"rewards": rewards, "ids": jnp.arange(BATCH)}
    state, info = filter_.add(state, groups, keep=filter_.keep(rewards))
    taken, filled, emptied = filter_.take(state)
    state = jax.tree.map(lambda a, b: jnp.where(info.ready, a, b), emptied, state)
    return state, (info.kept, info.ready, filled, taken["ids"])


def _multi_step(multi, state, key):
    k_batch, k_plan = jax.random.split(key)
    ids, _, _, losses = _batch(k_batch)
    plan = multi.plan(state, ids, k_plan)
    num_correct = jnp.minimum(ids % 5, plan.num_rollouts)
    new_state = multi.update(state, plan, ids, num_correct=num_correct, losses=losses)
    return new_state, (plan.bins, plan.num_rollouts, plan.prompt_of_slot, plan.advantage_weights)


def _make(name):
    if name == "passk_window":
        c = controllers.passk_classifier(NUM_PROMPTS, window=4, hysteresis=0.02)
        return c.init, functools.partial(_classifier_step, c)
    if name == "passk_cumulative":
        c = controllers.passk_classifier(NUM_PROMPTS, window=0, statistic="mean_accuracy")
        return c.init, functools.partial(_classifier_step, c)
    if name == "prompt_gdro":
        a = controllers.prompt_gdro(NUM_BINS)
        return a.init, functools.partial(_prompt_step, a)
    if name == "prompt_gdro_hedge":
        a = controllers.prompt_gdro(NUM_BINS, ema=None, clip=None, share_normalize=False)
        return a.init, functools.partial(_prompt_step, a)
    if name == "rollout_sqrt":
        a = controllers.rollout_gdro(NUM_BINS)
        return a.init, functools.partial(_rollout_step, a)
    if name == "rollout_arms":
        a = controllers.rollout_gdro(NUM_BINS, mode="arms")
        return a.init, functools.partial(_rollout_step, a)
    if name == "knapsack":
        a = controllers.knapsack(NUM_PROMPTS, n_mean=4, n_min=2, n_max=8, min_history=2)
        return a.init, functools.partial(_knapsack_step, a)
    if name == "mopps":
        a = controllers.mopps(NUM_PROMPTS, candidates=2)
        return a.init, functools.partial(_mopps_step, a)
    if name == "dynamic_sampling":
        a = controllers.dynamic_sampling(BATCH, max_rounds=4)
        example = {"rewards": jnp.zeros((BATCH, 4)), "ids": jnp.zeros((BATCH,), jnp.int32)}
        return functools.partial(a.init, example), functools.partial(_dynamic_sampling_step, a)
    if name == "multi_adversary":
        m = controllers.multi_adversary(
            controllers.passk_classifier(NUM_PROMPTS),
            controllers.prompt_gdro(NUM_BINS),
            controllers.rollout_gdro(NUM_BINS),
        )
        return m.init, functools.partial(_multi_step, m)
    raise KeyError(name)


NAMES = [
    "passk_window",
    "passk_cumulative",
    "prompt_gdro",
    "prompt_gdro_hedge",
    "rollout_sqrt",
    "rollout_arms",
    "knapsack",
    "mopps",
    "dynamic_sampling",
    "multi_adversary",
]


@pytest.fixture(scope="module", params=NAMES)
def driver(request):
    init, step = _make(request.param)
    return request.param, init, step, jax.jit(step)


def _assert_trees_close(a, b, atol=1e-6):
    chex.assert_trees_all_equal_structs(a, b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype
        if np.issubdtype(x.dtype, np.floating):
            np.testing.assert_allclose(x, y, atol=atol, rtol=1e-5)
        else:
            np.testing.assert_array_equal(x, y)


def test_jit_equals_eager(driver):
    _, init, step, jit_step = driver
    keys = jax.random.split(jax.random.key(0), 2)  # eager is op by op: two steps suffice
    eager_state = jit_state = init()
    with jax.disable_jit():
        for key in keys:
            eager_state, eager_out = step(eager_state, key)
    for key in keys:
        jit_state, jit_out = jit_step(jit_state, key)
    _assert_trees_close(eager_state, jit_state)
    _assert_trees_close(eager_out, jit_out)


def test_update_keeps_structure_shapes_and_dtypes(driver):
    _, init, _, jit_step = driver
    state = init()
    new_state, _ = jit_step(state, jax.random.key(1))
    chex.assert_trees_all_equal_structs(state, new_state)
    chex.assert_trees_all_equal_shapes_and_dtypes(state, new_state)


def test_vmap_over_four_independent_states(driver):
    _, init, _, jit_step = driver
    keys = jax.random.split(jax.random.key(2), 4)
    states = jax.tree.map(lambda x: jnp.stack([x] * 4), init())
    vmapped = jax.jit(jax.vmap(jit_step))
    states, _ = vmapped(states, keys)
    states, outs = vmapped(states, keys[::-1])
    for i, (k1, k2) in enumerate(zip(keys, keys[::-1], strict=True)):
        single, _ = jit_step(init(), k1)
        single, single_out = jit_step(single, k2)
        _assert_trees_close(jax.tree.map(lambda x, i=i: x[i], states), single)
        _assert_trees_close(jax.tree.map(lambda x, i=i: x[i], outs), single_out)


def test_a_forty_step_scan_equals_the_python_loop(driver):
    _, init, _, jit_step = driver
    keys = jax.random.split(jax.random.key(3), 40)
    scanned, outs = jax.jit(lambda s, k: jax.lax.scan(jit_step, s, k))(init(), keys)
    state = init()
    for key in keys:
        state, out = jit_step(state, key)
    _assert_trees_close(scanned, state, atol=1e-5)
    _assert_trees_close(jax.tree.map(lambda x: x[-1], outs), out, atol=1e-5)


def test_states_stay_replicated_on_an_eight_device_mesh(driver):
    name, init, step, jit_step = driver
    assert len(jax.devices()) == 8, "conftest must force 8 fake CPU devices"
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
    replicated = NamedSharding(mesh, P())
    state = jax.device_put(init(), replicated)
    keys = jax.random.split(jax.random.key(4), 3)
    sharded_step = jax.jit(step, out_shardings=(replicated, replicated))
    reference = init()
    with jax.set_mesh(mesh):
        for key in keys:
            state, _ = sharded_step(state, key)
    for key in keys:
        reference, _ = jit_step(reference, key)
    for leaf in jax.tree.leaves(state):
        assert leaf.sharding.is_fully_replicated, name
        assert len(leaf.sharding.device_set) == 8, name
    _assert_trees_close(state, reference)
