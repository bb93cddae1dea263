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


# --- Prompt-GDRO's `resample` realisation ------------------------------------------------------

# The pool's bins, made known by one visit each: 4, 6, 10 and 20 prompts with 0, 1, 2 and 4 of
# 4 rollouts right (bins of unequal sizes, so "a bin from q, then a prompt inside it" differs
# from "a prompt with weight q of its bin"); the other bins are empty.
POOL_CORRECT = np.repeat([0, 1, 2, 4], [4, 6, 10, 20])
SCORES = np.array([2.0, -1.0, 0.5, 3.0, 0.0, 1.0, -2.0, 0.7, 1.5, 0.2], np.float32)
ETA, GAMMA = 0.65, 0.1


def _resample_parts():
    classifier = controllers.passk_classifier(NUM_PROMPTS, window=4, statistic="mean_accuracy")
    prompt = controllers.prompt_gdro(
        classifier.num_bins, eta=ETA, gamma=GAMMA, share_normalize=False, realisation="resample"
    )
    multi = controllers.multi_adversary(classifier, prompt, None, n_mean=N_MEAN)
    state = multi.init()
    ids = jnp.arange(NUM_PROMPTS)
    classifier_state = classifier.update(
        state.classifier, ids, num_correct=jnp.asarray(POOL_CORRECT), num_rollouts=4
    )
    prompt_state = state.prompt._replace(
        scores=jnp.asarray(SCORES), seen=jnp.ones((classifier.num_bins,), bool)
    )
    state = state._replace(classifier=classifier_state, prompt=prompt_state)
    pool_bins = np.asarray(classifier.bins(classifier_state, ids))
    return multi, state, pool_bins


def _reference_q(pool_bins):
    """SPEC 4's q over the bins the pool fills (no score reaches the clip of 10)."""
    present = sorted(set(pool_bins.tolist()))
    soft = np.exp(ETA * SCORES[present]) / np.exp(ETA * SCORES[present]).sum()
    q = np.zeros(len(SCORES))
    q[present] = (1 - GAMMA) * soft + GAMMA / len(present)
    return q


def test_resample_draws_bins_from_q_and_prompts_uniformly_inside_them():
    multi, state, pool_bins = _resample_parts()
    assert sorted(np.bincount(pool_bins).tolist())[-4:] == [4, 6, 10, 20]
    q = _reference_q(pool_bins)
    keys = jax.random.split(jax.random.key(0), 4000)
    placeholder = jnp.zeros((BATCH,), jnp.int32)  # only its length counts under resample
    plans = jax.jit(jax.vmap(lambda key: multi.plan(state, placeholder, key)))(keys)
    ids = np.asarray(plans.prompt_ids).ravel()
    draws = len(ids)
    np.testing.assert_allclose(
        np.asarray(plans.importance), np.broadcast_to(q, (4000, 10)), rtol=1e-5
    )
    np.testing.assert_array_equal(np.asarray(plans.advantage_weights), 1.0)
    np.testing.assert_array_equal(np.asarray(plans.bins), pool_bins[np.asarray(plans.prompt_ids)])
    freq = np.bincount(pool_bins[ids], minlength=10) / draws
    tolerance = 4.5 * np.sqrt(q * (1 - q) / draws) + 1e-9
    assert np.all(np.abs(freq - q) <= tolerance), (freq, q)
    # Inside a bin each prompt is equally likely: count(d) ~ draws * q(b) / |b|.
    expected = draws * q[pool_bins] / np.bincount(pool_bins)[pool_bins]
    counts = np.bincount(ids, minlength=NUM_PROMPTS)
    assert np.all(np.abs(counts - expected) <= 5 * np.sqrt(expected)), (counts, expected)


def test_resample_update_divides_each_drawn_bins_loss_by_its_q():
    multi, state, pool_bins = _resample_parts()
    plan = multi.plan(state, jnp.zeros((BATCH,), jnp.int32), jax.random.key(3))
    ids = np.asarray(plan.prompt_ids)
    losses = np.linspace(0.1, 0.9, BATCH).astype(np.float32)
    new = multi.update(
        state, plan, plan.prompt_ids, num_correct=jnp.zeros(BATCH, jnp.int32), losses=losses
    )
    q, ema = _reference_q(pool_bins), 0.12
    expected = SCORES.astype(np.float64).copy()
    for b in set(pool_bins[ids].tolist()):
        signal = losses[pool_bins[ids] == b].mean() / q[b]
        expected[b] = (1 - ema) * SCORES[b] + ema * signal
    np.testing.assert_allclose(np.asarray(new.prompt.scores), expected, rtol=1e-5)
    assert len(set(pool_bins[ids].tolist())) > 1, "the draw should cover several bins"


def test_resample_needs_a_known_realisation():
    with pytest.raises(ValueError, match="realisation must be one of"):
        controllers.prompt_gdro(10, realisation="resampled")


# --- The released code's lagged bins -------------------------------------------------------------


