"""`multi_adversary.update` against the three updates composed by hand, leaf by leaf.

SPEC 7: after the rewards, the classifier records the step's visits, Prompt-GDRO folds the step's
per-prompt losses into the scores of the plan's bins, and Rollout-GDRO updates its per-bin variance
from the classifier's pass-rate estimate *after* this step's visit (so the variance that sizes the
next step's groups includes this step's rollouts), all under the same `valid` mask.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdro_jax import controllers

NUM_PROMPTS, BATCH, N_MEAN = 30, 8, 4


@pytest.fixture(scope="module")
def parts():
    classifier = controllers.passk_classifier(NUM_PROMPTS, window=3, statistic="mean_accuracy")
    prompt = controllers.prompt_gdro(classifier.num_bins, ema=0.3)
    rollout = controllers.rollout_gdro(
        classifier.num_bins, n_min=2, n_max=8, n_mean=N_MEAN, ema=0.3, reward_values=(0.0, 1.0)
    )
    multi = controllers.multi_adversary(classifier, prompt, rollout)
    return classifier, prompt, rollout, multi


def _observations(rng, plan):
    num_rollouts = np.asarray(plan.num_rollouts)
    num_correct = jnp.asarray(rng.integers(0, num_rollouts + 1), jnp.int32)
    losses = jnp.asarray(rng.normal(0.5, 0.3, size=BATCH), jnp.float32)
    return num_correct, losses


def _warm_state(multi, rng):
    """A few steps of visits, so every part of the state holds something."""
    state = multi.init()
    for step in range(5):
        ids = jnp.asarray(rng.choice(12, BATCH, replace=False), jnp.int32)
        plan = multi.plan(state, ids, jax.random.key(step))
        num_correct, losses = _observations(rng, plan)
        state = multi.update(state, plan, ids, num_correct=num_correct, losses=losses)
    return state


def _by_hand(parts, state, plan, ids, num_correct, losses, valid, p_hat_source="after"):
    classifier, prompt, rollout, _ = parts
    classifier_state = classifier.update(
        state.classifier, ids, num_correct=num_correct, num_rollouts=plan.num_rollouts, valid=valid
    )
    prompt_state = prompt.update(state.prompt, plan.bins, losses=losses, valid=valid)
    p_hat = {
        "after": classifier.p_hat(classifier_state, ids),
        "plan": plan.p_hat,
    }[p_hat_source]
    rollout_state = rollout.update(
        state.rollout,
        plan.bins,
        p_hat=p_hat,
        losses=losses,
        num_correct=num_correct,
        num_rollouts=plan.num_rollouts,
        valid=valid,
    )
    return controllers.GDROState(classifier_state, prompt_state, rollout_state)


def _assert_same_leaves(got, expected):
    paths = jax.tree_util.tree_flatten_with_path(expected)[0]
    for (path, want), have in zip(paths, jax.tree.leaves(got), strict=True):
        name = jax.tree_util.keystr(path)
        have, want = np.asarray(have), np.asarray(want)
        assert have.dtype == want.dtype and have.shape == want.shape, name
        if np.issubdtype(want.dtype, np.floating):
            np.testing.assert_allclose(have, want, rtol=1e-6, atol=1e-7, err_msg=name)
        else:
            np.testing.assert_array_equal(have, want, err_msg=name)


@pytest.mark.parametrize("masked", [False, True])
def test_update_equals_the_three_updates_composed_by_hand(parts, masked):
    *_, multi = parts
    rng = np.random.default_rng(0)
    state = _warm_state(multi, rng)
    # Revisited prompts (their bins are known) and new ones, with two padded entries.
    ids = jnp.asarray([0, 3, 5, 7, 9, 20, 21, 11], jnp.int32)
    plan = multi.plan(state, ids, jax.random.key(9))
    assert len(set(np.asarray(plan.bins).tolist())) >= 3, "the plan should use several bins"
    num_correct, losses = _observations(rng, plan)
    valid = jnp.asarray([True, True, False, True, True, True, False, True]) if masked else None
    got = multi.update(state, plan, ids, num_correct=num_correct, losses=losses, valid=valid)
    expected = _by_hand(parts, state, plan, ids, num_correct, losses, valid)
    _assert_same_leaves(got, expected)
    if masked:  # the mask reached every part: without it the state would differ
        unmasked = _by_hand(parts, state, plan, ids, num_correct, losses, None)
        for part in ("classifier", "prompt", "rollout"):
            leaves = zip(
                jax.tree.leaves(getattr(got, part)),
                jax.tree.leaves(getattr(unmasked, part)),
                strict=True,
            )
            assert any(not np.array_equal(a, b) for a, b in leaves), part


def test_rollout_update_sees_the_pass_rate_after_this_steps_visit(parts):
    classifier, _, _, multi = parts
    rng = np.random.default_rng(1)
    state = _warm_state(multi, rng)
    ids = jnp.asarray([0, 3, 5, 7, 9, 1, 2, 4], jnp.int32)
    plan = multi.plan(state, ids, jax.random.key(3))
    np.testing.assert_array_equal(plan.p_hat, classifier.p_hat(state.classifier, ids))
    # Every rollout correct this step: p_hat after the visit differs from the plan's.
    num_correct = plan.num_rollouts
    losses = jnp.zeros((BATCH,), jnp.float32)
    got = multi.update(state, plan, ids, num_correct=num_correct, losses=losses)
    after = _by_hand(parts, state, plan, ids, num_correct, losses, None, p_hat_source="after")
    before = _by_hand(parts, state, plan, ids, num_correct, losses, None, p_hat_source="plan")
    np.testing.assert_allclose(got.rollout.variance, after.rollout.variance, rtol=1e-6)
    assert not np.allclose(got.rollout.variance, before.rollout.variance, rtol=1e-3)
