"""Named datasets: the DAPO-Math training set and the six evaluation benchmarks of SPEC 9.

Each preset names its JSONL file in the data directory (see `_paths.py` and
`shared/data/SOURCES.md` for where each file comes from), its field names, and the row count the
file must have, so a truncated or substituted file fails loudly. `dapo_math_en` can also come
from the hub (`open-r1/DAPO-Math-17k-Processed`, config `en`, columns `prompt`/`solution`)
through the optional `datasets` package; the local file is the deduplicated English part of the
SvS copy of DAPO-Math-17k (14,048 rows; the hub config has about 14.1k).

| preset        | file                          | rows   | id field  |
|---------------|-------------------------------|--------|-----------|
| dapo_math_en  | dapo_math_17k_en_dedup.jsonl  | 14,048 | id        |
| math500       | math500.jsonl                 | 500    | unique_id |
| aime24        | aime24.jsonl                  | 30     | id        |
| aime25        | aime25.jsonl                  | 30     | id        |
| amc23         | amc23.jsonl                   | 40     | id        |
| minerva_math  | minerva_math.jsonl            | 272    | idx       |
| olympiadbench | olympiadbench.jsonl           | 675    | id        |
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from gdro_jax.data._paths import resolve_data_dir
from gdro_jax.data._prompts import PROMPT_SUFFIX, with_prompts
from gdro_jax.data._readers import DataFormatError, FieldNames, load_hub, read_rows


@dataclasses.dataclass(frozen=True)
class HubSource:
    """Where a preset lives on the Hugging Face hub, for loading through `datasets`."""

    name: str
    config: str | None
    split: str
    fields: FieldNames


@dataclasses.dataclass(frozen=True)
class DatasetPreset:
    """A named dataset: its file in the data directory, field names and expected row count."""

    name: str
    filename: str
    fields: FieldNames
    num_rows: int | None = None  # None: any count
    hub: HubSource | None = None

    def __post_init__(self):
        if self.num_rows is not None and self.num_rows < 1:
            raise ValueError(f"num_rows must be >= 1 or None, got num_rows={self.num_rows}")


_PROBLEM_ANSWER = dict(prompt="problem", answer="answer")

PRESETS: dict[str, DatasetPreset] = {
    preset.name: preset
    for preset in (
        DatasetPreset(
            "dapo_math_en",
            "dapo_math_17k_en_dedup.jsonl",
            FieldNames(**_PROBLEM_ANSWER, id="id"),
            num_rows=14_048,
            hub=HubSource(
                "open-r1/DAPO-Math-17k-Processed",
                "en",
                "train",
                FieldNames(prompt="prompt", answer="solution", id=None),
            ),
        ),
        DatasetPreset(
            "math500", "math500.jsonl", FieldNames(**_PROBLEM_ANSWER, id="unique_id"), 500
        ),
        DatasetPreset("aime24", "aime24.jsonl", FieldNames(**_PROBLEM_ANSWER, id="id"), 30),
        DatasetPreset("aime25", "aime25.jsonl", FieldNames(**_PROBLEM_ANSWER, id="id"), 30),
        DatasetPreset("amc23", "amc23.jsonl", FieldNames(**_PROBLEM_ANSWER, id="id"), 40),
        DatasetPreset(
            "minerva_math", "minerva_math.jsonl", FieldNames(**_PROBLEM_ANSWER, id="idx"), 272
        ),
        DatasetPreset(
            "olympiadbench", "olympiadbench.jsonl", FieldNames(**_PROBLEM_ANSWER, id="id"), 675
        ),
    )
}

BENCHMARKS = ("math500", "aime24", "aime25", "amc23", "minerva_math", "olympiadbench")


def load_preset(
    name: str,
    data_dir: str | os.PathLike | None = None,
    *,
    source: str = "file",
    suffix: str | None = PROMPT_SUFFIX,
    tokenizer: Any = None,
    system: str | None = None,
) -> list[dict]:
    """Loads a named dataset with its prompts formatted.

    Args:
      name: one of `PRESETS` (`dapo_math_en`, `math500`, `aime24`, `aime25`, `amc23`,
        `minerva_math`, `olympiadbench`).
      data_dir: the directory holding the files; None resolves it as `resolve_data_dir` does
        (`$GDRO_DATA_DIR`, else `../shared/data` from the working directory or the repo root).
      source: `"file"` reads the preset's file; `"hub"` loads it through `datasets` (only
        presets with a hub source; needs the package and a network).
      suffix: the instruction appended to each problem (default: the authors' suffix).
      tokenizer: optional transformers tokenizer whose chat template wraps each prompt.
      system: optional system message for the chat template.

    Returns:
      Rows `{"id", "prompt", "answer", "problem", **extra}`: `prompt` is the formatted prompt,
      `problem` the raw problem text; a row's position is its prompt index.

    Raises:
      ValueError: for an unknown `name` or `source`, or a preset without a hub source.
      FileNotFoundError: when the data directory or file does not exist.
      DataFormatError: for a malformed file or a row count other than the preset's.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown dataset name={name!r}; known: {sorted(PRESETS)}")
    preset = PRESETS[name]
    if source == "file":
        path = resolve_data_dir(data_dir) / preset.filename
        rows = read_rows(path, fields=preset.fields)
        origin = str(path)
    elif source == "hub":
        if preset.hub is None:
            raise ValueError(f"dataset name={name!r} has no hub source; use source='file'")
        hub = preset.hub
        rows = load_hub(hub.name, config=hub.config, split=hub.split, fields=hub.fields)
        origin = f"hub:{hub.name}"
    else:
        raise ValueError(f"source must be 'file' or 'hub', got source={source!r}")
    if source == "file" and preset.num_rows is not None and len(rows) != preset.num_rows:
        raise DataFormatError(
            origin, None, f"expected {preset.num_rows} rows for {name!r}, found {len(rows)}"
        )
    return with_prompts(rows, suffix=suffix, tokenizer=tokenizer, system=system)
