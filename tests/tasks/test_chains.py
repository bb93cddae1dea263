"""Tests of the chain task's problems and splits: determinism, disjointness, heavy tail, shared
skills, internal correctness (recomputed in plain Python), and config errors."""

import collections
import dataclasses
import itertools
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gdro_jax import tasks

CONFIG = tasks.ChainTaskConfig(
    num_levels=8, tail_base=1.5, pool_size=2048, validation_per_level=24, test_per_level=64, seed=3
)
PROMPT_PATTERN = re.compile(r"^(\d)((?:[-+*]\d)+)=$")
STEP_PATTERN = re.compile(r"^(\d)([-+*])(\d)=(\d)$")


@pytest.fixture(scope="module")
def splits():
    return tasks.build_splits(CONFIG)


@pytest.fixture(scope="module")
def pretraining():
    return tasks.pretraining_rows(CONFIG, 12_000, seed=7)


def reference_solve(prompt):
    """Plain-Python reading of a prompt: (start, [(op, operand)], [step values])."""
    match = PROMPT_PATTERN.match(prompt)
    assert match, prompt
    value = int(match.group(1))
    ops = [(chunk[0], int(chunk[1])) for chunk in re.findall(r"[-+*]\d", match.group(2))]
    values = []
    for op, operand in ops:
        if op == "+":
            value = (value + operand) % 10
        elif op == "-":
            value = (value - operand) % 10
        else:
            value = (value * operand) % 10
        values.append(value)
    return int(match.group(1)), ops, values


def step_table():
    """All 300 single steps `a op d = r` of the task, written out by hand."""
    table = set()
    for a, op, d in itertools.product(range(10), "+-*", range(10)):
        r = {"+": a + d, "-": a - d, "*": a * d}[op] % 10
        table.add(f"{a}{op}{d}={r}")
    return table


def test_rows_have_the_spec_shape(splits):
    for row in splits.train[:5] + splits.validation[:5] + splits.test[:5]:
        assert set(row) == {"id", "prompt", "answer", "solution", "level"}
    ids = [row["id"] for split in splits for row in split]
    assert len(ids) == len(set(ids))
    assert [row["id"] for row in splits.train[:2]] == ["train-000000", "train-000001"]


def test_splits_are_deterministic_by_seed(splits):
    assert tasks.build_splits(CONFIG) == splits
    other = tasks.build_splits(dataclasses.replace(CONFIG, seed=4))
    assert [r["prompt"] for r in other.test] != [r["prompt"] for r in splits.test]
    assert [r["prompt"] for r in other.train] != [r["prompt"] for r in splits.train]
    first = tasks.pretraining_rows(CONFIG, 500, seed=1)
    assert tasks.pretraining_rows(CONFIG, 500, seed=1) == first
    assert tasks.pretraining_rows(CONFIG, 500, seed=2) != first


def test_heldout_splits_do_not_depend_on_the_pool(splits):
    small = tasks.build_splits(dataclasses.replace(CONFIG, pool_size=64))
    assert small.test == splits.test
    assert small.validation == splits.validation


def test_split_sizes(splits):
    for split, per_level in ((splits.validation, 24), (splits.test, 64)):
        counts = collections.Counter(row["level"] for row in split)
        assert counts == {level: per_level for level in range(1, 9)}
        levels = [row["level"] for row in split]
        assert levels == sorted(levels)  # grouped by level
    train_counts = collections.Counter(row["level"] for row in splits.train)
    assert [train_counts[level] for level in range(1, 9)] == CONFIG.pool_level_counts().tolist()
    assert len(splits.train) == CONFIG.pool_size


def test_splits_are_disjoint_by_content(splits, pretraining):
    train = {row["prompt"] for row in splits.train}
    validation = [row["prompt"] for row in splits.validation]
    test = [row["prompt"] for row in splits.test]
    assert len(set(validation)) == len(validation)
    assert len(set(test)) == len(test)
    assert not train & set(validation)
    assert not train & set(test)
    assert not set(validation) & set(test)
    assert not {row["prompt"] for row in pretraining} & (set(validation) | set(test))


