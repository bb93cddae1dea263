"""The contract every controller keeps: jit equals eager, vmap, scan, fixed structure, mesh; and
every rollout allocation's exact total.

Each controller is driven by a `step(state, key) -> (state, outputs)` function that draws a random
batch from `key` and applies the controller's queries and update, as a training loop would. The
parts are taken from `controllers.PARTS` and driven through their decision's protocol only, so a
part registered there is covered without a line here.
"""

import functools
import inspect

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
    present = jnp.arange(NUM_BINS) < 7
    q = adversary.distribution(state, present)
    metrics = adversary.metrics(state, present)
    return adversary.update(state, bins, losses=losses), (weights, q, metrics)


def _allocation_step(allocator, state, key):
    """A `RolloutAllocator` through its protocol: allocate, then observe the counts."""
    k_batch, k_alloc = jax.random.split(key)
    ids, _, num_correct, losses = _batch(k_batch)
    bins = ids % NUM_BINS
    p_hat = (ids % 7) / 7.0
    n, info = allocator.allocate(state, bins, p_hat, k_alloc, prompt_ids=ids)
    new_state = allocator.update(
        state,
        bins,
        p_hat=p_hat,
        losses=losses,
        num_correct=jnp.minimum(num_correct, n),
        num_rollouts=n,
        prompt_ids=ids,
    )
    return new_state, (n, info.mu, info.success_rate, allocator.metrics(info))


def _sampler_step(sampler, state, key):
    """A `PromptSampler` through its protocol: draw a batch, then observe its groups."""
    k_batch, k_draw = jax.random.split(key)
    _, num_rollouts, num_correct, _ = _batch(k_batch)
    # A batch of 4: Beta draws run op by op eagerly, slowly.
    draw = sampler.draw(state, 4, k_draw)
    new_state = sampler.update(
        state,
        prompt_ids=draw.prompt_ids,
        num_correct=num_correct[:4],
        num_rollouts=num_rollouts[:4],
    )
    return new_state, (draw.prompt_ids, draw.sampled_rate, sampler.metrics(draw))


def _filter_step(filter_, state, key):
    """A `GroupFilter` through its protocol: select the round's prompts, keep, add, take when
    ready."""
    k_select, k_rewards = jax.random.split(key)
    selection = filter_.select(state, jnp.arange(BATCH), k_select)
    rewards = jnp.where(jax.random.uniform(k_rewards, (BATCH, 4)) < 0.4, 1.0, -1.0)
    groups = {"rewards": rewards, "ids": selection.prompt_ids}
    keep = filter_.keep(rewards)
    state, info = filter_.add(state, groups, keep=keep, rewards_NG=rewards, selection=selection)
    taken, filled, emptied = filter_.take(state)
    state = jax.tree.map(lambda a, b: jnp.where(info.ready, a, b), emptied, state)
    return state, (info.kept, info.ready, filled, taken["ids"], filter_.metrics(state, info))


def _multi_step(multi, state, key):
    k_batch, k_plan = jax.random.split(key)
    ids, _, _, losses = _batch(k_batch)
    plan = multi.plan(state, ids, k_plan)
    num_correct = jnp.minimum(ids % 5, plan.num_rollouts)
    new_state = multi.update(state, plan, ids, num_correct=num_correct, losses=losses)
    return new_state, (plan.bins, plan.num_rollouts, plan.prompt_of_slot, plan.advantage_weights)


# decision -> the driver that runs any part of it through the decision's protocol alone.
DRIVERS = {
    "prompt_sampler": _sampler_step,
    "rollout_allocation": _allocation_step,
    "prompt_adversary": _prompt_step,
    "group_filter": _filter_step,
}
# The run-level arguments a part's factory may take (`configs.build_controllers` passes them).
RUN_LEVEL = {"num_prompts": NUM_PROMPTS, "num_bins": NUM_BINS, "n_mean": 4, "num_groups": BATCH}
# (decision, part) -> hyperparameter variants beyond the defaults, each driven too.
VARIANTS = {
    ("prompt_adversary", "prompt_gdro"): {
        "hedge": {"ema": None, "clip": None, "share_normalize": False}
    },
    ("rollout_allocation", "rollout_gdro"): {"arms": {"mode": "arms"}},
    ("rollout_allocation", "knapsack"): {"short_history": {"n_max": 8, "min_history": 2}},
    ("prompt_sampler", "mopps"): {"two_candidates": {"candidates": 2}},
    ("group_filter", "dynamic_sampling"): {"four_rounds": {"max_rounds": 4}},
}


