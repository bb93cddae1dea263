"""`multi_adversary`: the three controllers threaded through plan and update."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdro_jax import controllers

NUM_PROMPTS, BATCH, N_MEAN = 40, 8, 4


@pytest.fixture(scope="module")
def parts():
    classifier = controllers.passk_classifier(NUM_PROMPTS, window=4, statistic="mean_accuracy")
    prompt = controllers.prompt_gdro(classifier.num_bins)
    rollout = controllers.rollout_gdro(classifier.num_bins, n_min=2, n_max=8, n_mean=N_MEAN)
    return classifier, prompt, rollout


def _visit(multi, state, ids, key):
    plan = multi.plan(state, ids, key)
    num_correct = jnp.minimum(ids % 5, plan.num_rollouts)
    losses = 1.0 - num_correct / plan.num_rollouts
    return multi.update(state, plan, ids, num_correct=num_correct, losses=losses), plan


def test_both_adversaries_off_is_plain_grpo(parts):
    classifier, _, _ = parts
    multi = controllers.multi_adversary(classifier, None, None, n_mean=N_MEAN)
    state = multi.init()
    ids = jnp.arange(BATCH)
    for step in range(3):
        state, plan = _visit(multi, state, ids + step, jax.random.key(step))
        np.testing.assert_array_equal(plan.num_rollouts, np.full(BATCH, N_MEAN))
        np.testing.assert_array_equal(plan.advantage_weights, np.ones(BATCH))
        np.testing.assert_array_equal(plan.prompt_of_slot, np.repeat(np.arange(BATCH), N_MEAN))
        assert float(plan.mu) == 0.0
    assert state.prompt is None and state.rollout is None


def test_plan_reads_history_up_to_the_previous_step_and_update_matches_the_parts(parts):
    classifier, prompt, rollout = parts
    multi = controllers.multi_adversary(classifier, prompt, rollout)
    rng = np.random.default_rng(0)
    state = multi.init()
    for step in range(6):
        ids = jnp.asarray(rng.choice(NUM_PROMPTS, BATCH, replace=False), jnp.int32)
        key = jax.random.key(step)
        plan = multi.plan(state, ids, key)
        np.testing.assert_array_equal(plan.bins, classifier.bins(state.classifier, ids))
        n, info = rollout.allocate(state.rollout, plan.bins, plan.p_hat, key)
        np.testing.assert_array_equal(plan.num_rollouts, n)
        assert float(plan.mu) == pytest.approx(float(info.mu))
        np.testing.assert_allclose(
            plan.advantage_weights, prompt.weights(state.prompt, plan.bins, num_rollouts=n)
        )
        assert int(plan.num_rollouts.sum()) == BATCH * N_MEAN
        np.testing.assert_array_equal(
            np.bincount(plan.prompt_of_slot, minlength=BATCH), plan.num_rollouts
        )
        num_correct = jnp.asarray(rng.integers(0, plan.num_rollouts + 1), jnp.int32)
        losses = 1.0 - num_correct / plan.num_rollouts
        new = multi.update(state, plan, ids, num_correct=num_correct, losses=losses)
        expected_classifier = classifier.update(
            state.classifier, ids, num_correct=num_correct, num_rollouts=plan.num_rollouts
        )
        np.testing.assert_array_equal(new.classifier.last_bin, expected_classifier.last_bin)
        np.testing.assert_allclose(
            new.prompt.scores, prompt.update(state.prompt, plan.bins, losses=losses).scores
        )
        state = new


def test_changing_decisions_never_recompile(parts):
    classifier, prompt, rollout = parts
    multi = controllers.multi_adversary(classifier, prompt, rollout)
    step = jax.jit(lambda s, ids, k: _visit(multi, s, ids, k))
    state = multi.init()
    allocations = set()
    for i in range(8):
        ids = (jnp.arange(BATCH) * 3 + i) % NUM_PROMPTS
        state, plan = step(state, ids, jax.random.key(i))
        allocations.add(tuple(np.asarray(plan.num_rollouts)))
    assert len(allocations) > 1, "the allocation should change as the classifier learns"
    assert step._cache_size() == 1


def test_slots_from_counts_maps_each_prompt_to_its_slots():
    n = jnp.array([3, 0, 2, 1], jnp.int32)
    np.testing.assert_array_equal(controllers.slots_from_counts(n, 6), [0, 0, 0, 2, 2, 3])


def test_mismatched_bins_raise(parts):
    classifier, _, _ = parts
    with pytest.raises(ValueError, match="num_bins"):
        controllers.multi_adversary(classifier, controllers.prompt_gdro(num_bins=5))
    with pytest.raises(ValueError, match="n_mean=0"):
        controllers.multi_adversary(classifier, n_mean=0)
