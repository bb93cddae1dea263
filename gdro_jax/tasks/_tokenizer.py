"""The chain task's character-level tokenizer: 18 symbols, built with `tokenizers`.

Every character of a prompt or a worked solution is one token, so the vocabulary is the 15
symbols the task writes (the ten digits, `+ - *`, `=` and the step separator `;`) plus three
special tokens:

    id  0      1      2      3..12   13 14 15 16 17
        <pad>  <bos>  <eos>  0..9    +  -  *  =  ;

A prompt is encoded as `<bos>` followed by its characters; a solution as its characters followed
by `<eos>`; the supervised sequence is their concatenation. The tokenizer is a `tokenizers`
WordLevel model over single characters, wrapped as a `transformers.PreTrainedTokenizerFast` so a
run can save it next to its checkpoints (`save_tokenizer`) and anything that reads HuggingFace
folders can load it offline with `transformers.AutoTokenizer.from_pretrained(folder)`. Calling the
loaded tokenizer on a prompt (`tok(prompt).input_ids`) gives exactly `encode_prompts`' ids.

`transformers` is imported only by the functions that need it, so `import gdro_jax.tasks` stays
fast.
"""

from __future__ import annotations

import functools
import os
import pathlib
from collections.abc import Sequence

import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, processors

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"
# The characters a prompt or solution may contain, in id order after the three special tokens.
SYMBOLS = tuple("0123456789+-*=;")
VOCAB = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, *SYMBOLS)
VOCAB_SIZE = len(VOCAB)
PAD_ID = VOCAB.index(PAD_TOKEN)
BOS_ID = VOCAB.index(BOS_TOKEN)
EOS_ID = VOCAB.index(EOS_TOKEN)
_SYMBOL_SET = frozenset(SYMBOLS)
# Byte value -> token id of the single-character symbols (-1 elsewhere).
_ID_OF_BYTE = np.full((256,), -1, np.int32)
_ID_OF_BYTE[[ord(symbol) for symbol in SYMBOLS]] = [VOCAB.index(symbol) for symbol in SYMBOLS]


@functools.lru_cache(maxsize=1)
def build_tokenizer() -> tokenizers.Tokenizer:
    """Builds the character-level `tokenizers.Tokenizer` of the chain task.

    The pre-tokenizer isolates every character, the WordLevel model maps it to its id in `VOCAB`,
    the post-processor prepends `<bos>` when special tokens are added (so a prompt encodes as
    `encode_prompts` does), and the `Fuse` decoder joins tokens without spaces. The special tokens
    are registered as such, so `decode(..., skip_special_tokens=True)` drops them and text that
    spells `<eos>` encodes back to `EOS_ID`.

    Returns:
      The tokenizer (cached: one shared instance; do not mutate it).
    """
    vocab = {token: index for index, token in enumerate(VOCAB)}
    tokenizer = tokenizers.Tokenizer(models.WordLevel(vocab=vocab))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(tokenizers.Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A", special_tokens=[(BOS_TOKEN, BOS_ID)]
    )
    tokenizer.add_special_tokens([PAD_TOKEN, BOS_TOKEN, EOS_TOKEN])
    return tokenizer


def hf_tokenizer():
    """Wraps `build_tokenizer()` as a `transformers.PreTrainedTokenizerFast`.

    Returns:
      A fresh `PreTrainedTokenizerFast` with `bos_token`, `eos_token` and `pad_token` set (right
      padding), whose ids equal this module's.
    """
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(),
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        padding_side="right",
    )


def save_tokenizer(directory: str | os.PathLike) -> pathlib.Path:
    """Saves the tokenizer as a `transformers` tokenizer folder (`save_pretrained`).

    Args:
      directory: the folder to write (created if missing), e.g. a run's work directory.

    Returns:
      The folder's path; `transformers.AutoTokenizer.from_pretrained(path)` loads it offline.
    """
    path = pathlib.Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    hf_tokenizer().save_pretrained(str(path))
    return path