def build_part(decision: str, name: str, **kwargs):
    """A registered part with the run-level arguments its factory accepts."""
    factory = controllers.PARTS[decision][name]
    accepted = inspect.signature(factory).parameters
    return factory(**{k: v for k, v in RUN_LEVEL.items() if k in accepted}, **kwargs)


def part_cases():
    """Every registered part (defaults, then each variant), as `decision/part[/variant]`."""
    cases = []
    for decision in controllers.DECISIONS:
        for name in controllers.PARTS[decision]:
            cases.append((f"{decision}/{name}", decision, name, {}))
            for variant, kwargs in VARIANTS.get((decision, name), {}).items():
                cases.append((f"{decision}/{name}/{variant}", decision, name, kwargs))
    return cases


def _init(part, decision):
    if decision == "group_filter":
        example = {"rewards": jnp.zeros((BATCH, 4)), "ids": jnp.zeros((BATCH,), jnp.int32)}
        return functools.partial(part.init, example)
    return part.init


def _make(name):
    for case, decision, part_name, kwargs in part_cases():
        if case == name:
            part = build_part(decision, part_name, **kwargs)
            return _init(part, decision), functools.partial(DRIVERS[decision], part)
    if name == "passk_window":
        c = controllers.passk_classifier(NUM_PROMPTS, window=4, hysteresis=0.02)
        return c.init, functools.partial(_classifier_step, c)
    if name == "passk_cumulative":
        c = controllers.passk_classifier(NUM_PROMPTS, window=0, statistic="mean_accuracy")
        return c.init, functools.partial(_classifier_step, c)
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
    *(case for case, *_ in part_cases()),
    "multi_adversary",
]


def test_every_decision_has_a_driver_and_every_part_its_protocol():
    """A registered part is driven by its decision's driver through its protocol: a new part
    needs no line here, a new decision fails until it has a driver, and a part that does not
    answer its decision's protocol (or cannot be built from the run-level arguments and its
    defaults) fails."""
    assert set(DRIVERS) == set(controllers.DECISIONS) == set(controllers.PROTOCOLS)
    for _, decision, name, kwargs in part_cases():
        part = build_part(decision, name, **kwargs)
        assert isinstance(part, controllers.PROTOCOLS[decision]), (decision, name)


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
    first, second = jax.random.split(jax.random.key(0), 2)
    # Eager is the plain call, as chex's `without_jit` variant: the controller's code runs op by
    # op on concrete arrays, so what it does at trace time only (a Python counter, a value read
    # once and baked in) differs from the jitted program. The bodies of its loops (a bisection,
    # the Beta sampler's) are traced in both programs; `jax.disable_jit` would run them in Python
    # too, at 2.4 times the time (75 s against 31 s for these tests). It takes one step: the
    # second, from a state one (jitted) step old, whose paths a fresh state may not take (a
    # buffer to commit, a history to read).
    state, _ = jit_step(init(), first)
    eager_state, eager_out = step(state, second)
    jit_state, jit_out = jit_step(state, second)
    _assert_trees_close(eager_state, jit_state)
    _assert_trees_close(eager_out, jit_out)


def test_update_keeps_structure_shapes_and_dtypes(driver):
    name, init, _, jit_step = driver
    state = init()
    new_state, outputs = jit_step(state, jax.random.key(1))
    chex.assert_trees_all_equal_structs(state, new_state)
    chex.assert_trees_all_equal_shapes_and_dtypes(state, new_state)
    if name.split("/")[0] in controllers.DECISIONS:
        # What a part reports through its protocol's `metrics` (its driver's last output): a
        # scalar, one value per bin (`bin/...`) or per prompt of the batch (`prompt/...`).
        metrics = outputs[-1]
        assert isinstance(metrics, dict) and metrics, name
        batch = 4 if name.startswith("prompt_sampler") else BATCH
        for metric, value in metrics.items():
            value = np.asarray(value)
            want = {"bin": (NUM_BINS,), "prompt": (batch,)}.get(metric.split("/")[0], ())
            assert value.shape == want, (name, metric, value.shape)
            assert np.all(np.isfinite(value)), (name, metric)


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


