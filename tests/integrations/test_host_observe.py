"""`HostControllers.observe(prompt_ids, rewards)`: one prompt id per reward, grouped by id.

The reference is numpy grouping the rewards by id (the classifier's pass@k of each prompt) and
the pure `adversary.update` fed those counts by hand. Each refusal is checked to name the
prompt id and the counts, and to leave the saved bytes as they were.

Planted bug this file was seen failing on: `observe` grouping the rewards by the plan's counts,
`np.repeat(arange(N), plan.num_rollouts)`, instead of by id (a TRL user's run: 4 rewards a
prompt, the plan's counts [4, 3, 4, 4, 3, 5, 5, 4], the totals equal, no check fired);
`test_rewards_are_grouped_by_id_not_by_the_plans_counts` failed on the classifier's history.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdro_jax import controllers
from gdro_jax.integrations import HostControllers

D, N, N_MEAN, K, WINDOW = 12, 8, 4, 2, 8
CLASSIFIER = controllers.passk_classifier(D, k=K, edges=(0.3, 0.7), window=WINDOW)
GDRO_BOTH = controllers.multi_adversary(
    CLASSIFIER,
    controllers.prompt_gdro(num_bins=CLASSIFIER.num_bins),
    controllers.rollout_gdro(num_bins=CLASSIFIER.num_bins, n_mean=N_MEAN, reward_values=(0.0, 1.0)),
)
RESAMPLE = controllers.multi_adversary(
    CLASSIFIER,
    controllers.prompt_gdro(num_bins=CLASSIFIER.num_bins, realisation="resample"),
    n_mean=N_MEAN,
)
RATE = np.linspace(0.0, 1.0, D)  # prompt d solves with probability RATE[d]


def pass_at_k(correct: int, rollouts: int, k: int = K) -> float:
    """Chen et al.'s unbiased pass@k, 1 - C(n - c, k') / C(n, k') with k' = min(k, n)."""
    k = min(k, rollouts)
    return 1.0 - math.comb(rollouts - correct, k) / math.comb(rollouts, k)


def warmed(adversary, steps: int, seed: int = 3) -> tuple[HostControllers, bytes]:
    """A host after `steps` steps of rewards at `RATE` (the prompts spread over the bins)."""
    host = HostControllers(adversary, seed=seed)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        ids = host.select_prompts(rng.choice(D, N, replace=False))
        rows = np.repeat(ids, host.allocate(ids))
        host.observe(rows, (rng.random(rows.size) < RATE[rows]).astype(float))
    return host, host.to_bytes()


@pytest.fixture(scope="module")
def gdro_both():
    return warmed(GDRO_BOTH, steps=4)


@pytest.fixture(scope="module")
def resample():
    return warmed(RESAMPLE, steps=2)


CANDIDATES = np.array([0, 2, 3, 5, 6, 8, 9, 11])


def rows_of(ids: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each prompt's rollouts, place `j` of the batch with `(3 j) % (n + 1)` correct of `n`."""
    rows, rewards = [], []
    for place, (prompt, n) in enumerate(zip(ids, counts, strict=True)):
        correct = (3 * place) % (n + 1)
        rows += [prompt] * n
        rewards += [1.0] * correct + [0.0] * (n - correct)
    return np.asarray(rows), np.asarray(rewards)


def shuffled(rng: np.random.Generator, *arrays: np.ndarray) -> list[np.ndarray]:
    order = rng.permutation(arrays[0].size)
    return [a[order] for a in arrays]


def pure_update(adversary, state, plan, counts, correct, losses):
    """The composed `update` fed per-place counts grouped by hand (jitted: it is the program
    the host runs, so the persistent compilation cache serves it)."""
    return jax.jit(adversary.update)(
        state,
        plan._replace(num_rollouts=jnp.asarray(counts, jnp.int32)),
        jnp.asarray(plan.prompt_ids, jnp.int32),
        num_correct=jnp.asarray(correct, jnp.int32),
        losses=jnp.asarray(losses, jnp.float32),
        valid=jnp.asarray(np.asarray(counts) > 0),
    )


def assert_states_close(got, want):
    for (path, a), b in zip(
        jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want), strict=True
    ):
        np.testing.assert_allclose(
            np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7, err_msg=jax.tree_util.keystr(path)
        )


