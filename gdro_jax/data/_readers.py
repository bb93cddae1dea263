"""Readers from JSONL, parquet and the Hugging Face hub into validated dataset rows (SPEC 9).

Every reader returns a list of rows `{"id": str, "prompt": str, "answer": str, **extra}`:
`prompt` is the problem text as stored (templates are applied later, see `_prompts.py`), `id` is
the source's id field as a string (or the row's position when no id field is named), and every
other top-level field of the source row is kept as an extra. A row's position in the list is its
prompt index.

Source field names are configurable with `FieldNames`; a name may be a dotted path into nested
values, e.g. `FieldNames(prompt="prompt.0.content", answer="reward_model.ground_truth")` for the
verl-style parquet files, where the prompt is a list of chat messages.

Validation is strict and every error names the file and the line (JSONL, counted from 1) or row
(parquet and hub, counted from 0): undecodable UTF-8, bad JSON, a line that is not an object, a
missing field, an empty prompt or answer, an id that is not a string or integer, a duplicate id
(naming both lines), and a file without rows. Blank lines in JSONL are skipped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple


class FieldNames(NamedTuple):
    """Which source fields hold a row's prompt, answer and id.

    Each name is a top-level key or a dotted path (`"reward_model.ground_truth"`,
    `"prompt.0.content"`; integer parts index lists).
    """

    prompt: str = "problem"  # problem text
    answer: str = "answer"  # gold final answer (string, or integer converted to a string)
    id: str | None = "id"  # stable id (string or integer); None: the row's position


DEFAULT_FIELDS = FieldNames()


class DataFormatError(ValueError):
    """A malformed dataset file; the message starts with `<source>:<line or row>:`."""

    def __init__(self, source: str, location: str | None, message: str):
        prefix = f"{source}:{location}" if location is not None else source
        super().__init__(f"{prefix}: {message}")
        self.source = source
        self.location = location


_MISSING = object()


def _lookup(record: dict, path: str) -> Any:
    """The value at dotted `path` in `record`, or `_MISSING`."""
    value: Any = record
    for part in path.split("."):
        if isinstance(value, dict):
            value = value.get(part, _MISSING)
        elif isinstance(value, (list, tuple)) and part.lstrip("-").isdigit():
            index = int(part)
            value = value[index] if -len(value) <= index < len(value) else _MISSING
        else:
            return _MISSING
        if value is _MISSING:
            return _MISSING
    return value


def _text_field(record: dict, path: str, what: str, source: str, location: str) -> str:
    value = _lookup(record, path)
    if value is _MISSING:
        raise DataFormatError(source, location, f"missing {what} field {path!r}")
    if isinstance(value, int) and not isinstance(value, bool) and what == "answer":
        value = str(value)
    if not isinstance(value, str):
        raise DataFormatError(
            source, location, f"{what} field {path!r} must be a string, got {type(value).__name__}"
        )
    if not value.strip():
        raise DataFormatError(source, location, f"empty {what} (field {path!r})")
    return value


def _id_field(record: dict, path: str, source: str, location: str) -> str:
    value = _lookup(record, path)
    if value is _MISSING:
        raise DataFormatError(source, location, f"missing id field {path!r}")
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise DataFormatError(
            source, location, f"id field {path!r} must be a string or integer, got {value!r}"
        )
    value = str(value)
    if not value.strip():
        raise DataFormatError(source, location, f"empty id (field {path!r})")
    return value


def rows_from_records(
    records: Iterable[tuple[str, Any]], *, source: str, fields: FieldNames = DEFAULT_FIELDS
) -> list[dict]:
    """Validates source records and maps them to dataset rows.

    Args:
      records: `(location, record)` pairs, e.g. `("12", {...})` for line 12; `location` is what
        errors print after the source name.
      source: the file path or hub name that errors start with.
      fields: which record fields hold the prompt, answer and id.

    Returns:
      Rows `{"id", "prompt", "answer", **extra}` in record order; `extra` holds every other
      top-level field of the record.

    Raises:
      DataFormatError: naming `source` and the location of the first malformed record, of a
        duplicate id (with the location of its first use), or the source alone when it is empty.
    """
    mapped = {fields.prompt.split(".")[0], fields.answer.split(".")[0]}
    if fields.id is not None:
        mapped.add(fields.id.split(".")[0])
    rows: list[dict] = []
    first_location: dict[str, str] = {}
    for location, record in records:
        if not isinstance(record, dict):
            raise DataFormatError(
                source, location, f"expected a JSON object, got {type(record).__name__}"
            )
        if fields.id is None:
            row_id = str(len(rows))
        else:
            row_id = _id_field(record, fields.id, source, location)
        if row_id in first_location:
            raise DataFormatError(
                source,
                location,
                f"duplicate id {row_id!r} (first used at {source}:{first_location[row_id]})",
            )
        first_location[row_id] = location
        row = {
            "id": row_id,
            "prompt": _text_field(record, fields.prompt, "prompt", source, location),
            "answer": _text_field(record, fields.answer, "answer", source, location),
        }
        for key, value in record.items():
            if key not in mapped and key not in row:
                row[key] = value
        rows.append(row)
    if not rows:
        raise DataFormatError(source, None, "the dataset has no rows")
    return rows


def _jsonl_records(path: Path) -> Iterator[tuple[str, Any]]:
    source = str(path)
    with open(path, "rb") as file:
        for line_number, raw in enumerate(file, start=1):
            location = f"line {line_number}"
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise DataFormatError(source, location, f"not valid UTF-8 ({error})") from error
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as error:
                raise DataFormatError(source, location, f"invalid JSON ({error})") from error
            yield location, record


def read_jsonl(path: str | os.PathLike, *, fields: FieldNames = DEFAULT_FIELDS) -> list[dict]:
    """Reads a JSONL file (one JSON object per line, UTF-8) into validated rows.

    Args:
      path: the file.
      fields: which fields hold the prompt, answer and id.

    Returns:
      Rows `{"id", "prompt", "answer", **extra}` in file order.

    Raises:
      DataFormatError: naming the file and line of the first malformed row (see module doc).
    """
    path = Path(path)
    return rows_from_records(_jsonl_records(path), source=str(path), fields=fields)


def read_parquet(path: str | os.PathLike, *, fields: FieldNames = DEFAULT_FIELDS) -> list[dict]:
    """Reads a parquet file into validated rows; needs `pyarrow`.

    Args:
      path: the file.
      fields: which columns hold the prompt, answer and id (dotted paths reach into struct and
        list columns).

    Returns:
      Rows `{"id", "prompt", "answer", **extra}` in file order.

    Raises:
      ImportError: when pyarrow is not installed.
      DataFormatError: naming the file and row (from 0) of the first malformed row, or the file
        when pyarrow cannot read it.
    """
    path = Path(path)
    try:
        import pyarrow.parquet as parquet
    except ImportError as error:
        raise ImportError(
            f"reading the parquet file {path} needs pyarrow, which is not installed: "
            "`pip install pyarrow` (or convert the file to JSONL)"
        ) from error
    try:
        records = parquet.read_table(path).to_pylist()
    except (OSError, ValueError) as error:
        raise DataFormatError(str(path), None, f"cannot read as parquet ({error})") from error
    return rows_from_records(
        ((f"row {index}", record) for index, record in enumerate(records)),
        source=str(path),
        fields=fields,
    )


def read_rows(path: str | os.PathLike, *, fields: FieldNames = DEFAULT_FIELDS) -> list[dict]:
    """Reads a `.jsonl` or `.parquet` file into validated rows, by its suffix.

    Args:
      path: the file.
      fields: which fields hold the prompt, answer and id.

    Returns:
      Rows `{"id", "prompt", "answer", **extra}` in file order.

    Raises:
      ValueError: when the suffix is neither `.jsonl` nor `.parquet`.
      FileNotFoundError: when the file does not exist.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"dataset file {path} does not exist")
    if path.suffix == ".jsonl":
        return read_jsonl(path, fields=fields)
    if path.suffix == ".parquet":
        return read_parquet(path, fields=fields)
    raise ValueError(f"path={str(path)!r}: expected a .jsonl or .parquet file")


