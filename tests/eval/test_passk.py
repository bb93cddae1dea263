"""pass@k estimators, grouped summaries with bootstrap intervals, and the chain-task harness."""

import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gdro_jax import eval as evaluation
from gdro_jax import sampling, tasks


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


# ------------------------------------------------------------------------------------------------
# The harness with a fake sampler of known per-level success probabilities.

_LEVEL_ODDS = {1: 1.0, 2: 0.0, 5: 0.3}  # chance that a sample is the gold solution
_PROBLEMS_PER_LEVEL = 24
_NUM_SAMPLES = 8


def _fake_sampler(
    model, prompt_tokens, *, prompt_lengths, prompt_of_slot, key, max_new_tokens, eos_ids, **_
):
    """Writes each slot's gold solution with its level's odds, else one with a wrong first token.

    It reads the chain back from the prompt tokens, so it checks that the harness hands every slot
    its own prompt.
    """
    del model
    assert tuple(eos_ids) == (tasks.EOS_ID,)
    rows = []
    for tokens, length in zip(np.asarray(prompt_tokens), np.asarray(prompt_lengths), strict=True):
        chain = tasks.decode(tokens[:length])  # e.g. "3+4*7=" (<bos> dropped)
        pairs = chain[1:-1]
        rows.append(
            tasks.make_problem(int(chain[0]), list(pairs[::2]), [int(d) for d in pairs[1::2]])
        )
    slots = np.asarray(prompt_of_slot)
    gold_RM, lengths_R = tasks.encode_solutions(
        [rows[i]["solution"] for i in slots], max_new_tokens
    )
    odds_R = np.asarray([_LEVEL_ODDS[rows[i]["level"]] for i in slots])
    hit_R = np.asarray(jax.random.uniform(key, (len(slots),))) < odds_R
    gold_RM[~hit_R, 0] = tasks.VOCAB.index("*")  # a solution never starts with an operation
    return sampling.GenerationResult(
        tokens=jnp.asarray(gold_RM),
        logprobs=jnp.zeros(gold_RM.shape),
        lengths=jnp.asarray(lengths_R),
        finish_reasons=jnp.ones(len(slots), jnp.int32),
        prompt_tokens=jnp.asarray(prompt_tokens)[slots],
        prompt_lengths=jnp.asarray(prompt_lengths)[slots],
    )


def _problem_rows():
    rng = np.random.default_rng(0)
    return [
        tasks.make_problem(
            int(rng.integers(10)),
            [tasks.OPERATIONS[i] for i in rng.integers(3, size=level)],
            rng.integers(10, size=level).tolist(),
        )
        for level in _LEVEL_ODDS
        for _ in range(_PROBLEMS_PER_LEVEL)
    ]


@pytest.fixture(scope="module")
def fake_evaluation():
    rows = _problem_rows()
    config = tasks.ChainTaskConfig(num_levels=6, validation_per_level=4, test_per_level=4)
    # 72 problems in batches of 20: the last batch is padded.
    result = evaluation.evaluate_task(
        None,
        rows,
        config,
        key=jax.random.key(3),
        num_samples=_NUM_SAMPLES,
        batch_size=20,
        num_resamples=200,
        sampler=_fake_sampler,
    )
    return rows, config, result


def test_harness_deterministic_levels_are_exact(fake_evaluation):
    _, _, result = fake_evaluation
    assert sorted(result.by_level) == sorted(_LEVEL_ODDS)
    np.testing.assert_array_equal(result.by_level[1].pass_at, np.ones(_NUM_SAMPLES))
    assert result.by_level[1].mean == 1.0
    np.testing.assert_array_equal(result.by_level[2].pass_at, np.zeros(_NUM_SAMPLES))
    assert result.by_level[2].mean == 0.0
    assert all(s.num_problems == _PROBLEMS_PER_LEVEL for s in result.by_level.values())


def test_harness_probabilistic_level_matches_its_odds(fake_evaluation):
    _, _, result = fake_evaluation
    odds = _LEVEL_ODDS[5]
    samples = _PROBLEMS_PER_LEVEL * _NUM_SAMPLES
    # Four binomial standard errors of the sample mean.
    tolerance = 4 * math.sqrt(odds * (1 - odds) / samples)
    assert result.by_level[5].mean == pytest.approx(odds, abs=tolerance)
    assert result.pass_at(1, 5) == pytest.approx(odds, abs=tolerance)
    for k in (2, 4, 8):
        assert result.pass_at(k, 5) == pytest.approx(1 - (1 - odds) ** k, abs=0.1)
    # Pooled numbers are the problem-weighted average of the levels (equal sizes here).
    for k in range(1, _NUM_SAMPLES + 1):
        levels = [result.pass_at(k, level) for level in _LEVEL_ODDS]
        assert result.pass_at(k) == pytest.approx(np.mean(levels), abs=1e-12)


def test_harness_counts_match_a_direct_reference(fake_evaluation):
    rows, config, result = fake_evaluation
    arrays = tasks.encode_rows(rows, config)
    key = jax.random.key(3)
    # Each harness batch b holds problems 20b .. 20b+19 (the last one wraps around to problem 0);
    # redo its sampler call and grade with the string reference grader.
    for batch in range(4):
        rows_B = np.arange(20 * batch, 20 * batch + 20) % len(rows)
        out = _fake_sampler(
            None,
            arrays.prompt_tokens[rows_B],
            prompt_lengths=arrays.prompt_lengths[rows_B],
            prompt_of_slot=np.repeat(np.arange(20), _NUM_SAMPLES),
            key=jax.random.fold_in(key, batch),
            max_new_tokens=config.max_solution_length,
            eos_ids=(tasks.EOS_ID,),
        )
        tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
        for i, problem in enumerate(rows_B[: len(rows) - 20 * batch]):
            want = sum(
                tasks.grade_tokens(tokens[r], rows[problem]["solution"], length=lengths[r])
                for r in range(i * _NUM_SAMPLES, (i + 1) * _NUM_SAMPLES)
            )
            assert result.correct[problem] == want
    assert result.correct.shape == (len(rows),)


def test_format_level_table_lists_every_level_and_pooled(fake_evaluation):
    *_, result = fake_evaluation
    table = evaluation.format_level_table(result)
    lines = table.splitlines()
    assert lines[0].split() == ["level", "problems", "mean@8", "pass@1", "pass@8"]
    assert [line.split()[0] for line in lines[2:]] == ["1", "2", "5", "pooled"]
    assert lines[2].split()[2:4] == ["1.000", "[1.000,"]
    with pytest.raises(ValueError, match="ks"):
        evaluation.format_level_table(result, ks=[9])
    assert result.to_dict()["levels"]["5"]["num_problems"] == _PROBLEMS_PER_LEVEL
