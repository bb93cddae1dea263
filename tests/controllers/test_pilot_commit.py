"""Pilot-Commit against a plain-Python model of its rule, round by round.

The model (`Reference`) keeps the replay buffer as a list of slots, the deferrals and evictions as
dicts and sets, and applies docs/controllers.md's rule with loops: the oldest buffered prompts
commit, each commit trains on its pilot and its commit rows, a candidate's pilot rate keeps,
defers or evicts it, and a buffered prompt is flushed after `max_off_steps` rounds. The candidates
are a random draw, so the model checks the draw's rules (never a buffered or waiting prompt; the
due ones first; the evicted last) and then takes the drawn ids as given.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdro_jax import controllers

N, D, C, N_MEAN = 8, 40, 6, 4
LOWER, UPPER = 0.125, 0.375  # asymmetric: a swap of the two changes which candidates are kept
MAX_OFF, DEFER = 2, 3


class Reference:
    """Pilot-Commit's rule with Python containers and loops."""

    def __init__(self, buffer_size=C, max_off=MAX_OFF):
        self.max_off = max_off
        self.slots = [None] * buffer_size  # (prompt, round piloted, pilot rows) or None
        self.deferred_until = {}  # prompt -> the round it returns in
        self.evicted = set()
        self.rounds = 0
        self.totals = {"piloted": 0, "committed": 0, "expired": 0}  # over the run

    def check_selection(self, ids, committed):
        """The commits are the oldest buffered prompts; the candidates follow the draw's rules."""
        order = sorted(
            (entry[1], slot) for slot, entry in enumerate(self.slots) if entry is not None
        )
        expected = [self.slots[slot][0] for _, slot in order[: N // 2]]
        k = len(expected)
        assert committed.tolist() == [True] * k + [False] * (N - k)
        assert ids[:k].tolist() == expected
        candidates = ids[k:].tolist()
        assert len(set(candidates)) == len(candidates)
        buffered = {entry[0] for entry in self.slots if entry is not None}
        waiting = {p for p, until in self.deferred_until.items() if until > self.rounds}
        due = {p for p, until in self.deferred_until.items() if until <= self.rounds}
        assert not set(candidates) & (buffered | waiting)
        assert len(set(candidates) & due) == min(len(due), N - k)  # the due ones come first
        others = set(range(D)) - buffered - waiting - self.evicted
        if len(others | due) >= N - k:
            assert not set(candidates) & self.evicted
        return k

    def round(self, ids, committed, rows):
        """`rows[i]` is position i's n_mean successes. Returns the staged pairs' rows."""
        k = int(committed.sum())
        order = sorted(
            (entry[1], slot) for slot, entry in enumerate(self.slots) if entry is not None
        )
        staged = []
        for i, (_, slot) in enumerate(order[:k]):
            prompt, _, pilot = self.slots[slot]
            assert prompt == ids[i]
            staged += [pilot, rows[i]]
            self.slots[slot] = None
        self.totals["committed"] += k
        self.totals["piloted"] += N - k
        for i in range(k, N):
            prompt, rate = int(ids[i]), rows[i].mean()
            self.deferred_until.pop(prompt, None)
            if LOWER <= rate <= 1 - UPPER:
                free = [slot for slot, entry in enumerate(self.slots) if entry is None]
                if free:
                    self.slots[free[0]] = (prompt, self.rounds, rows[i])
            elif rate < LOWER:
                self.deferred_until[prompt] = self.rounds + DEFER
            if rate >= 1.0:
                self.evicted.add(prompt)
        for slot, entry in enumerate(self.slots):
            if entry is not None and self.rounds - entry[1] >= self.max_off:
                self.slots[slot] = None
                self.totals["expired"] += 1
        self.rounds += 1
        return staged


def _part(**kwargs):
    options = dict(lower=LOWER, upper=UPPER, buffer_size=C, max_off_steps=MAX_OFF)
    options.update(defer_steps=DEFER, **kwargs)
    return controllers.pilot_commit(N, D, **options)


def _rates():
    rng = np.random.default_rng(0)
    rate = rng.uniform(0.0, 1.0, D)
    rate[:3] = 0.0  # never solved: deferred, again and again (3 < the N / 2 candidates a round has)
    rate[3:7] = 1.0  # always solved: evicted
    return rate


@pytest.fixture(scope="module")
def pilot_commit_round():
    """One compiled select and one compiled round of the part under test (rebuilt per part).

    Keyed by the part itself, which the cache then keeps alive: keyed by `id(part)`, a test's
    part freed at its end could leave its id to the next test's part, which then ran the freed
    part's programs (seen once: the deferral test ran the swapped thresholds' part)."""
    cache = {}

    def get(part):
        if part not in cache:
            cache[part] = (jax.jit(part.select), jax.jit(part.add), jax.jit(part.take))
        return cache[part]

    return get


def _run(part, compiled, rounds=40, check=True, reference=None):
    """Drives `part` for `rounds` rounds against `reference` (a `Reference()` by default, whose
    buffer size and flush age must be the part's); returns the ids of every round and the
    reference."""
    select, add, take = compiled
    reference = Reference() if reference is None else reference
    rng = np.random.default_rng(1)
    rate = _rates()
    example = {"success": jnp.zeros((N, N_MEAN), bool), "prompt": jnp.zeros((N,), jnp.int32)}
    state = part.init(example)
    keys = jax.random.split(jax.random.key(2), rounds)
    drawn = []
    for t in range(rounds):
        selection = select(state, jnp.zeros((N,), jnp.int32), keys[t])
        ids = np.asarray(selection.prompt_ids)
        committed = np.asarray(selection.committed)
        drawn.append(ids)
        if check:
            reference.check_selection(ids, committed)
        success = rng.uniform(size=(N, N_MEAN)) < rate[ids, None]
        groups = {"success": jnp.asarray(success), "prompt": jnp.asarray(ids, jnp.int32)}
        rewards = jnp.where(groups["success"], 1.0, -1.0)
        state, info = add(
            state, groups, keep=part.keep(rewards), rewards_NG=rewards, selection=selection
        )
        pairs, filled, emptied = take(state)
        staged = reference.round(ids, committed, list(success))
        if check:
            filled = np.asarray(filled)
            assert filled.tolist() == [True] * len(staged) + [False] * (N - len(staged))
            pairs = np.asarray(pairs["success"])
            assert pairs.dtype == bool
            np.testing.assert_array_equal(pairs[: len(staged)], np.reshape(staged, (-1, N_MEAN)))
            assert not pairs[len(staged) :].any()
            held = [entry[0] if entry else -1 for entry in reference.slots]
            assert np.asarray(state.pilot_ids).tolist() == held, f"round {t}"
            assert set(np.flatnonzero(np.asarray(state.evicted))) == reference.evicted
            until = np.asarray(state.deferred_until)
            assert {p: int(until[p]) for p in np.flatnonzero(until)} == reference.deferred_until
            assert bool(info.ready) == (len(staged) > 0)
            report = part.metrics(state, info)
            totals = {name: int(report[f"filter/{name}_total"]) for name in reference.totals}
            assert totals == reference.totals, f"round {t}"
        state = emptied if bool(info.ready) else state
    return drawn, reference


def test_forty_rounds_equal_the_reference(pilot_commit_round):
    part = _part()
    drawn, reference = _run(part, pilot_commit_round(part))
    # The run exercised every branch: commits, deferrals that came back, evictions.
    assert sum(int(p) in range(3) for ids in drawn for p in ids) > 6
    assert reference.evicted and reference.totals["committed"] > 0


def test_buffered_prompts_expire_after_max_off_steps(pilot_commit_round):
    """With a buffer of N and one round off, more is kept than the N / 2 commits of the next
    round can take: the rest is flushed, as the reference flushes it, and counted."""
    part = _part(buffer_size=N, max_off_steps=1)
    _, reference = _run(
        part, pilot_commit_round(part), rounds=20, reference=Reference(buffer_size=N, max_off=1)
    )
    assert reference.totals["expired"] > 0


def test_swapped_thresholds_keep_other_candidates(pilot_commit_round):
    """The reference's thresholds are (0.125, 0.375); a part built with them swapped keeps
    the candidates with rates in [0.375, 0.875], and the buffer differs within a few rounds."""
    part = _part(lower=UPPER, upper=LOWER)
    with pytest.raises(AssertionError):
        _run(part, pilot_commit_round(part))


def test_a_deferred_prompt_returns_first_defer_steps_rounds_later(pilot_commit_round):
    part = _part()
    drawn, _ = _run(part, pilot_commit_round(part), rounds=30, check=False)
    hopeless = set(range(3))  # rate 0: too hard at every pilot
    for t, ids in enumerate(drawn[:-DEFER]):
        for p in set(ids.tolist()) & hopeless:
            # Drawn again exactly DEFER rounds later (the due prompts come first).
            assert p in drawn[t + DEFER], (p, t)
            assert all(p not in drawn[t + s] for s in range(1, DEFER))


def test_a_solved_prompt_is_evicted_and_never_drawn_again(pilot_commit_round):
    part = _part()
    drawn, _ = _run(part, pilot_commit_round(part), rounds=30, check=False)
    solved = set(range(3, 7))  # rate 1: solved at every pilot
    first = {}
    for t, ids in enumerate(drawn):
        for p in set(ids.tolist()) & solved:
            assert p not in first, f"prompt {p} drawn at {first.get(p)} and again at {t}"
            first[p] = t
    assert first  # the run met some of them


def test_staged_pairs_are_one_group_each_in_the_composition():
    """Through `multi_adversary`: the plan takes the selection's prompts, the round's filtered
    rows pair up (`group_of_row`), and a plan with a commit trains on both of its rows."""
    classifier = controllers.passk_classifier(D)
    multi = controllers.multi_adversary(classifier, group_filter=_part(), n_mean=N_MEAN)
    assert multi.draws_prompts
    example = {"success": jnp.zeros((N, N_MEAN), bool)}
    state = multi.init(example)
    rate = _rates()
    rng = np.random.default_rng(3)
    readies = 0
    for t in range(6):
        plan = multi.plan(state, jnp.zeros((N,), jnp.int32), jax.random.key(t))
        ids = np.asarray(plan.prompt_ids)
        success = rng.uniform(size=(N, N_MEAN)) < rate[ids, None]
        groups = {"success": jnp.asarray(success)}
        state, filtered = multi.filter(state, groups, jnp.where(success, 1.0, -1.0), plan=plan)
        np.testing.assert_array_equal(np.asarray(filtered.group_of_row), np.arange(N) // 2)
        committed = int(np.asarray(plan.selections["group_filter"].committed).sum())
        assert bool(filtered.ready) == (committed > 0)
        assert int(np.asarray(filtered.filled).sum()) == 2 * committed
        readies += bool(filtered.ready)
        state = multi.update(
            state, plan, plan.prompt_ids, num_correct=success.sum(1), losses=jnp.zeros(N)
        )
    assert readies >= 4


def test_every_prompt_of_the_pool_can_be_drawn_beside_empty_buffer_slots():
    """An empty buffer slot (id -1) blocks no prompt: the last one of the pool is drawn too."""
    part = _part()
    state = part.init({"success": jnp.zeros((N, N_MEAN), bool)})
    draws = jax.vmap(lambda key: part.select(state, jnp.zeros((N,), jnp.int32), key).prompt_ids)
    drawn = np.asarray(draws(jax.random.split(jax.random.key(0), 200)))
    assert set(drawn.ravel().tolist()) == set(range(D))


def test_a_buffer_smaller_than_half_a_round_commits_each_prompt_once():
    part = controllers.pilot_commit(N, D, buffer_size=1)
    state = part.init({"success": jnp.zeros((N, N_MEAN), bool)})
    rewards = jnp.where(jnp.arange(N_MEAN) < 2, 1.0, -1.0) * jnp.ones((N, 1))  # every p = 0.5
    for t in range(3):
        selection = part.select(state, jnp.zeros((N,), jnp.int32), jax.random.key(t))
        assert int(selection.committed.sum()) == (0 if t == 0 else 1)
        assert len(set(np.asarray(selection.prompt_ids).tolist())) == N
        groups = {"success": rewards > 0}
        state, info = part.add(state, groups, keep=part.keep(rewards), rewards_NG=rewards,
                               selection=selection)  # fmt: skip
        _, _, state = part.take(state)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"num_groups": 7}, "num_groups"),
        ({"num_prompts": 10}, "num_prompts"),
        ({"lower": 0.8, "upper": 0.3}, "lower"),
        ({"solved": 0.5}, "solved"),
        ({"defer_steps": 0}, "defer_steps"),
        ({"max_off_steps": 0}, "max_off_steps"),
    ],
)
def test_bad_hyperparameters_are_refused_by_name(kwargs, field):
    options = {"num_groups": N, "num_prompts": D, **kwargs}
    with pytest.raises(ValueError, match=field):
        controllers.pilot_commit(**options)


def test_it_combines_with_no_other_draw_or_decision():
    classifier = controllers.passk_classifier(D)
    part = _part()
    with pytest.raises(ValueError, match="selects the round's prompts"):
        controllers.multi_adversary(classifier, group_filter=part, sampler=controllers.mopps(D))
    with pytest.raises(ValueError, match="group filter"):
        controllers.multi_adversary(classifier, controllers.prompt_gdro(10), group_filter=part)