def test_rewards_are_grouped_by_id_not_by_the_plans_counts(gdro_both):
    """The TRL run: no `allocate`, the trainer's 4 rollouts a prompt, rows shuffled, while the
    plan's counts differ; the classifier's new visit of each prompt is pass@k of its own
    rewards, and every part's state is the pure update's with those counts."""
    host, start = gdro_both
    host.load_bytes(start)
    before = host.state  # device arrays: the pure update runs on them
    ids = host.select_prompts(CANDIDATES)
    plan = host.plan()
    assert (plan.num_rollouts != N_MEAN).any(), "the test needs the plan's counts to differ"
    assert len(set(ids.tolist())) == N
    counts = np.full(N, N_MEAN)
    rows, rewards = rows_of(ids, counts)
    host.observe(*shuffled(np.random.default_rng(1), rows, rewards))

    got, visits_before = jax.device_get((host.state.classifier, before.classifier.visits))
    for prompt in range(D):
        mine = rewards[rows == prompt]
        visits = visits_before[prompt]
        if mine.size == 0:
            assert got.visits[prompt] == visits
            continue
        assert got.visits[prompt] == visits + 1
        want = pass_at_k(int((mine > 0.5).sum()), mine.size)
        np.testing.assert_allclose(
            got.history[prompt, visits % WINDOW], want, atol=1e-6, err_msg=f"prompt {prompt}"
        )
    correct = np.array([(rewards[rows == prompt] > 0.5).sum() for prompt in ids])
    want = pure_update(GDRO_BOTH, before, plan, counts, correct, 1.0 - correct / counts)
    assert_states_close(host.state, want)


def test_shuffled_rows_make_the_in_order_state(gdro_both):
    """With `allocate`'s counts and per-rollout losses: the rows in the plan's order and
    shuffled give the same bytes, and the pure update's state (each prompt's losses averaged)."""
    host, start = gdro_both
    saved = []
    for order in ("plan", "shuffled"):
        host.load_bytes(start)
        before = host.state
        ids = host.select_prompts(CANDIDATES)
        counts, plan = host.allocate(ids), host.plan()
        rows, rewards = rows_of(ids, counts)
        losses = 0.1 * rows + rewards  # differs within and between prompts
        if order == "shuffled":
            rows, rewards, losses = shuffled(np.random.default_rng(2), rows, rewards, losses)
        host.observe(rows, rewards, rollout_losses=losses)
        saved.append(host.to_bytes())
    assert saved[0] == saved[1]
    correct = np.array([(rewards[rows == prompt] > 0.5).sum() for prompt in ids])
    mean_losses = np.array([losses[rows == prompt].mean() for prompt in ids])
    want = pure_update(GDRO_BOTH, before, plan, counts, correct, mean_losses)
    assert_states_close(host.state, want)


def test_a_prompt_drawn_twice_is_pooled_in_any_row_order(resample):
    """`resample` draws with replacement: a prompt held at two places of the batch has its
    rewards pooled (the classifier's one visit: pass@k of all its rollouts), in any row order."""
    host, start = resample
    saved = []
    for order in ("plan", "shuffled"):
        host.load_bytes(start)
        before = jax.device_get(host.state.classifier)
        ids = host.select_prompts(np.zeros(N, np.int32))
        rows, rewards = rows_of(ids, np.full(N, N_MEAN))
        if order == "shuffled":
            rows, rewards = shuffled(np.random.default_rng(3), rows, rewards)
        host.observe(rows, rewards)
        saved.append(host.to_bytes())
    assert len(set(ids.tolist())) < N, "the test needs a prompt drawn twice"
    assert saved[0] == saved[1]
    got = jax.device_get(host.state.classifier)
    for prompt in set(ids.tolist()):
        mine = rewards[rows == prompt]
        visits = before.visits[prompt]
        assert got.visits[prompt] == visits + 1, "a pooled visit"
        want = pass_at_k(int((mine > 0.5).sum()), mine.size)
        np.testing.assert_allclose(got.history[prompt, visits % WINDOW], want, atol=1e-6)


