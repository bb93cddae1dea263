"""A small byte-level BPE tokenizer with Qwen's special tokens and chat template, for tests.

`build_tokenizer(texts)` trains a byte-level BPE (the `tokenizers` library, GPT-2/Qwen style
pre-tokenization) on a few hundred texts in well under a second and wraps it as a
`transformers.PreTrainedTokenizerFast`. It has Qwen3's three special tokens, `<|endoftext|>` (the
pad token), `<|im_start|>` and `<|im_end|>` (the end-of-turn, eos token), and a ChatML chat
template, so `apply_chat_template([{"role": "user", "content": q}], tokenize=False,
add_generation_prompt=True)` renders `<|im_start|>user\\n{q}<|im_end|>\\n<|im_start|>assistant\\n`
as Qwen3's template does (without Qwen3's tool-calling and thinking branches).

Byte-level: every string encodes (unseen characters fall back to their UTF-8 bytes) and decodes
back exactly. With it, tests build a tiny random Qwen3 (`DecoderConfig.tiny(vocab_size=len(tok))`)
and a tokenizer that `transformers.AutoTokenizer` loads from a folder, with no hub access.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

PAD_TOKEN = "<|endoftext|>"
IM_START_TOKEN = "<|im_start|>"
IM_END_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START_TOKEN, IM_END_TOKEN)

# ChatML as in Qwen3's template, reduced to plain messages (no tools, no <think> handling).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_NUM_BYTES = 256


def build_tokenizer(
    texts: Iterable[str],
    *,
    vocab_size: int = 512,
    path: str | os.PathLike | None = None,
):
    """Trains a byte-level BPE on `texts` and wraps it as a transformers fast tokenizer.

    Args:
      texts: training texts (a few hundred are enough; the 256 byte symbols are always in the
        vocabulary, so any text encodes).
      vocab_size: the vocabulary size to train to, special tokens included (>= 259: the 256 bytes
        and the 3 special tokens). The trained size may be smaller when the texts offer fewer
        merges; `len(tokenizer)` is the size to give the model.
      path: when given, the tokenizer is written there with `save_pretrained`, loadable with
        `transformers.AutoTokenizer.from_pretrained(path)`.

    Returns:
      A `transformers.PreTrainedTokenizerFast` with `pad_token="<|endoftext|>"`,
      `eos_token="<|im_end|>"` and a ChatML chat template. The special tokens have ids 0, 1, 2.

    Raises:
      ValueError: naming `vocab_size` when it is below 259, or `texts` when it is empty.
    """
    from transformers import PreTrainedTokenizerFast

    minimum = _NUM_BYTES + len(SPECIAL_TOKENS)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < minimum:
        raise ValueError(f"vocab_size must be an int >= {minimum}, got vocab_size={vocab_size!r}")
    texts = list(texts)
    if not texts:
        raise ValueError("texts must hold at least one string, got texts=[]")
    tokenizer = Tokenizer(models.BPE())
    # GPT-2/Qwen pre-tokenization: split on the GPT-2 regex, map bytes to printable symbols.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD_TOKEN,
        eos_token=IM_END_TOKEN,
        additional_special_tokens=[IM_START_TOKEN],
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
    )
    if path is not None:
        wrapped.save_pretrained(os.fspath(path))
    return wrapped
