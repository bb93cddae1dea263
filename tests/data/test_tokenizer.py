"""Tests of `data.build_tokenizer`: a byte-level BPE with Qwen special tokens and chat template."""

import pytest
import transformers

from gdro_jax import data

# Training texts that do not depend on the shared data directory.
_TEXTS = [
    f"Let $x = {i}$. Compute $\\frac{{{i}}}{{{i + 1}}} + x^2$ and give the answer in \\boxed{{}}."
    for i in range(200)
] + ["What is the sum of the roots of $x^2 - 5x + 6 = 0$?"] * 20


@pytest.fixture(scope="module")
def tokenizer():
    return data.build_tokenizer(_TEXTS, vocab_size=400)


@pytest.mark.parametrize(
    "text",
    [
        "So the answer is $\\boxed{\\frac{1}{2}}$.",
        "\\boxed{\\sqrt{3}\\pi}  with  two spaces\nand a newline\t tab",
        "Unseen characters: é, ∑, 你好, 🙂 and {nested {braces}}",
        "",
    ],
)
def test_encode_decode_round_trip(tokenizer, text):
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text


def test_special_tokens_and_vocabulary(tokenizer):
    assert len(tokenizer) == 400
    assert tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.eos_token == "<|im_end|>"
    ids = [tokenizer.convert_tokens_to_ids(t) for t in data.TOKENIZER_SPECIAL_TOKENS]
    assert ids == [0, 1, 2]
    assert tokenizer.pad_token_id == 0 and tokenizer.eos_token_id == 2
    # Special tokens in text are single tokens, and skip_special_tokens removes them.
    encoded = tokenizer("<|im_start|>user\nhi<|im_end|>")["input_ids"]
    assert encoded[0] == 1 and encoded[-1] == 2
    assert tokenizer.decode(encoded, skip_special_tokens=True) == "user\nhi"
    # Training merged frequent strings: the math text takes fewer tokens than bytes.
    text = _TEXTS[7]
    assert len(tokenizer(text)["input_ids"]) < len(text.encode()) / 2


def test_chat_template(tokenizer):
    messages = [{"role": "user", "content": "What is $1+1$?"}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nWhat is $1+1$?<|im_end|>\n<|im_start|>assistant\n"
    with_system = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, *messages], tokenize=False
    )
    assert with_system == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is $1+1$?<|im_end|>\n"
    )
    # The data module's prompt formatting uses the same template.
    prompt = data.format_prompt("What is $1+1$?", suffix=None, tokenizer=tokenizer)
    assert prompt == rendered


def test_save_and_load(tokenizer, tmp_path):
    built = data.build_tokenizer(_TEXTS, vocab_size=400, path=tmp_path)
    loaded = transformers.AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    text = "Hence $\\boxed{42}$ é"
    assert loaded(text)["input_ids"] == built(text)["input_ids"]
    assert loaded.decode(loaded(text)["input_ids"]) == text
    assert (loaded.pad_token, loaded.eos_token) == (built.pad_token, built.eos_token)
    messages = [{"role": "user", "content": "x"}]
    assert loaded.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    ) == built.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    # Training is deterministic: the module's tokenizer and the saved one agree.
    assert built(text)["input_ids"] == tokenizer(text)["input_ids"]


def test_bad_arguments():
    with pytest.raises(ValueError, match="vocab_size"):
        data.build_tokenizer(_TEXTS, vocab_size=100)
    with pytest.raises(ValueError, match="texts"):
        data.build_tokenizer([], vocab_size=512)
