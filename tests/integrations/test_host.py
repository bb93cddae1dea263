"""The host API (`integrations.HostControllers`): numpy calls that make the pure functions'
decisions.

The reference is the composed decisions called directly, unjitted (`adversary.plan` with the
key `fold_in(key(seed), step)`, `adversary.update` with the correct rollouts counted in a Python
loop), for every method the host API runs. Planted bugs each test was seen failing on: the key
folded with `step + 1` (the decisions differ at the first draw); `observe` counting rewards
`>= threshold` as correct (the classifier's state differs); `multipliers` returning the batch's
weights in batch order instead of by id (`test_multipliers_follow_the_ids...`); `load_bytes`
keeping the seed it was built with (the resumed run's draws differ).

`observe`'s grouping by id and its refusals are in `test_host_observe.py`; `for_method` and the
settings a restore compares in `test_host_methods.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdro_jax import controllers
from gdro_jax.integrations import HostControllers

D, N, N_MEAN, STEPS = 12, 4, 4, 6


def adversaries() -> dict[str, controllers.MultiAdversary]:
    classifier = controllers.passk_classifier(D, k=2, edges=(0.3, 0.7))
    bins = classifier.num_bins
    return {
        "grpo": controllers.multi_adversary(classifier, n_mean=N_MEAN),
        "prompt_gdro": controllers.multi_adversary(
            classifier, controllers.prompt_gdro(num_bins=bins), n_mean=N_MEAN
        ),
        "prompt_gdro_resample": controllers.multi_adversary(
            classifier, controllers.prompt_gdro(num_bins=bins, realisation="resample")
        ),
        "gdro_both": controllers.multi_adversary(
            classifier,
            controllers.prompt_gdro(num_bins=bins),
            controllers.rollout_gdro(num_bins=bins, n_mean=N_MEAN, reward_values=(0.0, 1.0)),
        ),
        "knapsack": controllers.multi_adversary(
            classifier, rollout=controllers.knapsack(D, n_mean=N_MEAN)
        ),
        "mopps": controllers.multi_adversary(
            classifier, sampler=controllers.mopps(D, candidates=2), n_mean=N_MEAN
        ),
    }


ADVERSARIES = adversaries()


def rewards_for(rng: np.random.Generator, ids: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Rewards 1 (correct) with a rate that depends on the prompt, else 0 or 0.5 (a partial
    credit at the threshold, which is not correct)."""
    rate = (ids % 4) / 4.0
    return np.concatenate(
        [
            np.where(rng.random(n) < p, 1.0, rng.choice([0.0, 0.5], n))
            for p, n in zip(rate, counts, strict=True)
        ]
    )


def host_loop(adversary, seed=7):
    host = HostControllers(adversary, seed=seed)
    rng = np.random.default_rng(0)
    decisions = []
    for _ in range(STEPS):
        candidates = rng.choice(D, N, replace=False)
        ids = host.select_prompts(candidates)
        counts = host.allocate(ids)
        weights = host.multipliers(ids)
        rewards = rewards_for(rng, ids, counts)
        decisions.append((candidates, ids, counts, weights, rewards))
        host.observe(np.repeat(ids, counts), rewards)
    return host, decisions


@pytest.mark.parametrize("name", list(ADVERSARIES))
def test_the_host_loop_makes_the_pure_functions_decisions(name):
    adversary = ADVERSARIES[name]
    host, decisions = host_loop(adversary)
    state = adversary.init()
    for step, (candidates, ids, counts, weights, rewards) in enumerate(decisions):
        key = jax.random.fold_in(jax.random.key(7), step)
        plan = adversary.plan(state, jnp.asarray(candidates, jnp.int32), key)
        np.testing.assert_array_equal(ids, plan.prompt_ids, err_msg=f"step {step}: the batch")
        np.testing.assert_array_equal(counts, plan.num_rollouts, err_msg=f"step {step}: counts")
        np.testing.assert_allclose(weights, plan.advantage_weights, rtol=1e-6)
        correct, start = [], 0
        for n in counts:  # each group's correct rollouts, counted by hand
            correct.append(sum(1 for r in rewards[start : start + n] if r > 0.5))
            start += n
        state = adversary.update(
            state,
            plan,
            plan.prompt_ids,
            num_correct=jnp.asarray(correct, jnp.int32),
            losses=jnp.asarray(
                [1.0 - c / n for c, n in zip(correct, counts, strict=True)], jnp.float32
            ),
            valid=jnp.asarray(counts > 0),
        )
    assert host.step == STEPS
    for (path, got), want in zip(
        jax.tree_util.tree_leaves_with_path(host.state), jax.tree.leaves(state), strict=True
    ):
        np.testing.assert_allclose(
            np.asarray(got), np.asarray(want), rtol=1e-6, err_msg=jax.tree_util.keystr(path)
        )
    if name in ("prompt_gdro", "gdro_both"):
        assert not np.allclose(np.concatenate([d[3] for d in decisions]), 1.0)


