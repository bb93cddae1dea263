"""pass@k estimators and grouped summaries with bootstrap intervals."""

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gdro_jax import eval as evaluation
from gdro_jax.eval._passk import summary_cells


def _exact_pass_at_k(n: int, c: int, k: int) -> float:
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


@st.composite
def _n_c_k(draw):
    n = draw(st.integers(1, 80))
    return n, draw(st.integers(0, n)), draw(st.integers(1, n))


@settings(max_examples=50, deadline=None)
@given(_n_c_k())
def test_pass_at_k_equals_combinatorial_value(nck):
    n, c, k = nck
    assert evaluation.pass_at_k(n, c, k) == pytest.approx(_exact_pass_at_k(n, c, k), abs=1e-12)


def test_pass_at_k_vectorised_matches_scalar_calls():
    rng = np.random.default_rng(0)
    n_N = rng.integers(1, 40, size=200)
    c_N = rng.integers(0, n_N + 1)
    k_N = rng.integers(1, n_N + 1)
    got_N = evaluation.pass_at_k(n_N, c_N, k_N)
    want_N = [_exact_pass_at_k(*map(int, nck)) for nck in zip(n_N, c_N, k_N, strict=True)]
    np.testing.assert_allclose(got_N, want_N, rtol=0, atol=1e-12)
    # Broadcasting: one problem, every k.
    ks = np.arange(1, 9)
    np.testing.assert_allclose(
        evaluation.pass_at_k(8, 3, ks), [_exact_pass_at_k(8, 3, int(k)) for k in ks], atol=1e-12
    )


def test_pass_at_k_is_one_where_bootstrap_best_of_k_is_biased_low():
    # 1 correct of 4 samples: every 4-subset of the 4 samples holds the correct one.
    assert evaluation.pass_at_k(4, 1, 4) == 1.0
    # Resampling k of the n with replacement ("bootstrap best@k") misses it (1-1/4)^4 of the time.
    bootstrap_best_of_k = 1 - (1 - 1 / 4) ** 4
    assert bootstrap_best_of_k < 0.7
    # "Any of the n correct" is biased high for k < n; the estimator is not.
    assert evaluation.pass_at_k(4, 1, 1) == pytest.approx(0.25, abs=1e-15)


def test_pass_at_k_large_n_is_finite_and_exact():
    # C(1000, 500) overflows float64; the product form does not.
    assert evaluation.pass_at_k(1000, 1, 500) == pytest.approx(0.5, abs=1e-12)
    assert evaluation.pass_at_k(1000, 0, 500) == 0.0


def test_pass_at_k_with_fewer_samples_than_k_is_nan():
    out = evaluation.pass_at_k([3, 8], [1, 1], 4)
    assert np.isnan(out[0]) and out[1] == pytest.approx(_exact_pass_at_k(8, 1, 4))
    assert np.isnan(evaluation.mean_at_k(3, 1, 4))


@pytest.mark.parametrize(
    "n, c, k, name",
    [(4, 5, 1, "c"), (4, -1, 1, "c"), (4, 1, 0, "k"), (-1, 0, 1, "n"), (4.5, 1, 1, "n")],
)
def test_pass_at_k_rejects_bad_arguments(n, c, k, name):
    with pytest.raises(ValueError, match=name):
        evaluation.pass_at_k(n, c, k)


def test_mean_at_k_is_the_accuracy():
    c_N = np.arange(9)
    np.testing.assert_allclose(evaluation.mean_at_k(8, c_N, 8), c_N / 8)
    np.testing.assert_allclose(evaluation.mean_at_k(8, c_N, 3), c_N / 8)


def test_mean_at_n_is_pass_at_1_intervals_included():
    """Why the reports' tables print pass@1 and no mean@n column: the two are one figure. By
    hand: pass@1 = 1 - (n - c) / n = c / n = mean@n per problem, and the bootstrap resamples the
    same problems for every column, so the intervals agree too."""
    rng = np.random.default_rng(3)
    n, groups_N = 8, np.repeat([1, 2], [9, 6])
    correct_N = rng.integers(0, n + 1, size=len(groups_N))
    by_group, pooled = evaluation.summarize_counts(correct_N, n, groups_N, num_resamples=300)
    for summary in [*by_group.values(), pooled]:
        assert summary.pass_at[0] == pytest.approx(summary.mean, abs=1e-12)
        np.testing.assert_allclose(summary.pass_interval[0], summary.mean_interval, atol=1e-12)
    cells = summary_cells(pooled, [1, n])
    assert len(cells) == 3  # problems, pass@1, pass@8: no duplicate mean@8 cell


def test_summarize_counts_matches_direct_reference():
    rng = np.random.default_rng(1)
    n = 8
    groups_N = np.repeat([1, 2, 5], [10, 7, 13])
    correct_N = rng.integers(0, n + 1, size=len(groups_N))
    by_group, pooled = evaluation.summarize_counts(correct_N, n, groups_N, num_resamples=400)
    assert list(by_group) == [1, 2, 5]

    def reference(counts):
        mean = float(np.mean([c / n for c in counts]))
        passes = [float(np.mean([_exact_pass_at_k(n, int(c), k) for c in counts])) for k in ks]
        return mean, passes

    ks = range(1, n + 1)
    for group, summary in [*by_group.items(), (None, pooled)]:
        counts = correct_N if group is None else correct_N[groups_N == group]
        mean, passes = reference(counts)
        assert summary.num_problems == len(counts)
        assert summary.mean == pytest.approx(mean, abs=1e-12)
        np.testing.assert_allclose(summary.pass_at, passes, atol=1e-12)
        # Percentile intervals bracket the point estimate and are ordered.
        assert summary.mean_interval[0] <= summary.mean <= summary.mean_interval[1]
        low_K, high_K = summary.pass_interval[:, 0], summary.pass_interval[:, 1]
        assert np.all(low_K <= summary.pass_at + 1e-12)
        assert np.all(summary.pass_at <= high_K + 1e-12)
        # pass@k rises with k.
        assert np.all(np.diff(summary.pass_at) >= -1e-12)


def test_summarize_counts_interval_has_zero_width_for_identical_problems():
    by_group, _ = evaluation.summarize_counts(np.full(12, 3), 8, np.ones(12, int))
    np.testing.assert_allclose(by_group[1].pass_interval[:, 0], by_group[1].pass_interval[:, 1])
