"""The GRPO/GDRO train step: a hand-written reference, compile counts, and 1 vs 8 devices."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from gdro_jax import configs, train
from tests.train.configs import parity_reward, tiny_config


def _config(method="grpo", **overrides):
    return tiny_config(method, **overrides)


def _synthetic_rollouts(run, plan, prompt_ids, seed):
    """Real samples from the policy, with rewards drawn at random so advantages are non-zero."""
    rollouts = run.rollout(run.state.params, plan, prompt_ids, jax.random.key(seed))
    rng = np.random.default_rng(seed)
    correct = rng.random(rollouts.rewards.shape) < 0.5
    return rollouts._replace(
        rewards=jnp.where(correct, 1.0, -1.0).astype(jnp.float32), correct=jnp.asarray(correct)
    )


def _reference_grpo_update(graphdef, params, tx, opt_state, rollouts, prompt_of_slot, order, cfg):
    """GRPO written out directly: numpy advantages, logits -> log-softmax, clipped surrogate."""
    rewards = np.asarray(rollouts.rewards, np.float64)
    groups = np.asarray(prompt_of_slot)
    adv = np.zeros_like(rewards)
    for g in np.unique(groups):
        r = rewards[groups == g]
        if r.max() > r.min():
            adv[groups == g] = np.clip((r - r.mean()) / (r.std(ddof=1) + 1e-6), -5, 5)  # released
    prompt_len = rollouts.prompt_tokens.shape[1]
    tokens = jnp.concatenate([rollouts.prompt_tokens, rollouts.tokens], axis=1)
    real_prompt = jnp.arange(prompt_len)[None] >= (prompt_len - rollouts.prompt_lengths)[:, None]
    completion_mask = jnp.arange(rollouts.tokens.shape[1])[None] < rollouts.lengths[:, None]
    mask = jnp.concatenate([real_prompt, completion_mask], axis=1)
    positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)

    # Jitted (one compilation for both mini-batches) only to be quick: the same written-out math.
    @jax.jit
    @jax.grad
    def gradient(params, idx, a):
        model = nnx.merge(graphdef, params)
        logits = model(tokens[idx], positions[idx], mask[idx])
        logp_all = jax.nn.log_softmax(logits[:, :-1], axis=-1)
        logp = jnp.take_along_axis(logp_all, tokens[idx][:, 1:, None], axis=-1)[..., 0]
        logp = logp[:, prompt_len - 1 :]
        ratio = jnp.exp(logp - rollouts.logprobs[idx])
        surrogate = jnp.minimum(ratio * a[:, None], jnp.clip(ratio, 0.8, 1.28) * a[:, None])
        m = completion_mask[idx]
        return -jnp.sum(jnp.where(m, surrogate, 0.0)) / jnp.sum(m)

    @jax.jit
    def apply(grads, opt_state, params):  # optax's step, jitted for the same reason
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    for idx in np.asarray(order).reshape(cfg.grpo.num_minibatches, -1):
        grads = gradient(params, jnp.asarray(idx), jnp.asarray(adv[idx], jnp.float32))
        params, opt_state = apply(grads, opt_state, params)
    return params


def test_grpo_step_equals_a_hand_written_reference():
    config = _config("grpo")
    run = train.build_run(config)
    prompt_ids = jnp.asarray(next(run.prompt_batches), jnp.int32)
    plan = run.plan(run.state.gdro, prompt_ids, jax.random.key(1))
    rollouts = _synthetic_rollouts(run, plan, prompt_ids, seed=2)
    assert float(jnp.abs(rollouts.rewards).min()) == 1.0
    _, perm_key = jax.random.split(run.state.key)
    order = jax.random.permutation(perm_key, len(plan.prompt_of_slot))
    expected = _reference_grpo_update(
        run.program.graphdef,
        run.state.params,
        configs.make_optimizer(configs.OptimizerConfig.from_block(config.optimizer)),
        run.state.opt_state,
        rollouts,
        plan.prompt_of_slot,
        order,
        config,
    )
    before = jax.tree.map(np.asarray, run.state.params)
    state, metrics = run.update(run.state, plan, prompt_ids, rollouts)
    changed = 0
    for got, want, old in zip(
        jax.tree.leaves(state.params),
        jax.tree.leaves(expected),
        jax.tree.leaves(before),
        strict=True,
    ):
        # Adam divides by sqrt(v): where a gradient is ~0, float32 rounding (here of the sample
        # std, sqrt(var * n / (n - 1)) against numpy's ddof=1) moves the update by up to ~1e-3
        # of the learning rate (1e-2), hence atol 2e-5. A wrong advantage or loss scale moves
        # every parameter by ~1e-2 (test_update_reference.py pins the loss and gradient norm).
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=1e-5)
        changed += int(np.abs(np.asarray(got) - old).max() > 1e-4)
    assert changed == len(jax.tree.leaves(before)), "every parameter should move"
    assert float(metrics["nonzero_advantage_fraction"]) > 0
    assert float(metrics["reward"]) == pytest.approx(float(rollouts.rewards.mean()))


@pytest.mark.slow
def test_a_pilot_commit_update_equals_the_reference_on_each_pilot_and_commit_pair():
    """Two rounds of Pilot-Commit: the first only pilots (no update); the second commits to the
    prompts it kept, and its update equals the hand-written GRPO reference on the staged pairs,
    each prompt's buffered pilot rollouts and this round's commit rollouts as one group."""
    config = _config("pilot_commit")
    run = train.build_run(config)
    n_mean, num_prompts = config.n_mean, config.num_prompts
    state = run.state
    for seed in (2, 3):
        before = jax.tree.map(jnp.copy, state)  # the update donates the state it is given
        ids = jnp.asarray(next(run.prompt_batches), jnp.int32)
        plan = run.plan(state.gdro, ids, jax.random.key(seed))
        rollouts = _synthetic_rollouts(run._replace(state=state), plan, plan.prompt_ids, seed)
        state, metrics = run.update(state, plan, plan.prompt_ids, rollouts)
    selection = plan.selections["group_filter"]
    committed = np.asarray(selection.committed)
    k = int(committed.sum())
    assert k >= 2 and bool(metrics["filter/updated"])
    # The staged rows written out: row 2i the buffered pilot of commit i, row 2i + 1 its commit.
    pilots = before.gdro.filter.pilots
    fresh = jax.tree.map(lambda x: x.reshape(num_prompts, n_mean, *x.shape[1:]), rollouts)
    rows = []
    for i in range(num_prompts // 2):
        slot = int(selection.slots[i])
        for source in (pilots, fresh):
            row = jax.tree.map(lambda x: np.asarray(x[slot if source is pilots else i]), source)
            rows.append(row if i < k else jax.tree.map(np.zeros_like, row))
    held = jax.tree.map(lambda *r: jnp.asarray(np.concatenate(r)), *rows)
    pairs = np.repeat(np.arange(num_prompts) // 2, n_mean)
    _, perm_key = jax.random.split(before.key)
    expected = _reference_grpo_update(
        run.program.graphdef,
        before.params,
        configs.make_optimizer(configs.OptimizerConfig.from_block(config.optimizer)),
        before.opt_state,
        held,
        pairs,
        jax.random.permutation(perm_key, num_prompts * n_mean),
        config,
    )
    for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=1e-5)


# A pool of 16; the R = 32 rollouts sampled by 8 decode slots of the continuous batch, so the
# sampler's queue refills slots under allocations that change from step to step. Adam's eps at
# 1e-4 (as tests/train/test_grad_accumulation.py): its step lr g / (|g| + eps) then has slope at
# most lr / eps = 1e2 where a gradient entry is ~0, so the rounding of sharded sums (and of
# another CPU's vector width) moves parameters by ~1e-6, not by a share of lr.
QUEUED = {"task.pool_size": 16, "rollout.micro_batch_slots": 8, "optimizer.eps": 1e-4}


@pytest.fixture(scope="module")
def gdro_both_one_device():
    """8 steps of gdro_both on one device with the parity reward (a reward earned about half the
    time gives mixed groups, and a pool of two batches makes every prompt come back, so the
    classifier spreads prompts over bins and both adversaries act): the run, its plans, the
    metrics rows and the parameters after step 2."""
    run = train.build_run(_config("gdro_both", **QUEUED), reward_fn=parity_reward)
    plans, rows = [], []

    def recorded_plan(*args):
        plan = run.plan(*args)
        plans.append(jax.tree.map(np.asarray, plan))
        return plan

    recording = run._replace(plan=recorded_plan)
    state, params_after_2 = run.state, None
    for step in range(8):
        state, metrics, _ = train.run_step(recording, state, next(run.prompt_batches))
        rows.append(jax.tree.map(np.asarray, metrics))
        if step == 1:
            params_after_2 = jax.tree.map(np.asarray, state.params)
    return dict(run=run, state=state, plans=plans, rows=rows, params_after_2=params_after_2)


def test_controller_decisions_never_recompile_the_step(gdro_both_one_device):
    run, state = gdro_both_one_device["run"], gdro_both_one_device["state"]
    plans, metrics = gdro_both_one_device["plans"], gdro_both_one_device["rows"][-1]
    # 8 steps: with this seed the policy soon earns the parity reward on most prompts, so the
    # allocation changes only twice in the first 6 (per-slot sampling keys, issue 12 item 2).
    assert run.plan._cache_size() == 1
    assert run.rollout._cache_size() == 1
    assert run.reward._cache_size() == 1
    assert run.update._cache_size() == 1
    assert int(state.step) == 8
    assert np.asarray(metrics["bin/rollouts"]).sum() == 8 * 4
    # The decisions really changed between steps: allocations, bins and multipliers.
    allocations = {tuple(plan.num_rollouts.tolist()) for plan in plans}
    multipliers = {tuple(np.round(plan.advantage_weights, 6).tolist()) for plan in plans}
    assert len(allocations) >= 3, allocations
    assert len(multipliers) >= 3, multipliers
    assert max(len(set(plan.bins.tolist())) for plan in plans) >= 2
    assert (
        min(plan.num_rollouts.min() for plan in plans)
        < 4
        < max(plan.num_rollouts.max() for plan in plans)
    )
    assert max(np.ptp(plan.advantage_weights) for plan in plans) > 0.05


@pytest.mark.slow
def test_two_steps_on_one_device_and_an_eight_device_mesh_agree(gdro_both_one_device):
    mesh = dict(data=2, fsdp=2, tensor=2)
    run = train.build_run(_config("gdro_both", mesh=mesh, **QUEUED), reward_fn=parity_reward)
    state, rows_8 = run.state, []
    for _ in range(2):
        state, metrics, _ = train.run_step(run, state, next(run.prompt_batches))
        rows_8.append(jax.tree.map(np.asarray, metrics))
    rows_1 = gdro_both_one_device["rows"][:2]
    params_1, params_8 = gdro_both_one_device["params_after_2"], state.params
    for leaf in jax.tree.leaves(params_8):
        assert len(leaf.sharding.device_set) == 8
    for leaf in jax.tree.leaves(state.gdro):
        assert leaf.sharding.is_fully_replicated
    assert 0 < rows_1[0]["accuracy"] < 1 and rows_1[0]["grad_norm"] > 0, "a non-trivial step"
    for row_1, row_8 in zip(rows_1, rows_8, strict=True):
        for name in row_1:
            np.testing.assert_allclose(row_8[name], row_1[name], atol=1e-5, rtol=1e-5, err_msg=name)
    # Sharded reductions round differently: gradient entries by ~1e-6 relative (<= ~1e-8 in all),
    # which Adam's slope of at most lr / eps = 1e2 (QUEUED) turns into <= 1e-6 a step, 2e-6 over
    # two; measured <= 4.5e-7, natively (AVX2) and under --xla_cpu_max_isa=SSE4_2. A placement bug
    # moves parameters by ~lr = 1e-2.
    for a, b in zip(jax.tree.leaves(params_1), jax.tree.leaves(params_8), strict=True):
        np.testing.assert_allclose(np.asarray(b), a, atol=2e-6, rtol=0)


def _allocations_once_compiled(config, *, steps: int, moved_after: int):
    """`steps` steps of an allocation by prompt with the parity reward: each phase compiled once,
    the counts summing to R, n_mean each at the first step (no history yet) and apart from it
    after `moved_after` steps. Returns the final state and the metrics rows."""
    run = train.build_run(config, reward_fn=parity_reward)
    state, rows = run.state, []
    for _ in range(steps):
        state, metrics, _ = train.run_step(run, state, next(run.prompt_batches))
        rows.append(jax.tree.map(np.asarray, metrics))
    for phase in (run.plan, run.rollout, run.reward, run.update):
        assert phase._cache_size() == 1
    rollouts = [row["prompt/rollouts"] for row in rows]
    assert all(r.sum() == config.num_prompts * config.n_mean for r in rollouts)
    assert np.all(rollouts[0] == config.n_mean)
    assert any(r.min() < config.n_mean < r.max() for r in rollouts[moved_after:]), rollouts
    return state, rows


@pytest.mark.slow
def test_knapsack_allocates_by_prompt_without_recompiling():
    """Knapsack-RL in the trainer (parity reward, every prompt back each second step, a history
    of one visit): per-prompt rollouts that differ and sum to R, logged per prompt, one compile."""
    config = _config("knapsack", **{"task.pool_size": 16, "knapsack.min_history": 4})
    _, rows = _allocations_once_compiled(config, steps=6, moved_after=2)
    assert all(len(row["prompt/ids"]) == config.num_prompts for row in rows)


@pytest.mark.slow
def test_vip_allocates_from_its_predictions_without_recompiling():
    """VIP in the trainer (parity reward, a pool of 16, the chain task's prompt features): the
    counts sum to R, start at n_mean each (every prompt at the prior), then move; each observed
    prompt's posterior logit is its observed rate's; one compile a phase."""
    config = _config("vip", **{"task.pool_size": 16})
    state, rows = _allocations_once_compiled(config, steps=4, moved_after=1)
    assert all(np.all((row["prompt/estimate"] > 0) & (row["prompt/estimate"] < 1)) for row in rows)
    last = rows[-1]
    rate = np.clip(last["prompt/correct"] / last["prompt/rollouts"], 1e-6, 1 - 1e-6)
    np.testing.assert_allclose(
        state.gdro.rollout.mean[last["prompt/ids"]], np.log(rate / (1 - rate)), atol=1e-4
    )


@pytest.mark.slow
def test_mopps_draws_its_batches_from_its_posteriors_without_recompiling():
    """MoPPS in the trainer (parity reward, a pool of 16): each batch is 8 distinct prompts of
    the pool drawn by the sampler (not the data order), and the posteriors after 4 steps equal a
    loop over the logged groups."""
    config = _config("mopps", **{"task.pool_size": 16, "mopps.candidates": 2})
    run = train.build_run(config, reward_fn=parity_reward)
    state, rows, data_order = run.state, [], []
    for _ in range(4):
        data_order.append(next(run.prompt_batches))
        state, metrics, _ = train.run_step(run, state, data_order[-1])
        rows.append(jax.tree.map(np.asarray, metrics))
    for phase in (run.plan, run.rollout, run.reward, run.update):
        assert phase._cache_size() == 1
    alpha, beta = np.ones(16), np.ones(16)
    for row in rows:
        ids = row["prompt/ids"]
        assert len(set(ids.tolist())) == 8 and ids.min() >= 0 and ids.max() < 16
        assert np.all((row["prompt/estimate"] >= 0) & (row["prompt/estimate"] <= 1))
        assert np.all(row["prompt/rollouts"] == 4)
        for prompt, correct in zip(ids, row["prompt/correct"], strict=True):
            alpha[prompt] = 0.5 * alpha[prompt] + 0.5 + correct
            beta[prompt] = 0.5 * beta[prompt] + 0.5 + (4 - correct)
    assert any(
        set(r["prompt/ids"].tolist()) != set(g.tolist())
        for r, g in zip(rows, data_order, strict=True)
    )
    np.testing.assert_allclose(state.gdro.sampler.alpha, alpha, rtol=1e-6)
    np.testing.assert_allclose(state.gdro.sampler.beta, beta, rtol=1e-6)


def _even_prompts_parity_reward(prompt_ids, tokens, lengths, prompt_of_slot):
    """The parity reward on even prompt ids; odd ones always fail (their groups carry no
    signal, so buffers fill slowly and some are taken partial)."""
    rewards, correct = parity_reward(prompt_ids, tokens, lengths, prompt_of_slot)
    even = prompt_ids[prompt_of_slot] % 2 == 0
    return jnp.where(even, rewards, -1.0), correct & even


def _six_steps_compiled_once(run):
    """Six steps of `run`: the final state, each step's metrics and whether it moved the
    parameters; each phase compiled once."""
    state, rows, moved = run.state, [], []
    for _ in range(6):
        before = jax.tree.map(np.asarray, state.params)
        state, metrics, _ = train.run_step(run, state, next(run.prompt_batches))
        rows.append(jax.tree.map(np.asarray, metrics))
        moved.append(
            any(np.any(a != np.asarray(b)) for a, b in zip(
                jax.tree.leaves(before), jax.tree.leaves(state.params), strict=True))
        )  # fmt: skip
    for phase in (run.plan, run.rollout, run.reward, run.update):
        assert phase._cache_size() == 1
    return state, rows, moved


def test_dynamic_sampling_updates_only_on_a_full_buffer_of_groups_with_a_signal():
    """DAPO's rounds in the trainer (the parity reward on half the prompts): the parameters
    move exactly on the rounds whose buffer filled or hit the round cap (a partial buffer, its
    empty groups without tokens, still a finite step), the optimizer counts those updates, and
    every kept group is mixed."""
    config = _config("dynamic_sampling", **{"task.pool_size": 16, "dynamic_sampling.max_rounds": 2})
    run = train.build_run(config, reward_fn=_even_prompts_parity_reward)
    state, rows, moved = _six_steps_compiled_once(run)
    updated = [bool(row["filter/updated"]) for row in rows]
    assert moved == updated and any(updated), (moved, updated)
    assert any(row["filter/partial"] for row in rows) and not any(row["skipped"] for row in rows)
    held = 0
    for row in rows:
        kept, correct = row["prompt/kept"].astype(bool), row["prompt/correct"]
        assert np.all((correct[kept] > 0) & (correct[kept] < 4)), "a kept group without a signal"
        mixed = (correct > 0) & (correct < 4)
        # Mixed groups are kept in order while the buffer has room (8 groups).
        assert kept.tolist() == (mixed & (np.cumsum(mixed) <= 8 - held)).tolist()
        np.testing.assert_allclose(row["filter/kept_fraction"], kept.mean())
        held = 0 if row["filter/updated"] else held + kept.sum()
        assert int(row["filter/buffered"]) == held
    assert int(state.gdro.filter.updates) == sum(updated)
    # Adam's step count: num_minibatches optimizer steps per update, none on the other rounds.
    counts = {int(leaf) for leaf in jax.tree.leaves(state.opt_state) if leaf.ndim == 0}
    assert counts == {sum(updated) * config.grpo.num_minibatches}


@pytest.mark.slow
def test_pilot_commit_commits_to_prompts_its_pilots_kept_and_compiles_once():
    """Pilot-Commit in the trainer (the parity reward on even prompts; odd ones are too hard):
    every prompt committed was kept by a pilot at most `max_off_steps` rounds before, every
    kept pilot's rate lies in [lower, 1 - upper], the parameters move exactly on the rounds that
    commit, each phase compiles once, and every round samples all R slots, pilots included."""
    config = _config("pilot_commit", **{"task.pool_size": 32, "pilot_commit.max_off_steps": 2})
    run = train.build_run(config, reward_fn=_even_prompts_parity_reward)
    n_mean, lower, upper = config.n_mean, config.pilot_commit.lower, config.pilot_commit.upper
    state, rows, moved = _six_steps_compiled_once(run)
    updated = [bool(row["filter/updated"]) for row in rows]
    assert moved == updated and sum(updated) >= 3, (moved, updated)
    kept_at = {}  # prompt -> the round its pilot kept it
    for t, row in enumerate(rows):
        ids, correct = row["prompt/ids"], row["prompt/correct"]
        committed, kept = row["prompt/committed"].astype(bool), row["prompt/kept"].astype(bool)
        assert committed.tolist() == sorted(committed.tolist(), reverse=True)  # commits first
        for prompt in ids[committed]:
            assert 1 <= t - kept_at.pop(int(prompt)) <= 2, (t, prompt)
        rate = correct[kept] / n_mean
        assert np.all((rate >= lower) & (rate <= 1 - upper)), rate
        assert not np.any(ids[kept] % 2), "an odd prompt (always wrong) was kept"
        kept_at.update({int(prompt): t for prompt in ids[kept]})
        # All R slots sampled and counted: the tokens are R times the mean response length
        # (the mean over every slot, pilots included), each response 1 to max_new_tokens long.
        slots = config.num_prompts * n_mean
        assert len(row["prompt/rollouts"]) == config.num_prompts
        assert int(np.sum(row["prompt/rollouts"])) == slots
        np.testing.assert_allclose(row["tokens"], slots * row["response_length"], rtol=1e-6)
        assert slots <= row["tokens"] <= slots * config.max_new_tokens
        kept_at = {p: s for p, s in kept_at.items() if t - s < 2}  # flushed after 2 rounds
    counts = {int(leaf) for leaf in jax.tree.leaves(state.opt_state) if leaf.ndim == 0}
    assert counts == {sum(updated) * config.grpo.num_minibatches}
