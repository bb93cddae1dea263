"""Tests for the online difficulty classifier against a plain-Python reference.

The reference (`ReferenceClassifier`) uses loops, dicts, `math.comb` and exact `Fraction`
arithmetic, with edges and hysteresis read as the decimals they are written as. It asserts that
every comparison it makes is either an exact tie or at least `_MARGIN` away from the threshold, so
that the float32 classifier (which counts values within 1e-6 of a threshold as on it) must agree
with it exactly; the random visit sequences below are sized so that this holds.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import jax
import jax.extend.core as jex_core
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gdro_jax.controllers._passk import (
    DEFAULT_EDGES,
    PassKState,
    passk_classifier,
    per_visit_statistic,
)

_MARGIN = Fraction(2, 10**6)
_P_HAT_ATOL = 2e-6


class ReferenceClassifier:
    """Plain-Python classifier: the semantics of SPEC section 3, written as directly as possible."""

    def __init__(self, edges, window, statistic, k, hysteresis, unseen):
        self.edges = [Fraction(str(e)) for e in edges]
        self.window = window
        self.statistic_name = statistic
        self.k = k
        self.delta = Fraction(str(hysteresis))
        self.prior = Fraction(0) if unseen == "hardest" else Fraction(str(unseen))
        self.statistics = {}  # prompt id -> list of every per-visit statistic, oldest first
        self.last_bin = {}  # prompt id -> bin assigned at its last visit

    def statistic(self, c, n):
        if self.statistic_name == "any_correct":
            return Fraction(int(c > 0))
        if self.statistic_name == "mean_accuracy":
            return Fraction(c, n)
        k_eff = min(self.k, n)
        return 1 - Fraction(math.comb(n - c, k_eff), math.comb(n, k_eff))

    def at_or_above(self, p, threshold):
        gap = abs(p - threshold)
        assert gap == 0 or gap > _MARGIN, f"ill-posed comparison {float(p)} vs {float(threshold)}"
        return p >= threshold

    def at_or_below(self, p, threshold):
        return self.at_or_above(-p, -threshold)

    def raw_bin(self, p):
        return sum(self.at_or_above(p, e) for e in self.edges)

    def p_hat(self, prompt):
        stats = self.statistics.get(prompt)
        if not stats:
            return self.prior
        kept = stats[-self.window :] if self.window else stats
        return sum(kept) / len(kept)

    def bins(self, prompt):
        return self.last_bin.get(prompt, self.raw_bin(self.prior))

    def update(self, ids, num_correct, num_rollouts, valid):
        pooled = {}
        for prompt, c, n, keep in zip(ids, num_correct, num_rollouts, valid, strict=True):
            if keep and n > 0:
                total_c, total_n = pooled.get(prompt, (0, 0))
                pooled[prompt] = (total_c + c, total_n + n)
        for prompt, (c, n) in pooled.items():
            self.statistics.setdefault(prompt, []).append(self.statistic(c, n))
            p = self.p_hat(prompt)
            if prompt not in self.last_bin:
                self.last_bin[prompt] = self.raw_bin(p)
                continue
            # SPEC 3, the released code's tie rule: up when p >= edge + delta, down when
            # p <= edge - delta (a tie moves), each edge crossed tested; never below the raw bin
            # (which only matters at delta = 0, where a p on an edge belongs above it).
            previous, raw = self.last_bin[prompt], self.raw_bin(p)
            new = previous
            while new < len(self.edges) and self.at_or_above(p, self.edges[new] + self.delta):
                new += 1
            if new == previous:
                while new > raw and self.at_or_below(p, self.edges[new - 1] - self.delta):
                    new -= 1
            self.last_bin[prompt] = new


@dataclasses.dataclass(frozen=True)
class Case:
    window: int
    statistic: str = "pass_at_k"
    k: int = 3
    hysteresis: float = 0.0
    unseen: str | float = "hardest"
    edges: tuple[float, ...] = DEFAULT_EDGES
    max_rollouts: int = 6


CASES = {
    "window3_passk": Case(window=3, k=3, max_rollouts=8),
    "window4_any_correct": Case(window=4, statistic="any_correct", hysteresis=0.2),
    "window5_mean_accuracy": Case(window=5, statistic="mean_accuracy"),
    "window1_mean_accuracy_prior": Case(window=1, statistic="mean_accuracy", unseen=0.5),
    "cumulative_passk": Case(window=0, k=4),
    "cumulative_mean_hysteresis": Case(window=0, statistic="mean_accuracy", hysteresis=0.05),
    "window2_passk_hysteresis_gap": Case(window=2, k=8, hysteresis=0.1, max_rollouts=8),
    "window3_wide_hysteresis_prior": Case(
        window=3,
        statistic="mean_accuracy",
        hysteresis=0.15,
        unseen=0.6,
        edges=(0.25, 0.5, 0.75),
    ),
    "window4_uneven_edges_prior": Case(
        window=4, k=2, hysteresis=0.03, unseen=0.35, edges=(0.05, 0.3, 0.35, 0.9)
    ),
    "single_bin": Case(window=2, edges=()),
}

NUM_PROMPTS = 30
BATCH = 12
STEPS = 30


def build(case: Case, num_prompts: int = NUM_PROMPTS):
    return passk_classifier(
        num_prompts,
        edges=case.edges,
        window=case.window,
        statistic=case.statistic,
        k=case.k,
        hysteresis=case.hysteresis,
        unseen=case.unseen,
    )


def visit_sequence(seed: int, max_rollouts: int):
    """Random batches with duplicates, padding, zero-rollout entries and varying n per prompt."""
    rng = np.random.default_rng(seed)
    # The last two prompts are never drawn, so the final query always covers unseen prompts.
    ids = rng.integers(0, NUM_PROMPTS - 2, size=(STEPS, BATCH))
    rollouts = rng.integers(0, max_rollouts + 1, size=(STEPS, BATCH))
    correct = rng.integers(0, rollouts + 1)
    valid = rng.random((STEPS, BATCH)) < 0.85
    return ids, correct, rollouts, valid


def make_run(classifier):
    """One jitted scan: bins and p_hat of each batch before its update, then the final state."""

    def step(state, batch):
        ids, correct, rollouts, valid = batch
        queried = (classifier.bins(state, ids), classifier.p_hat(state, ids))
        return classifier.update(
            state, ids, num_correct=correct, num_rollouts=rollouts, valid=valid
        ), queried

    def run(ids, correct, rollouts, valid):
        final, (bins_TN, p_TN) = jax.lax.scan(
            step, classifier.init(), (ids, correct, rollouts, valid)
        )
        everyone = jnp.arange(NUM_PROMPTS)
        return (
            final,
            bins_TN,
            p_TN,
            classifier.bins(final, everyone),
            classifier.p_hat(final, everyone),
        )

    return jax.jit(run)


@pytest.fixture(scope="module")
def runs():
    return {name: make_run(build(case)) for name, case in CASES.items()}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_reference_on_random_visits(runs, name, seed):
    case = CASES[name]
    ids, correct, rollouts, valid = visit_sequence(seed, case.max_rollouts)
    assert any(len(set(row)) < len(row) for row in ids.tolist()), "no duplicate ids drawn"
    final, bins_TN, p_TN, final_bins, final_p = runs[name](ids, correct, rollouts, valid)
    reference = ReferenceClassifier(
        case.edges, case.window, case.statistic, case.k, case.hysteresis, case.unseen
    )
    for t in range(STEPS):
        expected_bins = [reference.bins(i) for i in ids[t].tolist()]
        expected_p = [float(reference.p_hat(i)) for i in ids[t].tolist()]
        np.testing.assert_array_equal(np.asarray(bins_TN[t]), expected_bins, err_msg=f"step {t}")
        np.testing.assert_allclose(np.asarray(p_TN[t]), expected_p, rtol=0, atol=_P_HAT_ATOL)
        reference.update(ids[t].tolist(), correct[t].tolist(), rollouts[t].tolist(), valid[t])
    everyone = range(NUM_PROMPTS)
    np.testing.assert_array_equal(np.asarray(final_bins), [reference.bins(i) for i in everyone])
    expected_p = [float(reference.p_hat(i)) for i in everyone]
    np.testing.assert_allclose(np.asarray(final_p), expected_p, rtol=0, atol=_P_HAT_ATOL)
    expected_visits = [len(reference.statistics.get(i, [])) for i in everyone]
    np.testing.assert_array_equal(np.asarray(final.visits), expected_visits)
    expected_last = [reference.last_bin.get(i, -1) for i in everyone]
    np.testing.assert_array_equal(np.asarray(final.last_bin), expected_last)


def test_default_hyperparameters_match_reference_with_exact_ties():
    # Ten rollouts and decile edges put mean accuracies exactly on edges (3/10 against 0.3).
    case = Case(window=8, statistic="mean_accuracy")
    classifier = passk_classifier(NUM_PROMPTS, statistic="mean_accuracy")
    assert classifier.num_bins == 10 and classifier.edges == DEFAULT_EDGES
    rng = np.random.default_rng(7)
    reference = ReferenceClassifier(case.edges, 8, "mean_accuracy", 8, 0.0, "hardest")
    update = jax.jit(classifier.update)
    state = classifier.init()
    on_edge = 0
    for _ in range(10):
        ids = rng.choice(NUM_PROMPTS, size=BATCH, replace=False)
        correct = rng.integers(0, 11, size=BATCH)
        state = update(state, ids, num_correct=correct, num_rollouts=10)
        reference.update(ids.tolist(), correct.tolist(), [10] * BATCH, [True] * BATCH)
        on_edge += sum(reference.p_hat(i) in reference.edges for i in ids.tolist())
    assert on_edge > 0, "the sequence never put a p_hat exactly on an edge"
    expected = [reference.last_bin.get(i, -1) for i in range(NUM_PROMPTS)]
    np.testing.assert_array_equal(np.asarray(state.last_bin), expected)


def test_hysteresis_holds_bins_and_a_tie_at_edge_plus_or_minus_delta_moves():
    # One prompt, window 1, mean accuracy of 20 rollouts: p_hat is the last visit's c / 20.
    # Decile edges, delta = 0.1. SPEC 3 (the released code's tie rule): up when p >= e + delta,
    # down when p <= e - delta; a tie moves.
    correct = [11, 9, 8, 11, 12, 7, 6]  # p_hat 0.55, 0.45, 0.40, 0.55, 0.60, 0.35, 0.30
    raw = [5, 4, 4, 5, 6, 3, 3]
    expected = [
        5,  # first visit: the raw bin
        5,  # 0.45 > 0.5 - 0.1: held in bin 5 (raw 4)
        4,  # 0.40 = 0.5 - 0.1: the tie moves down
        4,  # 0.55 < 0.5 + 0.1: held in bin 4 (raw 5)
        5,  # 0.60 = 0.5 + 0.1: the tie moves up past 0.5, not past 0.6 (raw 6)
        4,  # 0.35 <= 0.4: down past 0.5; 0.35 > 0.4 - 0.1: held above 0.4 (raw 3)
        3,  # 0.30 = 0.4 - 0.1: the tie moves down
    ]
    reference = ReferenceClassifier(DEFAULT_EDGES, 1, "mean_accuracy", 8, 0.1, "hardest")
    for delta, want in ((0.1, expected), (0.0, raw)):
        classifier = passk_classifier(1, window=1, statistic="mean_accuracy", hysteresis=delta)
        update = jax.jit(classifier.update)
        state, got = classifier.init(), []
        for c in correct:
            state = update(state, jnp.array([0]), num_correct=jnp.array([c]), num_rollouts=20)
            got.append(int(classifier.bins(state, jnp.array([0]))[0]))
            if delta:
                reference.update([0], [c], [20], [True])
                assert reference.bins(0) == got[-1]
        assert got == want, f"hysteresis={delta}"
    assert expected != raw, "hysteresis should change some bins"


@pytest.mark.parametrize("k", [1, 2, 3, 8, 16])
def test_pass_at_k_equals_math_comb(k):
    pairs = [(c, n) for n in range(41) for c in range(n + 1)]
    correct, rollouts = (np.asarray(column) for column in zip(*pairs, strict=True))
    got = np.asarray(per_visit_statistic(correct, rollouts, statistic="pass_at_k", k=k))
    expected = [
        1 - math.comb(n - c, min(k, n)) / math.comb(n, min(k, n)) if n > 0 else 0.0
        for c, n in pairs
    ]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=0, atol=2e-6)


def test_other_statistics_and_out_of_range_counts():
    correct = np.array([0, 1, 3, 5, 7, -2, 2])
    rollouts = np.array([4, 4, 4, 5, 4, 4, 0])
    any_correct = per_visit_statistic(correct, rollouts, statistic="any_correct")
    mean_accuracy = per_visit_statistic(correct, rollouts, statistic="mean_accuracy")
    # c is clipped into [0, n] (7 of 4 counts as 4 of 4, -2 as 0); n = 0 is no observation.
    np.testing.assert_array_equal(np.asarray(any_correct), [0, 1, 1, 1, 1, 0, 0])
    np.testing.assert_allclose(
        np.asarray(mean_accuracy), [0, 0.25, 0.75, 1, 1, 0, 0], rtol=0, atol=1e-7
    )


def test_duplicate_ids_pool_into_one_visit():
    classifier = passk_classifier(8, window=3, k=2, hysteresis=0.05)
    state = classifier.update(
        classifier.init(), jnp.array([1, 2]), num_correct=jnp.array([1, 0]), num_rollouts=3
    )
    pooled = classifier.update(
        state, jnp.array([4, 1, 4, 4]), num_correct=jnp.array([1, 2, 0, 2]), num_rollouts=2
    )
    single = classifier.update(
        state, jnp.array([1, 4]), num_correct=jnp.array([2, 3]), num_rollouts=jnp.array([2, 6])
    )
    for got, expected in zip(pooled, single, strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
    assert int(pooled.visits[4]) == 1 and int(pooled.visits[1]) == 2


def test_invalid_entries_are_ignored_and_out_of_range_ids_are_unseen():
    classifier = passk_classifier(5, window=2, unseen=0.45)
    state = classifier.init()
    ids = jnp.array([0, 1, 2, -1, 5, 3])
    after = classifier.update(
        state, ids, num_correct=jnp.array([4, 4, 4, 4, 4, 0]),
        num_rollouts=jnp.array([4, 0, 4, 4, 4, 4]),
        valid=jnp.array([True, True, False, True, True, True]),
    )  # fmt: skip
    np.testing.assert_array_equal(np.asarray(after.visits), [1, 0, 0, 1, 0])
    np.testing.assert_array_equal(np.asarray(classifier.bins(after, ids)), [9, 4, 4, 4, 4, 0])
    np.testing.assert_allclose(
        np.asarray(classifier.p_hat(after, ids)), [1, 0.45, 0.45, 0.45, 0.45, 0], rtol=0, atol=1e-7
    )
    empty = classifier.update(
        after, jnp.zeros((0,), jnp.int32), num_correct=jnp.zeros((0,), jnp.int32), num_rollouts=4
    )
    for got, expected in zip(empty, after, strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


@pytest.mark.parametrize("window", [0, 4])
def test_init_shapes_and_dtypes(window):
    state = passk_classifier(7, window=window).init()
    assert isinstance(state, PassKState)
    assert state.history.shape == (7, max(window, 1)) and state.history.dtype == jnp.float32
    assert state.visits.shape == (7,) and state.visits.dtype == jnp.int32
    assert state.last_bin.shape == (7,) and state.last_bin.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(state.last_bin), -1)


# --- O(batch): update writes only the batch's rows and has no dataset-sized op but its scatters.

LARGE_PROMPTS = 1009  # a prime no other dimension of these programs equals


@pytest.fixture(scope="module")
def large():
    classifier = passk_classifier(LARGE_PROMPTS, window=3, hysteresis=0.05)
    update = jax.jit(classifier.update)
    rng = np.random.default_rng(3)
    state = classifier.init()
    for _ in range(20):
        ids = rng.integers(0, LARGE_PROMPTS, size=64)
        rollouts = rng.integers(1, 9, size=64)
        state = update(state, ids, num_correct=rng.integers(0, rollouts + 1), num_rollouts=rollouts)
    return classifier, update, state


def test_update_leaves_rows_outside_the_batch_bit_identical(large):
    classifier, update, state = large
    ids = np.array([5, 17, 17, 400, 1008, 0])
    after = update(
        state,
        ids,
        num_correct=np.array([1, 2, 3, 0, 4, 2]),
        num_rollouts=np.array([4, 4, 4, 4, 4, 4]),
    )
    outside = np.setdiff1d(np.arange(LARGE_PROMPTS), ids)
    for name, before_field, after_field in zip(state._fields, state, after, strict=True):
        np.testing.assert_array_equal(
            np.asarray(after_field)[outside], np.asarray(before_field)[outside], err_msg=name
        )
    unique = np.unique(ids)
    np.testing.assert_array_equal(
        np.asarray(after.visits)[unique], np.asarray(state.visits)[unique] + 1
    )


def _leaf_equations(jaxpr):
    """Equations of a jaxpr with every nested jaxpr (jit, cond, scan bodies) inlined."""
    for equation in jaxpr.eqns:
        nested = []
        for param in equation.params.values():
            for value in param if isinstance(param, (tuple, list)) else [param]:
                if isinstance(value, jex_core.ClosedJaxpr):
                    nested.append(value.jaxpr)
                elif isinstance(value, jex_core.Jaxpr):
                    nested.append(value)
        if nested:
            for inner in nested:
                yield from _leaf_equations(inner)
        else:
            yield equation


def _dataset_sized(jaxpr):
    return [
        equation.primitive.name
        for equation in _leaf_equations(jaxpr)
        if any(LARGE_PROMPTS in getattr(v.aval, "shape", ()) for v in equation.outvars)
    ]


def test_update_jaxpr_has_no_dataset_sized_op_but_three_scatters(large):
    classifier, _, state = large
    ids = jnp.arange(16)
    counts = jnp.ones((16,), jnp.int32)
    jaxpr = jax.make_jaxpr(
        lambda s, i, c, n, v: classifier.update(s, i, num_correct=c, num_rollouts=n, valid=v)
    )(state, ids, counts, counts, ids > 2).jaxpr
    assert _dataset_sized(jaxpr) == ["scatter"] * 3


def test_queries_have_no_dataset_sized_op(large):
    classifier, _, state = large
    ids = jnp.arange(16)
    assert _dataset_sized(jax.make_jaxpr(classifier.bins)(state, ids).jaxpr) == []
    assert _dataset_sized(jax.make_jaxpr(classifier.p_hat)(state, ids).jaxpr) == []


@settings(max_examples=30, deadline=None)
@given(
    entries=st.lists(
        st.tuples(st.integers(0, 5), st.integers(0, 8), st.integers(0, 8), st.booleans()),
        min_size=8,
        max_size=8,
    ),
    permutation_seed=st.integers(0, 2**31 - 1),
)
def test_update_does_not_depend_on_batch_order(large, entries, permutation_seed):
    _, update, state = large
    ids, correct, rollouts, valid = (np.asarray(column) for column in zip(*entries, strict=True))
    order = np.random.default_rng(permutation_seed).permutation(len(entries))
    first = update(state, ids, num_correct=correct, num_rollouts=rollouts, valid=valid)
    second = update(
        state,
        ids[order],
        num_correct=correct[order],
        num_rollouts=rollouts[order],
        valid=valid[order],
    )
    for got, expected in zip(first, second, strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


# --- Hyperparameter validation.

BAD_HYPERPARAMETERS = [
    ("num_prompts", {"num_prompts": 0}),
    ("num_prompts", {"num_prompts": 2.5}),
    ("num_prompts", {"num_prompts": True}),
    ("edges", {"edges": (0.5, 0.4)}),
    ("edges", {"edges": (0.2, 0.2)}),
    ("edges", {"edges": (0.0, 0.5)}),
    ("edges", {"edges": (0.5, 1.0)}),
    ("edges", {"edges": (float("nan"),)}),
    ("edges", {"edges": 0.5}),
    ("edges", {"edges": ("a", "b")}),
    ("window", {"window": -1}),
    ("window", {"window": 2.0}),
    ("statistic", {"statistic": "pass@k"}),
    ("k", {"k": 0}),
    ("k", {"k": 1.5}),
    ("hysteresis", {"hysteresis": -0.1}),
    ("hysteresis", {"hysteresis": 1.0}),
    ("hysteresis", {"hysteresis": float("nan")}),
    ("hysteresis", {"hysteresis": "0.1"}),
    ("unseen", {"unseen": "easiest"}),
    ("unseen", {"unseen": 1.5}),
    ("unseen", {"unseen": -0.1}),
    ("unseen", {"unseen": float("nan")}),
    ("unseen", {"unseen": True}),
]


@pytest.mark.parametrize(("name", "override"), BAD_HYPERPARAMETERS)
def test_bad_hyperparameter_raises_naming_it(name, override):
    kwargs = {"num_prompts": 10, **override}
    with pytest.raises(ValueError, match=rf"\b{name}="):
        passk_classifier(**kwargs)


@pytest.mark.parametrize(("name", "override"), [("statistic", {"statistic": "x"}), ("k", {"k": 0})])
def test_per_visit_statistic_rejects_bad_arguments(name, override):
    with pytest.raises(ValueError, match=rf"\b{name}="):
        per_visit_statistic(1, 2, **override)
