"""Tests of the chain task's tokenizer and array forms: round trips, the saved transformers folder
reloaded with AutoTokenizer, static shapes, and the supervised sequences with their loss mask."""

import numpy as np
import pytest

from gdro_jax import tasks

CONFIG = tasks.ChainTaskConfig(
    num_levels=8, tail_base=1.5, pool_size=256, validation_per_level=8, test_per_level=16, seed=1
)


@pytest.fixture(scope="module")
def rows():
    splits = tasks.build_splits(CONFIG)
    return splits.train + splits.test


@pytest.fixture(scope="module")
def reloaded(tmp_path_factory):
    """The tokenizer saved to a folder and loaded back through AutoTokenizer, offline."""
    from transformers import AutoTokenizer

    folder = tasks.save_tokenizer(tmp_path_factory.mktemp("run") / "tokenizer")
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def test_vocabulary():
    assert tasks.VOCAB_SIZE == 18 == len(set(tasks.VOCAB))
    assert tasks.VOCAB[:3] == (tasks.PAD_TOKEN, tasks.BOS_TOKEN, tasks.EOS_TOKEN)
    assert (tasks.PAD_ID, tasks.BOS_ID, tasks.EOS_ID) == (0, 1, 2)
    assert tasks.build_tokenizer().get_vocab_size() == tasks.VOCAB_SIZE
    for symbol in tasks.SYMBOLS:
        assert len(symbol) == 1


def test_encode_decode_round_trip(rows):
    prompts = [row["prompt"] for row in rows]
    solutions = [row["solution"] for row in rows]
    prompt_tokens, prompt_lengths = tasks.encode_prompts(prompts, CONFIG.max_prompt_length)
    solution_tokens, solution_lengths = tasks.encode_solutions(
        solutions, CONFIG.max_solution_length
    )
    for i, (prompt, solution) in enumerate(zip(prompts, solutions, strict=True)):
        assert prompt_lengths[i] == len(prompt) + 1
        assert solution_lengths[i] == len(solution) + 1
        assert prompt_tokens[i, 0] == tasks.BOS_ID
        assert solution_tokens[i, solution_lengths[i] - 1] == tasks.EOS_ID
        assert np.all(prompt_tokens[i, prompt_lengths[i] :] == tasks.PAD_ID)
        assert np.all(solution_tokens[i, solution_lengths[i] :] == tasks.PAD_ID)
        assert tasks.decode(prompt_tokens[i]) == prompt
        assert tasks.decode(solution_tokens[i]) == solution
        written = tasks.decode(solution_tokens[i, : solution_lengths[i]], skip_special_tokens=False)
        assert written == solution + tasks.EOS_TOKEN


def test_numpy_encoding_equals_the_tokenizers_pipeline(rows):
    tokenizer = tasks.build_tokenizer()
    arrays = tasks.encode_rows(rows, CONFIG)
    for i, row in enumerate(rows):
        prompt_ids = tokenizer.encode(row["prompt"]).ids  # the post-processor adds <bos>
        assert arrays.prompt_tokens[i, : arrays.prompt_lengths[i]].tolist() == prompt_ids
        solution_ids = tokenizer.encode(row["solution"], add_special_tokens=False).ids
        expected = solution_ids + [tasks.EOS_ID]
        assert arrays.solution_tokens[i, : arrays.solution_lengths[i]].tolist() == expected


def test_saved_folder_reloads_with_autotokenizer(rows, reloaded):
    assert len(reloaded) == tasks.VOCAB_SIZE
    assert reloaded.pad_token_id == tasks.PAD_ID
    assert reloaded.bos_token_id == tasks.BOS_ID
    assert reloaded.eos_token_id == tasks.EOS_ID
    sample = rows[:64]
    arrays = tasks.encode_rows(sample, CONFIG)
    batch = reloaded([row["prompt"] for row in sample]).input_ids
    for i, ids in enumerate(batch):
        assert ids == arrays.prompt_tokens[i, : arrays.prompt_lengths[i]].tolist()
        solution = arrays.solution_tokens[i, : arrays.solution_lengths[i]].tolist()
        assert reloaded.decode(solution, skip_special_tokens=True) == sample[i]["solution"]
        assert reloaded.decode(solution, skip_special_tokens=False) == (
            sample[i]["solution"] + tasks.EOS_TOKEN
        )


def test_the_longest_problem_fills_the_static_lengths():
    longest = tasks.make_problem(9, ["*"] * 8, [9] * 8)
    prompt_tokens, prompt_lengths = tasks.encode_prompts(
        [longest["prompt"]], CONFIG.max_prompt_length
    )
    _, solution_lengths = tasks.encode_solutions([longest["solution"]], CONFIG.max_solution_length)
    assert prompt_lengths[0] == CONFIG.max_prompt_length == prompt_tokens.shape[1]
    assert solution_lengths[0] == CONFIG.max_solution_length


def test_array_shapes_depend_only_on_the_config(rows):
    easy = [row for row in rows if row["level"] == 1][:5]
    hard = [row for row in rows if row["level"] == 8][:5]
    for chosen in (easy, hard):
        arrays = tasks.encode_rows(chosen, CONFIG)
        assert arrays.prompt_tokens.shape == (5, CONFIG.max_prompt_length)
        assert arrays.solution_tokens.shape == (5, CONFIG.max_solution_length)
        assert arrays.prompt_tokens.dtype == arrays.solution_tokens.dtype == np.int32
        assert arrays.levels.tolist() == [row["level"] for row in chosen]
        supervised = tasks.supervised_arrays(chosen, CONFIG)
        assert supervised.tokens.shape == (5, CONFIG.sequence_length)
        assert supervised.loss_mask.shape == (5, CONFIG.sequence_length)
        assert supervised.loss_mask.dtype == np.float32


def test_supervised_sequences_and_loss_mask(rows):
    supervised = tasks.supervised_arrays(rows, CONFIG)
    vocab = {symbol: index for index, symbol in enumerate(tasks.VOCAB)}
    for i, row in enumerate(rows):
        prompt = [tasks.BOS_ID] + [vocab[c] for c in row["prompt"]]
        solution = [vocab[c] for c in row["solution"]] + [tasks.EOS_ID]
        length = len(prompt) + len(solution)
        assert supervised.lengths[i] == length
        assert supervised.tokens[i, :length].tolist() == prompt + solution
        assert np.all(supervised.tokens[i, length:] == tasks.PAD_ID)
        expected_mask = np.zeros(CONFIG.sequence_length, np.float32)
        expected_mask[len(prompt) : length] = 1.0
        np.testing.assert_array_equal(supervised.loss_mask[i], expected_mask)


def test_encoding_errors_name_the_input():
    with pytest.raises(ValueError, match=r"prompts\[1\]"):
        tasks.encode_prompts(["1+2=", "1/2="], 10)
    with pytest.raises(ValueError, match=r"solutions\[0\].*length=5"):
        tasks.encode_solutions(["1+2=3"], 5)
    with pytest.raises(ValueError, match="length"):
        tasks.encode_prompts(["1+2="], 0)
    with pytest.raises(ValueError, match="ids"):
        tasks.decode([1, 2, 40])
    with pytest.raises(ValueError, match="'solution'"):
        tasks.encode_rows([{"prompt": "1+2="}], CONFIG)