def test_pool_is_distinct_where_the_level_allows_and_repeats_evenly_otherwise(splits):
    by_level = collections.defaultdict(list)
    for row in splits.train:
        by_level[row["level"]].append(row["prompt"])
    # Level 1 has 300 problems, 88 of them held out: 212 left for 589 pool prompts.
    level_one = collections.Counter(by_level[1])
    assert len(level_one) == 300 - 24 - 64
    assert max(level_one.values()) - min(level_one.values()) <= 1
    for level in range(2, 9):
        assert len(set(by_level[level])) == len(by_level[level])


def test_per_level_test_counts():
    """A count per level gives that many distinct test problems of each level, disjoint from
    validation and pool; a list reads as the same tuple (the form a JSON config comes back in),
    and every other level's problems are those an int count gives."""
    counts = (3, 5, 4, 4, 4, 4, 4, 40)
    config = dataclasses.replace(
        CONFIG, pool_size=256, validation_per_level=4, test_per_level=counts
    )
    assert config == dataclasses.replace(config, test_per_level=list(counts))
    assert [config.test_count(level) for level in range(1, 9)] == list(counts)
    split = tasks.build_splits(config)
    by_level = collections.Counter(row["level"] for row in split.test)
    assert [by_level[level] for level in range(1, 9)] == list(counts)
    test = [row["prompt"] for row in split.test]
    assert len(set(test)) == len(test)
    assert not set(test) & {row["prompt"] for row in split.validation + split.train}
    uniform = tasks.build_splits(dataclasses.replace(config, test_per_level=4))
    for level in range(3, 8):  # the same count as the uniform config: the same problems
        assert [r["prompt"] for r in split.test if r["level"] == level] == [
            r["prompt"] for r in uniform.test if r["level"] == level
        ]


@pytest.mark.parametrize("tail_base", [1.5, 2.0])
def test_pool_level_shares_follow_the_base(tail_base):
    config = tasks.ChainTaskConfig(
        num_levels=8,
        tail_base=tail_base,
        pool_size=20_000,
        validation_per_level=4,
        test_per_level=4,
    )
    levels = np.array([row["level"] for row in tasks.build_splits(config).train])
    frequency = np.bincount(levels, minlength=9)[1:] / len(levels)
    weights = tail_base ** -np.arange(1, 9, dtype=np.float64)
    # One prompt per level first, then largest remainders: off by at most L + 1 prompts.
    np.testing.assert_allclose(frequency, weights / weights.sum(), atol=9 / 20_000)
    ratios = frequency[:-1] / frequency[1:]
    np.testing.assert_allclose(ratios[:5], tail_base, rtol=0.05)


@settings(max_examples=40, deadline=None)
@given(
    total=st.integers(6, 5_000),
    num_levels=st.integers(1, 12),
    tail_base=st.floats(1.01, 4.0),
)
def test_level_counts_sum_exactly_and_keep_every_level(total, num_levels, tail_base):
    if total < num_levels:
        total = num_levels
    counts = tasks.level_counts(total, num_levels, tail_base)
    shares = tasks.level_shares(num_levels, tail_base)
    assert counts.sum() == total
    assert counts.min() >= 1
    assert np.all(np.abs(counts - shares * total) <= num_levels + 1)


def test_every_solution_is_internally_correct(splits, pretraining):
    rows = [row for split in splits for row in split] + pretraining
    for row in rows:
        start, ops, values = reference_solve(row["prompt"])
        steps = row["solution"].split(";")
        assert row["level"] == len(ops) == len(steps)
        previous = start
        for (op, operand), value, step in zip(ops, values, steps, strict=True):
            assert step == f"{previous}{op}{operand}={value}"
            previous = value
        assert row["answer"] == str(values[-1])