ALLOCATION_BATCH = 4  # prompts per step
ALLOCATION_POOL = 8


def _allocation_observations(key, num_rollouts):
    """Visits where most prompts are solved (or failed) by every rollout and a few are mixed:
    budgets larger than the mixed prompts can absorb below n_max."""
    k_ids, k_kind, k_mixed = jax.random.split(key, 3)
    ids = jax.random.randint(k_ids, (ALLOCATION_BATCH,), 0, ALLOCATION_POOL)
    kind = jax.random.choice(k_kind, 3, (ALLOCATION_BATCH,), p=jnp.array([0.6, 0.2, 0.2]))
    mixed = jnp.clip(
        jnp.floor(jax.random.uniform(k_mixed, (ALLOCATION_BATCH,)) * num_rollouts), 1, None
    )
    solved = jnp.where(kind == 0, num_rollouts, jnp.where(kind == 1, 0, mixed))
    correct = jnp.where(ids < ALLOCATION_POOL // 2, solved, mixed)  # half the pool stays mixed
    return ids, jnp.minimum(correct, num_rollouts).astype(jnp.int32)


@pytest.mark.parametrize(
    "part",
    [name for name in controllers.PARTS["rollout_allocation"]],
)
def test_every_allocation_spends_exactly_n_mean_per_prompt_whatever_its_state(part):
    """R = N * n_mean slots every step, n_min <= n_i, over random states: long runs of visits
    where most prompts are solved, so the mixed ones cannot absorb the budget below n_max."""
    n_mean, n_min, n_max = 4, 2, 6
    factory = controllers.PARTS["rollout_allocation"][part]
    accepted = inspect.signature(factory).parameters
    given = {"num_prompts": ALLOCATION_POOL, "num_bins": NUM_BINS, "n_mean": n_mean}
    extra = {"min_history": 1, "window": 2} if "min_history" in accepted else {}
    allocator = factory(
        **{k: v for k, v in given.items() if k in accepted}, n_min=n_min, n_max=n_max, **extra
    )

    @jax.jit
    def step(state, key):
        k_obs, k_alloc = jax.random.split(key)
        ids, _ = _allocation_observations(k_obs, n_mean)
        bins = ids % NUM_BINS
        n, _ = allocator.allocate(state, bins, None, k_alloc, prompt_ids=ids)
        _, correct = _allocation_observations(k_obs, n)
        state = allocator.update(
            state, bins, num_correct=correct, num_rollouts=n, prompt_ids=ids,
            losses=1.0 - correct / n,
        )  # fmt: skip
        return state, n

    for seed in range(4):
        _, counts = jax.lax.scan(step, allocator.init(), jax.random.split(jax.random.key(seed), 60))
        counts = np.asarray(counts)
        assert (counts.sum(axis=1) == ALLOCATION_BATCH * n_mean).all(), counts.sum(axis=1)
        assert (counts >= n_min).all() or part == "knapsack", counts.min()
        assert (counts >= 0).all()


def test_knapsack_spreads_a_budget_past_n_max_rather_than_lose_it():
    """One mixed prompt beside three solved ones, n_mean=4, n_min=2, n_max=6: the solved ones
    get their floor, the mixed one n_max, and what is left still reaches the 16 slots."""
    allocator = controllers.knapsack(
        4, n_mean=4, n_min=2, n_max=6, min_history=1, window=1, fallback=False
    )
    ids = jnp.arange(4, dtype=jnp.int32)
    state = allocator.update(
        allocator.init(),
        prompt_ids=ids,
        num_correct=jnp.array([2, 4, 4, 4]),
        num_rollouts=jnp.array([4, 4, 4, 4]),
    )
    counts, info = allocator.allocate(state, prompt_ids=ids)
    assert np.asarray(info.effective).tolist() == [True, False, False, False]
    assert int(jnp.sum(counts)) == 16, counts