def test_previous_batch_bins_are_the_last_batchs_bins_by_position(parts):
    """A hand loop keeps the previous batch's classification by position; the adversaries must
    weight, allocate and learn with it (the prompt's own bin only at the first step)."""
    classifier, prompt, rollout = parts
    multi = controllers.multi_adversary(
        classifier, prompt, rollout, bins_from="previous_batch", num_prompts=BATCH
    )
    plan_fn, update_fn = jax.jit(multi.plan), jax.jit(multi.update)
    rng = np.random.default_rng(1)
    state = multi.init()
    np.testing.assert_array_equal(state.previous_bins, np.full(BATCH, -1))
    ref_classifier, ref_prompt, ref_rollout = classifier.init(), prompt.init(), rollout.init()
    previous = None  # the hand loop's record: bins of the last batch, position by position
    differs = 0
    for step in range(8):
        ids = jnp.asarray(rng.choice(NUM_PROMPTS, BATCH, replace=False), jnp.int32)
        key = jax.random.key(step)
        own = np.asarray(classifier.bins(ref_classifier, ids))
        expected_bins = own if previous is None else previous
        differs += int(np.sum(expected_bins != own))
        plan = plan_fn(state, ids, key)
        np.testing.assert_array_equal(plan.bins, expected_bins)
        np.testing.assert_allclose(plan.p_hat, classifier.p_hat(ref_classifier, ids))
        n, _ = rollout.allocate(ref_rollout, jnp.asarray(expected_bins), plan.p_hat, key)
        np.testing.assert_array_equal(plan.num_rollouts, n)
        np.testing.assert_allclose(
            plan.advantage_weights,
            prompt.weights(ref_prompt, jnp.asarray(expected_bins), num_rollouts=n),
            rtol=1e-6,
        )
        num_correct = jnp.asarray(rng.integers(0, n + 1), jnp.int32)
        losses = 1.0 - num_correct / n
        state = update_fn(state, plan, ids, num_correct=num_correct, losses=losses)
        ref_classifier = classifier.update(
            ref_classifier, ids, num_correct=num_correct, num_rollouts=n
        )
        ref_prompt = prompt.update(ref_prompt, jnp.asarray(expected_bins), losses=losses)
        ref_rollout = rollout.update(
            ref_rollout,
            jnp.asarray(expected_bins),
            p_hat=classifier.p_hat(ref_classifier, ids),
            losses=losses,
            num_correct=num_correct,
            num_rollouts=n,
        )
        np.testing.assert_allclose(state.prompt.scores, ref_prompt.scores, rtol=1e-6)
        np.testing.assert_allclose(state.rollout.variance, ref_rollout.variance, rtol=1e-6)
        previous = np.asarray(classifier.bins(ref_classifier, ids))
        np.testing.assert_array_equal(state.previous_bins, previous)
    assert differs > 0, "the batches should give some position a bin other than its prompt's own"


def test_previous_batch_bins_need_the_batch_size_and_refuse_resample(parts):
    classifier, prompt, _ = parts
    with pytest.raises(ValueError, match="bins_from must be one of"):
        controllers.multi_adversary(classifier, bins_from="previous")
    with pytest.raises(ValueError, match="num_prompts must be >= 1"):
        controllers.multi_adversary(classifier, bins_from="previous_batch")
    resample = controllers.prompt_gdro(classifier.num_bins, realisation="resample")
    with pytest.raises(
        ValueError, match='does not combine with Prompt-GDRO.s realisation="resample"'
    ):
        controllers.multi_adversary(
            classifier, resample, bins_from="previous_batch", num_prompts=BATCH
        )
    multi = controllers.multi_adversary(
        classifier, prompt, bins_from="previous_batch", num_prompts=BATCH
    )
    with pytest.raises(ValueError, match=f"plan got {BATCH + 1} prompt ids.*num_prompts={BATCH}"):
        multi.plan(multi.init(), jnp.arange(BATCH + 1), jax.random.key(0))


# --- a prompt sampler (MoPPS) ------------------------------------------------------------------


def test_a_prompt_sampler_draws_the_batch_and_learns_from_every_group(parts):
    classifier, prompt, _ = parts
    sampler = controllers.mopps(NUM_PROMPTS, candidates=2)
    multi = controllers.multi_adversary(classifier, sampler=sampler, n_mean=N_MEAN)
    state = multi.init()
    given = jnp.arange(BATCH)
    for step in range(3):
        key = jax.random.key(step)
        plan = multi.plan(state, given, key)
        draw = sampler.draw(state.sampler, BATCH, jax.random.split(key)[0])
        np.testing.assert_array_equal(plan.prompt_ids, draw.prompt_ids)
        np.testing.assert_allclose(plan.estimate, draw.sampled_rate)
        np.testing.assert_array_equal(plan.bins, classifier.bins(state.classifier, draw.prompt_ids))
        num_correct = plan.prompt_ids % 5
        new = multi.update(
            state, plan, plan.prompt_ids, num_correct=num_correct, losses=num_correct
        )
        expected = sampler.update(
            state.sampler, prompt_ids=plan.prompt_ids, num_correct=num_correct,
            num_rollouts=jnp.full(BATCH, N_MEAN),
        )  # fmt: skip
        np.testing.assert_allclose(new.sampler.alpha, expected.alpha)
        np.testing.assert_allclose(new.sampler.beta, expected.beta)
        state = new
    with pytest.raises(ValueError, match="draws the batch itself"):
        resampling = controllers.prompt_gdro(classifier.num_bins, realisation="resample")
        controllers.multi_adversary(classifier, resampling, sampler=sampler)


def test_the_composition_names_its_parts_and_whether_it_draws_the_batch():
    """A trainer that cannot realise a decision reads the parts off the composition."""
    classifier = controllers.passk_classifier(8)
    sampler, rollout = controllers.mopps(8), controllers.rollout_gdro(num_bins=10)
    reweight, resample = controllers.prompt_gdro(), controllers.prompt_gdro(realisation="resample")
    cases = [
        (controllers.multi_adversary(classifier, reweight, rollout), False),
        (controllers.multi_adversary(classifier, resample), True),
        (controllers.multi_adversary(classifier, sampler=sampler), True),
        (controllers.multi_adversary(classifier), False),
    ]
    for adversary, draws in cases:
        assert adversary.draws_prompts is draws
    assert cases[0][0].rollout_allocator is rollout and cases[0][0].prompt_sampler is None
    assert cases[2][0].prompt_sampler is sampler and cases[2][0].rollout_allocator is None
