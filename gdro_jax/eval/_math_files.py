"""The math evaluation's resume files: `settings.json`, `samples.jsonl` and `completions.jsonl`
(docs/evaluation.md, "Resuming"). Reading and checking never write: `read_records` returns the
repair of a torn last line as a function, called once the run is accepted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gdro_jax.rewards import extract_answer

SETTINGS_FILE = "settings.json"
SAMPLES_FILE = "samples.jsonl"
COMPLETIONS_FILE = "completions.jsonl"


def check_settings(path: Path, settings: Mapping[str, Any], *, has_samples: bool) -> None:
    """Raises a ValueError naming the first setting that differs from the stored ones, when the
    folder holds samples drawn under them; writes nothing."""
    if not (has_samples and path.exists()):
        return
    stored = json.loads(path.read_text())
    for name in sorted(set(stored) | set(settings)):
        if stored.get(name) != settings.get(name):
            raise ValueError(
                f"{path}: setting {name!r} differs: the samples there were drawn with "
                f"{name}={stored.get(name)!r}, this run asks for {name}={settings.get(name)!r}; "
                "use the same settings to resume, or another output folder"
            )


def read_records(path: Path) -> tuple[dict[tuple[str, str], dict], Callable[[], None] | None]:
    """The finished problems in `samples.jsonl`, and the repair its last line needs, if any.

    Returns:
      `(records, repair)`: records keyed by (benchmark, id); `repair` is None, or a function that
      cuts a torn last line (an interrupted write) or adds the newline a whole last record lacks.
      Reading writes nothing; call `repair` once the run is accepted.

    Raises:
      ValueError: naming the file and line of a line that is not JSON (other than the last).
    """
    if not path.exists():
        return {}, None
    content = path.read_bytes()
    complete, _, tail = content.rpartition(b"\n")
    repair = None
    if tail:
        try:
            json.loads(tail)
            complete = content

            def repair():
                with open(path, "ab") as f:
                    f.write(b"\n")

        except json.JSONDecodeError:
            keep = len(complete) + 1 if complete else 0

            def repair():
                with open(path, "r+b") as f:
                    f.truncate(keep)

    records = {}
    for number, line in enumerate(complete.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not a JSON line ({error})") from error
        records[(record["benchmark"], record["id"])] = record
    return records, repair


def keep_finished_completions(path: Path, records: Mapping[tuple[str, str], Any]) -> None:
    """Rewrites `completions.jsonl` with one line per finished problem (the last written), when
    it holds torn lines, lines of unfinished problems, or repeats."""
    if not path.exists():
        return
    lines = path.read_bytes().split(b"\n")
    kept: dict[tuple[str, str], bytes] = {}
    for line in lines:
        try:
            entry = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            entry = None
        if isinstance(entry, dict) and (entry.get("benchmark"), entry.get("id")) in records:
            kept[(entry["benchmark"], entry["id"])] = line
    content = b"".join(line + b"\n" for line in kept.values())
    if content != path.read_bytes():
        temporary = path.with_suffix(".tmp")
        temporary.write_bytes(content)
        os.replace(temporary, path)


def completions_entry(name, row, texts, grades, lengths, truncated) -> dict[str, Any]:
    """One line of `completions.jsonl`: a problem and what each of its completions said."""
    entry = {"benchmark": name, "id": str(row["id"])}
    if "problem" in row:
        entry["problem"] = row["problem"]
    entry.update(prompt=row["prompt"], answer=str(row["answer"]))
    entry["completions"] = [
        {
            "text": text,
            "extracted_answer": extract_answer(text),
            "status": grade.status,
            "score": float(grade.score),
            "length": int(length),
            "truncated": bool(cut),
        }
        for text, grade, length, cut in zip(texts, grades, lengths, truncated, strict=True)
    ]
    return entry
