"""Tests of the chain task's reward: the jitted exact-match reward equals the plain-Python string
grader on perturbed completions, it works under jit and vmap, and blind guessing scores < 1 %."""

import collections
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gdro_jax import tasks

CONFIG = tasks.ChainTaskConfig(
    num_levels=8, tail_base=1.5, pool_size=64, validation_per_level=8, test_per_level=32, seed=5
)
KINDS = (
    "exact",
    "junk_after_eos",
    "junk_after_length",
    "truncated",
    "early_eos",
    "wrong_digit",
    "missing_eos",
    "extra_before_eos",
    "eos_past_length",
    "special_inside",
    "random",
)
DIGIT_IDS = np.array([tasks.VOCAB.index(d) for d in "0123456789"])
correct_fn = jax.jit(tasks.solution_correct)


@pytest.fixture(scope="module")
def rows():
    return tasks.build_splits(CONFIG).test


@pytest.fixture(scope="module")
def gold(rows):
    return tasks.encode_rows(rows, CONFIG)


def perturb(rng, gold_S, gold_length, kind, width):
    """One completion of `width` tokens and its length, made from a gold row by `kind`."""
    end = gold_length - 1  # position of the gold <eos>
    junk = rng.integers(0, tasks.VOCAB_SIZE, size=width)
    tokens = np.full(width, tasks.PAD_ID, np.int64)
    tokens[: min(gold_length, width)] = gold_S[: min(gold_length, width)]
    length = width
    if kind == "junk_after_eos":
        tokens[gold_length:] = junk[gold_length:]
    elif kind == "junk_after_length":
        length = int(rng.integers(gold_length, width + 1))
        tokens[length:] = junk[length:]
    elif kind == "truncated":
        tokens[int(rng.integers(0, end)) : gold_length] = tasks.PAD_ID
    elif kind == "early_eos":
        tokens[int(rng.integers(0, end))] = tasks.EOS_ID
    elif kind == "wrong_digit":
        digits = np.flatnonzero(np.isin(tokens[:end], DIGIT_IDS))
        position = int(rng.choice(digits))
        tokens[position] = rng.choice(DIGIT_IDS[DIGIT_IDS != tokens[position]])
    elif kind == "missing_eos":
        tokens[end] = rng.choice([tasks.PAD_ID, tasks.VOCAB.index(";"), tasks.BOS_ID])
    elif kind == "extra_before_eos":
        tokens[end] = rng.integers(3, tasks.VOCAB_SIZE)
        tokens[end + 1] = tasks.EOS_ID
    elif kind == "eos_past_length":
        length = int(rng.integers(0, gold_length))
    elif kind == "special_inside":
        tokens[int(rng.integers(0, end))] = rng.choice([tasks.PAD_ID, tasks.BOS_ID])
    elif kind == "random":
        tokens = junk
        length = int(rng.integers(0, width + 1))
    return tokens, length


def perturbed_batch(rows, gold, width, num_slots, seed):
    rng = np.random.default_rng(seed)
    row_R = rng.integers(0, len(rows), size=num_slots)
    kind_R = np.arange(num_slots) % len(KINDS)
    completion_RT = np.zeros((num_slots, width), np.int32)
    length_R = np.zeros((num_slots,), np.int32)
    for slot, (row, kind) in enumerate(zip(row_R, kind_R, strict=True)):
        gold_length = int(gold.solution_lengths[row])
        fits = gold_length + 1 <= width
        # A gold row too long for the width can only be copied cut short (so without <eos>).
        chosen = KINDS[kind] if fits else "exact"
        completion_RT[slot], length_R[slot] = perturb(
            rng, gold.solution_tokens[row], gold_length, chosen, width
        )
    return row_R, kind_R, completion_RT, length_R


def reference(rows, row_R, completion_RT, length_R):
    return np.array(
        [
            tasks.grade_tokens(completion, rows[row]["solution"], length=length)
            for row, completion, length in zip(row_R, completion_RT, length_R, strict=True)
        ]
    )


def test_jitted_reward_equals_the_string_grader_on_perturbations(rows, gold):
    width = CONFIG.max_solution_length + 6
    row_R, kind_R, completion_RT, length_R = perturbed_batch(rows, gold, width, 1100, seed=0)
    correct_R = np.asarray(
        correct_fn(completion_RT, gold.solution_tokens[row_R], completion_lengths=length_R)
    )
    expected_R = reference(rows, row_R, completion_RT, length_R)
    np.testing.assert_array_equal(correct_R, expected_R)
    for kind, name in enumerate(KINDS):
        outcome = correct_R[kind_R == kind]
        if name in ("exact", "junk_after_eos", "junk_after_length"):
            assert outcome.all(), name
        elif name != "random":
            assert not outcome.any(), name