def test_harder_levels_compose_the_same_steps(splits, pretraining):
    table = step_table()
    steps_of_level = collections.defaultdict(set)
    for row in pretraining + splits.train:
        steps_of_level[row["level"]].update(row["solution"].split(";"))
    for level, steps in steps_of_level.items():
        assert steps <= table, level
    # The hardest level uses every step of the table, so it contains all of level 1's steps.
    assert steps_of_level[8] == table
    assert steps_of_level[1] <= steps_of_level[8]
    # A level-l problem extended by one step keeps its solution as a prefix.
    for row in splits.test[-64:]:
        start, ops, _ = reference_solve(row["prompt"])
        for level in range(1, 9):
            short = tasks.make_problem(
                start, [op for op, _ in ops[:level]], [d for _, d in ops[:level]]
            )
            assert short["level"] == level
            assert short["solution"] == ";".join(row["solution"].split(";")[:level])
            assert row["prompt"].startswith(short["prompt"][:-1])


def test_pretraining_rows_follow_the_heavy_tail(pretraining):
    counts = collections.Counter(row["level"] for row in pretraining)
    expected = tasks.level_counts(12_000, 8, 1.5)
    assert [counts[level] for level in range(1, 9)] == expected.tolist()
    flat = tasks.pretraining_rows(CONFIG, 800, seed=0, tail_base=1.0001)
    flat_counts = collections.Counter(row["level"] for row in flat)
    assert max(flat_counts.values()) - min(flat_counts.values()) <= 2


def test_lengths_and_space_sizes():
    assert CONFIG.max_prompt_length == 2 * 8 + 3
    assert CONFIG.max_solution_length == 6 * 8
    assert CONFIG.sequence_length == CONFIG.max_prompt_length + CONFIG.max_solution_length
    assert [tasks.problem_space_size(level) for level in (1, 2)] == [300, 9_000]
    assert tasks.pool_size_for(steps=80, prompts_per_step=64) == 1024
    assert tasks.pool_size_for(steps=80, prompts_per_step=64, min_visits=8) == 640


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(num_levels=5), "num_levels"),
        (dict(num_levels=13), "num_levels"),
        (dict(num_levels=8.0), "num_levels"),
        (dict(tail_base=1.0), "tail_base"),
        (dict(tail_base=0.5), "tail_base"),
        (dict(tail_base=float("inf")), "tail_base"),
        (dict(pool_size=7), "pool_size"),
        (dict(pool_size=2_000_000), "pool_size"),
        (dict(validation_per_level=0), "validation_per_level"),
        (dict(test_per_level=-1), "test_per_level"),
        (dict(validation_per_level=60, test_per_level=100), "test_per_level"),
        (dict(test_per_level=(10,) * 7), "test_per_level"),  # 7 counts for 8 levels
        (dict(test_per_level=(10,) * 7 + (0,)), "test_per_level"),
        (dict(test_per_level=(200,) + (10,) * 7), "level 1"),  # over half of level 1
        (dict(test_per_level=(10, 5000) + (10,) * 6), "level 2"),  # 9,000 problems
        (dict(seed=-1), "seed"),
        (dict(seed=True), "seed"),
    ],
)
def test_config_errors_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        tasks.ChainTaskConfig(**kwargs)


def test_function_errors_name_the_parameter():
    with pytest.raises(ValueError, match="num_rows"):
        tasks.pretraining_rows(CONFIG, 3, seed=0)
    with pytest.raises(ValueError, match="seed"):
        tasks.pretraining_rows(CONFIG, 100, seed=-2)
    with pytest.raises(ValueError, match="tail_base"):
        tasks.pretraining_rows(CONFIG, 100, seed=0, tail_base=0.9)
    with pytest.raises(ValueError, match="prompts_per_step"):
        tasks.pool_size_for(steps=10, prompts_per_step=0)
    with pytest.raises(ValueError, match="total"):
        tasks.level_counts(3, 6, 2.0)
    with pytest.raises(ValueError, match="start"):
        tasks.make_problem(10, ["+"], [1])
    with pytest.raises(ValueError, match="operations"):
        tasks.make_problem(1, ["/"], [1])
    with pytest.raises(ValueError, match="operands"):
        tasks.make_problem(1, ["+"], [12])
    with pytest.raises(ValueError, match="operations and operands"):
        tasks.make_problem(1, ["+", "-"], [1])
