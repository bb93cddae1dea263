"""The run's log writers: step metrics (`step.step_metrics`) into `metrics.jsonl` and TensorBoard.

`MetricsWriter` writes one JSON object per line (scalars as numbers; per-bin arrays, names
starting `bin/`, and per-prompt ones, `prompt/`, as lists) and one TensorBoard scalar per bin
(`bin/q/3`; the per-prompt arrays stay out of TensorBoard); every line carries `step`.
`rewind_metrics` cuts the file back to a checkpoint's cursor when a run resumes.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from gdro_jax.runtime import broadcast_from_primary


def to_host(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Device scalars and arrays to Python floats and lists (NaN and inf kept as strings)."""

    def convert(value):
        array = np.asarray(value)
        if array.ndim == 0:
            number = array.item()
            if isinstance(number, float) and not math.isfinite(number):
                return str(number)
            return number
        return [convert(v) for v in array]

    return {name: convert(value) for name, value in metrics.items()}


class MetricsWriter:
    """Writes step metrics to `workdir/metrics.jsonl` and TensorBoard event files in `workdir/tb`.

    Args:
      workdir: the run's folder (created if missing).
      tensorboard: also write TensorBoard event files.
      append: keep the rows already in `metrics.jsonl` (a resumed run); False starts the file
        afresh (a new run in the same folder).
      purge_step: for a resumed run, the first step to be redone: TensorBoard hides events of
        this step and later that an earlier process wrote, so redone steps are not drawn twice.
    """

    def __init__(
        self,
        workdir: str | os.PathLike,
        *,
        tensorboard: bool = True,
        append: bool = True,
        purge_step: int | None = None,
    ):
        os.makedirs(workdir, exist_ok=True)
        self.path = os.path.join(workdir, "metrics.jsonl")
        mode = "a" if append else "w"
        self._file = open(self.path, mode, encoding="utf-8")  # noqa: SIM115 (closed in close())
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(os.path.join(workdir, "tb"), purge_step=purge_step)

    def write(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Writes one step's metrics; returns them as host values."""
        row = {"step": int(step), **to_host(metrics)}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._tb is not None:
            for name, value in row.items():
                if name == "step":
                    continue
                if isinstance(value, list):
                    if name.startswith("prompt/"):
                        continue  # a scalar per prompt: metrics.jsonl holds them
                    for index, item in enumerate(value):
                        if isinstance(item, int | float):
                            self._tb.add_scalar(f"{name}/{index}", item, step)
                elif isinstance(value, int | float):
                    self._tb.add_scalar(name, value, step)
        return row

    def size(self) -> int:
        """Bytes of `metrics.jsonl` written so far (every process gets process 0's figure)."""
        return broadcast_from_primary(os.path.getsize(self.path))

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RowsOnly:
    """The `MetricsWriter` of processes other than 0 in a multi-process run: rows, no files."""

    def __init__(self, workdir: str | os.PathLike):
        self.path = os.path.join(workdir, "metrics.jsonl")

    def write(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        return {"step": int(step), **to_host(metrics)}

    def size(self) -> int:
        return broadcast_from_primary(0)

    def close(self) -> None:
        pass


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Reads a `metrics.jsonl` file back into a list of dicts (one per step)."""
    with open(path, encoding="utf-8") as file:
        return [json.loads(line) for line in file if line.strip()]


def rewind_metrics(path: str | os.PathLike, step: int, metrics_bytes: int) -> int:
    """Cuts `metrics.jsonl` back to the rows of steps <= `step` (those after it are redone).

    The first `metrics_bytes` bytes (the checkpoint's cursor) are kept byte for byte when they
    end with the row of `step`; otherwise (the file was edited) the leading rows with steps <=
    `step` are kept, with a warning.

    Returns:
      The number of rows dropped.
    """
    if not os.path.exists(path):
        if step > 0:
            logging.warning("%s is missing; rows of steps 1-%d are lost", path, step)
        return 0
    with open(path, "rb") as file:
        content = file.read()
    head = content[:metrics_bytes]
    lines = head.splitlines()
    if len(head) == metrics_bytes and (
        (metrics_bytes == 0 and step == 0)
        or (head.endswith(b"\n") and lines and _row_step(lines[-1]) == step)
    ):
        keep = head
    else:
        logging.warning(
            "%s does not match the checkpoint's cursor (%d bytes up to step %d); keeping its "
            "leading rows of steps <= %d",
            path,
            metrics_bytes,
            step,
            step,
        )
        kept = []
        for line in content.splitlines(keepends=True):
            row_step = _row_step(line)
            if row_step is None or row_step > step:
                break
            kept.append(line)
        keep = b"".join(kept)
    dropped = len(content[len(keep) :].splitlines())
    if len(keep) != len(content):
        with open(path, "r+b") as file:
            file.truncate(len(keep))
    return dropped


def _row_step(line: bytes) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None