def test_completions_shorter_than_the_gold_width(rows, gold):
    width = 20  # level <= 3 solutions (<= 18 tokens) fit, longer ones cannot end in time
    row_R, _, completion_RT, length_R = perturbed_batch(rows, gold, width, 330, seed=1)
    correct_R = np.asarray(
        correct_fn(completion_RT, gold.solution_tokens[row_R], completion_lengths=length_R)
    )
    np.testing.assert_array_equal(correct_R, reference(rows, row_R, completion_RT, length_R))
    assert correct_R.any()


def test_default_lengths_read_every_token(rows, gold):
    _, _, completion_RT, _ = perturbed_batch(rows, gold, 54, 22, seed=2)
    row_R = np.arange(22)
    full = np.full((22,), 54, np.int32)
    np.testing.assert_array_equal(
        np.asarray(correct_fn(completion_RT, gold.solution_tokens[row_R])),
        np.asarray(correct_fn(completion_RT, gold.solution_tokens[row_R], completion_lengths=full)),
    )


@pytest.mark.parametrize("reward_values", [(0.0, 1.0), (-1.0, 1.0)])
def test_reward_values_map_correctness(rows, gold, reward_values):
    row_R, _, completion_RT, length_R = perturbed_batch(rows, gold, 54, 44, seed=3)
    reward_fn = jax.jit(functools.partial(tasks.solution_reward, reward_values=reward_values))
    reward_R = reward_fn(completion_RT, gold.solution_tokens[row_R], completion_lengths=length_R)
    expected = np.where(
        reference(rows, row_R, completion_RT, length_R), reward_values[1], reward_values[0]
    )
    assert reward_R.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(reward_R), expected.astype(np.float32))


def test_reward_under_vmap_equals_per_group_calls(rows, gold):
    groups = [perturbed_batch(rows, gold, 54, 16, seed=10 + g) for g in range(3)]
    completion_GRT = np.stack([g[2] for g in groups])
    gold_GRS = np.stack([gold.solution_tokens[g[0]] for g in groups])
    length_GR = np.stack([g[3] for g in groups])
    batched = jax.jit(jax.vmap(lambda c, s, n: tasks.solution_reward(c, s, completion_lengths=n)))
    reward_GR = np.asarray(batched(completion_GRT, gold_GRS, length_GR))
    for g in range(3):
        expected = reference(rows, groups[g][0], groups[g][2], groups[g][3]).astype(np.float32)
        np.testing.assert_array_equal(reward_GR[g], expected)


def test_reward_on_slots_sharded_over_an_eight_device_mesh(rows, gold):
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("data",))
    slots = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    row_R, _, completion_RT, length_R = perturbed_batch(rows, gold, 54, 32, seed=4)
    gold_RS = gold.solution_tokens[row_R]
    reward_fn = jax.jit(
        functools.partial(tasks.solution_reward, reward_values=(-1.0, 1.0)), out_shardings=slots
    )
    reward_R = reward_fn(
        jax.device_put(completion_RT, slots),
        jax.device_put(gold_RS, slots),
        completion_lengths=jax.device_put(length_R, slots),
    )
    assert reward_R.sharding.is_equivalent_to(slots, 1)
    expected = np.where(reference(rows, row_R, completion_RT, length_R), 1.0, -1.0)
    np.testing.assert_array_equal(np.asarray(reward_R), expected.astype(np.float32))


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 63),  # row among the level-1 and level-2 rows
            st.integers(0, 13),  # position to edit
            st.integers(0, tasks.VOCAB_SIZE - 1),  # new token
            st.booleans(),  # whether to edit
            st.integers(0, 14),  # completion length
        ),
        min_size=8,
        max_size=8,
    )
)
def test_reward_matches_the_grader_on_arbitrary_edits(rows, gold, slots):
    short = [i for i, row in enumerate(rows) if row["level"] <= 2]  # solutions of <= 12 tokens
    row_R = np.array([short[s[0] % len(short)] for s in slots])
    completion_RT = np.full((8, 14), tasks.PAD_ID, np.int32)
    completion_RT[:, :12] = gold.solution_tokens[row_R][:, :12]
    for slot, (_, position, token, edit, _) in enumerate(slots):
        if edit:
            completion_RT[slot, position] = token
    length_R = np.array([s[4] for s in slots], np.int32)
    correct_R = np.asarray(
        correct_fn(completion_RT, gold.solution_tokens[row_R][:, :12], completion_lengths=length_R)
    )
    np.testing.assert_array_equal(correct_R, reference(rows, row_R, completion_RT, length_R))