@pytest.mark.parametrize("name", ["prompt_gdro_resample", "gdro_both", "mopps"])
def test_the_state_round_trips_through_bytes_mid_run(name):
    """A run stopped after 3 steps and resumed from bytes (in an object built with another seed,
    which the bytes replace) makes the uninterrupted run's decisions."""
    adversary = ADVERSARIES[name]
    _, whole = host_loop(adversary)
    host = HostControllers(adversary, seed=7)
    rng = np.random.default_rng(0)
    for step in range(STEPS):
        if step == 3:
            data = host.to_bytes()
            host = HostControllers(adversary, seed=123)
            host.load_bytes(data)
            assert host.step == 3
        candidates = rng.choice(D, N, replace=False)
        ids = host.select_prompts(candidates)
        counts = host.allocate(ids)
        np.testing.assert_array_equal(ids, whole[step][1])
        np.testing.assert_array_equal(counts, whole[step][2])
        host.observe(np.repeat(ids, counts), rewards_for(rng, ids, counts))
    again = HostControllers.from_bytes(adversary, host.to_bytes())
    assert again.to_bytes() == host.to_bytes()


def test_multipliers_follow_the_ids_in_any_order():
    adversary = ADVERSARIES["prompt_gdro"]
    host, _ = host_loop(adversary)
    ids = np.array([1, 5, 2, 9])
    plan = host.plan(ids)
    assert len(set(plan.advantage_weights.tolist())) > 1, "the test needs distinct weights"
    per_rollout = np.repeat(ids, plan.num_rollouts)[::-1]
    by_hand = {int(i): w for i, w in zip(ids, plan.advantage_weights, strict=True)}
    np.testing.assert_array_equal(
        host.multipliers(per_rollout), [by_hand[int(i)] for i in per_rollout]
    )
    with pytest.raises(ValueError, match=r"prompt ids \[3\] are not in step 6's batch"):
        host.multipliers(np.array([1, 3]))


def test_misuse_is_named():
    adversary = ADVERSARIES["prompt_gdro"]
    host = HostControllers(adversary)
    with pytest.raises(ValueError, match=r"ids \[12\] outside \[0, 12\)"):
        host.allocate(np.array([0, 12]))
    ids = host.select_prompts(np.array([0, 1]))
    with pytest.raises(RuntimeError, match="already called at step 0"):
        host.select_prompts(np.array([0, 1]))
    with pytest.raises(ValueError, match="allocate: prompt_ids are not step 0's batch"):
        host.allocate(ids[::-1])
    with pytest.raises(ValueError, match="must be a non-empty 1-D integer array"):
        host.allocate(np.array([0.0, 1.0]))
    drawing = HostControllers(ADVERSARIES["mopps"])
    with pytest.raises(ValueError, match="draws its own batch: call select_prompts"):
        drawing.multipliers(np.array([0, 1]))
    group_filter = controllers.multi_adversary(
        controllers.passk_classifier(D),
        group_filter=controllers.dynamic_sampling(N),
        num_prompts=N,
        n_mean=N_MEAN,
    )
    with pytest.raises(ValueError, match="group filter"):
        HostControllers(group_filter)


def test_bytes_of_another_state_are_refused_naming_the_field():
    """The settings are compared first (`test_host_methods.py` checks every field is named);
    the shapes of bytes without settings in `test_host_methods.py` too."""
    data = HostControllers(ADVERSARIES["prompt_gdro"]).to_bytes()
    other = controllers.multi_adversary(
        controllers.passk_classifier(D + 1, k=2, edges=(0.3, 0.7)),
        controllers.prompt_gdro(num_bins=3),
        n_mean=N_MEAN,
    )
    with pytest.raises(ValueError, match=r"num_prompts: saved 12, here 13"):
        HostControllers.from_bytes(other, data)
    with pytest.raises(
        ValueError,
        match=r"method: saved 'gdro_both', here 'grpo'.*"
        r"parts\.prompt_adversary: saved 'prompt_gdro', here None",
    ):
        HostControllers.from_bytes(
            ADVERSARIES["grpo"], HostControllers(ADVERSARIES["gdro_both"]).to_bytes()
        )
    with pytest.raises(ValueError, match="not a gdro_jax controllers state"):
        HostControllers.from_bytes(ADVERSARIES["grpo"], b"\x00 not msgpack")


@pytest.mark.slow
def test_the_benchmark_runs_small(capsys):
    """`benchmarks/host_api.py` end to end on a tiny pool: a row per method, every time > 0."""
    from benchmarks import host_api

    rows = host_api.main(["--steps", "2", "--pool", "32", "--batch", "4"])
    assert [row["method"] for row in rows] == ["prompt_gdro", "gdro_both", "mopps"]
    for row in rows:
        assert all(t > 0 for t in (*row["host"].values(), *row["pure"].values()))
    assert "| mopps |" in capsys.readouterr().out