def _check_symbols(texts: Sequence[str], name: str) -> None:
    for index, text in enumerate(texts):
        if not isinstance(text, str) or not set(text) <= _SYMBOL_SET:
            raise ValueError(
                f"{name}[{index}]={text!r} must be a string over the task's symbols {SYMBOLS}"
            )


def _encode(
    texts: Sequence[str], length: int, *, name: str, bos: bool, eos: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Encodes texts into right-padded int32 rows of `length` ids, with optional BOS/EOS.

    Every symbol is one ASCII character, so this maps bytes through `_ID_OF_BYTE` in numpy (the
    `tokenizers` pipeline gives the same ids, as the tests check, but costs ~20 us a string).
    """
    texts = list(texts)
    _check_symbols(texts, name)
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"length must be a positive int, got length={length!r}")
    num_texts = len(texts)
    text_lengths_N = np.asarray([len(text) for text in texts], np.int64).reshape(num_texts)
    lengths_N = text_lengths_N + int(bos) + int(eos)
    if num_texts and lengths_N.max() > length:
        row = int(np.argmax(lengths_N))
        raise ValueError(
            f"{name}[{row}]={texts[row]!r} needs {lengths_N[row]} tokens, more than length={length}"
        )
    tokens_NL = np.full((num_texts, length), PAD_ID, np.int32)
    if num_texts:
        raw_N = np.asarray(texts, dtype=np.bytes_)
        bytes_NW = raw_N.view(np.uint8).reshape(num_texts, raw_N.dtype.itemsize)
        width = bytes_NW.shape[1]
        inside_NW = np.arange(width)[None, :] < text_lengths_N[:, None]
        ids_NW = np.where(inside_NW, _ID_OF_BYTE[bytes_NW], PAD_ID)
        tokens_NL[:, int(bos) : int(bos) + width] = ids_NW
        if bos:
            tokens_NL[:, 0] = BOS_ID
        if eos:
            tokens_NL[np.arange(num_texts), text_lengths_N + int(bos)] = EOS_ID
    return tokens_NL, lengths_N.astype(np.int32)


def encode_prompts(prompts: Sequence[str], length: int) -> tuple[np.ndarray, np.ndarray]:
    """Encodes prompts as `<bos>` + characters, right-padded with `PAD_ID`.

    Args:
      prompts: N prompt strings over `SYMBOLS`.
      length: P, the padded length (the task config's `max_prompt_length`).

    Returns:
      `(tokens, lengths)`: int32[N, P] ids and int32[N] numbers of real tokens (BOS included).

    Raises:
      ValueError: a prompt holds a character outside `SYMBOLS`, or needs more than `length` ids.
    """
    return _encode(prompts, length, name="prompts", bos=True, eos=False)


def encode_solutions(solutions: Sequence[str], length: int) -> tuple[np.ndarray, np.ndarray]:
    """Encodes solutions as characters + `<eos>`, right-padded with `PAD_ID`.

    Args:
      solutions: N solution strings over `SYMBOLS`.
      length: S, the padded length (the task config's `max_solution_length`).

    Returns:
      `(tokens, lengths)`: int32[N, S] ids and int32[N] numbers of real tokens (EOS included).

    Raises:
      ValueError: a solution holds a character outside `SYMBOLS`, or needs more than `length` ids.
    """
    return _encode(solutions, length, name="solutions", bos=False, eos=True)


def decode(ids: Sequence[int] | np.ndarray, *, skip_special_tokens: bool = True) -> str:
    """Decodes token ids to text.

    Args:
      ids: a 1-D sequence of ids in `[0, VOCAB_SIZE)`.
      skip_special_tokens: drop `<pad>`, `<bos>` and `<eos>` (True), or write them out as text
        (False; the reference grader reads completions this way, so that a stray `<pad>` or a
        missing `<eos>` is visible).

    Returns:
      The decoded string.
    """
    ids = [int(i) for i in np.asarray(ids).reshape(-1)]
    bad = [i for i in ids if not 0 <= i < VOCAB_SIZE]
    if bad:
        raise ValueError(f"ids must lie in [0, {VOCAB_SIZE}), got {bad[:5]}")
    return build_tokenizer().decode(ids, skip_special_tokens=skip_special_tokens)