# -- refusals: each names what is wrong and leaves the bytes as they were -------------------------


def refused(host: HostControllers, match: str, *args, **kwargs) -> None:
    before = host.to_bytes()
    with pytest.raises(ValueError, match=match):
        host.observe(*args, **kwargs)
    assert host.to_bytes() == before, "a refused observe changed the state"


def test_a_count_other_than_allocates_is_refused(gdro_both):
    """The TRL run with `allocate` called: 4 rollouts a prompt against its counts."""
    host, start = gdro_both
    host.load_bytes(start)
    ids = host.select_prompts(CANDIDATES)
    counts = host.allocate(ids)
    first = int(np.flatnonzero(counts != N_MEAN)[0])
    rows, rewards = rows_of(ids, np.full(N, N_MEAN))
    refused(
        host,
        rf"observe at step 4: prompt id {ids[first]} has {N_MEAN} rewards, expected "
        rf"{counts[first]}.*\(what allocate handed out\)",
        rows,
        rewards,
    )
    rows, rewards = rows_of(ids, counts)
    keep = np.arange(rows.size) != np.flatnonzero(rows == ids[2])[0]  # one of ids[2]'s less
    refused(
        host,
        rf"prompt id {ids[2]} has {counts[2] - 1} rewards, expected {counts[2]} ",
        rows[keep],
        rewards[keep],
    )
    host.observe(rows, rewards)  # the refusals left the step as it was
    assert host.step == 5


def test_without_allocate_a_count_other_than_n_mean_is_refused(gdro_both):
    """A trainer that read the plan's counts (`plan()`) but never took them from `allocate`."""
    host, start = gdro_both
    host.load_bytes(start)
    ids = host.select_prompts(CANDIDATES)
    counts = host.plan().num_rollouts
    first = int(np.flatnonzero(counts != N_MEAN)[0])
    refused(
        host,
        rf"prompt id {ids[first]} has {counts[first]} rewards, expected {N_MEAN}.*"
        rf"n_mean={N_MEAN} a prompt, as allocate was not called this step",
        *rows_of(ids, counts),
    )


def test_ids_not_selected_this_step_are_refused(gdro_both):
    host, start = gdro_both
    host.load_bytes(start)
    ids = host.select_prompts(CANDIDATES)
    rows, rewards = rows_of(ids, host.allocate(ids))
    stray = rows.copy()
    stray[[0, 5]] = [1, 10]  # not in the batch (and the counts are off too: the ids come first)
    refused(host, r"observe: prompt ids \[1, 10\] were not selected at step 4", stray, rewards)
    stray[0] = D + 5  # outside the pool
    refused(host, rf"prompt ids \[10, {D + 5}\] were not selected", stray, rewards)


def test_a_second_observe_of_a_step_is_refused(gdro_both):
    host, start = gdro_both
    host.load_bytes(start)
    ids = host.select_prompts(CANDIDATES)
    rows, rewards = rows_of(ids, host.allocate(ids))
    host.observe(rows, rewards)
    refused(
        host,
        "step 4's rewards were already observed; observing them again would count them twice",
        rows,
        rewards,
    )


def test_the_batchs_ids_with_the_rewards_are_refused(gdro_both):
    """The old form, `observe(ids, rewards)` with the batch's N ids, and a step with no batch."""
    host, start = gdro_both
    host.load_bytes(start)
    refused(host, "observe: step 4 has no batch yet", CANDIDATES, np.zeros(N))
    ids = host.select_prompts(CANDIDATES)
    rows, rewards = rows_of(ids, host.allocate(ids))
    refused(
        host,
        rf"one prompt id per reward.*got prompt_ids int\d+ \({N},\) and rewards "
        rf"\({rewards.size},\)",
        ids,
        rewards,
    )
    refused(host, "rollout_losses must be finite", rows, rewards, rollout_losses=np.zeros(3))
    refused(host, "rewards must be finite", rows, np.full(rows.size, np.nan))