def load_hub(
    name: str,
    *,
    config: str | None = None,
    split: str = "train",
    fields: FieldNames = DEFAULT_FIELDS,
    revision: str | None = None,
) -> list[dict]:
    """Loads a dataset by Hugging Face hub name through `datasets` (optional, needs a network).

    Args:
      name: the hub name, e.g. `"open-r1/DAPO-Math-17k-Processed"`.
      config: the dataset config, e.g. `"en"`.
      split: the split.
      fields: which columns hold the prompt, answer and id.
      revision: a hub revision to pin.

    Returns:
      Rows `{"id", "prompt", "answer", **extra}` in dataset order.

    Raises:
      ImportError: when `datasets` is not installed (it is not a dependency of gdro-jax).
      DataFormatError: naming the dataset and row of the first malformed row.
    """
    try:
        import datasets
    except ImportError as error:
        raise ImportError(
            f"loading {name!r} from the hub needs the `datasets` package, which is not installed "
            "(it is not a dependency of gdro-jax): `pip install datasets`, or download the file "
            "and read it with read_rows(path)"
        ) from error
    dataset = datasets.load_dataset(name, config, split=split, revision=revision)
    source = f"hub:{name}" + (f"[{config}]" if config else "") + f"/{split}"
    return rows_from_records(
        ((f"row {index}", dict(record)) for index, record in enumerate(dataset)),
        source=source,
        fields=fields,
    )
