"""Datasets (SPEC 9): readers, prompt formatting, named presets and the grain pipeline.

Typical use:

    rows = data.load_preset("dapo_math_en")            # 14,048 rows, prompts with the suffix
    bench = data.load_preset("math500", tokenizer=tok)  # chat-templated prompts
    rows = data.read_rows("train.parquet", fields=data.FieldNames(prompt="prompt",
                                                                  answer="solution", id=None))
    it = iter(data.make_pipeline(rows, seed=0, batch_size=64))
    batch = next(it)                                    # 64 rows, each with its "index"
    state = it.get_state()                              # ... later: it.set_state(state)

A row is `{"id", "prompt", "answer", ...extra}`; its position is its prompt index. The data
directory is `data_dir`, else `$GDRO_DATA_DIR`, else `../shared/data` (see `default_data_dir`).
"""

from gdro_jax.data._encode import encode_prompts, stop_token_ids
from gdro_jax.data._paths import (
    DATA_DIR_ENV,
    data_dir_candidates,
    default_data_dir,
    resolve_data_dir,
)
from gdro_jax.data._pipeline import make_pipeline
from gdro_jax.data._presets import BENCHMARKS, PRESETS, DatasetPreset, HubSource, load_preset
from gdro_jax.data._prompts import PROMPT_SUFFIX, format_prompt, with_prompts
from gdro_jax.data._readers import (
    DataFormatError,
    FieldNames,
    load_hub,
    read_jsonl,
    read_parquet,
    read_rows,
    rows_from_records,
)
from gdro_jax.data._tokenizer import SPECIAL_TOKENS as TOKENIZER_SPECIAL_TOKENS
from gdro_jax.data._tokenizer import build_tokenizer

__all__ = [
    "BENCHMARKS",
    "DATA_DIR_ENV",
    "PRESETS",
    "PROMPT_SUFFIX",
    "TOKENIZER_SPECIAL_TOKENS",
    "DataFormatError",
    "DatasetPreset",
    "FieldNames",
    "HubSource",
    "build_tokenizer",
    "data_dir_candidates",
    "default_data_dir",
    "encode_prompts",
    "format_prompt",
    "load_hub",
    "load_preset",
    "make_pipeline",
    "read_jsonl",
    "read_parquet",
    "read_rows",
    "resolve_data_dir",
    "rows_from_records",
    "stop_token_ids",
    "with_prompts",
]
