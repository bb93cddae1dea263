"""Tests of prompt formatting (suffix, chat template) and the grain pipeline (prompt indices,
per-epoch shuffles, batching, and exact resumption from an iterator state)."""

import itertools

import pytest

from gdro_jax import data, tasks

ROWS = [{"id": f"r{i}", "prompt": f"problem {i}", "answer": str(i)} for i in range(10)]
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def chat_tokenizer():
    tokenizer = tasks.hf_tokenizer()
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def test_format_prompt_appends_the_authors_suffix():
    assert data.PROMPT_SUFFIX == (
        "Let's think step by step and output the final answer within \\boxed{}."
    )
    assert data.format_prompt("What is 2+2?") == "What is 2+2? " + data.PROMPT_SUFFIX
    assert data.format_prompt("What is 2+2?", suffix=None) == "What is 2+2?"
    with pytest.raises(ValueError, match="system"):
        data.format_prompt("x", system="be brief")


def test_chat_template_wraps_the_prompt(chat_tokenizer):
    text = "What is 2+2? " + data.PROMPT_SUFFIX
    assert data.format_prompt("What is 2+2?", tokenizer=chat_tokenizer) == (
        f"<|user|>{text}\n<|assistant|>"
    )
    assert data.format_prompt("What is 2+2?", tokenizer=chat_tokenizer, system="be brief") == (
        f"<|system|>be brief\n<|user|>{text}\n<|assistant|>"
    )


def test_with_prompts_keeps_the_problem_and_does_not_mutate(chat_tokenizer):
    rows = data.with_prompts(ROWS[:2], tokenizer=chat_tokenizer)
    assert [row["problem"] for row in rows] == ["problem 0", "problem 1"]
    assert rows[0]["prompt"] == f"<|user|>problem 0 {data.PROMPT_SUFFIX}\n<|assistant|>"
    assert ROWS[0] == {"id": "r0", "prompt": "problem 0", "answer": "0"}


def test_pipeline_epochs_are_permutations_with_indices():
    stream = list(itertools.islice(data.make_pipeline(ROWS, seed=3), 3 * len(ROWS)))
    epochs = [stream[i * len(ROWS) : (i + 1) * len(ROWS)] for i in range(3)]
    for epoch in epochs:
        assert sorted(row["index"] for row in epoch) == list(range(len(ROWS)))
        for row in epoch:
            assert row["id"] == ROWS[row["index"]]["id"]
    orders = [tuple(row["index"] for row in epoch) for epoch in epochs]
    assert len(set(orders)) == 3  # a fresh order each epoch
    assert orders[0] != tuple(range(len(ROWS)))


def test_pipeline_is_deterministic_in_the_seed():
    def first(seed):
        return [row["index"] for row in itertools.islice(data.make_pipeline(ROWS, seed=seed), 30)]

    assert first(1) == first(1)
    assert first(1) != first(2)


def test_pipeline_unshuffled_single_epoch_in_batches():
    pipeline = data.make_pipeline(ROWS, shuffle=False, num_epochs=1, batch_size=4)
    batches = list(pipeline)
    assert [[row["index"] for row in batch] for batch in batches] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9],
    ]
    dropped = data.make_pipeline(
        ROWS, shuffle=False, num_epochs=1, batch_size=4, drop_remainder=True
    )
    assert [len(batch) for batch in dropped] == [4, 4]


def test_pipeline_resumes_exactly_from_a_state():
    iterator = iter(data.make_pipeline(ROWS, seed=5, batch_size=3))
    for _ in range(4):
        next(iterator)
    state = iterator.get_state()
    expected = [[row["index"] for row in next(iterator)] for _ in range(6)]
    resumed = iter(data.make_pipeline(ROWS, seed=5, batch_size=3))
    resumed.set_state(state)
    assert [[row["index"] for row in next(resumed)] for _ in range(6)] == expected


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(rows=[]), "rows must not be empty"),
        (dict(rows=ROWS, num_epochs=0), "num_epochs=0"),
        (dict(rows=ROWS, batch_size=0), "batch_size=0"),
        (dict(rows=ROWS, seed=None), "seed=None"),
    ],
)
def test_pipeline_argument_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        data.make_pipeline(**kwargs)