def test_reference_grader_on_strings():
    assert tasks.grade_text("1+2=3<eos>", "1+2=3")
    assert tasks.grade_text("1+2=3<eos>4*4=6<pad>", "1+2=3")
    assert not tasks.grade_text("1+2=3", "1+2=3")  # no <eos>
    assert not tasks.grade_text("1+2=3;<eos>", "1+2=3")
    assert not tasks.grade_text("1+2=<pad>3<eos>", "1+2=3")
    assert not tasks.grade_text("1+2=4<eos>", "1+2=3")


def test_errors_name_the_parameter(gold):
    with pytest.raises(ValueError, match="reward_values"):
        tasks.solution_reward(gold.solution_tokens, gold.solution_tokens, reward_values=(1, 0))
    with pytest.raises(ValueError, match="reward_values"):
        tasks.solution_reward(gold.solution_tokens, gold.solution_tokens, reward_values=(0.0,))
    with pytest.raises(AssertionError):
        tasks.solution_correct(gold.solution_tokens[0], gold.solution_tokens[0])


# ------------------------------------------------------------------ blind guessing (SPEC 11)


def random_chains(rng, level, count):
    start = rng.integers(0, 10, size=count)
    ops = rng.integers(0, 3, size=(count, level))
    operands = rng.integers(0, 10, size=(count, level))
    return [
        tasks.make_problem(int(s), [tasks.OPERATIONS[o] for o in op], d.tolist())
        for s, op, d in zip(start, ops, operands, strict=True)
    ]


def apply(value, op, operand):
    return {"+": value + operand, "-": value - operand, "*": value * operand}[op] % 10


def guessed_solution(prompt, guess_step):
    """A format-perfect chain: restates each step from the previous guess; results are guessed."""
    start, chain = int(prompt[0]), prompt[1:-1]
    previous, steps = start, []
    for op, operand in zip(chain[0::2], map(int, chain[1::2]), strict=True):
        result = guess_step(op, operand)
        steps.append(f"{previous}{op}{operand}={result}")
        previous = result
    return ";".join(steps)


def marginal_mode(op, operand):
    """The most frequent result of `x op operand` over x in 0..9 (smallest on ties)."""
    results = [apply(x, op, operand) for x in range(10)]
    return max(range(10), key=lambda r: (results.count(r), -r))


def whole_chain_rate(problems, guesses):
    gold_tokens, _ = tasks.encode_solutions(
        [p["solution"] for p in problems], CONFIG.max_solution_length
    )
    guess_tokens, _ = tasks.encode_solutions(guesses, CONFIG.max_solution_length)
    return float(np.mean(np.asarray(correct_fn(guess_tokens, gold_tokens))))


def test_blind_guessing_stays_well_under_one_percent_at_the_hardest_level():
    num_guesses = 20_000
    rng = np.random.default_rng(0)
    easy = random_chains(rng, 1, num_guesses)
    hard = random_chains(rng, CONFIG.num_levels, num_guesses)

    def random_step(op, operand):
        return int(rng.integers(0, 10))

    # The estimator works: at level 1 a random result is right 1/10 of the time (4 sigma band),
    # and guessing each (op, operand)'s most frequent result beats it (x*0 is always 0).
    random_easy = whole_chain_rate(easy, [guessed_solution(p["prompt"], random_step) for p in easy])
    assert abs(random_easy - 0.1) < 4 * math.sqrt(0.1 * 0.9 / num_guesses)
    marginal_easy = whole_chain_rate(
        easy, [guessed_solution(p["prompt"], marginal_mode) for p in easy]
    )
    assert marginal_easy > 0.12

    # Hardest level, graded on the whole chain. An upper confidence bound (k + 3) / n keeps the
    # claim honest when no guess succeeds (the true rates are ~1e-8 and ~1e-6).
    for guess_step in (random_step, marginal_mode):
        rate = whole_chain_rate(hard, [guessed_solution(p["prompt"], guess_step) for p in hard])
        assert rate + 3 / num_guesses < 0.01, guess_step
    # A prompt-blind constant solution: the most common gold solution string.
    most_common = collections.Counter(p["solution"] for p in hard).most_common(1)[0][1]
    assert most_common / num_guesses < 0.01

    # Why the whole chain is graded: the most common final digit alone is right >= 10 % of the
    # time (pigeonhole over 10 digits; x*0 makes 0 more common still).
    answers = np.array([int(p["answer"]) for p in hard])
    assert np.bincount(answers, minlength=10).max() / num_guesses > 0.09
